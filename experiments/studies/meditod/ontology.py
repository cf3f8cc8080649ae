"""The MediTOD ontology (``ontology.yaml`` beside this module): load, check, render, and the NLU slot shape.

``load_ontology(path=None) -> dict`` returns the YAML as a plain dict after checking its shape::

    {"intents": {NAME: meaning}, "actions": {NAME: meaning},
     "slots": {SLOT: {"meaning": str, "statuses": [str], "attributes": {ATTR: meaning}}}}

A slot with ``statuses`` is one whose status the data writes into the slot name (``positive_symptom``);
``prefixed_slots`` lists them. ``render_ontology`` is the text of the in-context system message;
``to_status_shape`` / ``from_status_shape`` convert NLU labels between the data's prefixed slots and the shape the
in-context model is asked for, as the authors' in-context baseline does (experiments/studies/meditod/README.md, Inputs).
"""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path

import yaml

from experiments.core.config import ConfigError

ONTOLOGY_FILE = Path(__file__).with_name("ontology.yaml")
# slots only doctors use (a diagnosis): left out of the NLU system message, as the authors' NLU ontology has none
DOCTOR_ONLY_SLOTS = ("disease",)


def _check(path: Path, data) -> dict:
    def bad(msg: str):
        raise ConfigError(f"{path}: {msg}")

    if not isinstance(data, dict):
        bad("expected a mapping with intents, actions and slots")
    for key in ("intents", "actions"):
        table = data.get(key)
        if not isinstance(table, dict) or not table or not all(isinstance(v, str) and v for v in table.values()):
            bad(f"{key}: expected a mapping NAME: one-line meaning")
    slots = data.get("slots")
    if not isinstance(slots, dict) or not slots:
        bad("slots: expected a mapping SLOT: {meaning, statuses, attributes}")
    for name, slot in slots.items():
        if not isinstance(slot, dict) or set(slot) != {"meaning", "statuses", "attributes"}:
            bad(f"slots.{name}: expected exactly the keys meaning, statuses, attributes")
        if not isinstance(slot["meaning"], str) or not slot["meaning"]:
            bad(f"slots.{name}.meaning: expected one line of text")
        if not isinstance(slot["statuses"], list) or not all(isinstance(s, str) for s in slot["statuses"]):
            bad(f"slots.{name}.statuses: expected a list of status names ([] = no status)")
        attrs = slot["attributes"]
        if not isinstance(attrs, dict) or not attrs or not all(isinstance(v, str) and v for v in attrs.values()):
            bad(f"slots.{name}.attributes: expected a mapping ATTR: one-line meaning")
    return data


@lru_cache(maxsize=None)
def _load(path: str) -> dict:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{p}: ontology file does not exist")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({e})") from None
    return _check(p, data)


def load_ontology(path: str | Path | None = None) -> dict:
    """The checked ontology (a fresh copy: callers may change it)."""
    return copy.deepcopy(_load(str(path or ONTOLOGY_FILE)))


def prefixed_slots(ontology: dict | None = None) -> dict[str, list[str]]:
    """{slot: its statuses} for the slots whose status the data writes as a name prefix."""
    ont = ontology or _load(str(ONTOLOGY_FILE))
    return {name: list(s["statuses"]) for name, s in ont["slots"].items() if s["statuses"]}


def split_slot(name: str, ontology: dict | None = None) -> tuple[str, str | None]:
    """``positive_symptom`` -> (``symptom``, ``positive``); an unprefixed name -> (name, None)."""
    for slot, statuses in prefixed_slots(ontology).items():
        for status in statuses:
            if name == f"{status}_{slot}":
                return slot, status
    return name, None


def render_ontology(task: str, ontology: dict | None = None) -> str:
    """The ontology as text for the ``task`` (nlu | pol) system message."""
    ont = ontology or load_ontology()
    if task == "nlu":
        head, names = "Patient intents", ont["intents"]
    elif task == "pol":
        head, names = "Doctor actions", ont["actions"]
    else:
        raise ValueError(f"no ontology block for task {task!r}")
    lines = [f"{head}:"] + [f"- {n}: {m}" for n, m in names.items()]
    lines.append("Slots (each slot holds a list of items; an item is an object of the slot's attributes):")
    for name, slot in ont["slots"].items():
        if task == "nlu" and name in DOCTOR_ONLY_SLOTS:
            continue
        attrs = {a: m for a, m in slot["attributes"].items() if not (task == "pol" and a == "status" and slot["statuses"])}
        lines.append(f"- {name}: {slot['meaning']}")
        if task == "nlu" and slot["statuses"]:
            lines.append(f"  status, one of: {', '.join(slot['statuses'])}")
        lines.append("  attributes: " + "; ".join(f"{a}: {m}" for a, m in attrs.items()))
    return "\n".join(lines)


def to_status_shape(nlu: list, ontology: dict | None = None) -> list:
    """Data NLU (prefixed slots) -> unprefixed slots with a ``status`` on each item."""
    out = []
    for entry in nlu:
        new = {"intent": entry["intent"]}
        if "slots" in entry:
            new["slots"] = {}
            for name, items in entry["slots"].items():
                slot, status = split_slot(name, ontology)
                if status is None:
                    new["slots"][name] = copy.deepcopy(items)
                    continue
                new["slots"].setdefault(slot, []).extend({**copy.deepcopy(it), "status": status} for it in items)
        out.append(new)
    return out


def from_status_shape(nlu, ontology: dict | None = None):
    """Model NLU in the status shape -> the data's prefixed slots (for scoring).

    A medical item whose ``status`` is missing or not one of its slot's statuses goes to
    ``unknown_<slot>``. Anything that is not a list of entries is returned as it is (the scorer judges it).
    """
    if not isinstance(nlu, list):
        return nlu
    statuses = prefixed_slots(ontology)
    out = []
    for entry in nlu:
        if not isinstance(entry, dict) or not isinstance(entry.get("slots"), dict):
            out.append(entry)
            continue
        new = {k: v for k, v in entry.items() if k != "slots"}
        new["slots"] = {}
        for name, items in entry["slots"].items():
            if name not in statuses or not isinstance(items, list):
                new["slots"][name] = items
                continue
            for it in items:
                st = it.get("status") if isinstance(it, dict) else None
                target = f"{st}_{name}" if st in statuses[name] else f"unknown_{name}"
                item = {k: v for k, v in it.items() if k != "status"} if isinstance(it, dict) else it
                new["slots"].setdefault(target, []).append(item)
        out.append(new)
    return out
