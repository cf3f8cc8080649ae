"""JSON schemas of the MediTOD in-context outputs (docs/protocols.md, MediTOD; docs/constrained-answers.md), built from the dataset's ontology.

Pure functions; the run applies them as constrained answers (``answers: constrained``) by passing
``Constraint.make("json", nlu_schema(ontology), "meditod/nlu")`` with the prediction call (see
experiments/core/study.py). ``ontology`` is the mapping :func:`experiments.studies.meditod.ontology.load_ontology` returns.

Shapes (docs/protocols.md, MediTOD, in-context):

- NLU: ``[{"intent": I, "slots": {SLOT: [{ATTR: text or [text, ...], ..., "status": S}]}}]`` —
  slots without their status prefix, a ``status`` on each item of a slot that has statuses (required
  there, one of the slot's statuses); ``slots`` may be left out, ``{}`` or null (an entry without slots).
- POL: ``[{"action": A, SLOT: [{"value": text, "checks": [{"type": T, "values": [text, ...]}]}]}]`` —
  T is one of the slot's attributes, ``value``, or ``status`` when the slot has statuses, so the
  ontology must list every check type the doctors' actions use as an attribute of that slot.

Attribute values are free text (a string or a list of strings); only names, intents, actions,
statuses and the nesting are constrained. No length bounds (xgrammar expands bounded repeats).
"""

from __future__ import annotations

TEXT = {"type": "string"}
TEXT_OR_LIST = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}


def _names(ontology: dict, key: str) -> list[str]:
    value = ontology.get(key) or {}
    return sorted(value) if isinstance(value, dict) else sorted(str(v) for v in value)


def _slots(ontology: dict) -> dict[str, dict]:
    return {str(name): (spec or {}) for name, spec in sorted((ontology.get("slots") or {}).items())}


def _statuses(spec: dict) -> list[str]:
    return [str(s) for s in (spec.get("statuses") or [])]


def _attributes(spec: dict) -> list[str]:
    attrs = spec.get("attributes") or {}
    return sorted(attrs) if isinstance(attrs, dict) else sorted(str(a) for a in attrs)


def nlu_item_schema(spec: dict) -> dict:
    """One item of an NLU slot: its attributes (text or list of text) and, where the slot has statuses, a required status."""
    props = {a: TEXT_OR_LIST for a in _attributes(spec)}
    statuses = _statuses(spec)
    item: dict = {"type": "object", "properties": props, "additionalProperties": False}
    if statuses:
        props["status"] = {"enum": statuses}
        item["required"] = ["status"]
    return item


def nlu_schema(ontology: dict) -> dict:
    """JSON schema of an in-context NLU prediction: a list of {intent, slots} entries (see the module docstring)."""
    slots = {name: {"type": "array", "items": nlu_item_schema(spec)} for name, spec in _slots(ontology).items()}
    entry = {
        "type": "object",
        "properties": {
            "intent": {"enum": _names(ontology, "intents")},
            "slots": {"anyOf": [{"type": "null"}, {"type": "object", "properties": slots, "additionalProperties": False}]},
        },
        "required": ["intent"],
        "additionalProperties": False,
    }
    return {"type": "array", "items": entry}


def pol_item_schema(spec: dict) -> dict:
    """One item of a POL action's slot: a value and the checks the doctor asks about (typed by the slot's attributes)."""
    types = sorted(set(_attributes(spec)) | {"value"} | ({"status"} if _statuses(spec) else set()))
    check = {"type": "object", "properties": {"type": {"enum": types}, "values": {"type": "array", "items": TEXT}},
             "required": ["type"], "additionalProperties": False}
    return {"type": "object", "properties": {"value": TEXT, "checks": {"type": "array", "items": check}}, "additionalProperties": False}


def pol_schema(ontology: dict) -> dict:
    """JSON schema of an in-context POL prediction: a list of {action, SLOT: [items]} (see the module docstring)."""
    props: dict = {"action": {"enum": _names(ontology, "actions")}}
    for name, spec in _slots(ontology).items():
        props[name] = {"type": "array", "items": pol_item_schema(spec)}
    return {"type": "array", "items": {"type": "object", "properties": props, "required": ["action"], "additionalProperties": False}}
