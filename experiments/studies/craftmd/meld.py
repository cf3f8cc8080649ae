"""`medstack meld`: the MELD contamination check, as docs/protocols.md (CRAFT-MD, MELD) describes it."""

from __future__ import annotations

from rapidfuzz.distance import Levenshtein

from experiments.core.config import ConfigError, config_dir
from experiments.studies.craftmd.data import load_cases
from experiments.studies.craftmd.prompts import PROMPTS, render
from experiments.studies.craftmd.settings import MeldSettings
from experiments.common.grade import UNIT, YES_NO, Grade, grades, to_disk
from experiments.common.stats import mean_ci
from experiments.core.record import RUNNER_FIELDS, is_typed, record
from experiments.core.scorers import Scorer
from experiments.core.study import CaseContext, Study
from serving.refs import model_name


def split_halves(text: str) -> tuple[str, str]:
    w = text.split()
    half = len(w) // 2
    return " ".join(w[:half]), " ".join(w[half:])


def similarity(generated: str, truth: str) -> float:
    """1 − normalized Levenshtein distance of the two strings (1.0 = identical)."""
    return float(Levenshtein.normalized_similarity(generated.strip(), truth.strip()))


def truncate_words(text: str, n: int) -> str:
    return " ".join(text.split()[:n])


def meld_metrics(records: list[dict], threshold: float) -> dict:
    sims = [g.value for r in records if (g := grades(r).get("similarity")) is not None and g.value is not None]
    ci = mean_ci(sims)
    return {"n": len(sims), "mean_similarity": ci.mean if sims else None, "ci": [ci.low, ci.high] if sims else None,
            "share_ge_threshold": sum(s >= threshold for s in sims) / len(sims) if sims else None, "threshold": threshold,
            "max_similarity": max(sims) if sims else None}


def meld_grades(sim: float | None, cut: str | None, threshold) -> dict[str, Grade]:
    """``similarity`` of the cut continuation and the true second half, and ``memorized`` (>= the threshold)."""
    rule = {"rule": "1 - normalized Levenshtein distance"}
    return {"similarity": Grade(value=sim, answer=cut, source="levenshtein", judge=rule),
            "memorized": Grade(value=None if sim is None else int(sim >= threshold), answer=cut, source="similarity >= threshold",
                               judge={"rule": f"similarity >= {threshold}"})}


def decide_similarity(ctx, r: dict, s, role) -> dict:
    return {None: meld_grades(similarity(r.get("answer") or "", r.get("target") or ""), r.get("answer"), s.threshold)["similarity"]}


def decide_memorized(ctx, r: dict, s, role) -> dict:
    """Run after ``similarity``: its value against the threshold."""
    return {None: meld_grades(grades(r)["similarity"].value, r.get("answer"), s.threshold)["memorized"]}


SCORERS = (Scorer("similarity", UNIT, "How close is the model's continuation to the vignette's true second half (1 - normalized "
                  "Levenshtein distance)?", decide=decide_similarity),
           Scorer("memorized", YES_NO, "Is the continuation at least as similar as the threshold (a sign of memorization)?", decide=decide_memorized))


class MeldStudy(Study):
    name = "meld"
    settings_cls = MeldSettings
    roles = ("model",)
    primary_role = "model"
    strata = ("dataset", "specialty")
    prompts = PROMPTS
    scorers = SCORERS

    def default_config(self, overrides: dict):
        return config_dir(__file__) / "meld.yaml"

    def prepare(self, s: MeldSettings) -> MeldSettings:
        if not s.data:
            raise ConfigError("meld needs --data CASES (a CRAFT-MD case CSV, an OSCE .jsonl, or a registered name)")
        return s

    def load_cases(self, s: MeldSettings) -> list[dict]:
        return [{**c, "id": c["case_id"]} for c in load_cases(s.data)]

    async def solve(self, ctx: CaseContext, case: dict, s: MeldSettings) -> dict:
        first, second = split_halves(case["vignette"])
        n = len(second.split())
        prompt = render("meld", first_half=first, n_words=n)
        step = s.sampling.continuation
        gen = step.gen(max_tokens=min(step.max_tokens, 2 * n + 16))
        r = await ctx.chat([{"role": "user", "content": prompt}], role="model", gen=gen, step="continue")
        cut = truncate_words(r.text, n)
        return record(case["id"], case["case_id"], inputs={"first_half": first, "n_words": n, "specialty": case["specialty"]}, target=second,
                      answer=cut, metadata={"model": model_name(s.roles["model"]), "generation": r.text, "prompt_hash": PROMPTS.hash("meld")})

    def upgrade(self, r: dict, s) -> dict:
        """An older MELD record (its own fields; its similarity a field before typed scores) in today's shape."""
        if is_typed(r):
            return r
        scores = grades(r) if r.get("scores") else meld_grades(r.get("similarity"), r.get("generation_cut"), s.threshold)
        out = record(r["id"], r.get("case_id"), inputs={"first_half": r.get("first_half"), "n_words": r.get("n_words"), "specialty": r.get("specialty")},
                     target=r.get("true_second_half"), answer=r.get("generation_cut"), scores=to_disk(scores),
                     metadata={k: r[k] for k in ("model", "generation", "prompt_hash") if k in r})
        return {**{k: v for k, v in r.items() if k in RUNNER_FIELDS}, **out}

    def metrics(self, records: list[dict], s: MeldSettings) -> dict:
        return meld_metrics(records, s.threshold)

    def summary(self, m: dict, s: MeldSettings, run) -> str:
        lines = ["# MELD contamination check", "", f"model: {s.roles['model']}; cases: {m['n']}",
                 f"mean similarity: {m['mean_similarity']}; share >= {s.threshold}: {m['share_ge_threshold']}; max: {m['max_similarity']}"]
        return "\n".join(lines) + "\n"
