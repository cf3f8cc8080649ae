"""The autoeval study: `medstack autoeval RESULTS` (the Study: run.py), with its paper tables."""

from __future__ import annotations

from pathlib import Path

from experiments.autoeval.paper_values import ADAPTER
from experiments.autoeval.run import AutoevalStudy
from experiments.core.registry import register_study, register_tables

register_study("autoeval", AutoevalStudy, top_level=True, help="""Rate every stored doctor-patient dialogue 1-5 per rubric criterion with a self-CoT LLM judge (AMIE style).

    Step (a): the judge explains (Good/Bad/Summary) example dialogues with known ratings, once per judge
    model (cached in the output directory). Step (b): a few-shot prompt with one explained example per
    rating point rates each dialogue (Good/Bad/Summary/Rating). Unparseable ratings are unscored and counted.
    One case per (dialogue, criterion); --limit counts dialogues. Default --out runs/autoeval/<results>-<judge>;
    default config experiments/autoeval/configs/default.yaml (see also amie.yaml, embedded-completion.yaml).
    Writes records.jsonl, metrics.json (mean rating per criterion with 95% CI, n, unscored; agreement with
    --reference) and summary.md. Exit 0 done, 2 bad input, 3 some ratings failed (run the same command again).
    """)
register_tables(Path(__file__).with_name("paper_tables.yaml"), ADAPTER)
