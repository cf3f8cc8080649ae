"""Run metrics of what is not a score (pure functions of the records) and summary.md tables shaped like the paper's,
whose cells are the scores' figures the runner computed (metrics.json ``scores``: experiments/core/scorers.py)."""

from __future__ import annotations

from collections import Counter
from functools import partial
from statistics import mean

from experiments.common.grade import grades, split_name, unit_values
from experiments.common.markdown import md_table, num
from experiments.common.stats import paired_bootstrap
from experiments.common.text import bertscore_config, bertscore_label
from experiments.core.scorers import figure_cell, find
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

def figure(metrics: dict, score: str, metric: str = "mean") -> dict | None:
    """The runner's figure of ``score`` (metrics.json ``scores``: the one aggregation, resampled by case), or None."""
    return next((f for f in metrics.get("scores") or [] if f["score"] == score and f["metric"] == metric), None)


def _paired(records: list[dict], a: str, b: str, scale=None) -> dict | None:
    """``b - a`` per case over the cases both scores scored: the paired bootstrap (mean difference, 95 % CI, p)."""
    va, vb = unit_values(records, a, scale), unit_values(records, b, scale)
    both = [c for c in vb if c in va]
    return paired_bootstrap([vb[c] for c in both], [va[c] for c in both]).to_dict() if both else None


def dialogue_metrics(records: list[dict], settings) -> dict:
    """What the loop did and how often the concept cap cut, beside the GPT-F1 figures (the runner's ``scores``), and
    the paired difference DERA − initial of each case's average F1."""
    ok = _ok(records)
    m = common_metrics(records)
    m["mean_scratchpad_lines"] = round(mean(len(_meta(r)["scratchpad"]) for r in ok), 2) if ok else None
    m["final_sections_kept_from_initial"] = sum(len(_meta(r).get("final_sections_kept_from_initial", [])) for r in ok)
    # the concept-list cap is a setting; say how often it cut (case x section x comparison)
    m["gptf1_max_concepts"] = settings.gptf1.max_concepts
    m["gptf1_concept_lists_cut"] = sum(1 for r in ok for name, g in grades(r).items()
                                       if split_name(name)[0] == "gptf1" and not split_name(name)[2] and g.metadata.get("concepts_cut"))
    if any("gptf1/initial" in r.get("scores", {}) for r in ok):
        m["dera_minus_initial_f1"] = _paired(ok, "gptf1/initial[f1]", "gptf1/dera[f1]")
    if settings.corruption_level is not None and settings.task == "corrupt":
        m["corruption_level"] = settings.corruption_level
    return m


def _section_rows(metrics: dict, arms: tuple[str, ...], sections: list[str], lead: list) -> list[list]:
    """One row per section and the average: each arm's P and R, and its F1 with its interval (the runner's figures)."""
    rows = []
    for sec in [*sections, None]:
        row = [*lead, sec or "**Average**"]
        for arm in arms:
            name = f"gptf1/{arm}" + (f"/{sec}" if sec else "")
            p, r, f1 = (figure(metrics, f"{name}[{m}]") for m in ("precision", "recall", "f1"))
            row += [num(p and p["value"]), num(r and r["value"]), figure_cell(f1) if f1 else "–"]
        rows.append(row)
    return rows


def dialogue_summary(metrics: dict, settings, command: str) -> str:
    lines = [f"# {command}", "", f"Cases: {metrics['n_cases']} (errors {metrics['case_errors']}); "
             f"parse-error rate {_fmt(metrics['parse_error_rate'])}; stop reasons {metrics['stop_reasons']}; "
             f"mean turns {metrics['mean_turns']}; mean scratchpad lines {metrics['mean_scratchpad_lines']}.", ""]
    cap, cut = metrics.get("gptf1_max_concepts"), metrics.get("gptf1_concept_lists_cut", 0)
    note = "no cap" if cap is None else f"{cap} concepts per list, {cut} section comparison(s) cut"
    if cut:
        note += " (see `concepts_cut` in the scores' metadata)"
    lines += [f"GPT-F1 concept cap (`gptf1.max_concepts`): {note}.", ""]
    head_lines = len(lines)
    cells = ("Cells: the figures of the `gptf1` scores (the Scores section below): the mean over encounters of P, R and F1, "
             "F1 with its 95 % CI from resampling whole encounters; the average: each encounter's mean over its scored "
             "sections, averaged over encounters.")
    if figure(metrics, "gptf1/initial[f1]") and figure(metrics, "gptf1/dera[f1]"):
        level = metrics.get("corruption_level")
        title = f"GPT-F1 against the uncorrupted summary, corruption level {level}/10" if level else "GPT-F1 against the reference"
        head = ["Level", "Section", *(f"{a} {k}" for a in ("Initial", "DERA") for k in ("P", "R", "F1 [95% CI]"))]
        lines += [f"## {title}", "", *md_table(head, _section_rows(metrics, ("initial", "dera"), settings.score_sections, [level or "-"]))]
        diff = metrics.get("dera_minus_initial_f1")
        if diff:
            lines += ["", f"DERA − initial, average F1 per case: {diff['mean_diff']:+.3f} "
                          f"(95% CI {diff['low']:+.3f} to {diff['high']:+.3f}, paired bootstrap p = {diff['p_value']:.3f}, n = {diff['n']})."]
        lines.append("")
    if figure(metrics, "gptf1/dera_vs_initial[f1]"):
        lines += ["## GPT-F1 of the DERA output against the initial output (how much the dialogue changed)", "",
                  *md_table(["Section", "P", "R", "F1 [95% CI]"], _section_rows(metrics, ("dera_vs_initial",), settings.score_sections, [])), ""]
    if len(lines) > head_lines:
        lines += [cells, ""]
    return "\n".join(lines)


# -- QA ---------------------------------------------------------------------------------------------

PAPER_MCQ_OPTIONS = 4  # the paper's MCQ figures (GPT-4 0-shot 0.834, DERA 0.840) are on 4-option MedQA


def mcq_option_counts(records: list[dict]) -> dict[int, int]:
    """{number of options: questions} over the records (the released open-ended file has 5, A-E)."""
    return dict(sorted(Counter(len((r.get("inputs") or {}).get("choices") or []) for r in _ok(records)).items()))


def options_label(counts: dict) -> str:
    if not counts:
        return "options: n/a"
    if len(counts) == 1:
        n = next(iter(counts))
        letters = f", A–{chr(ord('A') + n - 1)}" if 0 < n <= 26 else ""
        return f"{n} options{letters}"
    return "mixed: " + ", ".join(f"{q} questions with {n} options" for n, q in counts.items())


def qa_metrics(records: list[dict], settings) -> dict:
    """What the loop did, the encoder or the options behind the scores, and DERA − 1-shot per question of each score
    (paired; the similarity normalised over the run as its scale says), beside the scores' figures (the runner's)."""
    ok = _ok(records)
    m = common_metrics(records)
    if settings.mcq:
        m["mcq_options"] = {str(k): v for k, v in mcq_option_counts(records).items()}
    else:
        m["bertscore"] = bertscore_config(settings.bertscore_model, settings.bertscore_layer)
    m["answer_changed_rate"] = round(mean(int(_meta(r)["answer_changed"]) for r in ok), 4) if ok else None
    m["dera_minus_oneshot"] = {name: _paired(ok, f"{STEPS[name]}/oneshot", f"{STEPS[name]}/dera", find(QA, STEPS[name]).scale)
                               for name in qa_names(settings)}
    return m


def qa_names(settings) -> list[str]:
    return ["accuracy"] if settings.mcq else ["bertscore", "exact", "similarity"]


def qa_summary(metrics: dict, settings, command: str) -> str:
    names = qa_names(settings)
    opt_counts = {int(k): v for k, v in (metrics.get("mcq_options") or {}).items()}
    opts = options_label(opt_counts)
    bs = metrics.get("bertscore")
    heads = {"accuracy": f"MCQ accuracy ({opts})", "exact": "LLM exact match", "similarity": "LLM similarity",
             "bertscore": bertscore_label(bs) if bs else "BERTScore F1"}
    lines = [f"# {command}{f' (multiple choice, {opts})' if settings.mcq else ''}", "",
             f"Questions: {metrics['n_cases']} (errors {metrics['case_errors']}); parse-error rate {_fmt(metrics['parse_error_rate'])}; "
             f"stop reasons {metrics['stop_reasons']}; mean turns {metrics['mean_turns']}; answer changed by DERA in "
             f"{_fmt(metrics['answer_changed_rate'], 2)} of questions.", ""]
    rows = [[ARM_NAMES[arm], *(figure_cell(f) if (f := figure(metrics, f"{STEPS[n]}/{arm}")) else "–" for n in names)] for arm in ARMS]
    rows.append(["DERA − 1-shot (paired bootstrap 95% CI)", *("n/a" if not d else f"{d['mean_diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] p={d['p_value']:.3f}"
                                                             for d in (metrics["dera_minus_oneshot"][n] for n in names))])
    lines += md_table(["Method", *(heads[n] for n in names)], rows)
    lines += ["", "Cells: the scores' figures (the Scores section below): the mean over questions [95% CI from resampling "
              "whole questions] (n questions; unscored: an unreadable verdict); the similarity normalised over the run."]
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
