"""CRAFT-MD's figures beyond its scores (stop reasons, turns, parse errors, the grader's extraction statuses and
re-asks) and its summary tables, which show the scorers' figures (metrics.json ``scores``: the one aggregation,
resampled by case) per format and mode, and per specialty through the same aggregation (the study README, "Records").
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from experiments.common.grade import Grade, aggregate, grades as typed_grades, split_name
from experiments.common.markdown import md_table, num, pct
from experiments.studies.craftmd.assess import LABELS, QUESTIONS
from experiments.studies.craftmd.settings import FORMATS, MODES

UNPARSED = ("unparsed", "unscored_extraction", "unscored_verdict")  # an MCQ mapped to no choice, an FRQ grader reply not read


def grades(record: dict) -> dict[tuple[str, str], Grade]:
    """{(format, mode): grade} of a record's answers: its scores ``mcq/<format>``, ``frq/<format>`` (not a rescore's)."""
    out = {}
    for name, g in typed_grades(record).items():
        mode, fmt, judge = split_name(name)
        if mode in MODES and fmt in FORMATS and judge is None:
            out[(fmt, mode)] = g
    return out


def formats_modes(records: list[dict]) -> list[tuple[str, str]]:
    seen = {fm for r in records for fm in grades(r)}
    return [(f, m) for f in FORMATS for m in MODES if (f, m) in seen]


def figure_of(metrics_or_figures, fmt: str, mode: str) -> dict | None:
    """The figure of ``<mode>/<format>`` (the mean over cases) among a run's figures (metrics.json ``scores``)."""
    figs = metrics_or_figures.get("scores") if isinstance(metrics_or_figures, dict) else metrics_or_figures
    return next((f for f in figs or [] if f["score"] == f"{mode}/{fmt}" and f["metric"] == "mean"), None)


def run_metrics(records: list[dict]) -> dict:
    """What the records say besides the scores' figures: cases, stop reasons, doctor turns, parse errors, the
    grader's extraction statuses and re-asks."""
    out: dict = {"records": len(records), "cases": len({r.get("case_id") for r in records})}
    meta = [r.get("metadata") or {} for r in records]
    out["stop_reasons"] = dict(Counter(m.get("stop_reason") for m in meta if m.get("stop_reason")))
    turns = [m.get("n_doctor_turns", 0) for m, r in zip(meta, records) if r.get("transcript")]
    out["mean_doctor_turns"] = sum(turns) / len(turns) if turns else None
    all_grades = [(fm, g) for r in records for fm, g in grades(r).items()]
    n_answers = sum(1 for _, g in all_grades if not g.skipped)
    n_parse = sum(g.source in UNPARSED for _, g in all_grades)
    out["parse_errors"] = n_parse
    out["parse_error_rate"] = n_parse / n_answers if n_answers else None
    frq = [g for (_, m), g in all_grades if m == "frq"]
    out["frq_extraction_status"] = dict(Counter(g.metadata.get("extraction_status") for g in frq))
    out["frq_grade_source"] = dict(Counter(g.source for g in frq))
    reasks = [int(g.metadata.get("grader_reasks") or 0) for g in frq]
    out["grader_reasks"] = {"total": sum(reasks), "answers_reasked": sum(k > 0 for k in reasks), "max": max(reasks, default=0)}
    return out


def per_specialty(records: list[dict]) -> dict:
    """Per specialty and format.mode: the same aggregation as the run's figures, over that specialty's cases."""
    by = defaultdict(list)
    for r in records:
        by[(r.get("inputs") or {}).get("specialty") or "unknown"].append(r)
    return {s: {f"{f}.{m}": aggregate(rs, f"{m}/{f}").json() for f, m in formats_modes(rs)} for s, rs in sorted(by.items())}


def fmt_acc(a: dict | None) -> str:
    if not a or a.get("value") is None:
        return "–"
    return f"{a['value']:.3f} [{a['low']:.3f}, {a['high']:.3f}] (n={a['n']})"


def grading_label(metrics_or_config: dict) -> str:
    """How a run's FRQ answers were graded, for every table: grades (local grader / the authors'
    published ones) and the concurrent-diagnosis rule (zero | any)."""
    grades = metrics_or_config.get("grades") or "local grader"
    rule = metrics_or_config.get("concurrent_rule") or "zero"
    return f"FRQ grades: {grades}; concurrent-diagnosis rule: {rule}"


def summary_markdown(name: str, metrics: dict) -> str:
    rows = [[f, fmt_acc(figure_of(metrics, f, "mcq")), fmt_acc(figure_of(metrics, f, "frq"))] for f in FORMATS
            if figure_of(metrics, f, "mcq") or figure_of(metrics, f, "frq")]
    lines = [f"# CRAFT-MD run: {name}", "", f"cases: {metrics['cases']}, records (case × trial): {metrics['records']}",
             grading_label(metrics), *([metrics["requests"]] if metrics.get("requests") else []),
             *([f"additions to the protocol (not deviations: the paper's requests are unchanged): {'; '.join(metrics['additions'])}"]
               if metrics.get("additions") else []), "",
             "Accuracy: the `mcq/<format>` and `frq/<format>` scores' figures (the Scores section below), resampled by case: "
             "a case's trials are one unit.", "",
             *md_table(["format", "MCQ accuracy [95% CI]", "FRQ accuracy [95% CI]"], rows)]
    cap = f"; turn cap inferred from the release: {metrics['turn_cap_inferred']} doctor turns" if metrics.get("turn_cap_inferred") else ""
    n_conv = sum(metrics["stop_reasons"].values())
    lines += ["", f"stop reasons: {metrics['stop_reasons']}; mean doctor turns: {num(metrics['mean_doctor_turns'], 2)}{cap}",
              *([f"doctor: reached the turn cap in {metrics['stop_reasons'].get('turn_cap', 0)} of {n_conv} conversation(s)"] if n_conv else []),
              f"parse errors: {metrics['parse_errors']} ({pct(metrics['parse_error_rate'])} of answers); FRQ extraction: {metrics['frq_extraction_status']}; "
              f"FRQ grade source: {metrics['frq_grade_source']}"]
    if metrics.get("grader_reasks", {}).get("total"):
        r = metrics["grader_reasks"]
        lines.append(f"grader re-asks (verdict neither yes nor no): {r['total']} over {r['answers_reasked']} FRQ answer(s), at most {r['max']} for one")
    mapping = metrics.get("mcq_mapping")
    if isinstance(mapping, dict) and "counts" in mapping:
        lines += ["", f"## MCQ mapping (rule: {mapping['rule']})", "", *md_table(
            ["format", *mapping["counts"]], [*([f, *(c.get(k, 0) for k in mapping["counts"])] for f, c in mapping["per_format"].items()),
                                             ["all", *mapping["counts"].values()]])]
        if mapping.get("answer_only"):
            lines.append(f"\nanswers matched against the correct answer alone (no choices): {mapping['answer_only']}")
    if metrics.get("frq_published_minus_one") is not None:
        lines.append(f"\npublished FRQ grades of -1 (no answer graded), counted as wrong: {metrics['frq_published_minus_one'] or 0}")
    unmapped = metrics.get("mcq_unmapped")
    if unmapped:
        texts = [re.sub(r"\s+", " ", str(u.get("answer") or "")).replace("|", "\\|") for u in unmapped]
        lines += ["", f"## Unmapped MCQ answers ({len(unmapped)}; scored wrong)", "", *md_table(
            ["id", "format", "answer"], [[u["id"], u["format"], t[:160] + ("…" if len(t) > 160 else "")] for u, t in zip(unmapped, texts)])]
    run = metrics.get("run")
    if run:
        lines.append(f"wall time: {num(run.get('wall_seconds'), 1)} s; output tokens/s: {num(run.get('output_tokens_per_s'), 1)}; "
                     f"requests: {run.get('requests')}; cache hits: {run.get('cache_hits')}")
    return "\n".join(lines) + "\n"


PAPER_LABELS = {"gpt-4": "GPT-4", "gpt-3.5": "GPT-3.5", "mistral-v2-7b": "Mistral-v2-7b", "llama-2-7b": "LLaMA-2-7b"}


def _pct(x: float | None) -> str:
    return "–" if x is None or x != x else f"{100 * x:.1f}"


def published_expert_value(published: dict | None, question: str, paper_model: str | None) -> str:
    """The paper's dermatologists' % yes for this question beside a run (Fig. 3i: Q1, Fig. 3j: Q2, per model; Q3 over
    all 180 conversations), or '' where the paper has none (the two patient-AI questions were not released)."""
    if not published:
        return ""
    if question == "Q3" and published.get("Q3_overall") is not None:
        return f"{published['Q3_overall']:.2f} (all four models)"
    per = published.get(question)
    if isinstance(per, dict) and paper_model and per.get(paper_model) is not None:
        return f"{per[paper_model]:.2f} ({PAPER_LABELS.get(paper_model, paper_model)})"
    return ""


def conversation_markdown(metrics: dict, published: dict | None = None, paper_model: str | None = None) -> str:
    """summary.md's "Conversation quality" table: the assessors' figures (``assess-<Q>``, as the Scores section gives
    them) beside the paper's dermatologists; '' when the run has none."""
    lines: list[str] = []
    q = {f["score"].removeprefix("assess-"): f for f in metrics.get("scores") or [] if f["score"].startswith("assess-") and "@" not in f["score"]}
    if q:
        lines += ["", "## Conversation quality (an addition to the paper's protocol: LLM assessors, role assessor)", "", *md_table(
            ["question", "assessor: % yes [95% CI] (n cases)", "unscored", "paper's dermatologists: % yes"],
            [[LABELS[name], f"{_pct(x['value'])} [{_pct(x['low'])}, {_pct(x['high'])}] (n={x['n']})", x["unscored"],
              published_expert_value(published, name, paper_model) or "–"] for name, x in ((n, q[n]) for n in QUESTIONS if n in q)])]
        lines += ["", "One yes/no request per question and conversation; an unreadable reply is unscored (left out of the rate, never a No). "
                  "The paper's values (Fig. 3i: Q1, Fig. 3j: Q2, per clinical LLM; Q3 over all 180 conversations) are dermatologists' labels "
                  "of the paper's own conversations" + ("" if paper_model else "; this run's doctor model is none of the paper's four") + "."]
    return "\n".join(lines) + ("\n" if lines else "")
