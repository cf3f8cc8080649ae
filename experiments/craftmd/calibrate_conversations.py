"""`medstack calibrate conversations`: the CRAFT-MD conversation assessors against the paper's dermatologists.

The released expert labels (:func:`experiments.craftmd.experts.load_expert_labels`: 180 conversations, 45 per
model, Q1-Q3 yes/no, combined as the paper did) are assessed with the same requests a CRAFT-MD run sends with
``assess_conversations`` (:func:`experiments.craftmd.assess.assess_conversation`: the same templates, the same
verdict parser, the same role ``assessor``), through the one study runner, so the results directory resumes and
every answered request is cached. Per expert-labelled question (Q1-Q3), over the conversations where both the
experts' label and the assessor's verdict exist:

- exact agreement and Cohen's kappa (two categories: unweighted), each with a 95 % percentile bootstrap CI over
  conversations (experiments/common/stats.py ``rater_agreement``, ``stratified_bootstrap`` with one stratum);
- the confusion matrix (rows: the experts, columns: the assessor; No, Yes);
- per paper model, the assessor's % yes beside the experts' % yes (and the published figure where there is one).

The two patient-AI questions (grounded, complete) were not released with labels: their assessor rates per
model are reported alone. An unreadable assessor reply is unscored (counted, left out of every figure); a
conversation whose request got no answer fails, is left out, and runs again on resume (exit 3).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from experiments.common.stats import mean_ci, rater_agreement, stratified_bootstrap
from experiments.core.config import ConfigError, RunSettings, Sampling
from experiments.core.study import CaseContext, Study
from experiments.craftmd import paper_values
from experiments.craftmd.assess import LABELS, QUESTIONS, TEMPLATES, assess_conversation, transcript_turns
from experiments.craftmd.experts import EXPERT_QUESTIONS as EXPERT_LABELLED, PAPER_LABELS, PAPER_MODELS, load_expert_labels
from experiments.craftmd.judges import CALIBRATE_CONVERSATIONS
from experiments.craftmd.prompts import PROMPTS

N_BOOT = 2000


class ConversationCalibrationSettings(RunSettings):
    """What :func:`experiments.craftmd.assess.assess_conversation` reads (sampling, completion_steps,
    lone_system_as_user), as a CRAFT-MD run's settings name them."""

    experiment: str = "calibrate-craftmd-conversations"
    roles: dict[str, str] = {"assessor": "embedded"}
    sampling: dict[str, Sampling] = {"assessor": Sampling(temperature=0.0, max_tokens=64)}
    completion_steps: list[Literal["assessor"]] = []
    lone_system_as_user: bool = False
    n_boot: int = Field(N_BOOT, ge=100)
    concurrency: Annotated[int, Field(ge=1)] | Literal["auto"] = 16


class ConversationCalibration(Study):
    name = "calibrate-conversations"
    settings_cls = ConversationCalibrationSettings
    roles = ("assessor",)
    primary_role = "assessor"
    prompts = PROMPTS
    results = CALIBRATE_CONVERSATIONS  # the assessor's and the experts' verdicts typed, the assess-* judges (judges.py)

    def prepare(self, s: ConversationCalibrationSettings) -> ConversationCalibrationSettings:
        if not s.data:
            raise ConfigError("no labels: pass --labels craftmd-expert-labels or the folder of the three expert workbooks")
        if "assessor" not in s.sampling:
            raise ConfigError("sampling needs an entry for: assessor")
        return s

    def load_cases(self, s: ConversationCalibrationSettings) -> list[dict]:
        convs = interleaved(load_expert_labels(s.data))  # DataError naming the file, sheet and row
        return [{"id": c.id, "conversation": c} for c in self.select(convs, s)]

    async def solve(self, ctx: CaseContext, unit: dict, s: ConversationCalibrationSettings) -> dict:
        c = unit["conversation"]
        transcript = c.transcript
        assessment = await assess_conversation(ctx, transcript_turns(transcript), c.vignette, s)
        return {"id": c.id, "case_id": c.case_id, "model": c.model, "vignette": c.vignette, "correct_answer": c.correct_diagnosis, "final_diagnosis": c.final_diagnosis,
                "transcript": transcript, "experts": dict(c.combined), "expert_raters": {r: dict(v) for r, v in c.raters.items()},
                "assessment": assessment, "prompt_hashes": PROMPTS.hashes(TEMPLATES.values())}

    def metrics(self, records: list[dict], s: ConversationCalibrationSettings) -> dict:
        return calibration_metrics(records, n_boot=s.n_boot)

    def summary(self, metrics: dict, s: ConversationCalibrationSettings) -> str:
        return calibration_summary(metrics, s.roles.get("assessor", ""))


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


def _rate(values: list[bool]) -> dict:
    ci = mean_ci([float(v) for v in values])
    return {"n": ci.n, "yes": int(sum(values)), "pct": 100 * ci.mean if ci.n else None,
            "ci_low": 100 * ci.low if ci.n else None, "ci_high": 100 * ci.high if ci.n else None}


def agreement(experts: list[bool], assessor: list[bool], *, n_boot: int = N_BOOT) -> dict:
    """Two raters' yes/no on the same conversations: exact agreement and Cohen's kappa with percentile bootstrap
    95 % CIs (one stratum), and the confusion matrix (rows: experts, columns: assessor; No, Yes)."""
    a, b = [int(x) for x in experts], [int(x) for x in assessor]
    if not a:
        return {"n": 0, "exact_agreement": None, "kappa": None, "confusion": [[0, 0], [0, 0]], "ci95": {}}
    r = rater_agreement(a, b, [0, 1], rank=False)

    def stat(idx):
        x = rater_agreement([a[i] for i in idx], [b[i] for i in idx], [0, 1], rank=False)
        return {"exact_agreement": x["exact_agreement"], "kappa": x["weighted_kappa_linear"]}

    ci = stratified_bootstrap(stat, ["all"] * len(a), n_boot=n_boot)
    kappa = r["weighted_kappa_linear"]
    return {"n": len(a), "exact_agreement": r["exact_agreement"], "kappa": None if kappa != kappa else kappa,
            "confusion": r["confusion"], "ci95": {k: list(v) for k, v in ci.items()}}


def calibration_metrics(records: list[dict], *, n_boot: int = N_BOOT) -> dict:
    out: dict = {"conversations": len(records), "questions": {}, "per_model": {}}
    for q in QUESTIONS:
        verdicts = [(r.get("experts") or {}).get(q) for r in records], [((r.get("assessment") or {}).get(q) or {}).get("verdict") for r in records]
        pairs = [(e, v) for e, v in zip(*verdicts) if e is not None and v is not None]
        entry = {"assessor_unscored": sum(v is None for v in verdicts[1]), "experts_unlabelled": sum(e is None for e in verdicts[0])}
        if q in EXPERT_LABELLED:
            entry.update(agreement([e for e, _ in pairs], [v for _, v in pairs], n_boot=n_boot))
        else:
            entry["experts_unlabelled"] = None  # the paper released no labels for the patient-AI questions
        out["questions"][q] = entry
    for m in PAPER_MODELS:
        recs = [r for r in records if r.get("model") == m]
        if not recs:
            continue
        out["per_model"][m] = {}
        for q in QUESTIONS:
            mine = [v for r in recs if (v := ((r.get("assessment") or {}).get(q) or {}).get("verdict")) is not None]
            theirs = [e for r in recs if (e := (r.get("experts") or {}).get(q)) is not None] if q in EXPERT_LABELLED else None
            out["per_model"][m][q] = {"conversations": len(recs), "assessor": _rate(mine), "experts": _rate(theirs) if theirs is not None else None}
    return out


def _f(x, nd: int = 3) -> str:
    return "–" if x is None or x != x else f"{x:.{nd}f}"


def _ci(m: dict, k: str) -> str:
    ci = (m.get("ci95") or {}).get(k)
    return _f(m.get(k)) + (f" [{_f(ci[0])}, {_f(ci[1])}]" if ci else "")


def _p(x: dict | None) -> str:
    return "–" if not x or x["pct"] is None else f"{x['pct']:.1f} ({x['yes']}/{x['n']})"


def calibration_summary(m: dict, assessor: str) -> str:
    published = getattr(paper_values, "EXPERT_PUBLISHED", None) or {}
    L = ["# CRAFT-MD conversation assessors against the paper's dermatologists", "",
         f"assessor: `{assessor}`; {m['conversations']} released conversation(s) assessed with the requests of a CRAFT-MD run's "
         "`assess_conversations` (prompts/assess_*.txt); experts' label: the two raters' shared label, the tie-breaker's where they disagree.",
         "Kappa: Cohen's (two categories); 95 % CIs: percentile bootstrap over conversations. Confusion: rows experts, columns assessor, (No, Yes).", "",
         "| question | n pairs | agreement [95% CI] | Cohen's kappa [95% CI] | confusion [[No/No, No/Yes], [Yes/No, Yes/Yes]] | assessor unscored | experts unlabelled |",
         "| --- | --- | --- | --- | --- | --- | --- |"]
    for q in EXPERT_LABELLED:
        x = m["questions"].get(q)
        if x:
            L.append(f"| {LABELS[q]} | {x['n']} | {_ci(x, 'exact_agreement')} | {_ci(x, 'kappa')} | {x['confusion']} | {x['assessor_unscored']} | {x['experts_unlabelled']} |")
    L += ["", "## % yes per model: the assessor beside the experts", "",
          "| model | question | assessor: % yes (yes/n) | experts: % yes (yes/n) | published % |", "| --- | --- | --- | --- | --- |"]
    for model, qs in m["per_model"].items():
        for q in QUESTIONS:
            x = qs[q]
            pub = (published.get(q) or {}).get(model) if isinstance(published.get(q), dict) else None
            if q == "Q3" and published.get("Q3_overall") is not None:
                pub_text = f"{published['Q3_overall']:.2f} (all four models)"
            else:
                pub_text = "–" if pub is None else f"{pub:.2f}"
            L.append(f"| {PAPER_LABELS.get(model, model)} | {q} | {_p(x['assessor'])} | {_p(x['experts']) if x['experts'] is not None else 'not released'} | {pub_text} |")
    return "\n".join(L) + "\n"
