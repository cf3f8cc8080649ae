"""Paper tables over runs: declaration + runs -> a computed table (experiments/tables/README.md).

A *run* here is :meth:`experiments.core.results.Run.as_dict` (``path``, ``config``, ``metrics``, ``identity``,
``records``, and ``scorers``: its study's, where the caller knows them); failed records are dropped (never scored).
A ``score`` row is that score's figure as metrics.json holds it (the runner's one aggregation), else aggregated here
the same way (experiments/common/grade.py). The declarations come from the caller (``sources``: the registry's
``TableSource`` triples), so this package knows no registry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from experiments.common.grade import MEAN, Metric, aggregate, unit_values
from experiments.common.stats import holm, mean_ci, paired_bootstrap
from experiments.core.deviations import protocol_lines
from experiments.core.results import experiment_name
from experiments.tables.declare import Declaration, Published, Table, load_declaration, ordered


def dig(d, path: str):
    """``a.b.c`` into nested dicts; a key may itself hold dots (``p@inf``, ``vignette.mcq``): the longest match wins."""
    if not path:
        return d
    if not isinstance(d, dict):
        return None
    if path in d:
        return d[path]
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:i])
        if head in d:
            return dig(d[head], ".".join(parts[i:]))
    return None


def experiment_of(run: dict) -> str:
    """A run's kind, as :attr:`experiments.core.results.Run.experiment` reads it."""
    return experiment_name(run.get("config"), run.get("identity"))


def finished(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("status") != "failed"]


def matches(when: dict, attrs: dict) -> bool:
    """Every condition holds: ``attr: value`` (or a list of accepted values), ``attr: {ne: v}``,
    ``attr: {present: true|false}``, ``attr: {not_in: [..]}``."""
    for key, cond in (when or {}).items():
        v = dig(attrs, key)
        if isinstance(cond, dict):
            if "present" in cond and (v is not None) != bool(cond["present"]):
                return False
            if "ne" in cond and (v is None or v == cond["ne"]):
                return False
            if "not_in" in cond and (v is None or v in cond["not_in"]):
                return False
        elif isinstance(cond, list):
            if v not in cond:
                return False
        elif v != cond:
            return False
    return True


@dataclass
class Cell:
    value: float | None = None
    low: float | None = None
    high: float | None = None
    n: int | None = None
    published: float | None = None
    diff: float | None = None  # ours - published
    test: dict | None = None  # {vs, diff, low, high, p, p_holm, n}


@dataclass
class Group:
    label: str
    kind: str  # run | published-run | paper
    published_model: str | None = None
    published_source: str | None = None
    notes: list[int] = field(default_factory=list)  # footnote numbers
    cells: dict[str, Cell] = field(default_factory=dict)  # row id -> cell
    path: str | None = None


@dataclass
class ComputedTable:
    study: str
    id: str
    title: str
    paper: str
    source: str
    rows: list  # declare.Row
    groups: list[Group]
    footnotes: list[str]
    note: str | None
    plot: object
    tests: list[tuple[str, str]]

    def row_label(self, rid: str) -> str:
        return next(r.label for r in self.rows if r.id == rid)


class PreparedRun:
    """One run as the tables see it: label, attributes, per-case values (computed once)."""

    def __init__(self, run: dict, decl: Declaration, label: str):
        self.run, self.decl = run, decl
        self.adapter = decl.adapter
        self.records = finished(run.get("records") or [])
        base = {**(run.get("config") or {}), **((run.get("metrics") or {}).get("settings") or {})}
        base.update({"experiment": experiment_of(run), "published_run": bool((run.get("config") or {}).get("imported_from"))})
        try:
            extra = self.adapter.attrs(run, self.records)
        except (KeyError, TypeError, ValueError, AttributeError):
            extra = {}
        self.attrs = {**base, **extra}
        self.attrs["label"] = label
        self._values: dict | None = None
        self.warnings: list[str] = []

    def scorer(self, score: str):
        from experiments.common.grade import split_name

        step = split_name(score)[0]
        return next((s for s in self.run.get("scorers") or () if s.name == step), None)

    def figure(self, row) -> dict | None:
        """A score row's figure: metrics.json's (the run's own aggregation), else the same aggregation over the records."""
        got = next((f for f in (self.run.get("metrics") or {}).get("scores") or []
                    if f.get("score") == row.score and f.get("metric") == row.figure), None)
        if got is not None:
            return got
        sc = self.scorer(row.score)
        metric = next((m for m in (sc.metrics if sc else (MEAN,)) if m.label == row.figure), Metric(row.figure))
        return aggregate(self.records, row.score, metric, sc.scale if sc else None, sc.unit if sc else "case_id").json()

    def case_values(self, row) -> dict[str, float]:
        """Per-case values of a row (a score: its cases' means; a key: the adapter's), for paired tests."""
        if row.score:
            sc = self.scorer(row.score)
            return unit_values(self.records, row.score, sc.scale if sc else None, sc.unit if sc else "case_id")
        return self.values.get(row.key) or {}

    @property
    def values(self) -> dict[str, dict[str, float]]:
        if self._values is None:
            try:
                self._values = self.adapter.case_values(self.run, self.records)
            except (KeyError, TypeError, ValueError, AttributeError) as e:  # records of another shape: no per-case values
                self.warnings.append(f"{self.run.get('path')}: no per-case values for the {self.decl.study} tables ({type(e).__name__}: {e})")
                self._values = {}
        return self._values


def run_label(run: dict) -> str:
    cfg = run.get("config") or {}
    m = run.get("metrics") or {}
    name = cfg.get("name") or (m.get("settings") or {}).get("model")
    if not name:
        roles = cfg.get("roles") if isinstance(cfg.get("roles"), dict) else {}
        name = next(iter(roles.values()), None) if roles else None
    return str(name).split("@", 1)[0] if name else Path(run.get("path", "?")).name


def declarations(sources) -> tuple[Declaration, ...]:
    """The declarations of ``sources`` (the registry's ``TableSource``: path, adapter, study, kinds), in the report's order."""
    return ordered(load_declaration(t.path, t.adapter, t.study, t.kinds) for t in sources)


def declaration_for(experiment: str, sources) -> Declaration | None:
    return next((d for d in declarations(sources) if d.covers(experiment)), None)


def prepare_runs(runs: list[dict], sources) -> dict[str, list[PreparedRun]]:
    """study -> its runs (in the given order)."""
    by: dict[str, list[tuple[dict, Declaration, str]]] = {}
    for run in runs:
        decl = declaration_for(experiment_of(run), sources)
        if decl is None:
            continue
        by.setdefault(decl.study, []).append((run, decl, decl.adapter.label(run, run_label(run))))
    return {study: [PreparedRun(run, decl, lbl) for run, decl, lbl in items] for study, items in by.items()}


def _unique_labels(runs: list[PreparedRun]) -> list[str]:
    """Runs side by side in one table with the same label get their folder name added."""
    labels = [pr.attrs["label"] for pr in runs]
    return [lbl if labels.count(lbl) == 1 else f"{lbl} ({Path(pr.run.get('path', '?')).name})" for lbl, pr in zip(labels, runs)]


def _published_for(decl: Declaration, pr: PreparedRun) -> Published | None:
    own = [p for p in decl.published if p.match and re.search(p.match, pr.attrs["label"], re.I) and matches(p.when, pr.attrs)]
    if own:
        return own[0]
    return next((p for p in decl.published if p.any_model and matches(p.when, pr.attrs)), None)


def _cell(row, pr: PreparedRun) -> Cell:
    if row.score:
        f = pr.figure(row)
        if not f or f.get("value") is None:
            return Cell(n=(f or {}).get("n") or 0)
        return Cell(float(f["value"]), f.get("low"), f.get("high"), int(f.get("n") or 0))
    if row.key:
        if row.ci:
            got = dig(pr.run.get("metrics") or {}, row.ci)
            if isinstance(got, dict) and got.get("n"):
                mean = got.get("accuracy", got.get("mean"))
                low, high = got.get("ci_low", got.get("low")), got.get("ci_high", got.get("high"))
                if None not in (mean, low, high):
                    return Cell(float(mean), float(low), float(high), int(got["n"]))
        vals = pr.values.get(row.key) or {}
        if not vals:
            return Cell(n=0)
        ci = mean_ci(vals.values())
        return Cell(ci.mean, ci.low, ci.high, ci.n)
    v = dig(pr.run.get("metrics") or {}, row.metric)
    n = dig(pr.run.get("metrics") or {}, row.n) if row.n else None
    return Cell(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None, n=n if isinstance(n, int) else None)


def compute_table(decl: Declaration, table: Table, runs: list[PreparedRun]) -> ComputedTable | None:
    chosen = [pr for pr in runs if matches(table.when, pr.attrs)]
    if not chosen:
        return None
    notes: list[str] = []
    groups: list[Group] = []
    used_published: set[int] = set()
    tests = []
    for pr, label in zip(chosen, _unique_labels(chosen)):
        pub = _published_for(decl, pr)
        if pub is not None:
            used_published.add(id(pub))
        g = Group(label + (" (published run)" if pr.attrs.get("published_run") else ""),
                  "published-run" if pr.attrs.get("published_run") else "run",
                  published_model=pub.model if pub else None, published_source=(pub.source or decl.source) if pub else None,
                  path=str(pr.run.get("path")))
        texts = [_format(fn.text, pr.attrs) for fn in decl.footnotes
                 if (fn.tables is None or table.id in fn.tables) and matches(fn.when, pr.attrs)]
        texts += [line[0].upper() + line[1:] + "." for line in protocol_lines(dig(pr.run.get("metrics") or {}, "protocol"))]
        for text in texts:  # declared notes, then what the run sent less of than the protocol asks
            if text not in notes:
                notes.append(text)
            g.notes.append(notes.index(text) + 1)
        for row in table.rows:
            c = _cell(row, pr)
            if pub is not None and row.id in pub.values:
                c.published = pub.values[row.id]
                c.diff = c.value - c.published if c.value is not None else None
            g.cells[row.id] = c
        for a, b in table.tests:
            rows = {r.id: r for r in table.rows}
            va, vb = pr.case_values(rows[a]), pr.case_values(rows[b])
            common = sorted(set(va) & set(vb))
            if not common:
                continue
            t = paired_bootstrap([vb[i] for i in common], [va[i] for i in common])
            g.cells[b].test = {"vs": a, "diff": t.mean_diff, "low": t.low, "high": t.high, "p": t.p_value, "n": t.n}
            tests.append(g.cells[b].test)
        g.notes.sort()
        groups.append(g)
    for t, p in zip(tests, holm([t["p"] for t in tests])):
        t["p_holm"] = p
    row_ids = {r.id for r in table.rows}
    for pub in decl.published:  # the paper's other models: their published figures alone
        if id(pub) in used_published or not (row_ids & set(pub.values)):
            continue
        if not _compatible(pub.when, table.when):
            continue
        g = Group(pub.label or pub.model, "paper", published_model=pub.model, published_source=pub.source or decl.source)
        g.cells = {r.id: Cell(published=pub.values.get(r.id)) for r in table.rows}
        groups.append(g)
    return ComputedTable(decl.study, table.id, table.title, decl.paper, decl.source, table.rows, groups, notes, table.note, table.plot, table.tests)


def _compatible(pub_when: dict, table_when: dict) -> bool:
    """A paper-only entry shows in a table whose selection does not exclude its setting
    (e.g. an entry for task nlu in the NLU table, not in the POL one)."""
    for k, v in pub_when.items():
        if k in table_when:
            allowed = table_when[k] if isinstance(table_when[k], list) else [table_when[k]]
            if isinstance(table_when[k], dict) or v not in allowed:
                return False
    return True


def _format(text: str, attrs: dict) -> str:
    def sub(m):
        v = dig(attrs, m.group(1))
        return "?" if v is None else str(v)

    return re.sub(r"\{([\w.@-]+)\}", sub, text)


@dataclass
class StudyTables:
    decl: Declaration
    tables: list[ComputedTable]
    runs: list[PreparedRun]


def study_tables(runs: list[dict], sources) -> list[StudyTables]:
    """Every declared study (``sources``) with at least one of ``runs``, in the report's order, with its computed tables."""
    prepared = prepare_runs(runs, sources)
    out = []
    for decl in declarations(sources):
        prs = prepared.get(decl.study)
        if not prs:
            continue
        tables = [t for t in (compute_table(decl, tbl, prs) for tbl in decl.tables) if t is not None]
        out.append(StudyTables(decl, tables, prs))
    return out
