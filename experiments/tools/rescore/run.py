"""`medstack rescore RUN --judge STEP --judge-model M --out RUN2` (or ``--panel M1,M2,M3``): ask one judge step of a finished
run again, with other judge models, over the stored answers (experiments/tools/rescore/README.md: RUN2's records, panel rules,
config, metrics and summary).

The rescore is a study of its own built for the source run (:class:`RescoreStudy`), so it goes through the one runner
(experiments/core/runner.py): resume, the failure policy, the call log, the response cache, servers started and
stopped, ``--dry-run``. Its solver runs the source study's scorer (experiments/core/scorers.py) once per judge model
over each stored record, so the only requests sent are the judge's. Nothing of the source folder is written.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

from pydantic import ConfigDict, ValidationError

from experiments.common.grade import Grade, grades, score_name, split_name
from experiments.common.markdown import md_table
from experiments.common.stats import fleiss_kappa, weighted_kappa
from experiments.core.config import ConfigError, RunSettings, validation_lines
from experiments.core.deviations import settings_deviations
from experiments.core.scorers import Scorer, by_judge, find, on_scale, panel_grade
from experiments.core.results import Run
from experiments.core.study import CaseContext, Study
from models.errors import DataError
from serving.refs import ModelRef

# what the runner adds to every record: the source's are dropped, RUN2's own are the rescore's
RUNNER_FIELDS = ("calls", "usage", "roles", "served_dtype", "seconds", "status", "answer_formats", "protocol")
PANEL = "panel"
OWN = "run"  # the source run's own judge, in metrics.json
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*$")  # no '/', '@' or '|': score names and review ids split on them


class RescoreSettings(RunSettings):
    """The source run's settings (every key of its config.yaml, kept as written) with the judge roles, this run's
    ``out`` and the ``rescore`` block: ``{source, judge, models: {label: ref}, roles: {role: label}, source_roles}``."""

    model_config = ConfigDict(extra="allow")
    rescore: dict = {}


def judge_models(model: str | None, panel: str | None) -> dict[str, str]:
    """``--judge-model REF`` or ``--panel [LABEL=]REF,...`` -> {label: model reference}; a label defaults to the
    reference's alias. Bad input raises ConfigError (exit 2)."""
    if model and panel:
        raise ConfigError("--judge-model and --panel together: give one (--judge-model REF: one judge; --panel REF1,REF2,REF3: a panel)")
    if not model and not panel:
        raise ConfigError("rescore needs --judge-model REF (one judge) or --panel REF1,REF2,REF3 (a judge panel)")
    items = [model] if model else [x.strip() for x in str(panel).split(",") if x.strip()]
    flag = "--judge-model" if model else "--panel"
    out: dict[str, str] = {}
    for item in items:
        label, sep, ref = item.partition("=")
        if not sep:
            label, ref = "", item
        parsed = ModelRef.parse(ref.strip(), where=f"{flag} {item!r}")
        label = label.strip() or parsed.alias
        if not LABEL.match(label) or label == PANEL:
            raise ConfigError(f"{flag} {item!r}: the label {label!r} must be letters, digits, '.', '_' or '-' (and not {PANEL!r})")
        if label in out:
            raise ConfigError(f"{flag}: two judges labelled {label!r}; name each LABEL=REF, e.g. a={ref.strip()},b={ref.strip()}")
        out[label] = str(parsed)
    if panel and len(out) < 2:
        raise ConfigError(f"--panel {panel!r}: a panel needs at least two judges (one judge: --judge-model)")
    return out


def judge_roles(models: dict[str, str]) -> dict[str, str]:
    """role -> label: ``judge`` for one model, ``judge1``..``judgeN`` for a panel (in the order given)."""
    labels = list(models)
    return {"judge": labels[0]} if len(labels) == 1 else {f"judge{i}": label for i, label in enumerate(labels, 1)}


def find_judge(run: Run, step: str, study: Study | None) -> Scorer:
    """The source study's scorer ``step``, which must be a model's decision; ConfigError (exit 2) naming the run's
    scorers that can be asked again otherwise."""
    scorers = study.scorers if study is not None else ()
    steps = [s.name for s in scorers if s.rescorable]
    listed = f"its judge steps: {', '.join(steps)}" if steps else "its study declares no judge that can be asked again"
    scorer = next((s for s in scorers if s.name == step), None)
    if scorer is None:
        raise ConfigError(f"--judge {step}: {run.path} ({run.experiment or 'no experiment'}) has no judge step {step!r}; {listed}")
    if not scorer.rescorable:
        raise ConfigError(f"--judge {step}: {run.experiment}'s {step} cannot be asked again over a stored answer; {listed}")
    return scorer


def parts_of(record: dict, step: str) -> list[str | None]:
    """The parts of ``step`` the run's own judge graded in this record (None: the record is one item)."""
    return [part for name in (record.get("scores") or {}) for s, part, who in [split_name(name)] if s == step and who is None]


def _validated(cls: type[RunSettings], data: dict, where: Path):
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        lines = "; ".join(validation_lines(e))
        raise ConfigError(f"{where}: its settings do not validate as {cls.__name__} ({lines})") from None


def rescore_settings(run: Run, step: str, models: dict[str, str], out: Path, *, concurrency: int | None = None,
                     use_cache: bool = True, allow_remote: bool = False) -> RescoreSettings:
    """RUN2's settings: the source's config.yaml with the judge roles (and no adapters: the source's were for the model
    under test), this run's ``out`` and connection flags, and the ``rescore`` block."""
    base = {k: v for k, v in run.config.items() if k != "prompt_files"}
    roles = judge_roles(models)
    data = {**base, "experiment": base.get("experiment") or run.experiment, "out": str(out), "lora": {}, "limit": None, "sample": None,
            "roles": {role: models[label] for role, label in roles.items()}, "use_cache": use_cache, "allow_remote": allow_remote,
            "rescore": {"source": str(run.path), "judge": step, "models": dict(models), "roles": roles,
                        "source_roles": base.get("roles") or {}}}
    if concurrency is not None:
        data["concurrency"] = concurrency
    return _validated(RescoreSettings, data, run.path / "config.yaml")


def check_out(source: Path, out: Path) -> None:
    """RUN2 is never RUN nor inside it: the source folder is not written."""
    src, dst = source.resolve(), out.resolve()
    if dst == src or src in dst.parents:
        raise ConfigError(f"--out {out}: that is the source run {source} (or inside it); the source is never written, choose another --out")


class RescoreStudy(Study):
    """One source run's judge step asked again by other models (see the module docstring)."""

    settings_cls = RescoreSettings
    case_noun = "records"

    def __init__(self, source: Run, judge: Scorer, models: dict[str, str], study: Study | None = None):
        self.source, self.judge, self.models = source, judge, dict(models)
        self.scorers = study.scorers if study is not None else (judge,)  # how its scores aggregate; none is run again but the judge
        self.labels = judge_roles(models)  # role -> label
        self.roles = tuple(self.labels)
        self.primary_role = self.roles[0]
        self.name = source.experiment  # identity.json's experiment: RUN2 is a run of the source's study
        self.prompts = study.prompts if study is not None else None  # the judge's templates: pinned, an edit refuses a resume
        # a results kind no registered study writes (a calibration's): its config read as it is, keys as attributes
        cls = study.settings_cls if study is not None else RescoreSettings
        base = {k: v for k, v in source.config.items() if k not in ("prompt_files", "rescore")}  # a rescored run rescored again
        own = _validated(cls, base, source.path / "config.yaml")
        # the source study's settings, as its judge reads them, with the judge roles added (Grade.judge names settings.roles[role])
        # the source's settings against the authors' (as its metrics.json says; else as its settings compare today)
        self.deviations = (source.metrics or {}).get("deviations") or settings_deviations(own)
        self.ask_settings = own.model_copy(update={"roles": {**own.roles, **{r: models[label] for r, label in self.labels.items()}}})

    @property
    def panel(self) -> bool:
        return len(self.models) > 1

    def load_cases(self, settings: RescoreSettings) -> list[dict]:
        records = self.source.finished
        if not records:
            raise DataError(f"{self.source.path}/records.jsonl: no finished record to rescore")
        return records

    def scorers_for(self, settings) -> list:
        return []  # the judge is asked in solve, once per judge model

    async def solve(self, ctx: CaseContext, case: dict, settings: RescoreSettings) -> dict:
        record = {k: v for k, v in case.items() if k not in RUNNER_FIELDS}
        scores = dict(case.get("scores") or {})
        own = set(parts_of(case, self.judge.name))
        if own:
            members: dict[str, list[Grade]] = {}
            for role, label in self.labels.items():
                for name, g in (await self.judge.run(ctx, case, self.ask_settings, role)).items():
                    step, part, _ = split_name(name)
                    if part not in own:
                        continue
                    if not g.judge:  # who decided: the model of this role
                        g = replace(g, judge={"model": self.ask_settings.roles[role]})
                    scores[score_name(step, part, label)] = g.to_json()
                    members.setdefault(part, []).append(g)
            if self.panel:
                for part, grades_ in members.items():
                    scores[score_name(self.judge.name, part, PANEL)] = panel_grade(grades_, ordinal=self.judge.scale.ordinal, name=PANEL).to_json()
        record["scores"] = scores
        return record

    def describe(self, settings: RescoreSettings) -> list[str]:
        who = ", ".join(f"{label} = {ref}" for label, ref in self.models.items())
        return [f"rescore of {self.source.path}: judge step {self.judge.name} asked again by {who}"
                + (" (a panel: a majority of all members for binary grades, the mean of ordinal ones)" if self.panel else "")
                + "; no other request is made"]

    def metrics(self, records: list[dict], settings: RescoreSettings) -> dict:
        return {"records": len(records), "rescore": rescore_metrics(records, self.judge, self.models, settings.rescore),
                "deviations": self.deviations}

    def summary(self, metrics: dict, settings: RescoreSettings, run) -> str:
        return rescore_summary(metrics["rescore"], metrics["records"])


# -- metrics ------------------------------------------------------------------------------------------------------

def _clean(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 4)


def _judged(records: list[dict], step: str, who: list[str]) -> dict[str, dict[tuple, Grade]]:
    """judge -> {(record id, part): grade} for the step's grades of the run's own judge (``OWN``) and of ``who``."""
    out: dict[str, dict[tuple, Grade]] = {w: {} for w in [OWN, *who]}
    for r in records:
        for name, g in grades(r).items():
            s, part, by = split_name(name)
            key = OWN if by is None else by
            if s == step and key in out and not isinstance(g.value, dict):
                out[key][(str(r["id"]), part)] = g
    return out


def agreement(own: dict[tuple, Grade], other: dict[tuple, Grade], judge: Scorer) -> dict:
    """Agreement of ``other`` with the run's own judge over the items both scored that a judge decided on either side
    (``by_rule``: the items both sides left to a rule, e.g. 0 for no answer, left out): percent (exact)
    agreement and Cohen's kappa (binary) or linear-weighted kappa and the mean |difference| (ordinal; a panel's mean
    rating is put on the scale by :func:`~experiments.core.scorers.on_scale` for agreement and kappa, not for the
    difference); unit scale: the mean |difference| only."""
    both = [k for k in own if k in other and own[k].scored and other[k].scored]
    keys = [k for k in both if by_judge(own[k]) or by_judge(other[k])]
    a, b = [float(own[k].value) for k in keys], [float(other[k].value) for k in keys]
    kind = judge.scale.kind
    out: dict = {"n": len(keys), "by_rule": len(both) - len(keys),
                 "mean_abs_diff": _clean(sum(abs(x - y) for x, y in zip(a, b)) / len(keys)) if keys else None}
    if kind == "unit":
        return {**out, "percent_agreement": None, "kappa": None, "kappa_kind": None}
    ca, cb = [on_scale(x, judge.scale) for x in a], [on_scale(y, judge.scale) for y in b]
    cats = judge.scale.values or sorted(set(ca) | set(cb))
    return {**out, "percent_agreement": _clean(100 * sum(x == y for x, y in zip(ca, cb)) / len(keys)) if keys else None,
            "kappa": _clean(weighted_kappa(ca, cb, categories=sorted(cats), weights="linear")) if keys else None,
            "kappa_kind": "cohen" if kind == "binary" else "linear-weighted"}


def _part_stats(judged: dict[tuple, Grade]) -> dict:
    out: dict = {}
    for (rid, part), g in sorted(judged.items(), key=lambda kv: (str(kv[0][1]), kv[0][0])):
        s = out.setdefault(part or "-", {"sum": 0.0, "n": 0, "unscored": 0})
        if g.scored:
            s["sum"] += float(g.value)
            s["n"] += 1
        else:
            s["unscored"] += 1
    return {p: {"mean": _clean(s["sum"] / s["n"]) if s["n"] else None, "n": s["n"], "unscored": s["unscored"]} for p, s in out.items()}


def rescore_metrics(records: list[dict], judge: Scorer, models: dict[str, str], block: dict) -> dict:
    labels = list(models)
    who = labels + ([PANEL] if len(labels) > 1 else [])
    judged = _judged(records, judge.name, who)
    own_model = (block.get("source_roles") or {}).get(judge.role)
    out: dict = {"source": block.get("source"), "judge": judge.name, "scale": judge.scale.kind, "role": judge.role,
                 "models": {OWN: own_model, **models, **({PANEL: "+".join(labels)} if len(labels) > 1 else {})},
                 "judges": {w: _part_stats(judged[w]) for w in [OWN, *who]},
                 "agreement": {w: agreement(judged[OWN], judged[w], judge) for w in who}}
    if len(labels) > 1:
        scored = [k for k in judged[labels[0]] if all(k in judged[m] and judged[m][k].scored for m in labels)]
        keys = [k for k in scored if any(by_judge(judged[m][k]) for m in labels)]
        ratings = [[on_scale(float(judged[m][k].value), judge.scale) for m in labels] for k in keys]
        ordinal_unit = judge.scale.kind == "unit"
        out["panel_agreement"] = {"members": labels, "n": len(keys), "by_rule": len(scored) - len(keys),
                                  "fleiss_kappa": None if ordinal_unit or not keys else _clean(fleiss_kappa(ratings, list(judge.scale.values) or None))}
    return out


def _fmt(v, pct: bool = False) -> str:
    return "-" if v is None else (f"{v:.1f}%" if pct else f"{v:.3f}")


def grade_table(m: dict) -> tuple[list[str], list[list[str]]]:
    """metrics.json's ``rescore`` -> the judges side by side: one row per part, one column per judge (the run's own
    first), each cell the mean of scored values (n scored, unscored). summary.md and the report show it."""
    judges = list(m["judges"])
    parts = sorted({p for w in judges for p in m["judges"][w]})
    rows = [[p, *("-" if (s := m["judges"][w].get(p)) is None else f"{_fmt(s['mean'])} ({s['n']}, {s['unscored']})" for w in judges)]
            for p in parts]
    return ["part", *("the run's own" if w == OWN else w for w in judges)], rows


def agreement_table(m: dict) -> tuple[list[str], list[list[str]]]:
    """Each new judge (and the panel) against the run's own, over the items both scored that a judge decided."""
    rows = [[w, str(a["n"]), _fmt(a["percent_agreement"], pct=True), "-" if a["kappa"] is None else f"{a['kappa']:.3f} ({a['kappa_kind']})",
             _fmt(a["mean_abs_diff"])] for w, a in m["agreement"].items()]
    return ["judge", "n", "agreement", "kappa", "mean abs diff"], rows


def panel_line(m: dict) -> str | None:
    pa = m.get("panel_agreement")
    return None if not pa else (f"Panel's internal agreement: Fleiss' kappa {_fmt(pa['fleiss_kappa'])} over the {pa['n']} items every member "
            f"({', '.join(pa['members'])}) scored ({pa.get('by_rule', 0)} that a rule decided for every member left out).")


def rescore_summary(m: dict, n_records: int) -> str:
    new = [f"{w} = {ref}" for w, ref in m["models"].items() if w not in (OWN, PANEL)]
    lines = [f"# Rescore: judge {m['judge']} asked again", "",
             f"Source run: {m['source']} ({n_records} records; its own {m['judge']} judge, role {m['role']}: {m['models'].get(OWN) or 'unknown'}). "
             f"New judges: " + ", ".join(new)
             + (f"; the panel is the {'mean' if m['scale'] != 'binary' else 'majority of all members (otherwise unscored)'} of their grades." if PANEL in m["judges"] else "."),
             "", f"## Grades ({m['scale']} scale): mean of scored values (n scored, unscored)", "", *md_table(*grade_table(m)),
             "", "## Agreement with the run's own judge (items both scored)", "", *md_table(*agreement_table(m)), "",
             "Left out of agreement, the items no judge decided (a rule on both sides, e.g. 0 for no answer): "
             + ", ".join(f"{w} {a.get('by_rule', 0)}" for w, a in m["agreement"].items()) + "."]
    if line := panel_line(m):
        lines += ["", line]
    return "\n".join(lines) + "\n"


def prepare_rescore(run_dir: Path, step: str, *, model: str | None = None, panel: str | None = None, out: Path,
                    concurrency: int | None = None, use_cache: bool = True, allow_remote: bool = False, log=print):
    """Everything checked before a server starts: the judge models, the source run and its judge, RUN2's settings.
    Returns (study, settings, cases) for the runner; bad input raises a MedstackError naming it (exit 2)."""
    from experiments.core import registry
    from experiments.core.runner import prepare_run

    models = judge_models(model, panel)
    check_out(Path(run_dir), Path(out))
    run = registry.open_run(run_dir)
    source = registry.study_of(run)
    judge = find_judge(run, step, source)
    study = RescoreStudy(run, judge, models, source)
    settings = rescore_settings(run, step, models, Path(out), concurrency=concurrency, use_cache=use_cache, allow_remote=allow_remote)
    settings, cases = prepare_run(study, settings)
    if study.prompts is not None and run.config.get("prompt_files"):
        then, now = run.config["prompt_files"], study.prompts.file_hashes()
        edited = sorted(n for n in then if n in now and now[n] != then[n])
        if edited:
            log(f"note: prompt file(s) {', '.join(edited)} changed since {run.path} was made; the judge is asked with today's text")
    judged = sum(1 for r in cases if parts_of(r, step))
    if not judged:
        log(f"note: no finished record of {run.path} has a {step} score; every record is carried over as it is")
    return study, settings, cases
