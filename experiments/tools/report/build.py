"""Build the report: results directories -> a view model -> one self-contained HTML file (experiments/tools/report/README.md).

All content goes through Jinja2 autoescaping: model output can hold anything, including markup.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

from serving.bench.measure import FIGURES
from serving.bench.summary import RATIO_HEADS
from experiments.tools.calibrate.reviews import COLUMNS, consensus_note, table_rows
from experiments.common.grade import grades as typed_grades, split_name
from experiments.core.conditions import EFFECT_COLUMNS, EFFECT_NOTE, effect_rows, relative_effects, settings_columns
from experiments.core.record import FIELDS, RUNNER_FIELDS, is_typed, turns
from experiments.core.registry import study_of, table_sources
from experiments.core.scorers import figure_cell, find
from experiments.tools.compare.run import run_figures
from experiments.tools.report.collect import find_runs, full_record, load_run_dir
from experiments.tools.rescore.run import agreement_table, grade_table, panel_line
from experiments.tables.build import declaration_for, declarations, experiment_of, study_tables
from experiments.tables.plots import figure_png
from experiments.tables.render import table_view
from finetune.report import loss_figure_png

TEMPLATES = Path(__file__).with_name("templates")
OUTCOMES = ("correct", "incorrect", "mixed", "rated", "unscored", "failed")  # a case's, by its typed scores (outcome)


def _is_scalar(v) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v).lower() if isinstance(v, bool) else "-"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"
    if isinstance(v, (list, tuple)) and all(_is_scalar(x) for x in v):
        text = ", ".join(fmt(x) for x in v)
        return text if len(text) <= 200 else text[:200] + " ..."
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False, default=str)[:300]
    return str(v)


# ---------------------------------------------------------------- metrics tables

def metric_tables(data, title: str = "overview") -> list[dict]:
    """Flatten nested metrics into tables: scalars of one level -> key/value table; a dict of
    flat dicts -> one matrix (rows x union of keys); a list of dicts -> one table."""
    if not isinstance(data, dict):
        return [{"title": title, "columns": ["value"], "rows": [[fmt(data)]]}]
    pairs, tables = [], []
    for k, v in data.items():
        name = f"{title}.{k}" if title != "overview" else str(k)
        if _is_scalar(v) or (isinstance(v, list) and all(_is_scalar(x) for x in v)):
            pairs.append([str(k), fmt(v)])
        elif isinstance(v, list) and all(isinstance(x, dict) for x in v):
            cols = list(dict.fromkeys(c for x in v for c in x))
            if len(cols) > 10:  # wide: one column per entry instead
                tables.append({"title": name, "columns": ["", *(str(i + 1) for i in range(len(v)))],
                               "rows": [[c, *(fmt(x.get(c)) for x in v)] for c in cols]})
            else:
                tables.append({"title": name, "columns": cols, "rows": [[fmt(x.get(c)) for c in cols] for x in v]})
        elif isinstance(v, dict) and v and all(isinstance(x, dict) and all(_is_scalar(y) for y in x.values()) for x in v.values()):
            cols = list(dict.fromkeys(c for x in v.values() for c in x))
            tables.append({"title": name, "columns": ["", *cols], "rows": [[str(r), *(fmt(x.get(c)) for c in cols)] for r, x in v.items()]})
        elif isinstance(v, dict):
            tables += metric_tables(v, name)
        else:
            pairs.append([str(k), fmt(v)])
    head = [{"title": title, "columns": ["metric", "value"], "rows": pairs}] if pairs else []
    return head + tables


# ---------------------------------------------------------------- cases

def own_values(rec: dict) -> list:
    """The scored values of the record's own typed scores (a rescore's ``@JUDGE`` grades left out)."""
    return [g.value for name, g in typed_grades(rec).items() if g.scored and split_name(name)[2] is None]


def outcome(rec: dict) -> str:
    """failed (no answer: never scored), else from the record's own typed scores (a rescore's ``@JUDGE`` grades left
    out): correct / incorrect when every scored value is 1 / 0, mixed when some are 1 and some 0, rated when one is
    another value (a rating, a fraction, named values), unscored when none is scored."""
    if rec.get("status") == "failed" or rec.get("error") or rec.get("request_error"):
        return "failed"
    values = own_values(rec)
    if not values:
        return "unscored"
    if any(isinstance(v, dict) or v not in (0, 1) for v in values):
        return "rated"
    return "correct" if all(v == 1 for v in values) else "incorrect" if all(v == 0 for v in values) else "mixed"


def _text(v, sep: str = "\n\n") -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return sep.join(v)
    return json.dumps(v, indent=2, ensure_ascii=False, default=str)


def _short(v, n: int = 160):
    return v[:n] + " ..." if isinstance(v, str) and len(v) > n else v


def score_rows(rec: dict, scorers=()) -> list[list[str]] | None:
    """A record's typed scores (experiments/common/grade.py), one row each: name and what its scorer asks, value
    (or not checkable / unscored), who decided (the judge model and its prompt hash, or the rule), the answer judged."""
    rows = []
    for name, g in typed_grades(rec).items():
        j = g.judge or {}
        who = " ".join(x for x in (str(j["model"]) if j.get("model") else "", f"prompt {j['prompt_hash']}" if j.get("prompt_hash") else "",
                                   f"rule {j['rule']}" if j.get("rule") else "") if x) or (f"rule {g.source}" if g.source else "-")
        value = "not checkable" if g.skipped else fmt(dict(g.value) if isinstance(g.value, dict) else g.value) if g.value is not None else "unscored"
        sc = find(scorers, name)
        asked = sc.question_of(split_name(name)[1]) if sc else ""
        rows.append([name + (f" ({asked})" if asked else ""), value, who, fmt(_short(g.answer)) if g.answer is not None else ""])
    return rows or None


def judges_view(run: dict) -> dict | None:
    """A rescored run (`medstack rescore`): its judges side by side per part and each one's agreement with the run's own
    judge, from metrics.json's ``rescore`` section."""
    m = run["metrics"].get("rescore") if isinstance(run.get("metrics"), dict) else None
    if not isinstance(m, dict) or not m.get("judges"):
        return None
    grade_cols, grade_rows = grade_table(m)
    agree_cols, agree_rows = agreement_table(m)
    return {"tables": [{"caption": f"judge {m.get('judge')} ({m.get('scale')} scale): mean of scored values (n scored, unscored)",
                        "columns": grade_cols, "rows": grade_rows},
                       {"caption": "agreement with the run's own judge over the items both scored", "columns": agree_cols, "rows": agree_rows}],
            "note": panel_line(m)}


def case_view(rec: dict, run_model: str, scorers=()) -> dict:
    """One case of the typed record (experiments/core/record.py): its transcript, inputs, answer against target,
    scores; the study's own metadata as JSON."""
    error, o = rec.get("error") or rec.get("request_error"), outcome(rec)
    inputs = rec.get("inputs") if isinstance(rec.get("inputs"), dict) else {}
    meta = rec.get("metadata") if isinstance(rec.get("metadata"), dict) else {}
    if not is_typed(rec):  # a kind no study upgrades: its own fields, whatever they are
        meta = {k: v for k, v in rec.items() if k not in (*FIELDS, *RUNNER_FIELDS, "request_error")}
    return {
        "id": str(rec.get("id", "?")),
        "model": str(meta.get("model") or run_model or "?"),
        "outcome": o,
        "badge": "rated " + ", ".join(fmt(v) for v in own_values(rec) if not isinstance(v, dict)) if o == "rated" else o,
        "turns": [{"agent": role, "turn": i, "content": _text(text)} for i, (role, text) in enumerate(turns(rec))],
        "scores": score_rows(rec, scorers),
        "inputs": [[str(k), fmt(_short(v, 400)) if not isinstance(v, str) else _short(v, 400)] for k, v in inputs.items()] or None,
        "answer": _text(rec["answer"]) if rec.get("answer") is not None else None,
        "target": _text(rec["target"]) if rec.get("target") is not None else None,
        "error": _text(error) if error else None,
        "traceback": rec.get("traceback"),
        "rest": json.dumps(meta, indent=2, ensure_ascii=False, default=str) if meta else None,
        "calls": json.dumps(rec["calls"], indent=2, ensure_ascii=False, default=str) if rec.get("calls") else None,
        "n_calls": len(rec.get("calls") or []),
    }


# ---------------------------------------------------------------- runs

def _run_model(run: dict) -> str:
    roles = run["config"].get("roles") if isinstance(run["config"].get("roles"), dict) else {}
    spec = roles.get("default") or next(iter(roles.values()), None) if roles else None
    if not spec and run["config"].get("model"):
        spec = run["config"]["model"]
    if not spec and isinstance(run.get("bench"), dict):
        spec = (run["bench"].get("config") or {}).get("model")
    if not spec and isinstance(run.get("identity"), dict):
        models = run["identity"].get("models") or {}
        first = models.get("default") or next(iter(models.values()), None) if isinstance(models, dict) else None
        spec = first.get("alias") if isinstance(first, dict) else first
    return str(spec).split("@", 1)[0] if spec else ""  # a label only: references are parsed in serving/refs.py


def review_calibration_view(c: dict) -> dict:
    """A `medstack calibrate RUN_DIR --labels` result (reviews/calibration-<judge>.json): its table, as in its summary."""
    s, scale = c.get("sample") or {}, c.get("scale") or {}
    weighted = any((v.get("vs_judge") or {}).get("weighted") for v in (c.get("reviewers") or {}).values())
    return {"judge": c.get("judge"), "columns": COLUMNS, "rows": table_rows(c),
            "caption": f"judge decisions vs clinicians' blind review labels, {scale.get('kind')} scale {scale.get('values') or '0-1'}; 95% CIs (stratified bootstrap)",
            "note": f"sample {s.get('size')} of {s.get('population')} decisions, {len(s.get('strata') or {})} strata, seed {s.get('seed')}; "
                    + ("weights N_h/m_h undo the stratified sampling" if weighted else "every stratum sampled at the same rate (no weights)")
                    + (f"; consensus: the label more than half of {', '.join(c['consensus']['reviewers'])} gave ({consensus_note(c['consensus'])})"
                       if c.get("consensus") else "")}


def run_view(run: dict, idx: int, max_cases: int) -> dict:
    model = _run_model(run) or str(((run.get("finetune") or {}).get("metrics") or {}).get("base") or "")
    study = study_of(run["run"])
    scorers = study.scorers if study is not None else ()
    cases = [case_view(full_record(run, i), model, scorers) for i in range(min(max_cases, len(run["records"])))]
    outcomes = [outcome(r) for r in run["records"]]
    means = run_figures(run["run"], study)
    metrics = run["metrics"] if run["metrics"] is not None else (run["bench"] or {}).get("results") if run["bench"] else None
    run_stats = (run["metrics"] or {}).get("run", {}) if isinstance(run["metrics"], dict) else {}
    if run["bench"] and not run_stats:
        head = run["bench"].get("headline") or {}
        run_stats = {"output_tokens_per_s": head.get("vllm_output_tokens_per_s")}
    cfg = run["config"]
    kind = cfg.get("experiment") or cfg.get("study") or ("bench" if run["bench"] else "finetune" if run.get("finetune") else "")
    return {
        "key": f"run{idx}",
        "path": run["path"],
        "name": "/".join(Path(run["path"]).parts[-2:]),
        "study": str(kind),
        "model": model,
        "roles": {str(k): str(v) for k, v in cfg["roles"].items()} if isinstance(cfg.get("roles"), dict) else {},
        "n_records": len(run["records"]),
        "n_shown": len(cases),
        "n": {o: sum(x == o for x in outcomes) for o in OUTCOMES},
        "score_means": "; ".join(f"{x['score']} {fmt(x['value'])}" for x in means if x["value"] is not None and x["metric"] == "mean") or "-",
        "tokens_per_s": fmt(run_stats.get("output_tokens_per_s")) if run_stats.get("output_tokens_per_s") is not None else "-",
        "wall_s": fmt(run_stats.get("wall_seconds")) if run_stats.get("wall_seconds") is not None else "-",
        "metric_tables": metric_tables(metrics) if metrics is not None else [],
        "study_tables": study.report_run(run) if study is not None else [],
        "score_table": [[x["score"], x["metric"], figure_cell(x)] for x in means],
        "judges": judges_view(run),
        "review_calibrations": [review_calibration_view(c) for c in run.get("review_calibrations") or []],
        # a fine-tuning run's loss.png is drawn again with the best checkpoint marked (finetune_view)
        "charts": [c for c in run["charts"] if not (run.get("finetune") and c["name"] == "loss.png")],
        "summary": run["summary"],
        "config_text": run["config_text"],
        "identity": json.dumps(run["identity"], indent=2, ensure_ascii=False) if run["identity"] is not None else "",
        "bench_config": json.dumps(run["bench"].get("config"), indent=2) if run["bench"] else "",
        "warnings": run["warnings"],
        "finetune": finetune_view(run),
        "bench_view": bench_view(run),
        "cases": cases,
    }


def _png(data: bytes | None) -> str | None:
    return base64.b64encode(data).decode("ascii") if data else None


def finetune_view(run: dict) -> dict | None:
    """Loss curves (train, valid, best checkpoint marked), the headline numbers, the recipe and the adapter hash."""
    ft = run.get("finetune")
    if not ft:
        return None

    m = ft["metrics"]
    keys = ("task", "base", "device", "dtype", "world_size", "global_step", "planned_steps", "best_step", "best_valid_loss",
            "final_valid_loss", "first_loss", "last_loss", "train_tokens", "train_tokens_per_s", "train_seconds", "stopped_early")
    return {"loss_png": _png(loss_figure_png(m)), "rows": [[k, fmt(m.get(k))] for k in keys if k in m],
            "recipe": ft["recipe"], "adapter_hash": ft["adapter_hash"], "adapter": ft["adapter"]}


def bench_view(run: dict) -> dict | None:
    """A benchmark run: its headline and the vLLM / transformers ratio table (the plot is its bench.png)."""
    b = run.get("bench")
    if not isinstance(b, dict):
        return None

    rows = [[str(r.get("concurrency")), str(r.get("baseline_batch")), *(("-" if (r.get("figures") or {}).get(k) is None else f"{r['figures'][k]:.2f}x") for k in FIGURES)]
            for r in b.get("ratios") or []]
    head = b.get("headline") or {}
    line = None
    if head.get("ratio") is not None:
        line = (f"vLLM at concurrency {head.get('vllm_concurrency')}: {fmt(head.get('vllm_output_tokens_per_s'))} output tok/s = "
                f"{head['ratio']:.2f}x the best transformers figure ({fmt(head.get('best_hf_output_tokens_per_s'))} tok/s at batch {head.get('best_hf_batch')})")
    return {"columns": ["vLLM conc", "vs HF batch", *RATIO_HEADS], "rows": rows, "headline": line,
            "host": json.dumps(b.get("host"), default=str) if b.get("host") else None}


SECTION_TITLES = {"finetune": "Fine-tuning (LoRA)", "bench": "Benchmark: serving throughput", "other": "Other runs"}


def section_of(run: dict) -> str:
    decl = declaration_for(experiment_of(run), table_sources())
    if decl:
        return decl.study
    if run.get("finetune"):
        return "finetune"
    if run.get("bench"):
        return "bench"
    return "other"


def paper_sections(raw_runs: list[dict], views: list[dict]) -> list[dict]:
    """The report's sections in order: each study's paper tables and figures over its runs, then fine-tuning,
    benchmark and other runs."""
    keys = [section_of(r) for r in raw_runs]
    sources = table_sources()
    with_scorers = [{**r, "scorers": (st.scorers if (st := study_of(r["run"])) else ())} for r in raw_runs]
    computed = {st.decl.study: st for st in study_tables(with_scorers, sources)}
    out = []
    for decl in declarations(sources):
        runs = [v for v, k in zip(views, keys) if k == decl.study]
        if not runs:
            continue
        told_apart = conditions_view([r for r, k in zip(raw_runs, keys) if k == decl.study], runs)
        st = computed.get(decl.study)
        tables = []
        for t in (st.tables if st else []):
            view = table_view(t)
            view["figure"] = _png(figure_png(t))
            tables.append(view)
        warnings = [w for pr in (st.runs if st else []) for w in pr.warnings]
        out.append({"key": decl.study, "title": decl.title, "paper": decl.paper, "tables": tables, "runs": runs, "warnings": warnings,
                    "roles_note": roles_note(runs), **told_apart})
    for key in ("finetune", "bench", "other"):
        runs = [v for v, k in zip(views, keys) if k == key]
        if runs:
            out.append({"key": key, "title": SECTION_TITLES[key], "paper": None, "tables": [], "runs": runs, "warnings": []})
    return out


def conditions_view(raw_runs: list[dict], views: list[dict]) -> dict:
    """A study section's runs told apart: a column per setting that differs among them (``settings``), and the effects its paper reports relative to a baseline run where that run is among them
    (``effects``): the same computation as `medstack compare` (experiments/core/conditions.py)."""
    studies = [study_of(r["run"]) for r in raw_runs]
    study = studies[0] if studies and all(type(s) is type(studies[0]) for s in studies) else None
    cls = study.settings_cls if study is not None else None
    keys, values = settings_columns([r["config"] for r in raw_runs], cls)
    labels = [str((r["config"] or {}).get("name") or v["name"]) for r, v in zip(raw_runs, views)]
    labels = [lbl if labels.count(lbl) == 1 else f"{lbl} ({v['name']})" for lbl, v in zip(labels, views)]
    out: dict = {"settings": {"columns": ["run", *keys], "rows": [[lbl, *v] for lbl, v in zip(labels, values)]} if keys else None,
                 "effects": None}
    if study is not None and study.effects:
        effects = relative_effects([(lbl, r["config"], r["run"].finished) for lbl, r in zip(labels, raw_runs)], cls, study.effects, study.scorers)
        if effects:
            out["effects"] = {"columns": EFFECT_COLUMNS, "rows": effect_rows(effects), "note": EFFECT_NOTE}
    return out


def roles_note(runs: list[dict]) -> str:
    """Over a section's runs: which roles had one model in every run ('patient: X, grader: Y for every run')
    and which varied; empty for fewer than two runs with a role map."""
    maps = [r["roles"] for r in runs if r.get("roles")]
    if len(maps) < 2:
        return ""
    roles = list(dict.fromkeys(k for m in maps for k in m))
    fixed = [k for k in roles if len({m.get(k) for m in maps}) == 1]
    varied = [k for k in roles if k not in fixed]
    parts = ([f"{', '.join(f'{k}: {maps[0][k]}' for k in fixed)} for every run"] if fixed else []) + \
            ([f"{', '.join(varied)}: the model of each run"] if varied else [])
    return "Roles: " + "; ".join(parts) + "."


def render(runs: list[dict], sources: list[str], sections: list[dict] | None = None):
    """The report's HTML, in chunks (written as they come: a paper-scale report is never one string in memory)."""
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"], default=True))
    models = sorted({c["model"] for r in runs for c in r["cases"]} | {r["model"] for r in runs if r["model"]})
    if sections is None:
        sections = [{"key": "runs", "title": "Runs", "paper": None, "tables": [], "runs": runs, "warnings": []}]
    return env.get_template("report.html.j2").generate(
        runs=runs, models=models, sources=sources, sections=sections, outcomes=OUTCOMES,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        n_cases=sum(len(r["cases"]) for r in runs),
    )


def build_report(paths: list[str], out: str | Path, max_cases: int = 500) -> Path:
    dirs = find_runs(paths)
    raw = [load_run_dir(d) for d in dirs]
    runs = [run_view(r, i, max_cases) for i, r in enumerate(raw)]
    sections = paper_sections(raw, runs)
    for r in runs:
        for w in r["warnings"]:
            print(f"warning: {w}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(render(runs, paths, sections))
    return out
