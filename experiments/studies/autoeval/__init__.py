"""Rubric auto-evaluation of dialogues (AMIE-style self-CoT judge, docs/protocols.md, Auto-evaluation)."""

from experiments.core.registry import Command, Kind, StudyDeclaration

# everything this folder adds to medstack (experiments/core/registry.py): read by `medstack --help` without importing study.py
STUDY = StudyDeclaration(
    commands=(Command("autoeval", "Rate every stored doctor-patient dialogue 1-5 per rubric criterion with a self-CoT LLM judge (AMIE style).",
                      "study:AutoevalStudy", top_level=True, more="""
    Step (a): the judge explains (Good/Bad/Summary) example dialogues with known ratings, once per judge
    model (cached in the output directory). Step (b): a few-shot prompt with one explained example per
    rating point rates each dialogue (Good/Bad/Summary/Rating). Unparseable ratings are unscored and counted.
    One case per (dialogue, criterion); --limit counts dialogues. Default --out runs/autoeval/<results>-<judge>;
    default config experiments/studies/autoeval/configs/default.yaml (see also amie.yaml, embedded-completion.yaml).
    Writes records.jsonl, metrics.json (mean rating per criterion with 95% CI, n, unscored; agreement with
    --reference) and summary.md. Exit 0 done, 2 bad input, 3 some ratings failed (run the same command again).
    """),),
    tables="paper_tables.yaml", adapter="paper_values:ADAPTER",
    results=(Kind("calibrate-autoeval", "calibrate:Calibration"),),  # `calibrate autoeval` writes results folders of this kind: its table in the report
    cli={"calibrate autoeval": "cli:autoeval_cmd"},
)
