"""`medstack sweep STUDY --models A,B,C [study options]`: one study, once per model, under one sweep folder
(docs/running-studies.md, A study over several models: the folder's layout, roles, resume, exit codes).

Each entry runs through :func:`run_entry` (the study's own command body), then :func:`join`; ``--executor slurm``
(experiments/tools/sweep/slurm.py) runs the same checked plan through the same two functions as Slurm jobs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import typer

from experiments.common.markdown import md_table
from experiments.core import registry
from experiments.core.commands import COMMON, build_settings, parse_role_items, run_command
from experiments.core.config import ConfigError, parse_set, read_yaml_mapping
from experiments.core.results import check_owner, claim_dir, latest_records, make_results_dir
from experiments.core.runlock import RunDirInUse, RunLock
from experiments.core.runner import prepare_run
from experiments.datasets.registry import resolve_data
from experiments.tools.report.build import build_report
from models.errors import MedstackError, StorageError
from serving.launcher import plan_gpu_shares, will_start
from serving.refs import ModelRef


@dataclass
class ModelRun:
    label: str
    model: str
    out: Path
    status: str = "pending"  # finished | skipped (finished earlier) | incomplete (failed cases) | error | in use | dry run (nothing sent)
    message: str = ""
    roles: dict[str, str] = field(default_factory=dict)  # role -> model reference of this run


@dataclass
class SweepOutcome:
    runs: list[ModelRun]
    published: list[Path] = field(default_factory=list)
    compare: Path | None = None
    report: Path | None = None
    varied: tuple[str, ...] = ()
    idle: tuple[str, ...] = ()  # roles the study does not call with these settings (left on each run's model)

    @property
    def exit_code(self) -> int:
        return 3 if any(r.status in ("error", "incomplete") for r in self.runs) else 0


def parse_models(text: str) -> list[str]:
    models = [m.strip() for m in (text or "").split(",") if m.strip()]
    if not models:
        raise ConfigError("--models: give at least one model, e.g. --models embedded,llama3-8b-instruct")
    for m in models:
        ModelRef.parse(m, where="--models")
    return models


def labels_for(models: list[str]) -> list[str]:
    """One folder name per model, unique by construction: its alias, and where that is taken (the same alias again,
    at this or another endpoint, or a name another model's alias holds: ``m-2``) the first free ``<alias>-2``,
    ``-3``, ... Entry i runs models[i] into labels[i], always."""
    bases = [re.sub(r"[^A-Za-z0-9._-]+", "_", ModelRef.parse(m).alias) for m in models]
    taken, out = set(bases), []
    for i, base in enumerate(bases):
        label = base if base not in out else next(f"{base}-{n}" for n in range(2, len(models) + 2)
                                                  if f"{base}-{n}" not in taken and f"{base}-{n}" not in out)
        out.append(label)
    return out


def finished_ids(out: Path) -> set[str]:
    """The ids whose last record in OUT/records.jsonl is not a failure (none where it is missing or unreadable)."""
    try:
        records, _ = latest_records(out / "records.jsonl")
    except (OSError, MedstackError):
        return set()
    return {str(r.get("id")) for r in records if r.get("status") != "failed"}


def is_finished(out: Path, case_ids: list[str]) -> bool:
    """Every case has a finished (not failed) record and metrics were written: nothing left to run."""
    return (out / "metrics.json").exists() and set(map(str, case_ids)) <= finished_ids(out)


def _split(values: dict, to_overrides) -> tuple[dict, dict]:
    values = dict(values)
    common = {k: values.pop(k) for k in COMMON if k in values}
    given = to_overrides(values) if to_overrides else {k: v for k, v in values.items() if v is not None}
    return common, given


def swept_roles(study, vary: str | None) -> tuple[str, ...]:
    """The roles the sweep's model plays: ``--vary`` (a comma list) or the study's role under test."""
    if not vary:
        return tuple(study.sweep_roles) or (study.primary_role,)
    roles = tuple(dict.fromkeys(x.strip() for x in vary.split(",") if x.strip()))
    unknown = [x for x in roles if x not in study.roles]
    if unknown or not roles:
        raise ConfigError(f"--vary {vary!r}: roles of {study.name}: {', '.join(study.roles)}")
    return roles


def named_roles(study, values: dict, to_overrides) -> tuple[dict[str, str], dict[str, str]]:
    """The roles named for the whole sweep: (in a --config file's ``roles:``, on the command line: the study's
    per-role options, --role ROLE=REF, --set roles.ROLE=REF). A config file's role under test is overridden
    by each model; one named on the command line is a mistake."""
    common, given = _split(values, to_overrides)
    in_config = read_yaml_mapping(common["config"]).get("roles") or {} if common.get("config") else {}
    named: dict[str, str] = {}
    named.update(given.get("roles") or {})
    named.update(parse_role_items(common.get("role") or [], study))
    named.update(parse_set(common.get("set_") or []).get("roles") or {})
    as_text = lambda d: {str(k): str(v) for k, v in d.items()}  # noqa: E731
    return as_text(in_config if isinstance(in_config, dict) else {}), as_text(named)


def _role_items(study, vary: tuple[str, ...], named: dict[str, str], model: str) -> list[str]:
    """--role items of one run: the swept roles on ``model``, a following role on what it follows."""
    items = [f"{r}={model}" for r in vary]
    for role, leader in study.role_follows.items():
        if role not in named and role not in vary and leader in named:
            items.append(f"{role}={named[leader]}")
    return items


def fixed_roles_line(roles: dict[str, str], vary: tuple[str, ...], idle: tuple[str, ...] = ()) -> str:
    """'clinical: the model of each run; patient: X, grader: Y for every run' (+ the roles not called)."""
    fixed = [f"{r}: {m}" for r, m in roles.items() if r not in vary and r not in idle]
    parts = ([f"{', '.join(vary)}: the model of each run"] if vary else []) + ([f"{', '.join(fixed)} for every run"] if fixed else [])
    return "; ".join(parts) + (f" ({', '.join(idle)}: not called with these settings)" if idle else "")


def run_sweep(study_factory, to_overrides, values: dict, models: list[str], sweep_dir: Path, *,
              published: list[str] | None = None, report: bool = True, vary: str | None = None, log=print,
              executor=None) -> SweepOutcome:
    """Run ``study`` (the factory and option mapping of its command) once per model; see the module docstring.
    ``values`` are the study command's parsed option values (``out`` and the swept roles are set here).
    ``executor``: None runs the entries here in turn; else a callable given the checked :class:`Plan` (Slurm)."""
    study = study_factory()
    if values.get("model") or values.get("out"):
        raise ConfigError("sweep: give the models with --models, the fixed roles with --role ROLE=REF and the sweep folder with --out (not --model)")
    if published and not study.published:
        have = sorted(n for n, c in registry.studies().items() if c.make.published)
        raise ConfigError(f"--published imports a study's released runs ({', '.join(have)}); {study.name} has none")
    roles_varied = swept_roles(study, vary)
    in_config, named = named_roles(study, values, to_overrides)
    clash = [r for r in roles_varied if r in named]
    if clash:
        raise ConfigError(f"--role {clash[0]}={named[clash[0]]}: {clash[0]} is the role under test in this sweep and takes each model "
                          f"of --models; name only the fixed roles (or choose the varied ones with --vary)")
    on_cli, named = named, {**{k: v for k, v in in_config.items() if k not in roles_varied}, **named}
    sweep_dir = Path(sweep_dir)
    check_owner(sweep_dir, "sweep")  # a sweep folder is a sweep's: never a results folder of another command
    runs = [ModelRun(lbl, m, sweep_dir / lbl) for lbl, m in zip(labels_for(models), models)]

    def plan(r: ModelRun, idle: tuple[str, ...]):
        extra = _role_items(study, roles_varied, named, r.model) + [f"{x}={r.model}" for x in idle]
        v = {**values, "out": str(r.out), "role": list(values.get("role") or []) + extra}
        if "name" in v and v["name"] is None:
            v["name"] = r.label  # the run's name in `compare` and the tables
        common, given = _split(v, to_overrides)
        settings, cases = prepare_run(study, build_settings(study, common, given))
        return common, given, settings, [str(c["id"]) for c in cases]

    needed = study.fixed_roles(plan(runs[0], ())[2])  # the roles besides the swept ones that these settings call
    missing = [x for x in needed if x not in roles_varied and x not in named and "default" not in named
               and study.role_follows.get(x) not in named]
    # a role that follows another the user is asked for (``Study.role_follows``) is not asked for
    ask = [x for x in missing if study.role_follows.get(x) not in missing]
    if ask:
        follow = [f"the {x} follows the {study.role_follows[x]}" for x in missing if x not in ask]
        raise ConfigError(f"sweep {study.name}: the {', '.join(ask)} role(s) stay one model for every run, as in the paper; "
                          f"name {'it' if len(ask) == 1 else 'each'} once with {' '.join(f'--role {x}=ALIAS' for x in ask)}"
                          + (f" ({'; '.join(follow)})" if follow else ""))
    # a role these settings never call and nobody named on the command line goes with the swept model: no server for it
    idle = tuple(x for x in study.roles if x not in roles_varied and x not in needed and x not in on_cli)
    planned = []
    for r in runs:  # every input check first, for every model, before any server starts
        common, given, settings, case_ids = plan(r, idle)
        r.roles = dict(settings.roles)
        planned.append((r, common, given, settings, case_ids))
    if executor is None and not values.get("dry_run"):  # a Slurm job checks its own entry on the GPUs it was given
        for *_, settings, _ in planned:  # servers a run will start together on one GPU that do not fit: refused now, not mid-sweep
            check_gpu_fit(settings)
    pub_dirs = _published_plan(published or [], sweep_dir, study.name)
    outcome = SweepOutcome(runs, varied=roles_varied, idle=idle)
    claim = {"study": study.name, "models": models}
    if executor is not None:  # another executor (experiments/tools/sweep/slurm.py) takes the checked plan from here
        RunLock(sweep_dir, "sweep").acquire().release()  # a folder in use is refused before anything is written to it
        claim_dir(sweep_dir, "sweep", claim)
        return executor(Plan(study, study_factory, planned, pub_dirs, sweep_dir, report, log, outcome))
    with RunLock(sweep_dir, "sweep"):  # one process per sweep folder (the runner's lock), taken after every input check
        claim_dir(sweep_dir, "sweep", claim)
        plan = Plan(study, study_factory, planned, pub_dirs, sweep_dir, report, log, outcome)
        for r, common, given, _settings, case_ids in planned:
            run_entry(plan, r, common, given, case_ids)
        return join(plan)


def check_gpu_fit(settings) -> None:
    """:class:`~serving.gpu_memory.GpuMemoryError` (with the numbers) when the servers one run would start together on
    this machine's GPU do not fit it (serving/gpu_memory.py); nothing on a CPU or for endpoints given by URL."""
    refs = [ModelRef.parse(v) for v in dict.fromkeys(settings.roles.values())]
    aliases = list(dict.fromkeys(r.alias for r in refs if not r.url))
    plan_gpu_shares([a for a in aliases if will_start(a, dtype=settings.dtype)], dtype=settings.dtype, log=lambda m: None)


@dataclass
class Plan:
    """A sweep after every input check: each entry's (run, common options, study options, settings, case ids)."""
    study: object
    study_factory: object
    planned: list
    pub_dirs: list
    sweep_dir: Path
    report: bool
    log: object
    outcome: SweepOutcome


def run_entry(plan: Plan, r: ModelRun, common: dict, given: dict, case_ids: list[str]) -> ModelRun:
    """One entry of the sweep, as the local executor runs it in turn and a Slurm job runs it alone."""
    study, log = plan.study, plan.log
    if is_finished(r.out, case_ids):
        r.status, r.message = "skipped", "finished earlier"
        log(f"sweep: {r.label}: all {len(case_ids)} cases finished earlier in {r.out}; skipped")
        return r
    log(f"sweep: {r.label}: {'dry run of' if common.get('dry_run') else 'running'} {study.name} with model {r.model} -> {r.out}")
    try:
        run_command(plan.study_factory(), common, given)  # the study command's own body: the one runner
        r.status, r.message = ("dry run", f"requests written to {r.out / 'dry-run.jsonl'}; nothing was sent") if common.get("dry_run") else ("finished", "")
    except RunDirInUse as e:  # another process (a duplicate of this entry's job) holds its folder: its run, not ours
        r.status, r.message = "in use", str(e)
        log(f"sweep: {r.label}: {e}")
    except MedstackError as e:  # e.g. its server would not start (weights missing): report, go on
        r.status, r.message = "error", str(e)
        log(f"sweep: [red]{r.label}: {study.name} with model {r.model} stopped: {e}[/red] — going on to the next model")
    except typer.Exit as e:  # exit 3: the run finished with failed or unstarted cases (kept; the next sweep retries them)
        r.status, r.message = "incomplete", f"exit {e.exit_code}: failed or unstarted cases; run the sweep again to retry them"
    return r


def join(plan: Plan) -> SweepOutcome:
    """After every entry: the published releases imported, the study's compare, SWEEP/summary.md, the report."""
    out, sweep_dir, log = plan.outcome, plan.sweep_dir, plan.log
    if any(common.get("dry_run") for _, common, *_ in plan.planned):  # nothing ran: no import, compare or report
        write_summary(out, sweep_dir, plan.study.name)
        return out
    declared = plan.study
    if plan.pub_dirs:
        out.published = _import_published(declared, plan.pub_dirs, plan.planned[0][3].data, log)
    done = [r.out for r in out.runs if (r.out / "metrics.json").exists()] + out.published
    if done and declared.compare([str(p) for p in done], sweep_dir / "compare") is not None:  # the study's own comparison, if it has one
        out.compare = sweep_dir / "compare"
        log(f"sweep: compare: {out.compare / 'summary.md'}")
    write_summary(out, sweep_dir, plan.study.name)
    if plan.report and done:
        out.report = build_report([str(sweep_dir)], sweep_dir / "report.html")
        log(f"sweep: report: {out.report.resolve()}")
    return out


def _published_plan(names: list[str], sweep_dir: Path, study: str) -> list[tuple[str, Path]]:
    plan = []
    for item in names:
        for name in (x.strip() for x in item.split(",") if x.strip()):
            resolve_data(name)  # not fetched: an error naming the fetch command, before anything runs
            plan.append((name, sweep_dir / f"published-{name.removeprefix(f'{study}-published-')}"))
    return plan


def _import_published(declared, plan: list[tuple[str, Path]], cases: str | None, log) -> list[Path]:
    out = []
    for name, dest in plan:
        if (dest / "metrics.json").exists():
            log(f"sweep: {name}: imported earlier into {dest}; skipped")
        else:
            declared.import_published(name, dest, cases)
            log(f"sweep: {name}: imported into {dest}")
        out.append(dest)
    return out


def roles_line(outcome: SweepOutcome) -> str:
    """'Roles: clinical: the model of each run; patient: X, grader: Y, summarizer: Y for every run'."""
    first = next((r.roles for r in outcome.runs if r.roles), {})
    idle = tuple(x for x in outcome.idle if x in first)  # a role these settings leave out of the run (one a setting turns off) is not named
    return f"Roles: {fixed_roles_line(first, outcome.varied, idle)}." if first else ""


def write_summary(outcome: SweepOutcome, sweep_dir: Path, study: str) -> Path:
    """SWEEP/summary.md: the roles and the table printed at the end (the file to open first)."""
    path = make_results_dir(sweep_dir) / "summary.md"
    text = "\n".join([f"# sweep {study}: {sweep_dir}", "", *summary_lines(outcome)]) + "\n"
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise StorageError.from_os(path, e) from None
    return path


def summary_lines(outcome: SweepOutcome) -> list[str]:
    def one_line(text: str) -> str:  # a server's log tail is many lines: its first line, in the table
        first = text.strip().splitlines()[0] if text.strip() else ""
        return (first[:200] + " ...") if len(first) > 200 or "\n" in text.strip() else first

    head = roles_line(outcome)
    return ([head, ""] if head else []) + md_table(["model", "run", "status"], [
        *([r.model, r.out, f"{r.status}{': ' + one_line(r.message).replace('|', '/') if r.message else ''}"] for r in outcome.runs),
        *(["(published)", p, "imported"] for p in outcome.published)])
