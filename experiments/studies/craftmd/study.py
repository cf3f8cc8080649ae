"""`medstack run craftmd`: cases × trials through the study runner (declared in __init__.py, with `medstack meld`)."""

from __future__ import annotations

import re
from pathlib import Path

from experiments.common.grade import to_disk
from experiments.core.config import ConfigError, config_dir
from experiments.studies.craftmd import paper_values
from experiments.studies.craftmd.assess import TEMPLATES, assess_conversation, question_rates, transcript_turns
from experiments.studies.craftmd.data import load_cases, synthetic_cases
from experiments.studies.craftmd.judges import CRAFTMD
from experiments.studies.craftmd.metrics import PATIENT_CHECKS_HEADING, PATIENT_CHECKS_NOTE, conversation_markdown, per_specialty, released_rows, run_metrics, summary_markdown
from experiments.studies.craftmd.prompts import PROMPTS, render
from experiments.studies.craftmd.protocol import solve
from experiments.studies.craftmd.scores import conversation_grades
from experiments.studies.craftmd.settings import CraftSettings, additions, loop_line, requests_line
from experiments.core.study import CaseContext, PatientRole, Study
from experiments.tables.render import run_paper_tables
from serving.refs import model_name

CONFIGS = config_dir(__file__)


def units_for(cases: list[dict], trials: int) -> list[dict]:
    """One unit of work per (case, trial), id ``<case_id>/t<trial>``."""
    return [{"id": f"{c['case_id']}/t{t}", "case": c, "trial": t} for c in cases for t in range(trials)]


async def assess_record(ctx: CaseContext, case: dict, record: dict, s: CraftSettings) -> dict:
    """A record with its conversation assessed (``assess_conversations``): ``assessment``, the assessor's five
    verdicts, and their scores. Nothing is added to a record without a conversation."""
    turns = transcript_turns(record.get("transcript"))
    if not turns or not s.assess_conversations:
        return record
    # as the released conversations read: the doctor's fixed greeting first (the transcript keeps the models' turns only)
    record["assessment"] = await assess_conversation(ctx, [("doctor", render("greeting"))] + turns, case["vignette"], s)
    record["vignette"] = case["vignette"]  # what the assessor (and a clinician reviewing it) was given
    record["prompt_hashes"] = {**record.get("prompt_hashes", {}), **PROMPTS.hashes(TEMPLATES.values())}
    record["scores"] = {**record.get("scores", {}), **to_disk(conversation_grades(record, s.roles.get("assessor")))}
    return record


# the patient-AI, checked by the runner (experiments/common/patient_checks.py); the answer choices where the run asks the MCQ
PATIENT = PatientRole(
    turns=lambda record: transcript_turns(record.get("transcript")), facts=lambda unit: unit["case"]["vignette"],
    correct=lambda unit: unit["case"]["answer"],
    choices=lambda unit, s: unit["case"]["choices"] if s.mcq and len(unit["case"].get("choices") or []) == 4 else None,
    span_words=lambda s: s.copy_span_words if s.patient_checks else None, beside=released_rows,
    heading=PATIENT_CHECKS_HEADING, note=PATIENT_CHECKS_NOTE)


def paper_model(alias: str) -> str | None:
    """The paper's model (a normalised name of experts.PAPER_MODELS) a doctor-model alias is, or None."""
    a = re.sub(r"[^a-z0-9.]", "", (alias or "").lower())
    if a.startswith("gpt4") and not a.startswith("gpt4o"):
        return "gpt-4"
    if a.startswith(("gpt3.5", "gpt35")):
        return "gpt-3.5"
    if "mistral" in a and "7b" in a and ("v0.2" in a or "v2" in a):
        return "mistral-v2-7b"
    if ("llama2" in a or "llama-2" in a) and "7b" in a:
        return "llama-2-7b"
    return None


class CraftmdStudy(Study):
    name = "craftmd"
    settings_cls = CraftSettings
    roles = ("clinical", "patient", "grader", "summarizer", "assessor")
    primary_role = "clinical"
    prompts = PROMPTS
    sweep_roles = ("clinical",)  # the doctor-AI varies; patient-AI and grader-AI stay fixed (Johri et al.)
    role_follows = {"summarizer": "grader", "assessor": "grader"}
    strata = ("dataset", "specialty")  # --sample keeps the whole set's mix of data sets and specialties
    judge_roles = ("grader",)
    results = CRAFTMD  # typed scores, judges, compare, released runs, report lines (experiments/studies/craftmd/judges.py)
    patient = PATIENT

    @classmethod
    def runner_scale(cls, case_trials: int, trials: int, ref: str):
        """This study over synthetic cases, the paper run's call pattern (`bench --runner-scale`), and its settings:
        the paper config (all formats, MCQ + FRQ, 14-turn cap, sampled turns), every role but the assessor on ``ref``."""

        class RunnerScaleStudy(cls):
            name = "craftmd-runner-scale"

            def prepare(self, s):
                return s.model_copy(update={"name": s.name or "instant"})

            def load_cases(self, s):
                return units_for(synthetic_cases(-(-case_trials // s.trials)), s.trials)[:case_trials]

        return RunnerScaleStudy(), {"trials": trials, "data": "synthetic", "roles": {r: ref for r in ("clinical", "patient", "grader", "summarizer")}}

    def fixed_roles(self, s: CraftSettings) -> tuple[str, ...]:
        talks = any(f != "vignette" for f in s.formats)  # every format but the vignette has a patient-AI
        return ((("patient",) if talks else ()) + (("grader",) if s.frq else ()) + (("summarizer",) if "summarized" in s.formats else ())
                + (("assessor",) if talks and s.assess_conversations else ()))

    def default_config(self, overrides: dict) -> Path:
        return CONFIGS / "paper.yaml"

    def prepare(self, s: CraftSettings) -> CraftSettings:
        if not s.data:
            raise ConfigError("no case file: pass --data CASES.csv (or a registered name such as craftmd-cases), or an AgentClinic OSCE .jsonl")
        if not (s.mcq or s.frq):
            raise ConfigError("nothing to ask: --no-mcq and --no-frq together leave no question")
        roles = dict(s.roles)
        if not s.assess_conversations:  # the assessor is not called: not a role of this run (earlier runs' settings unchanged)
            roles.pop("assessor", None)
        return s.model_copy(update={"name": s.name or model_name(s.roles["clinical"]), "roles": roles})

    def load_cases(self, s: CraftSettings) -> list[dict]:
        return units_for(self.select(load_cases(s.data, specialty=s.specialty), s), s.trials)

    async def solve(self, ctx: CaseContext, unit: dict, s: CraftSettings) -> dict:
        return await assess_record(ctx, unit["case"], await solve(ctx, unit, s), s)

    def metrics(self, records: list[dict], s: CraftSettings) -> dict:
        metrics = run_metrics(records)
        metrics["per_specialty"] = per_specialty(records)
        metrics["grades"] = "local grader"
        metrics["concurrent_rule"] = s.concurrent_rule
        metrics["requests"] = loop_line(s)  # the settings unlike the authors' follow under the title (the runner's metrics["deviations"])
        metrics["additions"] = additions(s)
        quality = question_rates(records)
        if quality:
            metrics["conversation_quality"] = quality
        return metrics

    def describe(self, s: CraftSettings) -> list[str]:
        adds = additions(s)
        return [requests_line(s)] + ([f"additions to the protocol: {'; '.join(adds)}"] if adds else [])

    def summary(self, metrics: dict, s: CraftSettings, run) -> str:
        paper = paper_model(model_name(s.roles["clinical"]))
        return (summary_markdown(s.name, metrics) + conversation_markdown(metrics, paper_values.EXPERT_PUBLISHED, paper)
                + "\n" + run_paper_tables(run))
