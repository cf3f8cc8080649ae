"""Where medstack keeps its state: converted weights, server records, the response cache."""

from __future__ import annotations

import os
from pathlib import Path


def medstack_home() -> Path:
    """$MEDSTACK_HOME, default ~/.cache/medstack. Created on first use."""
    home = Path(os.environ.get("MEDSTACK_HOME") or Path.home() / ".cache" / "medstack")
    home.mkdir(parents=True, exist_ok=True)
    return home


OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def set_offline() -> None:
    """Nothing is fetched from a model hub at run time unless the user explicitly allows it."""
    if os.environ.get("MEDSTACK_ALLOW_DOWNLOAD") != "1":
        for k, v in OFFLINE_ENV.items():
            os.environ.setdefault(k, v)
