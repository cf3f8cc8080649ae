"""MediTOD scorers, pure functions equal to the dataset authors' scorer: the tuple rules, skips, edge shapes,
Precision@K, NLG normalisation and the optional LLM adjudication are in experiments/studies/meditod/README.md, Metrics and
Running a baseline.

Stable interface: ``score(task, golds, preds, **options) -> dict`` with ``task`` in
{"nlu", "pol", "nlg"}. ``golds``/``preds`` are aligned lists: for NLU/POL each element is a
turn's list (``nlu`` / ``actions``); a prediction of ``None`` means "unparseable" (format error,
scored as empty). For NLG they are strings. Adjudication: ``judgments`` = {(gold_value, pred_value): bool};
``adjudication_pairs`` lists the pairs a judge must decide.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable

from experiments.common.normalize import normalize
from experiments.common.stats import prf
from experiments.common.text import bertscore_config, bertscore_f1, corpus_bleu, rouge

SYMPTOM_CANON = ("location", "progression", "severity", "lesion_size", "rash_swollen", "itching", "lesions_peel_off")
MEDICATION_CANON = ("respone_to", "impact")
NLU_MEDICAL = ("_medical_history", "_family_history", "_habit", "_medical_test", "_exposure")
POL_MEDICAL = ("medical_history", "family_history", "habit", "medical_test", "exposure")
SOCIAL = ("occupation", "residence", "travel")
P_AT_K = (1, 4, 8, math.inf)

Tuples = tuple[set, set]  # (canonical, non-canonical)


class _Malformed(Exception):
    pass


def _values(v) -> list:
    vals = v if isinstance(v, list) else [v]
    for x in vals:
        hash(x)  # unhashable (dict/list) values are malformed, as in the authors' set-based scorer
    return vals


def _empty(x) -> bool:
    return isinstance(x, (str, list, dict)) and len(x) == 0


def _items(data) -> list[dict]:
    """A slot's list of attribute dicts. Empty values (``""``, ``[]``, ``{}``) and empty elements of the
    list (``""``, ``[]``) give nothing, as the authors' ``for ee in data: for key in ee`` loop iterates
    over them silently; anything else that is not a list of objects (null, a non-empty string, a
    number) is malformed: the whole turn becomes a format error."""
    if _empty(data):
        return []
    items = [e for e in data if not _empty(e)] if isinstance(data, list) else None
    if items is None or not all(isinstance(e, dict) for e in items):
        raise _Malformed(f"slot data must be a list of objects, got {data!r:.60}")
    return items


# ---------------------------------------------------------------- NLU

def nlu_entry_tuples(entry: dict) -> Tuples:
    """Canonical and non-canonical tuples of one ``{intent, slots}`` entry (raises on malformed)."""
    if not isinstance(entry, dict) or "intent" not in entry:
        raise _Malformed("an NLU entry must be an object with 'intent'")
    intent = entry["intent"]
    hash(intent)
    slots = entry.get("slots", {})
    if slots is None:
        raise _Malformed("'slots' is null")
    if hasattr(slots, "__len__") and len(slots) == 0:  # "slots": [] / {} -> the bare intent, as the authors' scorer
        return {(intent,)}, set()
    if not isinstance(slots, dict):
        raise _Malformed("'slots' must be an object")
    canon, noncanon = set(), set()
    for slot, data in slots.items():
        if "_symptom" in slot:
            canon_attrs = SYMPTOM_CANON
        elif any(m in slot for m in NLU_MEDICAL):
            canon_attrs = ()
        elif "_medication" in slot:
            canon_attrs = MEDICATION_CANON
        else:
            canon_attrs = None
        if canon_attrs is not None:
            for ee in _items(data):
                if "value" in ee:
                    head = ee["value"]
                    hash(head)
                    canon.add((intent, slot, head))
                else:
                    head = "dummy"
                for key, v in ee.items():
                    if key == "value":
                        continue
                    target = canon if key in canon_attrs else noncanon
                    target.update((intent, slot, head, key, vv) for vv in _values(v))
        elif slot in SOCIAL or slot == "basic_information":
            for ee in _items(data):
                for key, v in ee.items():
                    target = canon if (slot == "basic_information" or key == "status") else noncanon
                    target.update((intent, slot, key, vv) for vv in _values(v))
    return canon, noncanon


def nlu_tuples(nlu) -> Tuples:
    """Tuples of a whole turn label; raises ``_Malformed``/TypeError on a malformed prediction."""
    if not isinstance(nlu, list):
        raise _Malformed("an NLU label must be a list")
    canon, noncanon = set(), set()
    for entry in nlu:
        c, n = nlu_entry_tuples(entry)
        canon |= c
        noncanon |= n
    return canon, noncanon


def nlu_skipped(gold: list) -> bool:
    return len(gold) == 0 or (len(gold) == 1 and gold[0].get("intent") == "inform" and len(gold[0].get("slots", {}) or {}) == 0)


# ---------------------------------------------------------------- POL

def pol_action_tuples(entry: dict) -> Tuples:
    if not isinstance(entry, dict) or "action" not in entry:
        raise _Malformed("an action must be an object with 'action'")
    intent = entry["action"]
    hash(intent)
    slots = {k: v for k, v in entry.items() if k != "action"}
    if not slots:
        return {(intent,)}, set()
    canon, noncanon = set(), set()
    for slot, data in slots.items():
        if slot == "symptom":
            canon_attrs = SYMPTOM_CANON
        elif any(m in slot for m in POL_MEDICAL):
            canon_attrs = ()
        elif "medication" in slot:
            canon_attrs = MEDICATION_CANON
        elif "disease" in slot:
            canon_attrs = ()
        else:
            canon_attrs = None
        if canon_attrs is not None:
            if not isinstance(data, list):
                raise _Malformed("action slot data must be a list")
            for ee in data:
                if "value" in ee:
                    head = ee["value"]
                    canon.add((intent, slot, head))
                else:
                    head = "dummy"
                for ck in ee.get("checks", []):
                    ctype = ck.get("type", "dummy")
                    if "type" in ck:
                        canon.add((intent, slot, head, ctype))
                    target = canon if ctype in canon_attrs else noncanon
                    for vv in ck.get("values", []):
                        target.add((intent, slot, head, ctype, vv))
        elif slot in SOCIAL:
            for item in data:
                if "value" in item:
                    noncanon.add((intent, slot, item["value"]))
                for ck in item.get("checks", []):
                    ctype = ck.get("type", "dummy")
                    if "type" in ck:
                        canon.add((intent, slot, ctype))
                    target = canon if ctype == "status" else noncanon
                    for vv in ck.get("values", []):
                        target.add((intent, slot, ctype, vv))
        elif slot == "basic_information":
            for item in data:
                if "value" in item:
                    noncanon.add((intent, slot, item["value"]))
    return canon, noncanon


def pol_tuples(actions) -> Tuples:
    """Tuples of a turn's actions. Like the authors' scorer, a malformed action adds nothing."""
    if isinstance(actions, dict):
        actions = [actions]
    canon, noncanon = set(), set()
    if not isinstance(actions, list):
        return canon, noncanon
    for entry in actions:
        try:
            c, n = pol_action_tuples(entry)
        except Exception:  # noqa: BLE001 - any malformed piece voids that action only
            continue
        canon |= c
        noncanon |= n
    return canon, noncanon


def pol_skipped(gold: list) -> bool:
    return len(gold) == 0 or (len(gold) == 1 and gold[0].get("action") == "inquire" and len(gold[0]) == 1)


# ---------------------------------------------------------------- P/R/F1 counts

def _groups(tuples: Iterable[tuple]) -> dict[tuple, list]:
    g: dict[tuple, set] = defaultdict(set)
    for t in tuples:
        g[t[:-1]].add(t[-1])
    return {k: sorted(v, key=lambda x: (-len(str(x)), str(x))) for k, v in g.items()}


def _adjudicated_counts(gold: set, pred: set, judgments: dict) -> tuple[int, int, int]:
    """TP/FP/FN of non-canonical tuples where values of the same group may match by judgment."""
    tp = fp = fn = 0
    gg, pg = _groups(gold), _groups(pred)
    for gid, gvals in gg.items():
        pvals = pg.get(gid)
        if pvals is None:
            fn += len(gvals)
            continue
        used: set[int] = set()
        for gv in gvals:
            for j, pv in enumerate(pvals):
                if j not in used and (gv == pv or judgments.get((str(gv), str(pv)), False)):
                    used.add(j)
                    tp += 1
                    break
            else:
                fn += 1
        fp += len(pvals) - len(used)
    fp += sum(len(v) for k, v in pg.items() if k not in gg)
    return tp, fp, fn


def structured_scores(task: str, golds: list, preds: list, judgments: dict | None = None) -> dict:
    """NLU / POL micro P/R/F1 (canonical, non-canonical, all), joint accuracy, format errors."""
    tuples, skipped = (nlu_tuples, nlu_skipped) if task == "nlu" else (pol_tuples, pol_skipped)
    c = [0, 0, 0]
    n = [0, 0, 0]
    joint = format_errors = scored = 0
    for gold, pred in zip(golds, preds, strict=True):
        malformed = pred is None or not isinstance(pred, (list, dict) if task == "pol" else list)
        if skipped(gold):
            continue
        scored += 1
        g_c, g_n = tuples(gold)
        try:
            p_c, p_n = tuples(pred)
        except Exception:  # noqa: BLE001 - any malformed prediction is a format error, scored as empty
            malformed = True
            p_c, p_n = set(), set()
        format_errors += int(malformed)
        c[0] += len(g_c & p_c)
        c[1] += len(p_c - g_c)
        c[2] += len(g_c - p_c)
        if judgments is not None:
            tp, fp, fn = _adjudicated_counts(g_n, p_n, judgments)
        else:
            tp, fp, fn = len(g_n & p_n), len(p_n - g_n), len(g_n - p_n)
        n[0] += tp
        n[1] += fp
        n[2] += fn
        joint += int((g_c | g_n) == (p_c | p_n))
    turns = len(golds)
    out = {"turns": turns, "scored_turns": scored}
    for name, counts in (("medical", c), ("non_medical", n), ("", [c[i] + n[i] for i in range(3)])):
        p, r, f = prf(counts[0], counts[0] + counts[1], counts[0], counts[0] + counts[2])
        pre = f"{name}_" if name else ""
        out.update({f"{pre}precision": p, f"{pre}recall": r, f"{pre}f1": f, f"{pre}gold_tuples": counts[0] + counts[2]})
    out["joint_accuracy"] = joint / turns if turns else 0.0
    out["format_errors"] = format_errors
    out["format_error_rate"] = format_errors / turns if turns else 0.0
    return out


def precision_at_k(golds: list, preds: list, dialog_ids: list | None = None, ks=P_AT_K) -> dict:
    """POL Precision@K over all turns, predictions compared within their own dialogue."""
    groups: dict = defaultdict(list)
    for i, did in enumerate(dialog_ids if dialog_ids is not None else [None] * len(golds)):
        groups[did].append(i)
    out = {}
    for k in ks:
        hits = total = 0
        for idxs in groups.values():
            gold_sets = [set().union(*pol_tuples(golds[i])) for i in idxs]
            for a, i in enumerate(idxs):
                pred = set().union(*pol_tuples(preds[i])) if preds[i] is not None else set()
                end = len(idxs) if k == math.inf else min(a + int(k), len(idxs))
                hits += int(any(pred == gold_sets[b] for b in range(a, end)))
                total += 1
        out[f"p@{'inf' if k == math.inf else int(k)}"] = hits / total if total else 0.0
    return out


def adjudication_pairs(task: str, golds: list, preds: list) -> list[tuple[str, str]]:
    """The (gold value, predicted value) pairs of non-canonical groups present in both (scored turns only)."""
    tuples, skipped = (nlu_tuples, nlu_skipped) if task == "nlu" else (pol_tuples, pol_skipped)
    pairs: set = set()
    for gold, pred in zip(golds, preds):
        if skipped(gold) or pred is None:
            continue
        try:
            p_n = tuples(pred)[1]
        except Exception:  # noqa: BLE001
            continue
        gg, pg = _groups(tuples(gold)[1]), _groups(p_n)
        for gid, gvals in gg.items():
            for gv in gvals:
                for pv in pg.get(gid, []):
                    if gv != pv:
                        pairs.add((str(gv), str(pv)))
    return sorted(pairs)


# ---------------------------------------------------------------- NLG

def gold_length_report(golds: list[str], cap: int, count_tokens) -> dict:
    """How the gold NLG utterances compare with the generation cap ``cap`` (tokens, counted with
    ``count_tokens`` — the served model's tokenizer, without special tokens)."""
    lengths = sorted(int(count_tokens(g)) for g in golds)
    if not lengths:
        return {"max_tokens": cap, "golds": 0, "golds_over_cap": 0}

    def pct(q: float) -> int:
        return lengths[min(len(lengths) - 1, int(q * len(lengths)))]

    return {"max_tokens": cap, "golds": len(lengths), "golds_over_cap": sum(1 for x in lengths if x > cap),
            "gold_tokens_max": lengths[-1], "gold_tokens_p99": pct(0.99), "gold_tokens_p95": pct(0.95),
            "gold_tokens_median": pct(0.5), "gold_tokens_mean": round(sum(lengths) / len(lengths), 2)}


def nlg_scores(golds: list[str], preds: list[str], *, bertscore_encoder: str | None = None, bertscore: bool = True,
               bertscore_layer: int | None = None) -> dict:
    g = [normalize(x, split="punct") for x in golds]
    p = [normalize(x, split="punct") for x in preds]
    out = {"turns": len(golds), "empty_predictions": sum(1 for x in p if not x)}
    out["bleu2"] = corpus_bleu(p, g, 2) if g else 0.0
    out["bleu4"] = corpus_bleu(p, g, 4) if g else 0.0
    out.update(rouge(p, g))
    if bertscore:
        cfg = bertscore_config(bertscore_encoder, bertscore_layer)
        f = bertscore_f1(p, g, model_path=bertscore_encoder, num_layers=cfg["layer"])
        out["bertscore_f1"] = sum(f) / len(f) if f else 0.0
        out.update({"bertscore_encoder": cfg["encoder"], "bertscore_layer": cfg["layer"], "bertscore_layer_source": cfg["layer_source"]})
    return out


# ---------------------------------------------------------------- entry point

def score(task: str, golds: list, preds: list, *, dialog_ids: list | None = None, judgments: dict | None = None,
          bertscore_encoder: str | None = None, bertscore: bool = True, bertscore_layer: int | None = None,
          max_tokens: int | None = None, count_tokens=None) -> dict:
    """All metrics of ``task`` for aligned gold/prediction lists (see module docstring).
    NLG with ``max_tokens`` and ``count_tokens``: also ``gold_length`` (:func:`gold_length_report`)."""
    if len(golds) != len(preds):
        raise ValueError(f"{len(golds)} gold labels but {len(preds)} predictions")
    if task == "nlg":
        out = nlg_scores(golds, preds, bertscore_encoder=bertscore_encoder, bertscore=bertscore, bertscore_layer=bertscore_layer)
        if max_tokens is not None and count_tokens is not None:
            out["gold_length"] = gold_length_report(golds, max_tokens, count_tokens)
        return out
    if task not in ("nlu", "pol"):
        raise ValueError(f"unknown task {task!r}")
    out = structured_scores(task, golds, preds, judgments)
    if task == "pol":
        out.update(precision_at_k(golds, preds, dialog_ids))
    return out
