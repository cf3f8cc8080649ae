"""Where each study's command-line commands are plugged into `medstack`.

A study module exposes ``register(**apps)``; add its dotted path to STUDIES.
"""

from __future__ import annotations

import importlib

STUDIES: list[str] = ["experiments.craftmd.cli", "experiments.dera.cli", "experiments.autoeval.cli", "experiments.meditod.cli", "experiments.bench.cli", "experiments.report.cli", "finetune.cli", "experiments.datasets.cli", "experiments.calibrate.cli", "experiments.review.cli", "experiments.sweep.cli"]


def register_all(**apps) -> None:
    for dotted in STUDIES:
        importlib.import_module(dotted).register(**apps)
