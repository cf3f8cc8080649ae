"""What tells runs of one study apart (docs/running-studies.md, "Comparing runs"): the settings that are a run's
conditions, the run's default name, the settings columns ``compare`` and the report show, and the effects a paper
reports relative to a baseline run (AgentClinic's biases: accuracy with a bias / accuracy without).

A run's conditions are its settings (config.yaml) less those that say where it writes, how it reaches its servers,
which of the cases it takes, and its label (:data:`NOT_CONDITIONS`); nested settings are dotted
(``sampling.doctor.temperature``). The study's defaults are its settings class's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from experiments.common.grade import unit_values
from experiments.common.stats import ratio_ci

NOT_CONDITIONS = frozenset({
    "version", "experiment", "out", "name", "prompt_files",  # what the settings are, where results go, the run's label
    "data",  # the cases: compared over those both runs hold (a column where runs differ, never part of the name)
    "limit", "sample",  # which of the cases a run takes: its scope
    "concurrency", "timeout", "retries", "max_consecutive_failures", "use_cache", "allow_remote", "startup_timeout",
    "send_seed", "dtype",  # how the run reaches its servers
    "scorers",  # more grades of the same answers
})


def flat(d: Mapping, prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys (``sampling.doctor.temperature``); lists as they are."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flat(v, key + "."))
        else:
            out[key] = v
    return out


def defaults_of(settings_cls: type | None) -> dict[str, Any]:
    """The study's defaults: its settings class's, dotted."""
    if settings_cls is None:
        return {}
    return flat(settings_cls.model_construct().model_dump(mode="json"))


def conditions(config: Mapping, settings_cls: type | None = None) -> dict[str, Any]:
    """A run's conditions (dotted), the study's defaults filled in where its config.yaml has no key; ``roles.ROLE``
    the model of each role (``default`` standing for every role not named)."""
    cfg = dict(config or {})
    fields = set(settings_cls.model_fields) if settings_cls is not None else set(cfg)
    out = {k: v for k, v in defaults_of(settings_cls).items() if k.split(".")[0] not in NOT_CONDITIONS and k.split(".")[0] != "roles"}
    out.update({k: v for k, v in flat({k: v for k, v in cfg.items() if k in fields and k not in NOT_CONDITIONS}).items()})
    return out


def shown(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v)) or "[]"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def name_suffix(settings, settings_cls: type | None = None) -> str:
    """`` KEY=VALUE`` for every condition of ``settings`` (a run's settings object) that differs from the study's
    defaults, the model aside (``roles``): what a run's default name adds to its model's."""
    cls = settings_cls or type(settings)
    own = conditions(settings.model_dump(mode="json"), cls)
    base = defaults_of(cls)
    return "".join(f" {k}={shown(v)}" for k, v in own.items() if not k.startswith("roles.") and base.get(k) != v)


def run_name(model: str, settings) -> str:
    """A run's default name: its model, and every condition that differs from the study's defaults
    (``embedded doctor_bias=recency``)."""
    return model + name_suffix(settings)


def differing(configs: list[Mapping], settings_cls: type | None = None) -> list[str]:
    """The settings that tell these runs apart: the conditions, the models of the roles and the data whose values differ
    among them (a setting all of them share, default or not, is no column: each run's name says what it sets otherwise
    than the defaults)."""
    rows = [{**conditions(c, settings_cls), "data": (c or {}).get("data")} for c in configs]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return [k for k in keys if len({repr(r.get(k)) for r in rows}) > 1]


def settings_columns(configs: list[Mapping], settings_cls: type | None = None) -> tuple[list[str], list[list[str]]]:
    """(keys, one row of values per run) of :func:`differing`: the columns ``compare`` and the report show."""
    keys = differing(configs, settings_cls)
    rows = [[shown(conditions(c, settings_cls).get(k, (c or {}).get(k))) if k != "data" else shown((c or {}).get("data")) for k in keys]
            for c in configs]
    return keys, rows


# ------------------------------------------------------------------ effects relative to a baseline run

@dataclass(frozen=True)
class Effect:
    """An effect a paper reports relative to a baseline run (``Study.effects``): the ``score``'s figure with a
    condition over the same figure of the baseline run, which has ``baseline`` (setting -> value) and every other
    condition (the models too) the same. ``paper(conditions)``: the paper's figure for a run's conditions, as text
    (None: the paper gives none)."""

    score: str
    baseline: Mapping[str, Any]
    label: str
    paper: Callable[[dict], str | None] | None = None


def baseline_of(cond: dict, others: list[dict], effect: Effect) -> int | None:
    """The index in ``others`` of the baseline run of a run with conditions ``cond``, or None (the run is a baseline
    itself, or none of ``others`` is its baseline)."""
    if all(cond.get(k) == v for k, v in effect.baseline.items()):
        return None
    want = {**cond, **effect.baseline}
    return next((i for i, o in enumerate(others) if o == want), None)


def relative_effects(runs: list[tuple[str, Mapping, list[dict]]], settings_cls: type | None, effects, scorers=()) -> list[dict]:
    """For each of ``effects`` and each run whose baseline run is among ``runs`` (``(label, config, finished records)``,
    runs of one study): the ratio of the score's mean over the cases both hold, the run's over the baseline's, with its
    95 % interval from resampling whole cases (the unit the scorer declares; experiments/common/stats.py ``ratio_ci``),
    and the paper's figure."""
    from experiments.core.scorers import find

    conds = [conditions(cfg, settings_cls) for _, cfg, _ in runs]
    out = []
    for effect in effects:
        sc = find(scorers, effect.score)
        scale, unit = (sc.scale, sc.unit) if sc else (None, "case_id")
        for (label, _, records), cond in zip(runs, conds):
            b = baseline_of(cond, conds, effect)
            if b is None:
                continue
            va, vb = unit_values(records, effect.score, scale, unit), unit_values(runs[b][2], effect.score, scale, unit)
            shared = sorted(set(va) & set(vb))
            ci = ratio_ci([va[c] for c in shared], [vb[c] for c in shared])
            some = ci.n > 0 and ci.mean == ci.mean
            out.append({"effect": effect.label, "score": effect.score, "run": label, "baseline": runs[b][0],
                        "condition": ", ".join(f"{k}={shown(cond[k])}" for k in effect.baseline if cond.get(k) != effect.baseline[k]),
                        "ratio": ci.mean if some else None, "low": ci.low if some else None, "high": ci.high if some else None,
                        "n_shared": len(shared), "paper": effect.paper(cond) if effect.paper else None})
    return out


EFFECT_COLUMNS = ["effect", "run", "condition", "baseline", "ratio × 100 [95% CI]", "shared cases", "paper (× 100)"]
EFFECT_NOTE = ("The run's figure over the baseline's (the same study, models and settings but the condition), over the cases both "
               "hold, × 100 (the baseline = 100); [95% CI] from 10,000 resamples of whole cases (fixed seed).")


def effect_rows(effects: list[dict]) -> list[list[str]]:
    """:func:`relative_effects` as table rows (:data:`EFFECT_COLUMNS`)."""
    return [[e["effect"], e["run"], e["condition"], e["baseline"],
             "–" if e["ratio"] is None else f"{100 * e['ratio']:.1f} [{100 * e['low']:.1f}, {100 * e['high']:.1f}]",
             str(e["n_shared"]), e["paper"] or "–"] for e in effects]
