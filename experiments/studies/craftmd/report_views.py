"""CRAFT-MD's own tables in `medstack report` (``Study.report_run`` of its calibrations): their agreement with the
dermatologists. (A run's scores, conversation checks included, are the report's Scores table.) The report knows no study."""

from __future__ import annotations

from experiments.studies.craftmd.assess import LABELS


CALIBRATION_COLUMNS = ["rater", "n", "exact agreement", "mean |diff|", "trial agreement bound", "weighted kappa", "Spearman rho", "Kendall tau-b"]


def _f(v) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


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
