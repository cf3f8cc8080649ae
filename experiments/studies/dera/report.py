"""Run metrics (pure functions of the records) and summary.md tables shaped like the paper's."""

from __future__ import annotations

from collections import Counter
from functools import partial
from statistics import mean

from experiments.common.grade import Grade, aggregate, grades, split_name, unit_values
from experiments.common.markdown import md_table, num
from experiments.common.stats import paired_bootstrap
from experiments.common.text import bertscore_config, bertscore_label
from experiments.core.scorers import find
from experiments.studies.dera.qa_metrics import ARMS, STEPS
from experiments.studies.dera.scorers import QA

ARM_NAMES = {"oneshot": "1-shot", "dera": "DERA"}


def _ok(records: list[dict]) -> list[dict]:
    return [r for r in records if "error" not in r]


def _meta(r: dict) -> dict:
    return r.get("metadata") or {}


def common_metrics(records: list[dict]) -> dict:
    ok = _ok(records)
    attempts = sum(_meta(r).get("parse_attempts", 0) for r in ok)
    errors = sum(len(_meta(r).get("parse_errors", [])) for r in ok)
    calls = [c for r in ok for c in r.get("calls", [])]
    return {
        "n_cases": len(records),
        "case_errors": len(records) - len(ok),
        "parse_errors": errors,
        "parse_attempts": attempts,
        "parse_error_rate": round(errors / attempts, 4) if attempts else None,
        "failed_calls": sum(1 for c in calls if c["error"]),
        "calls_with_dropped_history": sum(1 for c in calls if c.get("dropped_history")),
        "stop_reasons": dict(Counter(_meta(r).get("stop_reason") for r in ok)),
        "mean_turns": round(mean(_meta(r)["turns"] for r in ok), 2) if ok else None,
    }


_fmt = partial(num, none="n/a")


# -- summaries / care plans / corruption ----------------------------------------------------------

PRF = ("precision", "recall", "f1")


def gptf1_of(record: dict) -> dict[str, tuple[dict[str, Grade], Grade]]:
    """{arm: ({section: grade}, the average's grade)} of a record's GPT-F1 scores (the run's, not a rescore's)."""
    out: dict[str, tuple[dict, Grade]] = {}
    for name, g in grades(record).items():
        step, part, by = split_name(name)
        if step == "gptf1" and part and not by:
            arm, _, section = part.partition("/")
            sections, average = out.get(arm, ({}, Grade(value=None)))
            out[arm] = ({**sections, section: g}, average) if section else (sections, g)
    return out


def gptf1_table(records: list[dict], key: str, sections: list[str]) -> dict:
    """Per-section mean P/R/F1 over the cases where that section was scored, and their average."""
    out = {}
    per_case = [g[key][0] for r in _ok(records) if key in (g := gptf1_of(r))]
    for s in sections:
        vals = [g[s] for g in per_case]
        scored = [v for v in vals if v.scored]
        out[s] = {m: (mean(v.named(m) for v in scored) if scored else None) for m in PRF}
        out[s].update({"n": len(scored), "unscored": len(vals) - len(scored)})
    have = [out[s] for s in sections if out[s]["n"]]
    out["average"] = {m: (mean(v[m] for v in have) if have else None) for m in PRF}
    return out


def dialogue_metrics(records: list[dict], settings) -> dict:
    ok = _ok(records)
    m = common_metrics(records)
    m["mean_scratchpad_lines"] = round(mean(len(_meta(r)["scratchpad"]) for r in ok), 2) if ok else None
    m["final_sections_kept_from_initial"] = sum(len(_meta(r).get("final_sections_kept_from_initial", [])) for r in ok)
    keys = sorted({k for r in ok for k in gptf1_of(r)})
    m["gptf1"] = {k: gptf1_table(records, k, settings.score_sections) for k in keys}
    # the concept-list cap is a setting; say how often it cut (case x section x comparison)
    m["gptf1_max_concepts"] = settings.gptf1.max_concepts
    m["gptf1_concept_lists_cut"] = sum(1 for r in ok for secs, _ in gptf1_of(r).values()
                                       for g in secs.values() if g.metadata.get("concepts_cut"))
    if "initial" in keys and "dera" in keys:
        pairs = [(g["dera"][1].named("f1"), g["initial"][1].named("f1")) for r in ok if "dera" in (g := gptf1_of(r))]
        pairs = [p for p in pairs if None not in p]
        m["dera_minus_initial_f1"] = paired_bootstrap([a for a, _ in pairs], [b for _, b in pairs]).to_dict() if pairs else None
    if settings.corruption_level is not None and settings.task == "corrupt":
        m["corruption_level"] = settings.corruption_level
    return m


def dialogue_summary(metrics: dict, settings, command: str) -> str:
    lines = [f"# {command}", "", f"Cases: {metrics['n_cases']} (errors {metrics['case_errors']}); "
             f"parse-error rate {_fmt(metrics['parse_error_rate'])}; stop reasons {metrics['stop_reasons']}; "
             f"mean turns {metrics['mean_turns']}; mean scratchpad lines {metrics['mean_scratchpad_lines']}.", ""]
    cap, cut = metrics.get("gptf1_max_concepts"), metrics.get("gptf1_concept_lists_cut", 0)
    note = "no cap" if cap is None else f"{cap} concepts per list, {cut} section comparison(s) cut"
    if cut:
        note += " (see `concepts_cut` in the records)"
    lines += [f"GPT-F1 concept cap (`gptf1.max_concepts`): {note}.", ""]
    g = metrics["gptf1"]
    if "initial" in g and "dera" in g:
        level = metrics.get("corruption_level")
        title = f"GPT-F1 against the uncorrupted summary, corruption level {level}/10" if level else "GPT-F1 against the reference"
        rows = [[level or "-", s if s != "average" else "**Average**", *(_fmt(g[arm][s][k]) for arm in ("initial", "dera") for k in PRF),
                 g["dera"][s].get("n", "")] for s in [*settings.score_sections, "average"]]
        lines += [f"## {title}", "", *md_table(["Level", "Section", *(f"{a} {k}" for a in ("Initial", "DERA") for k in ("P", "R", "F1")), "n"], rows)]
        diff = metrics.get("dera_minus_initial_f1")
        if diff:
            lines += ["", f"DERA − initial, average F1 per case: {diff['mean_diff']:+.3f} "
                          f"(95% CI {diff['low']:+.3f} to {diff['high']:+.3f}, paired bootstrap p = {diff['p_value']:.3f}, n = {diff['n']})."]
        lines.append("")
    if "dera_vs_initial" in g:
        t = g["dera_vs_initial"]
        lines += ["## GPT-F1 of the DERA output against the initial output (how much the dialogue changed)", "", *md_table(
            ["Section", "P", "R", "F1", "n"], [[s if s != "average" else "**Average**", *(_fmt(t[s][k]) for k in PRF), t[s].get("n", "")]
                                               for s in [*settings.score_sections, "average"]])]
        lines.append("")
    return "\n".join(lines)


# -- QA ---------------------------------------------------------------------------------------------

PAPER_MCQ_OPTIONS = 4  # the paper's MCQ figures (GPT-4 0-shot 0.834, DERA 0.840) are on 4-option MedQA


def mcq_option_counts(records: list[dict]) -> dict[int, int]:
    """{number of options: questions} over the records (the released open-ended file has 5, A-E)."""
    return dict(sorted(Counter(len((r.get("inputs") or {}).get("options") or {}) for r in _ok(records)).items()))


def options_label(counts: dict) -> str:
    if not counts:
        return "options: n/a"
    if len(counts) == 1:
        n = next(iter(counts))
        letters = f", A–{chr(ord('A') + n - 1)}" if 0 < n <= 26 else ""
        return f"{n} options{letters}"
    return "mixed: " + ", ".join(f"{q} questions with {n} options" for n, q in counts.items())


def qa_metrics(records: list[dict], settings) -> dict:
    ok = _ok(records)
    m = common_metrics(records)
    if settings.mcq:
        m["mcq_options"] = {str(k): v for k, v in mcq_option_counts(records).items()}
    else:
        m["bertscore"] = bertscore_config(settings.bertscore_model, settings.bertscore_layer)
    m["answer_changed_rate"] = round(mean(int(_meta(r)["answer_changed"]) for r in ok), 4) if ok else None
    names = ["accuracy"] if settings.mcq else ["bertscore", "exact", "similarity"]

    def figure(name: str, arm: str) -> dict:  # the scorer's figure: the one aggregation (the similarity normalised over the run)
        f = aggregate(ok, f"{STEPS[name]}/{arm}", scale=find(QA, STEPS[name]).scale)
        return {"mean": f.value, "low": f.low, "high": f.high, "n": f.n, "unscored": f.unscored}

    m["arms"] = {arm: {name: figure(name, arm) for name in names} for arm in ARMS}
    m["dera_minus_oneshot"] = {}
    for name in names:
        scale = find(QA, STEPS[name]).scale
        d, o = (unit_values(ok, f"{STEPS[name]}/{arm}", scale) for arm in ("dera", "oneshot"))
        both = [q for q in d if q in o]
        m["dera_minus_oneshot"][name] = paired_bootstrap([d[q] for q in both], [o[q] for q in both]).to_dict() if both else None
    return m


def qa_summary(metrics: dict, settings, command: str) -> str:
    names = ["accuracy"] if settings.mcq else ["bertscore", "exact", "similarity"]
    opt_counts = {int(k): v for k, v in (metrics.get("mcq_options") or {}).items()}
    opts = options_label(opt_counts)
    bs = metrics.get("bertscore")
    heads = {"accuracy": f"MCQ accuracy ({opts})", "exact": "LLM exact match", "similarity": "LLM similarity",
             "bertscore": bertscore_label(bs) if bs else "BERTScore F1"}
    lines = [f"# {command}{f' (multiple choice, {opts})' if settings.mcq else ''}", "",
             f"Questions: {metrics['n_cases']} (errors {metrics['case_errors']}); parse-error rate {_fmt(metrics['parse_error_rate'])}; "
             f"stop reasons {metrics['stop_reasons']}; mean turns {metrics['mean_turns']}; answer changed by DERA in "
             f"{_fmt(metrics['answer_changed_rate'], 2)} of questions.", ""]
    rows = [[ARM_NAMES[arm], *(f"{_fmt(a['mean'])} [{_fmt(a['low'], 2)}, {_fmt(a['high'], 2)}]" + (f" ({a['unscored']} unscored)" if a["unscored"] else "")
                               for a in (metrics["arms"][arm][n] for n in names))] for arm in ARMS]
    rows.append(["DERA − 1-shot (paired bootstrap 95% CI)", *("n/a" if not d else f"{d['mean_diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] p={d['p_value']:.3f}"
                                                             for d in (metrics["dera_minus_oneshot"][n] for n in names))])
    lines += md_table(["Method", *(heads[n] for n in names)], rows)
    lines += ["", "Cells: mean [95% bootstrap CI] over questions."]
    if not settings.mcq:
        lines += [f"BERTScore: {bs['encoder']}, layer {bs['layer']} ({bs['layer_source']}); no baseline rescaling. "
                  "Scores from different encoders or layers are not comparable." if bs else "",
                  "Paper (GPT-4, MedQA test, BERTScore with scibert-basevocab-uncased): 1-shot 0.746 / 0.698 / 0.65, "
                  "DERA 0.744 / 0.703 / 0.67."]
    elif set(opt_counts) == {PAPER_MCQ_OPTIONS}:
        lines += ["Paper (GPT-4, 4-option MedQA): accuracy 0.834 (0-shot) vs 0.840 (DERA)."]
    else:
        lines += [f"These questions have {opts}; the paper's multiple-choice figures are on 4-option MedQA and are "
                  "not comparable, so they are not shown here."]
    lines.append("")
    return "\n".join(lines)
