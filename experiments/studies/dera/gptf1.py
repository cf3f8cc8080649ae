"""GPT-F1: LLM-judged concept coverage of a predicted summary section against a ground truth
(experiments/studies/dera/README.md, Metrics: extraction, verification, the formulas and the empty-list rules).

The empty-list conventions are ours (the paper does not say); an unscored section is None and counted,
never silently 0 or 1. Concept lists longer than ``settings.max_concepts`` are cut, recorded per section
(``concepts_cut``) and named in each verification request as ``protocol: {concepts: (sent, asked)}``,
the runner's protocol deviations.
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config import Sampling
from experiments.studies.dera.calls import CaseLog
from experiments.studies.dera.settings import DialogueSettings
from experiments.common.stats import prf
from experiments.common.parsing import extract_indices, extract_list


@dataclass(frozen=True)
class GptF1:
    """What GPT-F1 scoring reads of a run's settings: the judge's two steps and the concept cap."""

    extraction: Sampling
    verification: Sampling
    max_concepts: int | None

    @classmethod
    def of(cls, settings: DialogueSettings) -> "GptF1":
        return cls(settings.sampling.extraction, settings.sampling.verification, settings.gptf1.max_concepts)


def _dedupe(items: list[str]) -> list[str]:
    seen, out = set(), []
    for i in items:
        k = i.lower().strip(" .")
        if k and k not in seen:
            seen.add(k)
            out.append(i.strip())
    return out


def cap_concepts(items: list[str], cap: int | None) -> tuple[list[str], int]:
    """(the first ``cap`` concepts, how many were dropped); ``cap`` None keeps all."""
    if cap is None or len(items) <= cap:
        return items, 0
    return items[:cap], len(items) - cap


async def extract_concepts_capped(log: CaseLog, text: str, settings: GptF1, step: str,
                                  section: str = "", role: str = "judge") -> tuple[list[str] | None, int]:
    """(deduplicated concept list of ``text`` read as section ``section`` — None if unparseable —, concepts cut by the cap)."""
    if not text.strip():
        return [], 0
    r = await log.call(step, role, "gptf1_extract", settings.extraction, text=text, section=section or "(unnamed)")
    items = extract_list(r.text) if r.ok else None
    if not log.parsed(step, items is not None, r.error or "no concept list in reply", r.text):
        return None, 0
    return cap_concepts(_dedupe([str(i) for i in items]), settings.max_concepts)


async def count_found(log: CaseLog, snippet: str, list_a: list[str], list_b: list[str], settings: GptF1, step: str,
                      cut_b: int = 0, role: str = "judge") -> list[int] | None:
    """1-based numbers of ``list_b`` concepts found in ``snippet`` / ``list_a``; ``cut_b``: concepts of ``list_b`` the
    cap left out (a protocol deviation of this request, experiments/core/deviations.py)."""
    if not list_b:
        return []
    if not snippet.strip() and not list_a:
        return []
    numbered = "\n".join(f"{i}. {c}" for i, c in enumerate(list_b, 1))
    r = await log.call(step, role, "gptf1_verify", settings.verification, constraint_values={"n": len(list_b)},
                       protocol={"concepts": (len(list_b), len(list_b) + cut_b)}, snippet=snippet, list_a=", ".join(list_a) or "(none)", list_b=numbered)
    found = extract_indices(r.text, len(list_b)) if r.ok else None
    log.parsed(step, found is not None, r.error or "no concept numbers in reply", r.text)
    return found


async def score_section(log: CaseLog, gt_text: str, pred_text: str, settings: GptF1, *,
                        label: str, concept_cache: dict, section: str = "", role: str = "judge") -> dict:
    cut = {"gt": 0, "pred": 0}

    async def concepts(text: str, who: str):
        key = (section, text)  # the prompt names the section, so the same text under another heading is asked again
        if key not in concept_cache:
            concept_cache[key] = await extract_concepts_capped(log, text, settings, f"gptf1:{label}:extract_{who}", section, role)
        items, dropped = concept_cache[key]
        cut[who] = dropped
        return items

    if not gt_text.strip():  # no reference text (e.g. the section could not be parsed): nothing to score against
        return {"gt_concepts": None, "pred_concepts": None, "scored": False, "reason": "empty reference section",
                "precision": None, "recall": None, "f1": None}
    gt_c = await concepts(gt_text, "gt")
    pred_c = await concepts(pred_text, "pred")
    out = {"gt_concepts": gt_c, "pred_concepts": pred_c}
    if cut["gt"] or cut["pred"]:
        out["concepts_cut"] = dict(cut)
    if gt_c is None or pred_c is None:
        return {**out, "scored": False, "precision": None, "recall": None, "f1": None}
    found_gt = await count_found(log, pred_text, pred_c, gt_c, settings, f"gptf1:{label}:recall", cut_b=cut["gt"], role=role)
    found_pred = await count_found(log, gt_text, gt_c, pred_c, settings, f"gptf1:{label}:precision", cut_b=cut["pred"], role=role)
    out.update({"gt_found_in_pred": found_gt, "pred_found_in_gt": found_pred})
    if found_gt is None or found_pred is None:
        return {**out, "scored": False, "precision": None, "recall": None, "f1": None}
    return {**out, "scored": True, **dict(zip(("precision", "recall", "f1"), prf(len(found_pred), len(pred_c), len(found_gt), len(gt_c), both_empty=1.0)))}


async def score_summary(log: CaseLog, gt: dict, pred: dict, sections: list[str], settings: GptF1, *,
                        label: str, concept_cache: dict | None = None, role: str = "judge") -> dict:
    """GPT-F1 per section and the average over the scored sections."""
    cache = concept_cache if concept_cache is not None else {}
    per = {}
    for s in sections:
        per[s] = await score_section(log, gt.get(s, ""), pred.get(s, ""), settings, label=f"{label}:{s}", concept_cache=cache, section=s, role=role)
    scored = [v for v in per.values() if v["scored"]]
    return {"sections": per, "average": {k: (sum(v[k] for v in scored) / len(scored) if scored else None) for k in ("precision", "recall", "f1")}}
