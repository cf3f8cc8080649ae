"""`medstack compare`: CRAFT-MD runs (local or imported) side by side with the same statistics: every pair of runs
in one format and mode, and every pair of formats within a run and mode, each table Holm-corrected (the study README).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from experiments.common.grade import aggregate, unit_values
from experiments.studies.craftmd.metrics import formats_modes, per_specialty
from experiments.studies.craftmd.settings import FORMATS, MODES
from experiments.core.registry import open_run
from experiments.common.markdown import md_table, num
from experiments.common.stats import MIN_SHARED_CASES, holm, mcnemar_test, paired_over_shared
from experiments.tables.build import study_tables
from experiments.tables.plots import write_figures
from experiments.tables.render import study_markdown
from models.errors import MedstackError


def grading_of(run: dict) -> dict:
    """How a run's FRQ answers were graded: ``grades`` (``published``: the authors' grader-AI, or ``local``),
    ``concurrent_rule`` (a local run without the key predates the setting and used ``zero``) and ``answers``."""
    cfg = run.get("config") or {}
    metrics = run.get("metrics") or {}
    grades = cfg.get("grades") or metrics.get("grades") or ("published" if cfg.get("imported_from") else "local")
    rule = cfg.get("concurrent_rule") or metrics.get("concurrent_rule") or ("any" if grades == "published" else "zero")
    # docs/constrained-answers.md: free text (the papers' protocol; published runs, and local runs from before the setting) or constrained
    answers = cfg.get("answers") or metrics.get("answers") or "free"
    return {"grades": grades, "concurrent_rule": rule, "answers": answers}


def grading_warnings(runs: list[dict]) -> list[str]:
    """Warnings for runs side by side whose FRQ grades are not comparable."""
    out = []
    rules = {r["name"]: r["concurrent_rule"] for r in runs}
    if len(set(rules.values())) > 1:
        out.append("FRQ accuracies side by side use different concurrent-diagnosis rules (" + ", ".join(f"{n}: {v}" for n, v in rules.items())
                   + "); 'zero' scores an answer naming several diagnoses 0, 'any' scores it 1 when any matches")
    modes = {r["name"]: r.get("answers", "free") for r in runs}
    if len(set(modes.values())) > 1:
        out.append("runs side by side were answered in different modes (" + ", ".join(f"{n}: answers {v}" for n, v in modes.items())
                   + "); under 'constrained' the MCQ answer and the grader's replies were forced into their formats by vLLM "
                   "structured outputs, under 'free' they were parsed from free text: differences mix knowledge and format-following")
    grades = {r["name"]: r["grades"] for r in runs}
    if len(set(grades.values())) > 1:
        out.append("FRQ accuracies side by side mix published grades (the authors' grader-AI) and local ones ("
                   + ", ".join(f"{n}: {v}" for n, v in grades.items()) + "); the graders differ")
    return out


def load_runs(paths: list[str]) -> list[dict]:
    runs = []
    for p in paths:
        run = open_run(p).as_dict()
        name = (run.get("config") or {}).get("name") or Path(p).name
        run["name"] = name
        run.update(grading_of(run))
        runs.append(run)
    names = [r["name"] for r in runs]
    for r in runs:
        if names.count(r["name"]) > 1:
            r["name"] = f"{r['name']} ({Path(r['path']).name})"
    if len({r["name"] for r in runs}) != len(runs):
        raise MedstackError("two results directories have the same run name and folder name; rename one")
    return runs


def paired_test(sa: dict, sb: dict) -> dict:
    """Two per-case value maps compared over the cases both hold (``stats.paired_over_shared``): no p-value (and no
    McNemar) below ``MIN_SHARED_CASES`` shared cases."""
    t = paired_over_shared(sa, sb)
    out = {"n_paired": t["n_shared"], "only_a": t["only_a"], "only_b": t["only_b"], "too_few": t["too_few"],
           "mean_diff": t["mean_diff"], "diff_ci": t["diff_ci"], "p": t["p"], "mcnemar_p": None}
    common = sorted(set(sa) & set(sb))
    a, b = [sa[c] for c in common], [sb[c] for c in common]
    # McNemar only where every per-case value is 0/1 (trial means are not paired binary outcomes), over enough cases
    if common and not t["too_few"] and all(v in (0.0, 1.0) for v in a + b):
        m = mcnemar_test(a, b)
        out.update(mcnemar_p=m["p_value"], mcnemar_table=m["table"])
    return out


MODE_WORDS = {"mcq": "MCQ", "frq": "FRQ"}


def comparison_label(t: dict) -> str:
    """A test's comparison in words: 'vignette MCQ accuracy, between runs' / 'MCQ accuracy of alpha, between formats'."""
    if t["table"].startswith("runs|"):
        return f"{t['format']} {MODE_WORDS.get(t['mode'], t['mode'])} accuracy, between runs"
    return f"{MODE_WORDS.get(t['mode'], t['mode'])} accuracy of {t['run']}, between formats"


def _holm_table(tests: list[dict]) -> None:
    idx = [i for i, t in enumerate(tests) if t.get("p") is not None]
    adj = holm([tests[i]["p"] for i in idx])
    for i, p in zip(idx, adj):
        tests[i]["p_holm"] = p
    for t in tests:
        t.setdefault("p_holm", None)


def compare(paths: list[str], runs: list[dict] | None = None) -> dict:
    runs = runs if runs is not None else load_runs(paths)
    fm_by_run = {r["name"]: formats_modes(r["records"]) for r in runs}
    acc_rows, tests = [], []
    scores = {}
    for r in runs:
        for f, m in fm_by_run[r["name"]]:  # each score's figure by the one aggregation (resampled by case), as every table gives it
            acc_rows.append({"run": r["name"], "format": f, "mode": m, **aggregate(r["records"], f"{m}/{f}").json(),
                             **({"grades": r["grades"], "concurrent_rule": r["concurrent_rule"]} if m == "frq" else {})})
            scores[(r["name"], f, m)] = unit_values(r["records"], f"{m}/{f}")
    # between runs, per format and mode
    for f in FORMATS:
        for m in MODES:
            names = [r["name"] for r in runs if (f, m) in fm_by_run[r["name"]]]
            table = [{"table": f"runs|{f}.{m}", "a": a, "b": b, "format": f, "mode": m, **paired_test(scores[(a, f, m)], scores[(b, f, m)])}
                     for a, b in itertools.combinations(names, 2)]
            _holm_table(table)
            tests += table
    # between formats, within a run and mode
    for r in runs:
        for m in MODES:
            fmts = [f for f in FORMATS if (f, m) in fm_by_run[r["name"]]]
            table = [{"table": f"formats|{r['name']}|{m}", "a": fa, "b": fb, "run": r["name"], "mode": m,
                      **paired_test(scores[(r["name"], fa, m)], scores[(r["name"], fb, m)])} for fa, fb in itertools.combinations(fmts, 2)]
            _holm_table(table)
            tests += table
    return {
        "runs": [{"name": r["name"], "path": r["path"], "records": len(r["records"]), "cases": len({x.get("case_id") for x in r["records"]}),
                  "grades": r["grades"], "concurrent_rule": r["concurrent_rule"], "answers": r["answers"]} for r in runs],
        "warnings": grading_warnings(runs),
        "accuracy": acc_rows,
        "tests": tests,
        "per_specialty": {r["name"]: per_specialty(r["records"]) for r in runs},
    }


def summary_markdown(result: dict) -> str:
    L = ["# CRAFT-MD comparison", "", "Runs: " + ", ".join(f"{r['name']} ({r['cases']} cases, {r['records']} records, answers: {r.get('answers', 'free')})"
                                                          for r in result["runs"]), ""]
    L += ["FRQ grading per run: " + "; ".join(f"{r['name']}: {r.get('grades', 'local')} grades, concurrent-diagnosis rule `{r.get('concurrent_rule', 'zero')}`"
                                             for r in result["runs"]), ""]
    for w in result.get("warnings") or []:
        L += [f"> **Warning:** {w}", ""]
    for m in MODES:
        rows = [a for a in result["accuracy"] if a["mode"] == m]
        if not rows:
            continue
        fmts = [f for f in FORMATS if any(a["format"] == f for a in rows)]
        rule_col = m == "frq"
        acc = {(x["run"], x["format"]): x for x in rows if x["value"] is not None}
        L += [f"## {m.upper()} accuracy [95% bootstrap CI, cases resampled] (n = cases)", "", *md_table(["run", *["grades / concurrent rule"] * rule_col, *fmts], [
            [r["name"], *[f"{r.get('grades', 'local')} / {r.get('concurrent_rule', 'zero')}"] * rule_col,
             *(f"{a['value']:.3f} [{a['low']:.3f}, {a['high']:.3f}] n={a['n']}" if (a := acc.get((r["name"], f))) else "–" for f in fmts)]
            for r in result["runs"]]), ""]
    L += ["## Paired tests (over the cases both hold, paired by case; Holm within each comparison; McNemar where paired binary)", "",
          f"A difference is tested only over the cases both runs (or formats) hold, each case's mean over its trials; no p-value "
          f"below {MIN_SHARED_CASES} shared cases.", "",
          *md_table(["comparison", "a", "b", "shared cases", "mean diff (a−b) [95% CI]", "p", "p (Holm)", "McNemar p"], [
              [comparison_label(t), t["a"], t["b"], f"{t['n_paired']} (only in a: {t.get('only_a', 0)}; only in b: {t.get('only_b', 0)})",
               "–" if t.get("mean_diff") is None else f"{num(t['mean_diff'])} [{num(t['diff_ci'][0])}, {num(t['diff_ci'][1])}]",
               f"– (fewer than {MIN_SHARED_CASES} shared cases)" if t.get("too_few") else num(t.get("p"), 4),
               *(num(t.get(k), 4) for k in ("p_holm", "mcnemar_p"))]
              for t in result["tests"]])]
    L += ["", "The patient checks of every run, beside the authors' four released patients, are in the Scores section below."]
    keys = [f"{f}.{m}" for f in FORMATS for m in MODES]
    L += ["", "## Per specialty (accuracy, n cases; FRQ graded as in the table above, per run)", "", *md_table(["run", "specialty", *keys], [
        [run, spec, *(f"{accs[k]['value']:.2f} ({accs[k]['n']})" if k in accs and accs[k]["value"] is not None else "–" for k in keys)]
        for run, by in result["per_specialty"].items() for spec, accs in by.items()])]
    return "\n".join(L) + "\n"


def bar_chart(result: dict, path: Path) -> None:
    """Formats side by side per run, one panel per mode (MCQ, FRQ), 95% CIs as error bars (cf. paper Fig. 2c)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    modes = [m for m in MODES if any(a["mode"] == m for a in result["accuracy"])]
    names = [r["name"] for r in result["runs"]]
    fmts = [f for f in FORMATS if any(a["format"] == f for a in result["accuracy"])]
    fig, axes = plt.subplots(1, max(1, len(modes)), figsize=(max(6, 1.8 * len(names) * len(modes) + 2), 4.2), squeeze=False)
    width = 0.8 / max(1, len(fmts))
    colors = {"vignette": "#4c72b0", "multiturn": "#dd8452", "singleturn": "#55a868", "summarized": "#c44e52"}
    scored = {(a["run"], a["format"], a["mode"]): a for a in result["accuracy"] if a["value"] is not None}
    for ax, m in zip(axes[0], modes):
        x = np.arange(len(names))
        for j, f in enumerate(fmts):
            got = [scored.get((n, f, m)) for n in names]
            vals = [a["value"] if a else np.nan for a in got]
            err = [[a["value"] - a["low"] if a else 0 for a in got], [a["high"] - a["value"] if a else 0 for a in got]]
            pos = x + (j - (len(fmts) - 1) / 2) * width
            ax.bar(pos, vals, width, yerr=err, capsize=3, label=f, color=colors.get(f))
            for px, v in zip(pos, vals):
                if np.isnan(v):  # no scored answer: say so, rather than a bar of height 0
                    ax.text(px, 0.01, "n/a", ha="center", va="bottom", fontsize=7, rotation=90, color="#555")
        ax.set_xticks(x, names, rotation=15 if len(names) > 3 else 0)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("accuracy")
        ax.set_title(f"{'4-choice MCQ' if m == 'mcq' else 'FRQ'}")
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, title="format", loc="lower center", ncol=len(fmts), fontsize=8, frameon=False)
    fig.suptitle("CRAFT-MD accuracy by format (95% bootstrap CI)")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_compare(paths: list[str], out: str | Path, study) -> dict:
    """The study's own comparison (``study``: the CRAFT-MD Study, for its scorers and paper tables)."""
    if len(paths) < 1:
        raise MedstackError("give at least one results directory")
    runs = load_runs(paths)
    result = compare(paths, runs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(result, indent=2, default=str))

    studies = study_tables([{**r, "scorers": study.scorers} for r in runs], study.tables)  # the paper's tables over the same runs, figures as PNG
    paper = "\n".join(study_markdown(st) for st in studies if st.tables)
    (out / "summary.md").write_text((paper + "\n" if paper else "") + summary_markdown(result))
    bar_chart(result, out / "accuracy.png")
    for st in studies:
        write_figures(st.tables, out)
    return result
