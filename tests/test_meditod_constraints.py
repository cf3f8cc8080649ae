"""MediTOD JSON schemas: built from an ontology of the agreed shape, they accept the gold outputs
of tests/fixtures/meditod converted to the in-context shape and reject malformed ones."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from experiments.core.constraints import Constraint
from experiments.studies.meditod.constraints import nlu_schema, pol_schema

DIALOGS = json.loads((Path(__file__).parent / "fixtures" / "meditod" / "dialogs.json").read_text())
STATUS_PREFIXES = ("positive", "negative", "unknown", "avail", "unavail")

ONTOLOGY = {  # hand-written, in the format experiments/studies/meditod/ontology.yaml has
    "intents": {"inform": "the patient gives information", "chit-chat": "small talk", "deny": "the patient says no"},
    "actions": {"inquire": "ask about a slot", "chit-chat": "small talk", "nod_prompt_salutations": "acknowledge, greet"},
    "slots": {
        "symptom": {"meaning": "a complaint", "statuses": ["positive", "negative", "unknown"],
                    "attributes": {"value": "name", "onset": "when it began", "location": "where", "progression": "how it changed",
                                   "positive_characteristics": "its features"}},
        "habit": {"meaning": "a habit", "statuses": ["positive", "negative", "unknown"], "attributes": {"value": "name", "frequency": "how often"}},
        "medication": {"meaning": "a drug taken", "statuses": ["positive", "negative"],
                       "attributes": {"value": "name", "impact": "effect", "respone_to": "what it treats"}},
        "medical_test": {"meaning": "a test", "statuses": ["avail", "unavail"], "attributes": {"value": "name"}},
        "occupation": {"meaning": "the job", "statuses": [], "attributes": {"value": "job", "status": "employment status"}},
    },
}


def split_slot(name: str) -> tuple[str | None, str]:
    for p in STATUS_PREFIXES:
        if name.startswith(p + "_"):
            return p, name[len(p) + 1:]
    return None, name


def to_icl_nlu(entries: list[dict]) -> list[dict]:
    """The data's NLU entries -> the in-context shape (slots unprefixed, a status on each item)."""
    out = []
    for e in entries:
        slots = e.get("slots")
        if isinstance(slots, dict):
            new: dict = {}
            for name, items in slots.items():
                status, slot = split_slot(name)
                new.setdefault(slot, []).extend({**it, **({"status": status} if status else {})} for it in items)
            slots = new
        out.append({"intent": e["intent"], **({"slots": slots} if "slots" in e else {})})
    return out


def golds(key: str) -> list:
    return [u[key] for d in DIALOGS.values() for u in d["utterances"] if u.get(key) is not None]


def test_nlu_schema_accepts_every_gold_turn_of_the_fixtures():
    schema = nlu_schema(ONTOLOGY)
    jsonschema.Draft202012Validator.check_schema(schema)
    turns = golds("nlu")
    assert len(turns) >= 5 and any(e.get("slots") for t in turns for e in t)
    for t in turns:
        jsonschema.validate(to_icl_nlu(t), schema)
    c = Constraint.make("json", schema, "meditod/nlu")  # also what the run would send
    assert c.check(json.dumps(to_icl_nlu(turns[0])))


@pytest.mark.parametrize("bad", [
    [{"intent": "greet"}],                                                                   # intent not in the ontology
    [{"intent": "inform", "slots": {"positive_symptom": [{"value": "cough", "status": "positive"}]}}],  # prefixed slot name
    [{"intent": "inform", "slots": {"symptom": [{"value": "cough"}]}}],                     # no status
    [{"intent": "inform", "slots": {"symptom": [{"value": "cough", "status": "avail"}]}}],  # a status of another slot
    [{"intent": "inform", "slots": {"symptom": [{"value": "cough", "status": "positive", "colour": "red"}]}}],  # unknown attribute
    [{"intent": "inform", "slots": {"symptom": "cough"}}],                                  # a slot that is not a list of items
    {"intent": "inform"},                                                                    # not a list
])
def test_nlu_schema_rejects_malformed(bad):
    assert not jsonschema.Draft202012Validator(nlu_schema(ONTOLOGY)).is_valid(bad)


def test_pol_schema_accepts_every_gold_turn_of_the_fixtures():
    schema = pol_schema(ONTOLOGY)
    jsonschema.Draft202012Validator.check_schema(schema)
    turns = golds("actions")
    assert len(turns) >= 5 and any(len(a) > 1 for t in turns for a in t)
    for t in turns:
        jsonschema.validate(t, schema)


@pytest.mark.parametrize("bad", [
    [{"action": "diagnose"}],                                                              # action not in the ontology
    [{"action": "inquire", "symptom": [{"value": "cough", "checks": [{"type": "colour"}]}]}],  # check type not an attribute
    [{"action": "inquire", "symptom": [{"value": "cough", "checks": [{"values": ["chest"]}]}]}],  # check without a type
    [{"action": "inquire", "positive_symptom": [{"value": "cough"}]}],                     # prefixed slot
    [{"action": "inquire", "symptom": {"value": "cough"}}],                                # slot not a list
])
def test_pol_schema_rejects_malformed(bad):
    assert not jsonschema.Draft202012Validator(pol_schema(ONTOLOGY)).is_valid(bad)


def test_statusless_slot_keeps_its_own_status_attribute_and_needs_none():
    s = nlu_schema(ONTOLOGY)
    v = jsonschema.Draft202012Validator(s)
    assert v.is_valid([{"intent": "inform", "slots": {"occupation": [{"value": "teacher", "status": "retired"}]}}])
    assert v.is_valid([{"intent": "inform", "slots": {"occupation": [{"value": "teacher"}]}}])
    assert v.is_valid([{"intent": "chit-chat", "slots": None}]) and v.is_valid([{"intent": "chit-chat", "slots": {}}])


def test_run_constraint_from_the_shipped_ontology_accepts_fixture_gold():
    """The prediction step's declared format (ontology.yaml -> schema) accepts every gold NLU/POL turn of our fixtures."""
    import json as _json
    from pathlib import Path as _Path

    from experiments.studies.meditod.ontology import to_status_shape
    from experiments.studies.meditod.study import icl_constraint

    dialogs = _json.loads((_Path(__file__).parent / "fixtures" / "meditod" / "dialogs.json").read_text())
    nlu, pol = icl_constraint("nlu"), icl_constraint("pol")
    assert icl_constraint("nlg") is None
    seen = 0
    for d in dialogs.values():
        for u in d["utterances"]:
            if u.get("nlu"):
                assert nlu.check(_json.dumps(to_status_shape(u["nlu"]))) is not False, u["nlu"]
                seen += 1
            if u.get("actions"):
                assert pol.check(_json.dumps(u["actions"])) is not False, u["actions"]
                seen += 1
    assert seen > 5
    assert nlu.check('[{"intent": "no_such_intent"}]') is False
