"""MediTOD (Saley et al., 2024): NLU, POL and NLG baselines with the dataset authors' metrics."""

from experiments.core.registry import Command, StudyDeclaration

MORE = """
    One case per test turn (id DIALOG/UTTR). Default config: configs/<task>_<mode>.yaml; default --out runs/meditod/<task>-<mode>.
    Writes records.jsonl, metrics.json, summary.md; re-running resumes.
    Exit 0 done, 2 bad input, 3 some turns failed (run the same command again to retry them).
    """

# everything this folder adds to medstack (experiments/core/registry.py): read by `medstack --help` without importing study.py
STUDY = StudyDeclaration(
    commands=(
        Command("meditod-nlu", "MediTOD NLU: dialog history + last turn -> the patient turn's intents/slots (JSON); P/R/F1, joint accuracy.",
                "study:MeditodStudy", more=MORE, fixed={"task": "nlu"}),
        Command("meditod-pol", "MediTOD POL: dialog state + last turn -> the doctor's next actions (JSON); P/R/F1, Precision@K.",
                "study:MeditodStudy", more=MORE, fixed={"task": "pol"}),
        Command("meditod-nlg", "MediTOD NLG: doctor actions + last turn -> the doctor's utterance; BLEU-2/4, ROUGE-1/L, BERTScore.",
                "study:MeditodStudy", more=MORE, fixed={"task": "nlg"}),
    ),
    tables="paper_tables.yaml", adapter="paper_values:ADAPTER",
    cli={"score meditod-nlu": "cli:score_nlu", "score meditod-pol": "cli:score_pol", "score meditod-nlg": "cli:score_nlg",
         "data meditod": "cli:data_command"},
)
