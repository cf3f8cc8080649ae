"""AgentClinic as the runner sees it: `medstack run agentclinic`, its typed scores and judge, its paper table.

Roles: ``doctor`` (the model under test), ``patient``, ``measurement``, ``moderator``. One record per OSCE case,
id ``case_<line-1>``; the loop is experiments/studies/agentclinic/protocol.py. The record's one score is ``diagnosis`` (the
moderator's yes/no, or 0 by rule without a diagnosis), written by the loop itself.
"""

from __future__ import annotations

import re
from pathlib import Path

from experiments.studies.agentclinic.protocol import PROMPTS, facts, moderate, no_diagnosis, solve, verdict
from experiments.studies.agentclinic.settings import AgentClinicSettings
from experiments.common.grade import Grade, grades
from experiments.common.markdown import md_table, num
from experiments.common.stats import mean_ci
from experiments.core.config import ConfigError, config_dir
from experiments.core.judging import YES_NO, Judge
from experiments.core.results import iter_jsonl
from experiments.common.patient_checks import DEFAULT_SPAN_WORDS
from experiments.core.study import CaseContext, PatientRole, Study, StudyResults
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


# ------------------------------------------------------------------ results: the typed score and its judge

def show_diagnosis(record: dict, part: str | None, config: dict) -> dict:
    """What the moderator was given: the correct diagnosis and the doctor's whole diagnosis line."""
    return {"correct diagnosis": record.get("correct_diagnosis"), "doctor's line": record.get("diagnosis") or ""}


async def ask_diagnosis(ctx: CaseContext, record: dict, part: str | None, settings: AgentClinicSettings, role: str) -> Grade:
    """The moderator's request again over the stored diagnosis line (none: 0 by rule, nothing asked)."""
    if not record.get("diagnosis"):
        return no_diagnosis()
    return await moderate(ctx, record["diagnosis"], record["correct_diagnosis"], settings, role)


RESULTS = StudyResults(experiment="agentclinic", judges=(Judge(
    "diagnosis", YES_NO, "Do the doctor's diagnosis and the correct diagnosis name the same disease?", role="moderator",
    show=show_diagnosis, ask=ask_diagnosis),))


# ------------------------------------------------------------------ metrics and summary

def run_metrics(records: list[dict], s: AgentClinicSettings) -> dict:
    values = [g.value for r in records if (g := grades(r).get("diagnosis")) and g.scored]
    ci = mean_ci(values)
    moderated = [r for r in records if r.get("diagnosis")]
    return {"records": len(records), "accuracy": {"accuracy": ci.mean if ci.n else None, "ci_low": ci.low if ci.n else None,
                                                  "ci_high": ci.high if ci.n else None, "n": ci.n},
            "diagnosed": len(moderated), "no_diagnosis": len(records) - len(moderated),
            "moderator_unscored": len(moderated) - sum(1 for r in moderated if grades(r).get("diagnosis", Grade(None)).scored),
            # replies the two rules read differently ('Yes.' is a no by the authors' rule, a yes by its first word)
            "rules_disagree": sum(1 for r in moderated if verdict(e := grades(r)["diagnosis"].explanation or "", "exact") != verdict(e, "first_word")),
            "verdict_rule": s.verdict_rule, "biases": {"doctor": s.doctor_bias, "patient": s.patient_bias}, "inferences": s.inferences,
            "mean_doctor_inferences": sum(r.get("doctor_inferences", 0) for r in records) / len(records) if records else None,
            "tests_requested": sum(r.get("tests_requested", 0) for r in records)}


def summary_markdown(m: dict, s: AgentClinicSettings) -> str:
    a = m["accuracy"]
    rows = [["diagnostic accuracy (moderator)", f"{num(a['accuracy'])} [{num(a['ci_low'])}, {num(a['ci_high'])}]", a["n"]],
            ["cases with a diagnosis", m["diagnosed"], m["records"]],
            ["no diagnosis within the budget (wrong)", m["no_diagnosis"], m["records"]],
            ["moderator replies unscored (unreadable)", m["moderator_unscored"], m["diagnosed"]],
            ["moderator replies read differently by the other rule (exact / first word)", m["rules_disagree"], m["diagnosed"]],
            ["tests requested (all cases)", m["tests_requested"], ""],
            ["doctor inferences per case (mean)", num(m["mean_doctor_inferences"], 2), f"budget {m['inferences']}"]]
    head = [f"# AgentClinic run: {s.name}", "", f"doctor bias: {s.doctor_bias}; patient bias: {s.patient_bias}; moderator rule: {s.verdict_rule}", ""]
    return "\n".join(head + md_table(["", "value", "of"], rows)) + "\n"


class AgentClinicStudy(Study):
    name = "agentclinic"
    settings_cls = AgentClinicSettings
    roles = ("doctor", "patient", "measurement", "moderator")
    primary_role = "doctor"
    prompts = PROMPTS
    sweep_roles = ("doctor",)  # the paper varies the doctor; patient, measurement and moderator stay one model
    strata = ("sex",)  # --sample keeps the set's mix of female and male patients (the cases have no specialty)
    judge_roles = ("moderator",)
    results = RESULTS
    # the simulated patient, checked by the runner (experiments/common/patient_checks.py): what it was told is its
    # Patient_Actor facts; the doctor chooses from no list
    patient = PatientRole(turns=lambda record: [(t["agent"], t["text"]) for t in record.get("transcript") or []],
                          facts=lambda case: facts(case["osce"]["Patient_Actor"]), correct=lambda case: case["correct_diagnosis"],
                          choices=lambda case, s: None, span_words=lambda s: DEFAULT_SPAN_WORDS)

    def fixed_roles(self, s: AgentClinicSettings) -> tuple[str, ...]:
        return ("patient", "measurement", "moderator")

    def default_config(self, overrides: dict) -> Path:
        return CONFIGS / "paper.yaml"

    def prepare(self, s: AgentClinicSettings) -> AgentClinicSettings:
        if not s.data:
            raise ConfigError("no case file: pass --data OSCE.jsonl or a registered name (agentclinic-medqa, agentclinic-medqa-ext)")
        return s.model_copy(update={"name": s.name or model_name(s.roles["doctor"])})

    def load_cases(self, s: AgentClinicSettings) -> list[dict]:
        return self.select(load_cases(s.data), s)

    async def solve(self, ctx: CaseContext, case: dict, s: AgentClinicSettings) -> dict:
        return await solve(ctx, case, s)

    def metrics(self, records: list[dict], s: AgentClinicSettings) -> dict:
        return run_metrics(records, s)

    def describe(self, s: AgentClinicSettings) -> list[str]:
        return [f"requests: built as the authors' agentclinic.py loop; doctor budget {s.inferences}; "
                f"biases doctor {s.doctor_bias}, patient {s.patient_bias}; moderator rule {s.verdict_rule}"]

    def summary(self, metrics: dict, s: AgentClinicSettings, run) -> str:
        return summary_markdown(metrics, s) + "\n" + run_paper_tables(run)

