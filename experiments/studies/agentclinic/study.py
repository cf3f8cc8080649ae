"""AgentClinic as the runner sees it: `medstack run agentclinic`, its scorers, its paper table.

Roles: ``doctor`` (the model under test), ``patient``, ``measurement``, ``moderator``. One record per OSCE case,
id ``case_<line-1>``; the loop is experiments/studies/agentclinic/protocol.py. Its scorers: ``diagnosis`` (the
moderator's yes/no, or 0 by rule without a diagnosis), the patient checks, and, optional, ``diagnosis-first-word``
(the moderator asked again, its reply read by its first word).
"""

from __future__ import annotations

import re
from pathlib import Path

from experiments.studies.agentclinic.protocol import PROMPTS, RULES, facts, moderate, no_diagnosis, solve, verdict, worst_case
from experiments.studies.agentclinic.paper_values import BIAS_EFFECTS
from experiments.studies.agentclinic.settings import AgentClinicSettings
from experiments.common.grade import YES_NO, grades
from experiments.common.markdown import md_table, num
from experiments.core.patient import patient_checks
from experiments.core.conditions import run_name
from experiments.core.config import ConfigError, config_dir
from experiments.core.record import RUNNER_FIELDS, record
from experiments.core.results import iter_jsonl
from experiments.core.scorers import Scorer
from experiments.core.study import CaseContext, Study
from experiments.tables.render import run_paper_tables
from models.errors import DataError
from serving.refs import model_name

CONFIGS = config_dir(__file__)
SEX = (("female", r"\b(female|woman|girl|mother)\b"), ("male", r"\b(male|man|boy|father)\b"))


def sex_of(demographics) -> str:
    """The patient's sex as the case's demographics line says it (the --sample stratum), else 'unstated'."""
    text = str(demographics or "").lower()
    return next((sex for sex, pattern in SEX if re.search(pattern, text)), "unstated")


def load_cases(path: str | Path) -> list[dict]:
    """AgentClinic OSCE JSONL (one ``OSCE_Examination`` per line, as the authors publish it) -> cases ``case_<line-1>``."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file (pass --data OSCE.jsonl or a registered name: agentclinic-medqa, agentclinic-medqa-ext)")
    cases = []
    for lineno, row in iter_jsonl(p):
        osce = row.get("OSCE_Examination")
        need = ("Objective_for_Doctor", "Patient_Actor", "Physical_Examination_Findings", "Test_Results", "Correct_Diagnosis")
        missing = [k for k in need if not isinstance(osce, dict) or k not in osce]
        if missing:
            raise DataError(f"{p}:{lineno}: an OSCE_Examination needs {', '.join(missing)}")
        if not str(osce["Correct_Diagnosis"]).strip():
            raise DataError(f"{p}:{lineno}: Correct_Diagnosis is empty")
        demographics = osce["Patient_Actor"].get("Demographics") if isinstance(osce["Patient_Actor"], dict) else osce["Patient_Actor"]
        cases.append({"id": f"case_{lineno - 1}", "case_id": f"case_{lineno - 1}", "sex": sex_of(demographics),
                      "correct_diagnosis": str(osce["Correct_Diagnosis"]).strip(), "osce": osce})
    if not cases:
        raise DataError(f"{p}: no cases")
    return cases


# ------------------------------------------------------------------ scorers

QUESTION = "Do the doctor's diagnosis and the correct diagnosis name the same disease?"


def show_diagnosis(record: dict, part: str | None) -> dict:
    """What the moderator was given: the correct diagnosis and the doctor's whole diagnosis line."""
    return {"correct diagnosis": record.get("target"), "doctor's line": record.get("answer") or ""}


def moderator(name: str, rule: str | None = None, optional: bool = False) -> Scorer:
    """The moderator as a scorer: its yes/no on the doctor's diagnosis line, read by ``rule`` (None: the run's
    ``verdict_rule``); without a diagnosis, 0 by rule and nothing asked."""

    async def decide(ctx: CaseContext, record: dict, s: AgentClinicSettings, role: str) -> dict:
        if not record.get("answer"):
            return {None: no_diagnosis()}
        return {None: await moderate(ctx, record["answer"], record["target"], s, role, rule)}

    return Scorer(name, YES_NO, QUESTION + ("" if rule is None else f" (reply read by: {RULES[rule]})"), decide=decide,
                  role="moderator", show=show_diagnosis, optional=optional,
                  label="diagnostic accuracy (moderator" + ("" if rule is None else f", reply read by: {RULES[rule]}") + ")")


# ------------------------------------------------------------------ metrics and summary

def run_metrics(records: list[dict], s: AgentClinicSettings) -> dict:
    """What the loop did, beside the scorers' figures (the runner adds those): diagnoses, unreadable verdicts,
    replies the two rules read differently, tests and inferences."""
    moderated = [r for r in records if r.get("answer")]
    said = [g.explanation or "" for r in moderated if (g := grades(r).get("diagnosis")) is not None]
    meta = [r.get("metadata") or {} for r in records]
    return {"records": len(records), "diagnosed": len(moderated), "no_diagnosis": len(records) - len(moderated),
            "moderator_unscored": sum(1 for r in moderated if not grades(r).get("diagnosis") or not grades(r)["diagnosis"].scored),
            # replies the two rules read differently ('Yes.' is a no by the authors' rule, a yes by its first word)
            "rules_disagree": sum(1 for e in said if verdict(e, "exact") != verdict(e, "first_word")),
            "verdict_rule": s.verdict_rule, "biases": {"doctor": s.doctor_bias, "patient": s.patient_bias}, "inferences": s.inferences,
            "mean_doctor_inferences": sum(m.get("doctor_inferences", 0) for m in meta) / len(meta) if meta else None,
            "tests_requested": sum(m.get("tests_requested", 0) for m in meta)}


def summary_markdown(m: dict, s: AgentClinicSettings) -> str:
    acc = next((f for f in m.get("scores") or [] if f["score"] == "diagnosis"), None)
    rows = [["diagnostic accuracy (moderator)", f"{num(acc['value'])} [{num(acc['low'])}, {num(acc['high'])}]" if acc and acc["value"] is not None else "–",
             acc["n"] if acc else 0],
            ["cases with a diagnosis", m["diagnosed"], m["records"]],
            ["no diagnosis within the budget (wrong)", m["no_diagnosis"], m["records"]],
            ["moderator replies unscored (unreadable)", m["moderator_unscored"], m["diagnosed"]],
            ["moderator replies read differently by the other rule (exact / first word)", m["rules_disagree"], m["diagnosed"]],
            ["tests requested (all cases)", m["tests_requested"], ""],
            ["doctor inferences per case (mean)", num(m["mean_doctor_inferences"], 2), f"budget {m['inferences']}"]]
    head = [f"# AgentClinic run: {s.name}", "", f"doctor bias: {s.doctor_bias}; patient bias: {s.patient_bias}; moderator rule: {s.verdict_rule}", ""]
    return "\n".join(head + md_table(["", "value", "of"], rows)) + "\n"


class AgentClinicStudy(Study):
    settings_cls = AgentClinicSettings
    roles = ("doctor", "patient", "measurement", "moderator")
    primary_role = "doctor"
    prompts = PROMPTS
    sweep_roles = ("doctor",)  # the paper varies the doctor; patient, measurement and moderator stay one model
    strata = ("sex",)  # --sample keeps the set's mix of female and male patients (the cases have no specialty)
    scorers = (moderator("diagnosis"), patient_checks(), moderator("diagnosis-first-word", "first_word", optional=True))
    effects = BIAS_EFFECTS  # the paper's bias effects: accuracy with a bias / without (docs/protocols.md, AgentClinic)
    # a dry run's doctor asks, requests a test and diagnoses, so the patient, the measurement agent and the moderator
    # each get their request (experiments/core/dryrun.py)
    standins = {"doctor": ("(dry run) Where does it hurt, and since when?", "REQUEST TEST: Complete_Blood_Count",
                           "DIAGNOSIS READY: (dry run) a stand-in diagnosis"),
                "patient": ("(dry run) It started two days ago.",), "measurement": ("RESULTS: (dry run) NORMAL READINGS",),
                "moderator": ("Yes",)}

    def upgrade(self, r: dict, s) -> dict:
        """A record written before the typed record (its loop's own fields) in today's shape; its scores as written."""
        keep = ("stop_reason", "doctor_inferences", "tests_requested", "biases", "prompt_hashes", "sex")
        out = record(r["id"], r.get("case_id"), inputs={"facts": facts(r.get("patient_facts") or "")},
                     target=r.get("correct_diagnosis"), transcript=[{"role": t.get("agent"), "text": t.get("text") or ""} for t in r.get("transcript") or []],
                     answer=r.get("diagnosis"), scores=r.get("scores"), metadata={k: r[k] for k in keep if k in r})
        return {**{k: v for k, v in r.items() if k in RUNNER_FIELDS}, **out}

    def fixed_roles(self, s: AgentClinicSettings) -> tuple[str, ...]:
        return ("patient", "measurement", "moderator")

    def default_config(self, overrides: dict) -> Path:
        return CONFIGS / "paper.yaml"

    def prepare(self, s: AgentClinicSettings) -> AgentClinicSettings:
        if s.doctor_actions and s.answers != "constrained":
            raise ConfigError("doctor_actions holds each doctor reply to an action by its reply format: it needs answers: constrained "
                              "(--set answers=constrained)")
        if not s.data:
            raise ConfigError("no case file: pass --data OSCE.jsonl or a registered name (agentclinic-medqa, agentclinic-medqa-ext)")
        return s.model_copy(update={"name": s.name or run_name(model_name(s.roles["doctor"]), s)})

    def load_cases(self, s: AgentClinicSettings) -> list[dict]:
        return load_cases(s.data)

    async def solve(self, ctx: CaseContext, case: dict, s: AgentClinicSettings) -> dict:
        return await solve(ctx, case, s)

    def metrics(self, records: list[dict], s: AgentClinicSettings) -> dict:
        return run_metrics(records, s)

    def worst_case(self, s: AgentClinicSettings, case: dict):
        return worst_case(case, s)

    def describe(self, s: AgentClinicSettings) -> list[str]:
        return [f"requests: built as the authors' agentclinic.py loop; doctor budget {s.inferences}; "
                f"biases doctor {s.doctor_bias}, patient {s.patient_bias}; moderator rule {s.verdict_rule}"]

    def summary(self, metrics: dict, s: AgentClinicSettings, run) -> str:
        return summary_markdown(metrics, s) + "\n" + run_paper_tables(run, self)

