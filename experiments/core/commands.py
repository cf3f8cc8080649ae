"""One command-line shape for every study: flags generated from its settings model, plus COMMON.

Flags, help, ``--print-config`` and exit codes: docs/running-studies.md. The body is always
YAML config -> study flags -> --model / per-role flags / --role -> --set (later wins) -> validated settings
-> cases loaded and checked (no server yet) -> run_study -> summary.md.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import shlex
import sys
from pathlib import Path
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any, Callable, List, Literal, Optional, get_args, get_origin

import typer

from experiments.core.concurrency import run_async
from experiments.core.config import ConfigError, Flag, RunSettings, arms as _arms, check_keys, deep_merge, is_flag, load_settings, parse_set, read_yaml_mapping, role_flag
from experiments.core.deviations import protocol_lines
from experiments.core import registry
from experiments.core.scope import check_scope
from experiments.core.study import Study
from models.errors import DataError, MedstackError

# The flags of every study command that are not settings: how the settings are assembled and sent.
COMMON: dict[str, tuple[Any, Any]] = {
    "model": (Optional[str], typer.Option(None, "--model", "-m", metavar="REF", help="Model for every role: registry ALIAS (a running server is reused, else one is started for the run) or ALIAS@URL.")),
    "role": (List[str], typer.Option([], "--role", metavar="ROLE=REF", help="ROLE=REF: the model of one role (repeatable); overrides --model.")),
    "config": (Optional[Path], typer.Option(None, "--config", metavar="FILE", help="YAML settings file (default: the study's paper config).")),
    "set_": (List[str], typer.Option([], "--set", metavar="KEY=VALUE", help="SECTION.KEY=VALUE: override any config key (repeatable), e.g. --set sampling.doctor.temperature=0.")),
    "api_key": (Optional[str], typer.Option(None, "--api-key", metavar="KEY", help="API key for keyed endpoints (default: $MEDSTACK_API_KEY, which other local users cannot see in ps). Never written to the results.")),
    "print_config": (bool, typer.Option(False, "--print-config", metavar="", help="Print the resolved settings (config file + flags + --set, "
                                        "validated as a run validates them before reading data) as YAML and exit; no data is read, nothing runs.")),
    "dry_run": (bool, typer.Option(False, "--dry-run", metavar="", help="Build every request as the run would send it and write them to OUT/dry-run.jsonl "
                                   "(case_id, role, step, messages or prompt); no server, no cache, no model call, no results. "
                                   "Each reply is a stand-in that ends a conversation early (the first request of each is exact); the plan of the full run "
                                   "follows: requests, tokens, cases at once and GPU-hours (--gpu-memory, --plan-from).")),
    "gpu_memory": (Optional[int], typer.Option(None, "--gpu-memory", metavar="GB", min=1, help="With --dry-run: plan the full run for one GPU "
                                               "of GB gigabytes (e.g. 24, 48, 80): cases at once and GPU-hours, computed, not measured (default: 24, 48 and 80).")),
    "plan_from": (Optional[Path], typer.Option(None, "--plan-from", metavar="RUN", help="With --dry-run: plan from the mean calls and tokens per "
                                               "case (case-trial) of an earlier run's call log (RUN/records.jsonl) instead of the study's own figures.")),
}
_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


@dataclass(frozen=True)
class Param:  # one generated parameter of a study command
    key: str  # the Python name typer passes it by
    flag: Flag
    switch: bool | None = None  # a one-name bool flag: the value it sets when given
    split: bool = False  # a comma list -> a list
    required: bool = False
    choices: tuple = ()  # the values a Literal field takes
    metavar: str | None = None  # what --help shows for the value (None: from the type)


def _kind(annotation) -> type:
    """bool / int / float / list / dict / str: what the command line reads for a settings field (str where a number
    or a word is accepted: ``concurrency: N | auto``)."""
    arms = _arms(annotation)
    if len(arms) > 1 and any(get_origin(a) is Literal for a in arms):
        return str
    for a in arms:
        if a in (bool, int, float) or get_origin(a) in (list, dict):
            return get_origin(a) or a
    return str


def choices(annotation) -> tuple:
    """The values a ``Literal`` field (or a list of one) takes, e.g. ('opensource', 'gpt'); () for any other field."""
    out: list = []
    for a in _arms(annotation):
        inner = get_args(a)[0] if get_origin(a) is list and get_args(a) else a
        if get_origin(inner) is Literal:
            out += [str(v) for v in get_args(inner)]
    return tuple(out)


def _inherited(cls: type[RunSettings], name: str, attr: str):
    """A field's description / json_schema_extra from the nearest class that gives one (a subclass may change the default only)."""
    return next((v for k in cls.__mro__ if (v := getattr(getattr(k, "model_fields", {}).get(name), attr, None))), None)


def _field_param(cls: type[RunSettings], name: str, field) -> Param | None:
    """A settings field -> its flag (name, type, bounds, choices and help from the field); None for a field marked
    ``cli(False)`` (experiments/core/config.py NO_FLAG). A description alone makes no flag: every field has one."""
    extra = _inherited(cls, name, "json_schema_extra") or {}
    if not is_flag(extra):
        return None
    desc = _inherited(cls, name, "description")
    assert desc, f"{cls.__name__}.{name}: a settings field needs a description (and json_schema_extra=NO_FLAG if it is no flag)"
    kind, named = _kind(field.annotation), "--" + name.replace("_", "-")
    decls = tuple(extra.get("cli") or [f"{named}/--no-{named[2:]}" if kind is bool else named])
    bounds = [f"{sign} {getattr(m, attr)}" for m in field.metadata for attr, sign in _BOUNDS if getattr(m, attr, None) is not None]
    flag = Flag(decls, {dict: list, list: str}.get(kind, kind), desc + (f" ({', '.join(bounds)})" if bounds and ">" not in desc else ""), (name,))
    switch = not decls[0].startswith("--no-") if kind is bool and "/" not in decls[0] else None
    values, numeric = choices(field.annotation), any(a in (int, float) for a in _arms(field.annotation))
    if numeric and values:  # a number or a word (concurrency: N | auto): the words go in the metavar
        return Param(name, flag, switch, kind is list, bool(extra.get("required")), (), "|".join(("N", *values)))
    return Param(name, flag, switch, kind is list, bool(extra.get("required")), values)


def _roles_of(p: Param) -> list[str]:
    """The roles a flag may name the model of: its target ``roles.ROLE``, or a spelling ``--ROLE-model`` (a field
    flag spelled so, e.g. MediTOD's --adjudicate-model, also --grader-model)."""
    if len(p.flag.targets) == 1 and p.flag.targets[0].startswith("roles."):
        return [p.flag.targets[0].split(".", 1)[1]]
    return [d[2:-len("-model")] for d in p.flag.decls if d.startswith("--") and d.endswith("-model")]


def _lookup(tree: dict, dotted: str):
    for key in dotted.split("."):
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def _shown(value) -> str | None:
    """A default as the command line spells it (None: nothing to show)."""
    if value is None or value in ([], {}, ""):
        return None
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value).lower() if isinstance(value, bool) else str(value)


def effective_defaults(study: Study, fixed: dict | None = None) -> tuple[dict, Path | None]:
    """What a run without options uses: the study's default config (as `run STUDY` loads it without --config and
    without the options that pick another one) validated over the settings model's defaults; and that config's path."""
    try:
        path = study.default_config({})
    except MedstackError:
        path = None
    for source in (path, None):
        try:
            return load_settings(study.settings_cls, source, dict(fixed or {})).model_dump(mode="json"), source
        except MedstackError:
            continue
    return {}, None


class StudyFlags:
    """A study's command-line flags, generated from its settings model (like vLLM's from its engine arguments):
    one ``--ROLE-model`` flag per role of the study (the settings class's own ``cli_flags`` where it spells one,
    else generated), then the other ``cli_flags`` (one flag for several keys), then each field not marked
    ``cli(False)`` (``--field-name`` unless ``json_schema_extra=cli(...)`` spells it); plus :data:`COMMON`."""

    def __init__(self, study: Study, fixed: dict | None = None):
        cls = study.settings_cls
        self.study, self.fixed = study, fixed or {}
        params = [Param(f.decls[0].lstrip("-").replace("-", "_"), f) for f in cls.cli_flags]
        params += [p for name, f in cls.model_fields.items() if (p := _field_param(cls, name, f))]
        by_role = {r: p for p in params for r in _roles_of(p) if r in study.roles}
        self.role_params: dict[str, Param] = {}
        for role in study.roles:  # a role named "model" is set by --model itself (COMMON)
            if role != "model":
                self.role_params[role] = by_role.get(role) or Param(f"{role}_model", role_flag(role, self._role_help(role)))
        self.params = [*self.role_params.values(), *(p for p in params if p not in self.role_params.values())]
        assert not {p.key for p in self.params} & set(COMMON), f"{cls.__name__}: settings flags shadow common ones"
        self.defaults, self.config = effective_defaults(study, self.fixed)

    def _role_help(self, role: str) -> str:
        s = self.study
        what = ": the model under test" if role == s.primary_role else ""
        return f"{role.capitalize()} model{what} (alias of --role {role}=REF)."

    def roles_text(self) -> str:
        """The study's roles and the flag that names each one's model, for its --help."""
        s, parts = self.study, []
        for role in s.roles:
            decls = self.role_params[role].flag.decls if role in self.role_params else ("--model",)
            flag = f"--{role}-model" if f"--{role}-model" in decls else decls[0]
            notes = (["under test"] if role == s.primary_role else []) + ([f"default: the {s.role_follows[role]}'s"] if role in s.role_follows else [])
            parts.append(f"{role} ({flag}{', ' + ', '.join(notes) if notes else ''})")
        return ("Roles: " + "; ".join(parts) + ". --model sets every role, --role ROLE=REF one; each a registry ALIAS "
                "(a running server is reused, else one is started for the run) or ALIAS@URL.")

    def default_of(self, p: Param) -> str | None:
        """The effective default of one flag, as shown in --help."""
        role = next((r for r, q in self.role_params.items() if q is p), None)
        if role is not None and p.flag.targets[0] == f"roles.{role}":
            if role in self.study.role_follows:
                return f"the {self.study.role_follows[role]}'s model"
            roles = self.defaults.get("roles") or {}
            return roles.get(role) or roles.get("default") or "embedded"  # experiments/core/runner.py resolve_roles
        values = [_lookup(self.defaults, t) for t in p.flag.targets]
        if p.switch is not None:
            return "on" if values[0] == p.switch else "off"
        if p.flag.type is bool and isinstance(values[0], bool):
            return p.flag.decls[0].split("/")[0 if values[0] else 1]
        if len(set(map(str, values))) > 1:
            return ", ".join(f"{t} {_shown(v)}" for t, v in zip(p.flag.targets, values))
        return _shown(values[0])

    def help_of(self, p: Param) -> str:
        """A flag's help for rich: its text, choices and effective default, escaped (``[answer]`` prints as written)."""
        text = p.flag.help
        if "<study>" in text or "<model>" in text:
            model = "<model>" if self.study.primary_role == "model" else f"<{self.study.primary_role} model>"
            text = text.replace("<study>", self.study.name).replace("<model>", model)
        if p.choices:
            text += f" Choices: {', '.join(p.choices)}" + (" (a comma list of any)." if p.split else ".")
        default = None if p.required else self.default_of(p)
        return escape(text + (f" [default: {default}]" if default is not None else ""))

    @staticmethod
    def metavar_of(p: Param) -> str | None:
        """The value's name in --help: a|b for choices, N, X, LIST (a comma list) or TEXT; none for a flag."""
        if p.switch is not None or p.flag.type is bool:
            return ""
        if p.metavar or (p.choices and not p.split):
            return p.metavar or "|".join(p.choices)
        return {int: "N", float: "X"}.get(p.flag.type, "LIST" if p.split else "TEXT")

    def signature(self) -> list[inspect.Parameter]:
        out = []
        for p in self.params:
            f, help = p.flag, self.help_of(p)
            ann, info = ((Optional[f.type], typer.Argument(None, help=help, metavar=f.decls[0].upper())) if not f.decls[0].startswith("-") else
                         (bool, typer.Option(False, *f.decls, help=help, metavar="")) if p.switch is not None else
                         (List[str], typer.Option([], *f.decls, help=help, metavar="NAME=PATH")) if f.type is list else
                         (Optional[f.type], typer.Option(None, *f.decls, help=help, metavar=self.metavar_of(p))))
            out.append(inspect.Parameter(p.key, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=ann))
        common = dict(COMMON)
        if self.config:  # --config names the file it replaces
            common["config"] = (Optional[Path], typer.Option(None, "--config", metavar="FILE", help=escape(
                "YAML settings file [default: the file named above; configs/ beside it holds the paper's other settings].")))
        return out + [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=ann) for k, (ann, info) in common.items()]

    def help(self, text: str) -> str:
        """The command's own help: ``text`` (the study's registration), its roles and where the defaults shown come from."""
        where = (f"the defaults shown are {_repo_path(self.config)}'s (--config replaces it)" if self.config
                 else "the defaults shown are the settings model's")
        text = inspect.cleandoc(text)
        if "Exit 0" not in text:  # a study whose text names no exit status: the runner's
            text += " Exit 0 done, 2 bad input, 3 some cases failed (the same command again retries them)."
        return escape(text + " Exit 130: interrupted (Ctrl-C; finished cases are kept, the same command "
                      "resumes).\n\n" + self.roles_text() + " Options below: " + where
                      + "; --print-config prints what a command line resolves to.")

    def overrides(self, values: dict) -> dict:
        """The parsed values of the generated flags -> settings overrides (a flag not given sets nothing)."""
        out: dict = {}
        for p in self.params:
            if p.required and values.get(p.key) is None:
                raise ConfigError(f"{self.study.name} needs {p.flag.decls[0]} ({p.flag.help})")
            if (v := values.get(p.key)) in (None, [], False if p.switch is not None else None):
                continue
            v = p.switch if p.switch is not None else [x.strip() for x in v.split(",") if x.strip()] if p.split else v
            for target in p.flag.targets:
                out = deep_merge(out, reduce(lambda value, key: {key: value}, reversed(target.split(".")), v))
        roles = out.get("roles") or {}
        for role, leader in self.study.role_follows.items():  # e.g. --grader-model also summarizes unless --summarizer-model
            if leader in roles and role not in roles:
                roles[role] = roles[leader]
        return {**out, **self.fixed}


def _repo_path(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path(__file__).resolve().parents[2]))
    except ValueError:
        return str(path)


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def log(msg: str, console=None) -> None:
    """One message to stderr, never folded: a line longer than the terminal stays one line (the terminal
    wraps it on screen only), so a command printed in it is copied whole at any width."""
    from rich.console import Console

    (console or Console(stderr=True)).print(msg, highlight=False, soft_wrap=True)


def report_resume(outcome, resume: str | None, console=None) -> None:
    """The end of a run that left cases to do: the counts and the command that resumes it, on one line."""
    log(f"[red]{outcome.failed} failed and {outcome.not_started} unstarted case(s).[/red] Resume with: " + escape(resume or "the same command"), console)
    if resume and ("--api-key" in resume or os.environ.get("MEDSTACK_KEY_FROM_ARGV")):
        log("(the API key is left out: set $MEDSTACK_API_KEY to it, or add --api-key KEY)", console)


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
    from experiments.datasets.registry import resolve_data as resolve

    return resolve(value) if value else value


def build_settings(study: Study, common: dict, study_overrides: dict, resolve: bool = True):
    """Config file + overrides -> the study's validated settings object (``resolve``: a data set's name -> its path)."""
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
    cli_lora = parse_lora(overrides.pop("lora")) if overrides.get("lora") else {}
    if cli_lora:
        overrides["lora"] = cli_lora
    for item in common.get("set_") or []:  # a key the settings have no place for, named as typed
        check_keys(study.settings_cls, parse_set([item]), given=f"--set {item}")
    overrides = deep_merge(overrides, parse_set(common.get("set_") or []))
    settings = load_settings(study.settings_cls, config, overrides)
    given = cli_lora  # --lora items are checked already; the config file's / --set's like them, before anything is written
    if set(settings.lora) - set(given):
        from serving.launcher import check_lora

        where = f"{config}: lora" if config and "lora" in read_yaml_mapping(config) else "--set lora"
        checked = {n: p for n, p in settings.lora.items() if given.get(n) == p}
        checked.update(check_lora({n: p for n, p in settings.lora.items() if n not in checked}, where=where))
        settings = settings.model_copy(update={"lora": checked})
    check_scope(settings)  # what a run refuses before it reads data, refused here too (--print-config, --dry-run, sweep)
    check_models(settings.roles)
    if settings.data and resolve:
        settings = settings.model_copy(update={"data": resolve_data(settings.data)})
    return settings


def check_models(roles: dict[str, str]) -> None:
    """Every role's model is a reference, and one served here (no @URL) is a registry alias: exit 2 naming it."""
    from models.registry import get_spec
    from serving.refs import ModelRef

    for role, spec in roles.items():
        ref = ModelRef.parse(spec, where=f"role {role}")
        if not ref.url:
            get_spec(ref.alias)


def config_yaml(study: Study, settings: RunSettings, config: Path | None, data_note: str) -> str:
    """``--print-config``: the validated settings with every role resolved, as YAML (the shape of a run's config.yaml),
    under a comment naming the config file they started from and the checks left to a run (those that read the data)."""
    import yaml

    from experiments.core.runner import resolve_roles

    settings = study.prepare(settings.model_copy(update={"roles": resolve_roles(study, settings)}))
    head = (f"# medstack run {study.name}: {_repo_path(config) if config else 'the settings model'} + the command line\n"
            f"# not checked: what needs the data ({data_note}); a run or --dry-run reads it\n")
    return head + yaml.safe_dump(settings.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def run_command(study: Study, common: dict, study_overrides: dict) -> None:
    """The body of every study command."""
    from experiments.core.runner import prepare_run

    if common.get("print_config"):  # every check a run makes before it reads data; no data file is opened
        settings = build_settings(study, common, study_overrides, resolve=False)
        try:  # where a registered name points (no file is read): a set not fetched yet is said, not refused
            note = (f"{resolve_data(settings.data)}: its cases, their ids, --limit/--sample against them" if settings.data
                    else "no data named")
        except DataError as e:
            note = str(e)
        typer.echo(config_yaml(study, settings, common.get("config") or study.default_config(study_overrides), note), nl=False)
        return
    settings = build_settings(study, common, study_overrides)
    try:
        settings, cases = prepare_run(study, settings)  # every input check happens here, before a server starts
    except UnicodeDecodeError as e:
        raise DataError(f"{settings.data}: not UTF-8 text ({e.reason} at byte {e.start}); is this the right file?") from None
    if (common.get("gpu_memory") or common.get("plan_from")) and not common.get("dry_run"):
        raise ConfigError("--gpu-memory and --plan-from plan a run: give them with --dry-run")
    if note := (study.scope or {}).get("note"):
        log(f"[yellow]warning:[/yellow] {escape(note)}")
    execute(study, settings, cases, api_key=common.get("api_key"), dry_run=bool(common.get("dry_run")),
            plan={"gpu_memory": common.get("gpu_memory"), "plan_from": str(common["plan_from"]) if common.get("plan_from") else None})


def execute(study: Study, settings, cases: list[dict], *, api_key: str | None = None, dry_run: bool = False, plan: dict | None = None) -> None:
    """Run prepared settings and cases through the one runner (or write the dry run), print the summary, and exit with
    the run's code, saying the command that resumes it: the end of every command that runs a study."""
    from experiments.core.runner import run_study

    if dry_run:
        from experiments.core.dryrun import dry_run as write_dry_run

        asyncio.run(write_dry_run(study, settings, cases, log=log, **(plan or {})))
        return
    resume = resume_command(sys.argv[1:])
    outcome = run_async(run_study(study, settings, cases, api_key=api_key, resume_command=resume, log=log))
    typer.echo(outcome.summary.rstrip("\n"))
    for line in protocol_lines(outcome.metrics.get("protocol")):  # the run's last words: what it sent less of than the protocol
        log(f"[yellow]{escape(line)}[/yellow]")
    log(f"results in {outcome.out}")
    if outcome.exit_code:
        report_resume(outcome, resume)
        raise typer.Exit(outcome.exit_code)


def resume_command(args: list[str]) -> str | None:
    """The command that resumes this run, as the user typed it, with every secret replaced by ***."""
    from serving.secrets import redact_argv

    return "medstack " + shlex.join(redact_argv(args)) if args else None


def study_command(entry) -> Callable:
    """The typer command of a registered study (experiments/core/registry.py): its generated flags + COMMON."""
    flags = StudyFlags(entry.make(), entry.fixed)

    def command(**values) -> None:
        common = {k: values.pop(k) for k in COMMON}
        run_command(entry.make(), common, flags.overrides(values))

    command.__signature__ = inspect.Signature(flags.signature())
    command.__doc__ = flags.help(entry.help)
    return command


def lazy_group(entries: dict[str, tuple[str, Callable[[], Any]]]) -> type:
    """A typer group class that lists ``entries`` (command name -> (help, load)) without loading them: a command's
    ``load()`` (importing its study) runs only when the command runs or shows its own ``--help``."""
    from typer.core import TyperCommand, TyperGroup

    class Declared(TyperCommand):  # a listed command, loaded when it is used
        def __init__(self, name: str, help: str, load: Callable[[], Any]):
            super().__init__(name, help=escape(help))
            self.load = load

        def make_context(self, info_name, args, parent=None, **extra):
            return self.load().make_context(info_name, args, parent=parent, **extra)

    class LazyGroup(TyperGroup):
        def list_commands(self, ctx) -> list[str]:
            return [*super().list_commands(ctx), *(n for n in entries if n not in self.commands)]

        def get_command(self, ctx, cmd_name: str):
            if cmd_name in self.commands or cmd_name not in entries:
                return super().get_command(ctx, cmd_name)
            help, load = entries[cmd_name]
            return Declared(cmd_name, help, load)

    return LazyGroup


def nested_flags(model, prefix: str = "") -> list[Param]:
    """The flags a model of nested sections spells (a fine-tuning recipe, finetune/recipe.py): each field marked
    ``json_schema_extra=cli("--x")``, built as a settings field's flag is (name, type, bounds, help from the field),
    its target the dotted key (``training.max_steps``)."""
    from pydantic import BaseModel

    out = []
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out += nested_flags(field.annotation, f"{prefix}{name}.")
        elif isinstance((field.json_schema_extra or {}).get("cli"), list) and (p := _field_param(model, name, field)):
            out.append(replace(p, key=f"{prefix}{name}".replace(".", "_"), flag=replace(p.flag, targets=(prefix + name,))))
    return out


def flag_parameters(params: list[Param], help_of: Callable[[Param], str]) -> list[inspect.Parameter]:
    """Typer parameters of generated flags (options with a value, as a study's), each with its help."""
    return [inspect.Parameter(p.key, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[p.flag.type],
                              default=typer.Option(None, *p.flag.decls, help=help_of(p), metavar=StudyFlags.metavar_of(p)))
            for p in params]


def flag_overrides(params: list[Param], values: dict) -> dict:
    """The values of generated flags given on the command line -> a nested overrides mapping (one not given sets nothing)."""
    out: dict = {}
    for p in params:
        if (v := values.get(p.key)) is not None:
            for target in p.flag.targets:
                out = deep_merge(out, reduce(lambda value, key: {key: value}, reversed(target.split(".")), v))
    return out


def _command(name: str):
    """The click command of one study: its folder's study module imported now (:func:`lazy_group`)."""
    one = typer.Typer()
    one.command(name)(study_command(registry.get(name)))
    return typer.main.get_command(one)


def register_all(app, run_app, **apps) -> None:
    """Plug every study command and every other command into `medstack`: the study commands are listed from their
    declarations without importing a study module; each declaration's ``cli`` adds its other commands to their group
    (``import``, ``calibrate``, ...); every tool folder's ``cli.py`` and ``finetune/cli.py`` add theirs."""
    import importlib
    from functools import partial

    lazy: dict[bool, dict] = {True: {}, False: {}}
    for name, (c, _) in registry.commands().items():
        lazy[c.top_level][name] = (c.help, partial(_command, name))
    app.info.cls, run_app.info.cls = lazy_group(lazy[True]), lazy_group(lazy[False])
    root = registry.EXPERIMENTS
    found = sorted(root.glob("*/cli.py")) + sorted(root.glob("tools/*/cli.py"))  # the framework's and the tools'
    tools = [".".join(p.relative_to(root.parent).with_suffix("").parts) for p in found]
    for module in tools + ["finetune.cli"]:
        importlib.import_module(module).register(app=app, run_app=run_app, **apps)
    groups = {"": app, "run": run_app, **{k.removesuffix("_app"): v for k, v in apps.items()}}
    for d in registry.declarations():
        for where, ref in d.cli.items():
            group, _, name = where.rpartition(" ")
            if group in groups:  # an app built without that group (tests) leaves its commands out
                groups[group].command(name)(d.resolve(ref))
