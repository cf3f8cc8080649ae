"""One command-line shape for every study: the common options, declared once.

``study_command(study, options=..., help=...)`` returns a typer command whose options are the
common ones below plus the study's own; its body is always the same:

    YAML config -> study options -> --model / per-role options / --role -> --set  (later wins)
    -> validated settings -> cases loaded and checked (no server yet) -> run_study -> summary.md

Exit codes, every study: 0 done, 2 bad input (nothing started), 3 finished with failed or
unstarted cases (the command to resume is printed).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, List, Optional

import typer

from experiments.core.concurrency import run_async
from experiments.core.config import ConfigError, load_settings, parse_set, read_yaml_mapping
from experiments.core.deviations import protocol_lines
from experiments.core.study import Study
from models.errors import DataError

COMMON: dict[str, tuple[Any, Any]] = {
    "data": (Optional[str], typer.Option(None, "--data", help="Input data: a file/folder path, or a registered data set name (`medstack data list`).")),
    "model": (Optional[str], typer.Option(None, "--model", "-m", help="Model for every role: registry ALIAS (a running server is reused, else one is started for the run) or ALIAS@URL.")),
    "role": (List[str], typer.Option([], "--role", help="ROLE=REF: the model of one role (repeatable); overrides --model.")),
    "config": (Optional[Path], typer.Option(None, "--config", help="YAML settings file (default: the study's paper config).")),
    "set_": (List[str], typer.Option([], "--set", help="SECTION.KEY=VALUE: override any config key (repeatable), e.g. --set sampling.doctor.temperature=0.")),
    "out": (Optional[str], typer.Option(None, "--out", help="Results directory (default runs/<study>-<model>); re-running the same command resumes.")),
    "limit": (Optional[int], typer.Option(None, "--limit", help="Only the first N cases (>= 1).")),
    "concurrency": (Optional[int], typer.Option(None, "--concurrency", help="Cases (and requests) in flight (>= 1).")),
    "seed": (Optional[int], typer.Option(None, "--seed", help="Run seed: sampled calls get seeds derived from it, the case id and the step.")),
    "no_cache": (bool, typer.Option(False, "--no-cache", help="Bypass the response cache (fresh samples; a killed run then cannot replay its calls).")),
    "allow_remote": (bool, typer.Option(False, "--allow-remote", help="Allow an ALIAS@URL endpoint that is not on this machine.")),
    "api_key": (Optional[str], typer.Option(None, "--api-key", help="API key for keyed endpoints (default: $MEDSTACK_API_KEY, which other local users cannot see in ps). Never written to the results.")),
    "lora": (List[str], typer.Option([], "--lora", help="NAME=PATH: a peft LoRA adapter served for the model under test (repeatable).")),
    "dry_run": (bool, typer.Option(False, "--dry-run", help="Build every request as the run would send it and write them to OUT/dry-run.jsonl "
                                   "(case_id, role, step, messages or prompt); no server, no cache, no model call, no results. "
                                   "Multi-turn studies go on with empty answers: the first request of each conversation is exact.")),
}


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def _log(msg: str, console=None) -> None:
    """One message to stderr, never folded: a line longer than the terminal stays one line (the terminal
    wraps it on screen only), so a command printed in it is copied whole at any width."""
    from rich.console import Console

    (console or Console(stderr=True)).print(msg, highlight=False, soft_wrap=True)


def report_resume(outcome, resume: str | None, console=None) -> None:
    """The end of a run that left cases to do: the counts and the command that resumes it, on one line."""
    _log(f"[red]{outcome.failed} failed and {outcome.not_started} unstarted case(s).[/red] Resume with: " + escape(resume or "the same command"), console)
    if resume and ("--api-key" in resume or os.environ.get("MEDSTACK_KEY_FROM_ARGV")):
        _log("(the API key is left out: set $MEDSTACK_API_KEY to it, or add --api-key KEY)", console)


def parse_role_items(items: list[str], study: Study) -> dict[str, str]:
    roles = {}
    for item in items:
        role, sep, ref = item.partition("=")
        if not sep or not role or not ref:
            raise ConfigError(f"--role {item!r}: expected ROLE=MODEL, roles of {study.name}: {', '.join(study.roles)}")
        roles[role.strip()] = ref.strip()
    return roles


def resolve_data(value: str | None) -> str | None:
    """A registered data set name -> its fetched path; a path stays as it is."""
    if not value:
        return value
    try:
        from experiments.datasets.registry import resolve_data as resolve
    except ImportError:  # the data registry is optional for path inputs
        return value
    return resolve(value)


def build_settings(study: Study, common: dict, study_overrides: dict):
    """Config file + overrides -> the study's validated settings object."""
    from serving.launcher import parse_lora

    config = common.get("config") or study.default_config(study_overrides)
    overrides: dict = dict(study_overrides)
    roles: dict[str, str] = {}
    if common.get("model"):
        roles.update({r: common["model"] for r in study.roles})
    roles.update(overrides.pop("roles", None) or {})
    roles.update(parse_role_items(common.get("role") or [], study))
    if roles:
        overrides["roles"] = roles
    for key in ("data", "out", "limit", "concurrency", "seed"):
        if common.get(key) is not None:
            overrides[key] = common[key]
    if common.get("no_cache"):
        overrides["use_cache"] = False
    if common.get("allow_remote"):
        overrides["allow_remote"] = True
    cli_lora = parse_lora(common["lora"]) if common.get("lora") else {}
    if cli_lora:
        overrides["lora"] = cli_lora
    from experiments.core.config import deep_merge

    overrides = deep_merge(overrides, parse_set(common.get("set_") or []))
    settings = load_settings(study.settings_cls, config, overrides)
    given = cli_lora  # --lora items are checked already; the config file's / --set's like them, before anything is written
    if set(settings.lora) - set(given):
        from serving.launcher import check_lora

        where = f"{config}: lora" if config and "lora" in read_yaml_mapping(config) else "--set lora"
        checked = {n: p for n, p in settings.lora.items() if given.get(n) == p}
        checked.update(check_lora({n: p for n, p in settings.lora.items() if n not in checked}, where=where))
        settings = settings.model_copy(update={"lora": checked})
    if settings.data:
        settings = settings.model_copy(update={"data": resolve_data(settings.data)})
    return settings


def run_command(study: Study, common: dict, study_overrides: dict) -> None:
    """The body of every study command."""
    from experiments.core.runner import prepare_run, run_study

    settings = build_settings(study, common, study_overrides)
    try:
        settings, cases = prepare_run(study, settings)  # every input check happens here, before a server starts
    except UnicodeDecodeError as e:
        raise DataError(f"{settings.data}: not UTF-8 text ({e.reason} at byte {e.start}); is this the right file?") from None
    if common.get("dry_run"):
        from experiments.core.dryrun import dry_run

        asyncio.run(dry_run(study, settings, cases, log=_log))
        return
    resume = resume_command(sys.argv[1:])
    outcome = run_async(run_study(study, settings, cases, api_key=common.get("api_key"), resume_command=resume, log=_log))
    typer.echo(outcome.summary.rstrip("\n"))
    for line in protocol_lines(outcome.metrics.get("protocol")):  # the run's last words: what it sent less of than the protocol
        _log(f"[yellow]{escape(line)}[/yellow]")
    _log(f"results in {outcome.out}")
    if outcome.exit_code:
        report_resume(outcome, resume)
        raise typer.Exit(outcome.exit_code)


def resume_command(args: list[str]) -> str | None:
    """The command that resumes this run, as the user typed it, with every secret replaced by ***."""
    from serving.secrets import redact_argv

    return "medstack " + shlex.join(redact_argv(args)) if args else None


def study_command(study_factory: Callable[[], Study], *, help: str,
                  options: dict[str, tuple[Any, Any]] | None = None,
                  to_overrides: Callable[[dict], dict] | None = None) -> Callable:
    """A typer command: the common options + ``options`` (param name -> (type, typer.Option)).

    ``to_overrides(values)`` turns the study options' values into settings overrides (default:
    each option sets the settings key of its own name; None = not given).
    """
    options = options or {}
    clash = set(options) & set(COMMON)
    assert not clash, f"study options shadow common ones: {clash}"

    def command(**values) -> None:
        common = {k: values.pop(k) for k in COMMON}
        given = to_overrides(values) if to_overrides else {k: v for k, v in values.items() if v is not None}
        run_command(study_factory(), common, given)

    params = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=ann)
              for name, (ann, info) in {**options, **COMMON}.items()]
    command.__signature__ = inspect.Signature(params)
    command.__doc__ = help
    command.study_factory, command.to_overrides = study_factory, to_overrides  # for `medstack sweep`
    return command
