"""CRAFT-MD: conversational diagnostic evaluation (Johri et al., Nat Med 2025). See README.md."""

from experiments.core.registry import Command, Kind, StudyDeclaration

# everything this folder adds to medstack (experiments/core/registry.py): read by `medstack --help` without importing study.py
STUDY = StudyDeclaration(
    commands=(
        Command("craftmd", "CRAFT-MD: simulated doctor–patient conversations, summaries, MCQ/FRQ in 4 formats, two-step grading, N trials.",
                "study:CraftmdStudy", more="""
    One record per (case, trial), id CASE/tK. Writes records.jsonl, metrics.json, summary.md in --out.
    Exit 0 done, 2 bad input, 3 some cases failed (run the same command again to retry them).
    """),
        Command("meld", "MELD contamination check: first half of each vignette -> model writes the second half; similarity = 1 − normalized Levenshtein.",
                "meld:MeldStudy", top_level=True, tables=False, formerly=("craftmd-meld",)),
    ),
    tables="paper_tables.yaml", adapter="paper_values:ADAPTER",
    # `import craftmd-experts`, `calibrate craftmd-grader | conversations` write results folders of these kinds
    results=(Kind("craftmd-experts", "study:ExpertsImport"), Kind("calibrate-craftmd-grader", "calibrate_grader:CalibrateGrader"),
             Kind("calibrate-conversations", "calibrate_conversations:ConversationCalibration", formerly=("calibrate-craftmd-conversations",))),
    cli={"import craftmd": "cli:import_craftmd", "import craftmd-experts": "cli:import_experts_cmd",
         "calibrate craftmd-grader": "cli:calibrate_grader_cmd", "calibrate conversations": "cli:calibrate_conversations_cmd"},
)
