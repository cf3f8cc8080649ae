"""`medstack calibrate conversations`: the CRAFT-MD conversation checks (:mod:`experiments.studies.craftmd.terminology`; with
``--assessor-model``, the assessor through the one study runner) against the paper's dermatologists (the study README).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from dataclasses import replace

from experiments.common.grade import YES_NO, Grade, grades, to_disk
from experiments.common.markdown import md_table, num
from experiments.common.stats import cluster_bootstrap, rater_agreement
from experiments.core.config import ConfigError, RunSettings, Sampling
from experiments.core.record import turns
from experiments.core.results import RunDir
from experiments.core.runlock import RunLock
from experiments.core.scorers import Scorer, always
from experiments.core.study import CaseContext, Study
from experiments.studies.craftmd import paper_values
from experiments.studies.craftmd.assess import QUESTIONS
from experiments.studies.craftmd.experts import EXPERT_QUESTIONS as EXPERT_LABELLED, PAPER_LABELS, PAPER_MODELS, load_expert_labels, rate, to_record
from experiments.studies.craftmd.prompts import PROMPTS
from experiments.studies.craftmd.scorers import SCORERS, ASSESS_QUESTIONS
from experiments.studies.craftmd.study import upgrade_record
from experiments.studies.craftmd.terminology import TERMS_FILE, terminology_check

N_BOOT = 2000


class ConversationCalibrationSettings(RunSettings):
    """What :func:`experiments.studies.craftmd.assess.assess_conversation` reads (sampling, completion_steps,
    lone_system_as_user), as a CRAFT-MD run's settings name them."""

    roles: dict[str, str] = {"assessor": "embedded"}
    sampling: dict[str, Sampling] = {"assessor": Sampling(temperature=0.0, max_tokens=64)}
    completion_steps: list[Literal["assessor"]] = []
    lone_system_as_user: bool = False
    n_boot: int = Field(N_BOOT, ge=100)
    study_config: str = ""  # the CRAFT-MD settings file whose assessor this is
    settings_line: str = ""  # how the assessor is asked, as a run of that file asks it (summary.md)
    concurrency: Annotated[int, Field(ge=1)] | Literal["auto"] = 16


def decide_terminology(ctx, record: dict, s, role) -> dict:
    """Q3 without a model: a listed medical term in a patient line (terminology.tsv)."""
    found = terminology_check(turns(record))
    return {None: Grade(value=int(found["verdict"]), answer=found["terms"] or None, source="terminology list",
                        judge={"rule": f"a term of {TERMS_FILE.name} in a patient line"})}


TERMINOLOGY = Scorer("terminology", YES_NO, ASSESS_QUESTIONS["Q3"] + " (the term list, no model)", decide=decide_terminology)
ASSESSORS = tuple(replace(s, applies=always) for s in SCORERS if s.name.startswith("assess-"))


class ConversationCalibration(Study):
    """The kind ``calibrate-conversations``: the paper's expert-labelled conversations, the terminology check and (with
    an assessor model) the assessor scorers run over each, the experts' labels their ``assess-<Q>@experts`` grades."""

    settings_cls = ConversationCalibrationSettings
    roles = ("assessor",)
    primary_role = "assessor"
    prompts = PROMPTS
    scorers = (TERMINOLOGY, *ASSESSORS)

    def prepare(self, s: ConversationCalibrationSettings) -> ConversationCalibrationSettings:
        if not s.data:
            raise ConfigError("no labels: pass --labels craftmd-expert-labels or the folder of the three expert workbooks")
        if "assessor" not in s.sampling:
            raise ConfigError("sampling needs an entry for: assessor")
        return s

    def load_cases(self, s: ConversationCalibrationSettings) -> list[dict]:
        convs = interleaved(load_expert_labels(s.data))  # DataError naming the file, sheet and row
        return [{"id": c.id, "conversation": c} for c in convs]

    async def solve(self, ctx: CaseContext, unit: dict, s: ConversationCalibrationSettings) -> dict:
        rec = to_record(unit["conversation"])
        rec.pop("roles", None)
        return rec

    def upgrade(self, r: dict, s) -> dict:
        return upgrade_record(r, s)

    def metrics(self, records: list[dict], s: ConversationCalibrationSettings) -> dict:
        return calibration_metrics(records, n_boot=s.n_boot)

    def summary(self, metrics: dict, s: ConversationCalibrationSettings, run) -> str:
        return calibration_summary(metrics, s.roles.get("assessor", ""), s.settings_line)

    def report_run(self, run: dict) -> list[dict]:
        from experiments.studies.craftmd.report_views import conversations_calibration_tables

        return conversations_calibration_tables(run)


def interleaved(convs: list) -> list:
    """The conversations with the models taken in turn (GPT-4's first case, GPT-3.5's first, ...), so that
    ``--limit N`` takes about N/4 of each model's."""
    by_model: dict[str, list] = {}
    for c in convs:
        by_model.setdefault(c.model, []).append(c)
    out = []
    for i in range(max((len(v) for v in by_model.values()), default=0)):
        out += [v[i] for v in by_model.values() if i < len(v)]
    return out


RATERS = ("combined", "d1", "d2")


def agreement(experts: list[bool], check: list[bool], clusters: list | None = None, *, n_boot: int = N_BOOT) -> dict:
    """The experts' and a check's yes/no on the same conversations: exact agreement, Cohen's kappa, sensitivity and
    specificity (the check's yes on the experts' yes; its no on their no), each with a percentile bootstrap 95 % CI
    resampling whole ``clusters`` (cases; None: each conversation alone), and the confusion matrix (rows: experts,
    columns: the check; No, Yes). A figure undefined on the data (kappa with one category on both sides) is None."""
    a, b = [int(x) for x in experts], [int(x) for x in check]
    if not a:
        return {"n": 0, "exact_agreement": None, "kappa": None, "sensitivity": None, "specificity": None, "confusion": [[0, 0], [0, 0]], "ci95": {}}

    def figures(x: dict) -> dict:
        (nn, ny), (yn, yy) = x["confusion"]
        return {"exact_agreement": x["exact_agreement"], "kappa": x["weighted_kappa_linear"],
                "sensitivity": yy / (yy + yn) if yy + yn else float("nan"), "specificity": nn / (nn + ny) if nn + ny else float("nan")}

    def stat(idx):
        return figures(rater_agreement([a[i] for i in idx], [b[i] for i in idx], [0, 1], rank=False))

    whole = rater_agreement(a, b, [0, 1], rank=False)
    ci = cluster_bootstrap(stat, clusters if clusters is not None else range(len(a)), n_boot=n_boot)
    return {"n": len(a), **{k: None if v != v else v for k, v in figures(whole).items()},
            "confusion": whole["confusion"], "ci95": {k: list(v) for k, v in ci.items()}}


def verdict(record: dict, name: str) -> bool | None:
    """A scorer's yes/no on the record (``terminology``, ``assess-<Q>``, the experts' ``assess-<Q>@experts``)."""
    g = grades(record).get(name)
    return None if g is None or g.value is None else bool(g.value)


def _label(record: dict, rater: str, q: str):
    if rater == "combined":
        return verdict(record, f"assess-{q}@experts")
    return (((record.get("metadata") or {}).get("expert_raters") or {}).get(rater) or {}).get(q)


def _versus(records: list[dict], verdicts: list, q: str, n_boot: int) -> dict:
    """A check's verdicts against the combined label and each rater's, clustered by case."""
    out = {}
    for rater in RATERS:
        keep = [(_label(r, rater, q), v, r.get("case_id")) for r, v in zip(records, verdicts)]
        keep = [k for k in keep if k[0] is not None and k[1] is not None]
        out[rater] = agreement([k[0] for k in keep], [k[1] for k in keep], [k[2] for k in keep], n_boot=n_boot)
    return out


def calibration_metrics(records: list[dict], *, n_boot: int = N_BOOT) -> dict:
    assessed = any(f"assess-{q}" in (r.get("scores") or {}) for r in records for q in QUESTIONS)
    out: dict = {"conversations": len(records), "questions": {}, "per_rater": {}, "raters": {}, "detector": {}, "per_model": {},
                 "ci": "percentile bootstrap resampling whole cases", "terminology_list": TERMS_FILE.name}
    for q in EXPERT_LABELLED:  # the ceiling: the two raters on the conversations both labelled
        both = [r for r in records if _label(r, "d1", q) is not None and _label(r, "d2", q) is not None]
        out["raters"][q] = agreement([_label(r, "d1", q) for r in both], [_label(r, "d2", q) for r in both], [r.get("case_id") for r in both], n_boot=n_boot)
    checks = {r["id"]: verdict(r, "terminology") for r in records}
    out["detector"]["Q3"] = {**_versus(records, [checks[r["id"]] for r in records], "Q3", n_boot), "yes": sum(bool(c) for c in checks.values())}
    for q in QUESTIONS if assessed else ():
        verdicts = [verdict(r, f"assess-{q}") for r in records]
        entry = {"assessor_unscored": sum(v is None for v in verdicts),
                 "terms_not_in_patient_lines": sum(bool(g.metadata.get("terms_not_found")) for r in records if (g := grades(r).get(f"assess-{q}")))}
        if q in EXPERT_LABELLED:
            versus = _versus(records, verdicts, q, n_boot)
            entry.update(versus["combined"], experts_unlabelled=sum(_label(r, "combined", q) is None for r in records))
            out["per_rater"][q] = {k: versus[k] for k in ("d1", "d2")}
        else:
            entry["experts_unlabelled"] = None  # the paper released no labels for the patient-AI questions
        out["questions"][q] = entry
    for m in PAPER_MODELS:
        recs = [r for r in records if (r.get("metadata") or {}).get("model") == m]
        if not recs:
            continue
        out["per_model"][m] = {}
        for q in QUESTIONS if assessed else ("Q3",):
            mine = [v for r in recs if (v := verdict(r, f"assess-{q}")) is not None]
            theirs = [e for r in recs if (e := _label(r, "combined", q)) is not None] if q in EXPERT_LABELLED else None
            out["per_model"][m][q] = {"conversations": len(recs), "assessor": rate(mine) if assessed else None,
                                      "detector": rate([checks[r["id"]] for r in recs]) if q == "Q3" else None,
                                      "experts": rate(theirs) if theirs is not None else None}
    return out


def _ci(m: dict, k: str) -> str:
    ci = (m.get("ci95") or {}).get(k)
    return num(m.get(k)) + (f" [{num(ci[0])}, {num(ci[1])}]" if ci else "")


def _p(x: dict | None) -> str:
    return "–" if not x or x["pct"] is None else f"{x['pct']:.1f} ({x['yes']}/{x['n']})"


AGREEMENT_COLUMNS = ["check", "question", "against", "n", "agreement [95% CI]", "Cohen's kappa [95% CI]", "sensitivity [95% CI]",
                     "specificity [95% CI]", "confusion [[No/No, No/Yes], [Yes/No, Yes/Yes]]"]


def calibration_summary(m: dict, assessor: str, settings_line: str = "") -> str:
    published = paper_values.EXPERT_PUBLISHED
    against = {"combined": "experts combined", "d1": "rater d1", "d2": "rater d2"}
    L = ["# CRAFT-MD conversation checks against the paper's dermatologists", "",
         f"{m['conversations']} released conversation(s). Experts' combined label: the two raters' shared label, the tie-breaker's where "
         "they disagree, the one rater's where only one labelled it; each rater's own label in the rows against d1 and d2.",
         f"Terminology check (no model): a listed medical term ({m.get('terminology_list', 'terminology.tsv')}) in a patient line = Yes (Q3).",
         (f"Assessor: `{assessor}`, the requests of a CRAFT-MD run's `assess_conversations` (prompts/assess_*.txt); {settings_line}." if m["questions"] else
          "No assessor (no --assessor-model): the deterministic check alone."),
         "Kappa: Cohen's (two categories); sensitivity: the check's Yes among the experts' Yes; specificity: its No among their No. "
         f"95 % CIs: {m.get('ci', 'percentile bootstrap')} (45 cases x 4 models: a case's conversations are not independent).", "",
         "## Agreement with the experts, combined and per rater", ""]
    rows = [("terminology check", "Q3", rater, x) for rater in RATERS if (x := (m["detector"].get("Q3") or {}).get(rater))]
    rows += [(f"assessor `{assessor}`", q, rater, x if rater == "combined" else m["per_rater"][q][rater])
             for q in EXPERT_LABELLED if (x := m["questions"].get(q)) for rater in ("combined", "d1", "d2")]
    rows += [("rater d2 (the ceiling)", q, "d1", m["raters"][q]) for q in EXPERT_LABELLED if m["raters"].get(q, {}).get("n")]
    L += md_table(AGREEMENT_COLUMNS, [[check, q, against[rater], x["n"], *(_ci(x, k) for k in ("exact_agreement", "kappa", "sensitivity", "specificity")),
                                       x["confusion"]] for check, q, rater, x in rows])
    if m["questions"]:
        L += ["", "Assessor replies left unscored: " + ", ".join(f"{q} {x['assessor_unscored']}" for q, x in m["questions"].items())
              + f"; of them, Q3 replies quoting a term no patient line holds: {m['questions'].get('Q3', {}).get('terms_not_in_patient_lines', 0)}."]
    L += ["", "## % yes per model: the checks beside the experts", "",
          *md_table(["model", "question", "assessor: % yes (yes/n)", "terminology check: % yes (yes/n)", "experts: % yes (yes/n)", "published %"], [
              [PAPER_LABELS.get(model, model), q, _p(x["assessor"]), _p(x.get("detector")), _p(x["experts"]) if x["experts"] is not None else "not released",
               f"{published['Q3_overall']:.2f} (all four models)" if q == "Q3" and published.get("Q3_overall") is not None
               else num((published.get(q) or {}).get(model) if isinstance(published.get(q), dict) else None, 2)]
              for model, qs in m["per_model"].items() for q, x in qs.items()])]
    return "\n".join(L) + "\n"


def calibrate_without_model(labels: str, out: str | Path, *, n_boot: int = N_BOOT) -> dict:
    """The deterministic checks alone (no model, no server): records, metrics.json and summary.md in ``out``."""
    from experiments.core.registry import named

    records = []
    for c in load_expert_labels(labels):
        r = to_record(c)
        r.pop("roles", None)
        r["scores"].update(to_disk(TERMINOLOGY.rule(r, None)))
        records.append(r)
    kind = named(ConversationCalibration).name
    with RunLock(out, kind):  # recomputed whole (no request is made): the old result stays until the new one is in place
        rundir = RunDir(out, {"experiment": kind, "data": str(labels), "roles": {}, "n_boot": n_boot}, whole=True)
        rundir.append_many(records)
        metrics = calibration_metrics(records, n_boot=n_boot)
        rundir.write_metrics(metrics)
        rundir.write_summary(calibration_summary(metrics, ""))
        rundir.commit()
    return metrics
