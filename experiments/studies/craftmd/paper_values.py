"""CRAFT-MD for the paper tables (paper_tables.yaml): the run's setting attributes (the figures are its scores')."""

from __future__ import annotations

from collections import Counter

from experiments.core.deviations import settings_deviations
from experiments.core.scope import counts_text
from experiments.studies.craftmd.compare import grading_of
from experiments.studies.craftmd.settings import CraftSettings
from experiments.tables.adapter import PaperAdapter


def subset_text(records: list[dict], scope: dict | None) -> str:
    """The cases a table was computed on: '100 cases (a stratified random sample, seed 0): 90 MedQA_USMLE, 5 ...'
    (per data set, from the finished records; how they were chosen from the run's scope, experiments/core/scope.py)."""
    datasets = {r.get("case_id"): (r.get("inputs") or {}).get("dataset") or "unknown" for r in records}
    how = {"sample": f"a random sample stratified by {' and '.join((scope or {}).get('strata') or [])}, seed {(scope or {}).get('seed')}",
           "first": "the first cases of the input (--limit), not a sample"}.get((scope or {}).get("how"))
    made_of = dict(Counter(datasets.values()).most_common())
    return f"{len(datasets)} cases" + (f" ({how})" if how else "") + (f": {counts_text(made_of)}" if set(made_of) != {"unknown"} else "")


class CraftmdPaper(PaperAdapter):
    def attrs(self, run: dict, records: list[dict]) -> dict:
        cfg, m = run.get("config") or {}, run.get("metrics") or {}
        g = grading_of(run)
        return {"grades": g["grades"], "concurrent_rule": g["concurrent_rule"], "answers": cfg.get("answers") or "free",
                "cases": len({r.get("case_id") for r in records}), "turn_cap_inferred": m.get("turn_cap_inferred"),
                "trials": cfg.get("trials") or max((int(r.get("trial") or 0) + 1 for r in records), default=None),
                "grader": (cfg.get("roles") or {}).get("grader"), "subset": subset_text(records, m.get("scope")), **self.requests(run)}

    @staticmethod
    def requests(run: dict) -> dict:
        """loop and deviations (joined; absent when none) of a local run that records its loop; nothing for an
        imported run or one made before requests followed the authors' code (no ``loop`` in its config)."""
        cfg = run.get("config") or {}
        if cfg.get("imported_from") or "loop" not in cfg:
            return {}
        try:
            s = CraftSettings.model_validate({k: v for k, v in cfg.items() if k in CraftSettings.model_fields})
        except ValueError:
            return {}
        devs = settings_deviations(s)
        return {"loop": s.loop, **({"deviations": "; ".join(devs)} if devs else {})}

ADAPTER = CraftmdPaper()


# The expert assessment of conversations (`medstack import craftmd-experts`, docs/protocols.md):
# Q1 Fig. 3i, Q2 Fig. 3j (the paper truncates: 35.55 and 8.88 are 35.56 and 8.89 rounded), Q3 of all 180
# conversations, and the exact McNemar p-values of Supplementary Table 18 as printed there ("Q|model A|model B"; the
# pairs missing here are not in our sources and are shown without a published value).
EXPERT_PUBLISHED = {
    "Q1": {"gpt-4": 53.33, "gpt-3.5": 31.11, "mistral-v2-7b": 11.11, "llama-2-7b": 35.55},
    "Q2": {"gpt-4": 71.11, "gpt-3.5": 31.11, "mistral-v2-7b": 8.88, "llama-2-7b": 51.11},
    "Q3_overall": 7.22,
    "mcnemar": {"Q1|gpt-4|gpt-3.5": 0.0129, "Q1|gpt-3.5|mistral-v2-7b": 0.0039, "Q1|gpt-3.5|llama-2-7b": 0.7744, "Q1|gpt-4|llama-2-7b": 0.0573,
                "Q2|gpt-4|gpt-3.5": 0.0001, "Q2|gpt-3.5|mistral-v2-7b": 0.0212, "Q2|gpt-4|llama-2-7b": 0.0635},
}
