"""CRAFT-MD's own tables in `medstack report` (its ``StudyResults.report_run`` hook): a run's conversation quality
and patient checks, and the calibrations' agreement with the dermatologists. The report itself knows no study."""

from __future__ import annotations

from experiments.studies.craftmd.assess import LABELS, QUESTIONS
from experiments.common.patient_checks import CHECKS, DESCRIPTIONS, patient_check_table
from experiments.studies.craftmd.metrics import released_rows


CALIBRATION_COLUMNS = ["rater", "n", "exact agreement", "mean |diff|", "trial agreement bound", "weighted kappa", "Spearman rho", "Kendall tau-b"]


def _f(v) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def conversation_tables(run: dict) -> list[dict]:
    """A CRAFT-MD run's conversation quality (assessor rates with CIs), its patient checks beside the authors' released patients, and the cases each check flagged."""
    m = run.get("metrics") if isinstance(run.get("metrics"), dict) else {}
    q, pc = m.get("conversation_quality") or {}, m.get("patient_checks") or {}
    out = []
    if q:
        out.append({"heading": "Conversation checks",
                    "title": "Conversation quality: the assessor's % yes per question (an addition to the paper's protocol; unreadable replies unscored)",
                    "columns": ["question", "% yes", "95% CI", "n cases", "yes", "no", "unscored"],
                    "rows": [[LABELS[k], f"{100 * x['rate']:.1f}" if x.get("rate") is not None else "–",
                              f"[{100 * x['ci_low']:.1f}, {100 * x['ci_high']:.1f}]" if x.get("ci_low") is not None else "–",
                              x["n"], x["yes"], x["no"], x["unscored"]] for k in QUESTIONS if (x := q.get(k))]})
    if pc:
        columns, rows = patient_check_table([(str(((run.get("config") or {}).get("name")) or "this run"), pc), *released_rows()])
        out.append({"heading": None if q else "Conversation checks", "columns": columns, "rows": rows,
                    "title": "Patient checks (no model): % of conversations flagged [95% CI over cases] (flagged/checked), "
                             "this run's patient beside the authors' four released ones (docs/protocols.md, CRAFT-MD patient checks)"})
        flagged: dict[str, list[str]] = {c: [] for c in CHECKS}
        for r in run.get("records") or []:
            for c in CHECKS:
                if (r.get("patient_checks") or {}).get(c):
                    flagged[c].append(str(r.get("id")))
        out.append({"heading": None, "title": "Patient checks: the conversations each flagged", "columns": ["check", "conversations"],
                    "rows": [[DESCRIPTIONS[c].format(n=pc.get("span_words")), ", ".join(flagged[c][:50]) + (" ..." if len(flagged[c]) > 50 else "") or "–"]
                             for c in CHECKS]})
    return out


def conversations_calibration_tables(run: dict) -> list[dict]:
    """A `calibrate conversations` run: per question, the assessor against the paper's dermatologists."""
    m = run.get("metrics") if isinstance(run.get("metrics"), dict) else {}
    rows = []
    checks = [(f"assessor {((run.get('config') or {}).get('roles') or {}).get('assessor', '')}: {LABELS.get(q, q)}", x)
              for q, x in (m.get("questions") or {}).items()]
    if ((m.get("detector") or {}).get("Q3") or {}).get("combined"):  # the terminology check (no model)
        checks.insert(0, (f"terminology check (no model): {LABELS['Q3']}", m["detector"]["Q3"]["combined"]))
    for name, x in checks:
        if "exact_agreement" not in x:
            continue  # no expert label released for this question
        ci = x.get("ci95") or {}
        kappa = _f(x["kappa"]) + (f" [{_f(ci['kappa'][0])}, {_f(ci['kappa'][1])}]" if ci.get("kappa") else "")
        agree = _f(x["exact_agreement"]) + (f" [{_f(ci['exact_agreement'][0])}, {_f(ci['exact_agreement'][1])}]" if ci.get("exact_agreement") else "")
        rows.append([name, x["n"], agree, f"confusion {x['confusion']} (rows experts, cols the check: no, yes)", "–", kappa, "–", "–"])
    return [{"heading": "Judge calibration",
             "title": "CRAFT-MD conversation assessors vs the paper's dermatologists (yes/no per conversation; Cohen's kappa; 95% bootstrap CIs)",
             "columns": CALIBRATION_COLUMNS, "rows": rows}] if m else []


def grader_calibration_tables(run: dict) -> list[dict]:
    """A `calibrate craftmd-grader` run: the judge and the authors' grader against the dermatologist."""
    m = run.get("metrics") if isinstance(run.get("metrics"), dict) else {}
    pub, rows = m.get("published") or {}, []
    for name, x in ((f"judge {m.get('judge')} (rule {m.get('concurrent_rule')})", m.get("judge_vs_dermatologist")),
                    (f"authors' grader ({pub.get('cases_matched')} matched cases)", pub.get("vs_dermatologist"))):
        if x:
            rows.append([name, x["n"], _f(x["exact_agreement"]), _f(x["mean_abs_diff"]), _f(x["trial_agreement_bound"]),
                         _f(x["weighted_kappa_linear"]), _f((x.get("spearman") or {}).get("rho")), "–"])
    return [{"heading": "Judge calibration", "title": "CRAFT-MD grader vs dermatologist (counts of correct trials 0-5; kappa linear-weighted)",
             "columns": CALIBRATION_COLUMNS, "rows": rows}] if rows else []
