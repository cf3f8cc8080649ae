"""Pure aggregation of CRAFT-MD records (local or imported; same shape): accuracy per format and mode over cases,
as the study README ("Records", metrics.json) describes; unscored answers are left out and counted.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path

import yaml

from experiments.common.grade import Grade, grades as typed_grades, split_name
from experiments.common.markdown import md_table
from experiments.common.stats import mean_ci
from experiments.studies.craftmd.assess import LABELS, QUESTIONS
from experiments.common.patient_checks import NOTE, patient_check_markdown
from experiments.studies.craftmd.settings import FORMATS, MODES


def grades(record: dict) -> dict[tuple[str, str], Grade]:
    """{(format, mode): grade} of a record's answers: its scores ``mcq/<format>``, ``frq/<format>`` (not a rescore's)."""
    out = {}
    for name, g in typed_grades(record).items():
        mode, fmt, judge = split_name(name)
        if mode in MODES and fmt in FORMATS and judge is None:
            out[(fmt, mode)] = g
    return out


UNPARSED = ("unparsed", "unscored_extraction", "unscored_verdict")  # an MCQ mapped to no choice, an FRQ grader reply not read


def case_scores(records: list[dict], fmt: str, mode: str) -> dict[str, float]:
    per = defaultdict(list)
    for r in records:
        g = grades(r).get((fmt, mode))
        if g is not None and g.value is not None:
            per[str(r["case_id"])].append(float(g.value))
    return {cid: sum(v) / len(v) for cid, v in per.items()}


def formats_modes(records: list[dict]) -> list[tuple[str, str]]:
    seen = {fm for r in records for fm in grades(r)}
    return [(f, m) for f in FORMATS for m in MODES if (f, m) in seen]


def accuracy(records: list[dict], fmt: str, mode: str) -> dict:
    scores = case_scores(records, fmt, mode)
    present = [g for r in records if (g := grades(r).get((fmt, mode))) is not None and not g.skipped]
    ci = mean_ci(scores.values())
    return {"accuracy": ci.mean if ci.n else None, "ci_low": ci.low if ci.n else None, "ci_high": ci.high if ci.n else None,
            "n": ci.n, "n_answers": len(present), "unscored": sum(g.value is None for g in present)}


def run_metrics(records: list[dict]) -> dict:
    good = [r for r in records if "error" not in r or r.get("answers")]
    out: dict = {"records": len(records), "case_errors": len(records) - len(good), "cases": len({r.get("case_id") for r in good})}
    out["accuracy"] = {f"{f}.{m}": accuracy(good, f, m) for f, m in formats_modes(good)}
    stops = Counter(r.get("stop_reason") for r in good if r.get("stop_reason"))
    out["stop_reasons"] = dict(stops)
    turns = [r.get("n_doctor_turns", 0) for r in good if r.get("transcript")]
    out["mean_doctor_turns"] = sum(turns) / len(turns) if turns else None
    all_grades = [(fm, g) for r in good for fm, g in grades(r).items()]
    n_answers = sum(1 for _, g in all_grades if not g.skipped)
    n_parse = sum(g.source in UNPARSED for _, g in all_grades)
    out["parse_errors"] = n_parse
    out["parse_error_rate"] = n_parse / n_answers if n_answers else None
    frq = [g for (_, m), g in all_grades if m == "frq"]
    out["frq_extraction_status"] = dict(Counter(g.metadata["extraction_status"] for g in frq))
    out["frq_grade_source"] = dict(Counter(g.source for g in frq))
    reasks = [g.metadata["grader_reasks"] for g in frq]
    out["grader_reasks"] = {"total": sum(reasks), "answers_reasked": sum(k > 0 for k in reasks), "max": max(reasks, default=0)}
    out["request_errors"] = sum(len(r.get("errors") or []) for r in good)
    return out


def per_specialty(records: list[dict]) -> dict:
    by = defaultdict(list)
    for r in records:
        by[r.get("specialty") or "unknown"].append(r)
    return {s: {f"{f}.{m}": accuracy(rs, f, m) for f, m in formats_modes(rs)} for s, rs in sorted(by.items())}


def fmt_acc(a: dict) -> str:
    if a.get("accuracy") is None:
        return "–"
    return f"{a['accuracy']:.3f} [{a['ci_low']:.3f}, {a['ci_high']:.3f}] (n={a['n']})"


def grading_label(metrics_or_config: dict) -> str:
    """How a run's FRQ answers were graded, for every table: grades (local grader / the authors'
    published ones) and the concurrent-diagnosis rule (zero | any)."""
    grades = metrics_or_config.get("grades") or "local grader"
    rule = metrics_or_config.get("concurrent_rule") or "zero"
    return f"FRQ grades: {grades}; concurrent-diagnosis rule: {rule}"


def summary_markdown(name: str, metrics: dict) -> str:
    acc = metrics["accuracy"]
    lines = [f"# CRAFT-MD run: {name}", "", f"cases: {metrics['cases']}, records (case × trial): {metrics['records']}, case errors: {metrics['case_errors']}",
             grading_label(metrics), *([metrics["requests"]] if metrics.get("requests") else []),
             *([f"additions to the protocol (not deviations: the paper's requests are unchanged): {'; '.join(metrics['additions'])}"]
               if metrics.get("additions") else []), "",
             *md_table(["format", "MCQ accuracy [95% CI]", "FRQ accuracy [95% CI]"],
                       [[f, fmt_acc(acc.get(f"{f}.mcq", {})), fmt_acc(acc.get(f"{f}.frq", {}))] for f in FORMATS if f"{f}.mcq" in acc or f"{f}.frq" in acc])]
    cap = f"; turn cap inferred from the release: {metrics['turn_cap_inferred']} doctor turns" if metrics.get("turn_cap_inferred") else ""
    n_conv = sum(metrics["stop_reasons"].values())
    lines += ["", f"stop reasons: {metrics['stop_reasons']}; mean doctor turns: {metrics['mean_doctor_turns']}{cap}",
              *([f"doctor: reached the turn cap in {metrics['stop_reasons'].get('turn_cap', 0)} of {n_conv} conversation(s)"] if n_conv else []),
              f"parse errors: {metrics['parse_errors']} (rate {metrics['parse_error_rate']}); FRQ extraction: {metrics['frq_extraction_status']}; "
              f"FRQ grade source: {metrics['frq_grade_source']}; failed requests: {metrics['request_errors']}"]
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
        lines.append(f"wall time: {run.get('wall_seconds')} s; output tokens/s: {run.get('output_tokens_per_s')}; requests: {run.get('requests')}; cache hits: {run.get('cache_hits')}")
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


RELEASED_CHECKS = Path(__file__).with_name("released_patient_checks.yaml")
PATIENT_CHECKS_HEADING = "Patient checks (no model), beside the authors' four released patients"
PATIENT_CHECKS_NOTE = (NOTE + " The turn cap is the doctor's (stop reasons above). Rules, and how "
                       "the released rates were measured: docs/protocols.md, CRAFT-MD patient checks.")


def released_patient_checks() -> dict[str, dict]:
    """The patient checks of the authors' four released runs, measured by `import craftmd` of each (the file says how)."""
    return yaml.safe_load(RELEASED_CHECKS.read_text(encoding="utf-8"))["releases"]


def released_rows() -> list[tuple[str, dict]]:
    """The authors' four released patients, as rows beside a run's in the patient-check table."""
    return [(f"{label} (authors' release)", pc) for label, pc in released_patient_checks().items()]


def patient_check_section(rows: list[tuple[str, dict]]) -> str:
    """The patient-check table of ``rows`` beside the authors' four released patients (import, compare)."""
    return patient_check_markdown([*rows, *released_rows()], PATIENT_CHECKS_HEADING, PATIENT_CHECKS_NOTE)


def conversation_markdown(metrics: dict, published: dict | None = None, paper_model: str | None = None) -> str:
    """summary.md's "Conversation quality" table (assessors); '' when the run has none."""
    lines: list[str] = []
    q = metrics.get("conversation_quality") or {}
    if q:
        lines += ["", "## Conversation quality (an addition to the paper's protocol: LLM assessors, role assessor)", "", *md_table(
            ["question", "assessor: % yes [95% CI] (n cases)", "conversations: yes / no / unscored", "paper's dermatologists: % yes"],
            [[LABELS[name], f"{_pct(x['rate'])} [{_pct(x['ci_low'])}, {_pct(x['ci_high'])}] (n={x['n']})", f"{x['yes']} / {x['no']} / {x['unscored']}",
              published_expert_value(published, name, paper_model) or "–"] for name, x in ((n, q[n]) for n in QUESTIONS if n in q)])]
        lines += ["", "One yes/no request per question and conversation; an unreadable reply is unscored (left out of the rate, never a No). "
                  "The paper's values (Fig. 3i: Q1, Fig. 3j: Q2, per clinical LLM; Q3 over all 180 conversations) are dermatologists' labels "
                  "of the paper's own conversations" + ("" if paper_model else "; this run's doctor model is none of the paper's four") + "."]
    return "\n".join(lines) + ("\n" if lines else "")
