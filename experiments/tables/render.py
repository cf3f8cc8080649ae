"""Paper tables as text: one view (columns and rows of strings) for summary.md, `compare` and the report.

Long layout, one block of rows per run (the paper's models as groups): run | row | ours [95% CI] | n |
paper | ours − paper | paired test (Holm). Runs whose setting differs from the paper's carry footnote
numbers; the footnotes follow the table.
"""

from __future__ import annotations

from experiments.common.markdown import md_cell, md_table
from experiments.core.results import Run
from experiments.tables.build import ComputedTable, StudyTables, study_tables

COLUMNS = ["run", "", "ours [95% CI]", "n", "paper", "ours − paper", "paired test (Holm)"]


def _num(x, digits: int = 3, sign: bool = False) -> str:
    if x is None or x != x:
        return "–"
    if round(x, digits) == 0:
        x = 0.0  # no "-0.000"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _p(p) -> str:
    if p is None or p != p:
        return "–"
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def value_text(c, digits: int) -> str:
    if c.value is None:
        return "–"
    if c.low is None:
        return _num(c.value, digits)
    return f"{_num(c.value, digits)} [{_num(c.low, digits)}, {_num(c.high, digits)}]"


def test_text(t: dict | None, vs_label: str, digits: int) -> str:
    if not t:
        return ""
    return f"vs {vs_label}: {_num(t['diff'], digits, sign=True)} [{_num(t['low'], digits, sign=True)}, {_num(t['high'], digits, sign=True)}], {_p(t.get('p_holm'))}"


def table_view(t: ComputedTable) -> dict:
    """{title, caption, columns, groups: [{label, kind, notes, rows: [[cells]]}], footnotes, source}."""
    groups = []
    for g in t.groups:
        rows = []
        for r in t.rows:
            c = g.cells.get(r.id)
            if c is None:
                continue
            if g.kind == "paper":  # the paper's figures alone: only the rows it reports
                if c.published is not None:
                    rows.append([r.label, "–", "–", _num(c.published, r.digits), "–", ""])
                continue
            rows.append([r.label, value_text(c, r.digits), "–" if c.n is None else str(c.n), _num(c.published, r.digits),
                         _num(c.diff, r.digits, sign=True), test_text(c.test, t.row_label(c.test["vs"]) if c.test else "", r.digits)])
        if not rows:
            continue
        label = g.label + (" (paper)" if g.kind == "paper" else "")
        if g.kind != "paper" and g.published_model and g.published_model.lower() not in g.label.lower():
            label += f" — paper column: {g.published_model}"
        groups.append({"label": label, "kind": g.kind, "notes": g.notes, "rows": rows, "path": g.path})
    caption = f"{t.paper} — {t.title}"
    key_rows = any(r.key for r in t.rows)
    legend = []
    if key_rows:
        legend.append("ours: mean over cases with its 95% percentile-bootstrap CI (10,000 resamples, fixed seed); n = cases")
    if any(r.metric for r in t.rows):
        legend.append("corpus-level figures (no CI); n = scored turns" if not key_rows else "rows without a CI are corpus-level figures")
    if t.tests:
        legend.append("paired test: mean difference (this row − the named row) over cases scored in both with its 95% CI, "
                      "paired bootstrap, p Holm–Bonferroni-corrected across every test of this table")
    legend.append(f"paper: {t.source}" + ("; groups marked (paper) are the paper's models without a run here" if any(g.kind == "paper" for g in t.groups) else ""))
    if t.note:
        legend.append(t.note)
    return {"study": t.study, "id": t.id, "title": t.title, "caption": caption, "columns": COLUMNS, "groups": groups,
            "footnotes": t.footnotes, "legend": legend}


def table_markdown(view: dict) -> str:
    rows = [[f"**{md_cell(g['label'])}**" + "".join(f"^{n}" for n in g["notes"]) if i == 0 else "", *map(md_cell, row)]
            for g in view["groups"] for i, row in enumerate(g["rows"])]
    lines = [f"### {view['caption']}", "", *md_table([c or "measure" for c in view["columns"]], rows), ""]
    lines += [f"^{i} {text}" for i, text in enumerate(view["footnotes"], 1)]
    if view["footnotes"]:
        lines.append("")
    lines += [f"- {x}" for x in view["legend"]]
    return "\n".join(lines) + "\n"


def study_markdown(st: StudyTables) -> str:
    parts = [f"## {st.decl.title}: as in the paper ({st.decl.paper})", ""]
    parts += [table_markdown(table_view(t)) for t in st.tables]
    return "\n".join(parts)


def paper_tables_markdown(runs: list[dict], sources) -> str:
    """Every paper table declared in ``sources`` over ``runs`` as markdown ('' when none applies)."""
    return "\n".join(study_markdown(st) for st in study_tables(runs, sources) if st.tables)


def run_paper_tables(run: Run, study) -> str:
    """The paper tables of one run of ``study`` (for its summary.md), over the run as computed in memory (the runner's,
    an importer's: records, config, metrics; nothing is read from its folder); '' when none applies."""
    return paper_tables_markdown([{**run.as_dict(), "scorers": study.scorers}], study.tables)
