"""The patient checks' labelled set: its figures are weighted back to the releases by the sampling design, and the
committed set is whole (every labelled item is a drawn item, every drawn item labelled once, dev and held-out apart)."""

import json
from pathlib import Path

import pytest

from experiments.studies.craftmd.patient_labels import validate

CASES = (",case_vignette,choice_1,choice_2,choice_3,choice_4,answer,category,dataset,case_id\n"
         '0,"A 40-year-old man has an itchy red rash on both shins for a week.",Contact dermatitis,Psoriasis,Tinea corporis,Scabies,'
         "Contact dermatitis,dermatology,derm_public,case_1\n")
TURNS = [("system", "You are a doctor."), ("assistant", "What brings you in?"), ("user", "An itchy rash on my shins."),
         ("assistant", "Any other illnesses?"), ("user", "The case vignette does not mention any."),
         ("assistant", "Any new soaps?"), ("user", "I'm just a patient, so I can't provide that."), ("assistant", "Final diagnosis: Contact dermatitis")]


def _release(tmp_path: Path) -> Path:
    folder = tmp_path / "rel" / "gpt4_1106"
    folder.mkdir(parents=True)
    conv = [{"role": r, "content": t} for r, t in TURNS]
    case = {"case_id": "case_1", "case_vignette": "A 40-year-old man has an itchy red rash on both shins for a week.",
            "question": "What is the diagnosis?", "correct_ans": "Contact dermatitis", "trial_0": {"multiturn_conversation": conv}}
    (folder / "case_1.json").write_text(json.dumps(case))
    (tmp_path / "cases.csv").write_text(CASES)
    return tmp_path / "rel"


def test_precision_and_recall_are_weighted_by_the_stratum_each_item_stands_for(tmp_path):
    releases = _release(tmp_path)
    # three labelled turns of one conversation: turn 2 a break in a stratum of 10 turns (1 drawn), turn 3 a break
    # in a stratum of 30 turns (1 drawn: it weighs 30), turn 1 no break in that same stratum of 30 (weighs 30 too)
    items = {"character-0000": {"stratum": "narrow", "release": "GPT-4", "part": "dev", "case_id": "case_1", "trial": 0, "patient_turn": 2},
             "character-0001": {"stratum": "rest", "release": "GPT-4", "part": "dev", "case_id": "case_1", "trial": 0, "patient_turn": 3},
             "character-0002": {"stratum": "wide", "release": "GPT-4", "part": "dev", "case_id": "case_1", "trial": 0, "patient_turn": 1}}
    strata = {"seed": 0, "items": items, "sizes": {"character|narrow|GPT-4": 10, "character|rest|GPT-4": 30, "character|wide|GPT-4": 30}}
    (tmp_path / "strata.json").write_text(json.dumps(strata))
    (tmp_path / "labels.jsonl").write_text("".join(json.dumps({"id": i, "label": lab, "note": ""}) + "\n" for i, lab in
                                                   [("character-0000", "break"), ("character-0001", "break"), ("character-0002", "no")]))
    labels = validate.load_labels(tmp_path / "labels.jsonl", tmp_path / "strata.json")
    assert sorted(i["weight"] for i in labels) == [10, 30, 30]
    flags = validate.flagged_turns(labels, releases, tmp_path / "cases.csv")
    got = validate.figures(labels, flags, "breaks_character", "dev")
    flagged = {t for (_, _, _, t), checks in flags.items() if "breaks_character" in checks}
    # whatever the rule flags, the figures are the weighted shares of what it flagged
    tp = sum(w for t, w in ((2, 10), (3, 30)) if t in flagged)
    assert got["recall"] == round(tp / 40, 3)
    if flagged & {1, 2, 3}:
        fp = 30 if 1 in flagged else 0
        assert got["precision"] == round(tp / (tp + fp), 3)
    assert 2 in flagged  # "The case vignette does not mention any" is a break by any version of the rule
    assert got["n"] == 3 and got["positives"] == 2 and got["part"] == "dev"


def test_an_unknown_item_is_named(tmp_path):
    (tmp_path / "strata.json").write_text(json.dumps({"items": {}, "sizes": {}}))
    (tmp_path / "labels.jsonl").write_text(json.dumps({"id": "character-0009", "label": "no"}) + "\n")
    with pytest.raises(SystemExit, match=r"labels.jsonl:1: item 'character-0009' is not in strata.json"):
        validate.load_labels(tmp_path / "labels.jsonl", tmp_path / "strata.json")


def test_the_committed_set_is_whole():
    strata = json.loads(validate.STRATA.read_text(encoding="utf-8"))
    labelled = [json.loads(line)["id"] for line in validate.LABELS.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert sorted(labelled) == sorted(strata["items"])  # each drawn item labelled exactly once
    assert {i["part"] for i in strata["items"].values()} == {"dev", "held-out"}
    for family, (fam, _) in validate.MEASURED.items():
        assert any(i.startswith(fam + "-") for i in strata["items"]), family


def test_a_release_entry_counts_per_conversation_and_per_patient_turn(tmp_path):
    from experiments.studies.craftmd.released_checks import release_entry, table
    from experiments.studies.craftmd.data import load_cases

    rel = _release(tmp_path) / "gpt4_1106"
    entry = release_entry(rel, "GPT-4", {c["case_id"]: c for c in load_cases(tmp_path / "cases.csv")})
    # one conversation, three patient turns: two speak of a source or a role ("case vignette", "just a patient")
    assert entry["conversations"] == 1 and entry["patient_turns"] == 3
    assert entry["counts"]["breaks_character"] == {"conversations": 1, "turns": 2, "not_checkable": 0}
    assert entry["figures"]["patient-check/breaks_character|per patient turn"]["value"] == pytest.approx(2 / 3)
    assert all(k.startswith("patient-check/") for k in entry["figures"])
    md = table({"GPT-4": entry}, {"breaks_character": {"precision": 1.0, "precision_ci": [1.0, 1.0], "recall": 0.5, "recall_ci": [0.2, 0.9], "n": 10, "part": "held-out"}})
    row = next(line for line in md.splitlines() if "`breaks_character`" in line)
    assert "100.00 [100.00, 100.00] / 66.67" in row and "(1 conv., 2 turns)" in row and "1.00 [1.00, 1.00] / 0.50 [0.20, 0.90] (10 labelled, held-out)" in row
