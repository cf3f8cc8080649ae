"""MediTOD's studies: `medstack run meditod-nlu|meditod-pol|meditod-nlg` (the Study: run.py), with their paper tables."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from experiments.core.registry import register_study, register_tables
from experiments.meditod.paper_values import ADAPTER
from experiments.meditod.run import MeditodStudy

HELP = {
    "nlu": "MediTOD NLU: dialog history + last turn -> the patient turn's intents/slots (JSON); P/R/F1, joint accuracy.",
    "pol": "MediTOD POL: dialog state + last turn -> the doctor's next actions (JSON); P/R/F1, Precision@K.",
    "nlg": "MediTOD NLG: doctor actions + last turn -> the doctor's utterance; BLEU-2/4, ROUGE-1/L, BERTScore.",
}
for _task, _help in HELP.items():
    register_study(f"meditod-{_task}", partial(MeditodStudy, _task), fixed={"task": _task}, help=_help + """

    One case per test turn (id DIALOG/UTTR). Default config: configs/<task>_<mode>.yaml; default --out runs/meditod/<task>-<mode>.
    Writes records.jsonl, metrics.json, summary.md; re-running resumes.
    Exit 0 done, 2 bad input, 3 some turns failed (run the same command again to retry them).
    """)
register_tables(Path(__file__).with_name("paper_tables.yaml"), ADAPTER)
