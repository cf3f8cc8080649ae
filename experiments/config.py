"""Config flows one way: YAML file -> validated settings object -> run.

Each experiment declares a pydantic settings class and ships YAML files (one per paper
setting) under ``experiments/<study>/configs/``. Command-line options override single
keys. Validation errors name the file and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from models.errors import MedstackError

T = TypeVar("T", bound=BaseModel)


class ConfigError(MedstackError):
    """A config file or override that does not validate."""


class RunSettings(BaseModel):
    """Settings every experiment run shares."""

    model_config = ConfigDict(extra="forbid")

    version: int = 1
    experiment: str = ""
    data: str | None = None
    out: str | None = None
    limit: int | None = None
    concurrency: int = 32
    timeout: float = 600.0
    retries: int = 5
    seed: int = 0
    use_cache: bool = True
    allow_remote: bool = False
    roles: dict[str, str] = {"default": "embedded"}


def read_yaml_mapping(path: str | Path, *, missing_hint: str = "", what: str = "settings") -> dict:
    """A YAML file whose top level is a mapping; ConfigError naming the file otherwise."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist{missing_hint}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of {what} at the top level, got {type(data).__name__}")
    return data


def load_settings(cls: type[T], path: str | Path | None, overrides: dict | None = None) -> T:
    data: dict = read_yaml_mapping(path) if path is not None else {}
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        where = f"{path}" if path else "settings"
        lines = [f"  {'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"{where}: invalid settings\n" + "\n".join(lines)) from None


def config_dir(study_file: str) -> Path:
    return Path(study_file).with_name("configs")
