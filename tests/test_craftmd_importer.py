"""`import craftmd` on the open-model release shape (fixture published_open/, written like the
authors' LLaMA-2 files): the doctor's prompt as the first `user` message, a fixed greeting, a turn cap."""

from __future__ import annotations

import json

from experiments.studies.craftmd.importer import import_folder, infer_stop, parse_conversation
from experiments.studies.craftmd.metrics import grades

GREETING = "Hi! What symptoms are you facing today?"


def _import(fixtures_dir, tmp_path):
    m = import_folder(fixtures_dir / "craftmd" / "published_open", "open", tmp_path / "imp", str(fixtures_dir / "craftmd" / "cases.csv"))
    recs = {r["id"]: r for r in map(json.loads, (tmp_path / "imp" / "records.jsonl").read_text().splitlines())}
    return m, recs


def test_instruction_dropped_and_greeting_not_a_doctor_turn(fixtures_dir, tmp_path):
    m, recs = _import(fixtures_dir, tmp_path)
    t0 = recs["case_c/t0"]["transcript"]
    assert t0[0] == {"agent": "doctor", "content": GREETING, "turn": 0}
    assert t0[1]["agent"] == "patient" and t0[1]["content"].startswith("My son has a sore throat")
    assert not any(t["content"].startswith("You are an AI doctor") for r in recs.values() for t in r["transcript"])
    assert [t["turn"] for t in t0] == [0, 0, 1, 1, 2]
    assert [recs[f"case_c/t{k}"]["n_doctor_turns"] for k in range(5)] == [2, 2, 2, 1, 1]
    assert m["mean_doctor_turns"] == 8 / 5


def test_stop_reasons_with_the_inferred_turn_cap(fixtures_dir, tmp_path):
    m, recs = _import(fixtures_dir, tmp_path)
    # a closing question without the marker: only a cap stops it -> the release's cap is 2 doctor turns
    assert m["turn_cap_inferred"] == 2
    assert [recs[f"case_c/t{k}"]["stop_reason"] for k in range(5)] == ["turn_cap", "turn_cap", "final_diagnosis", "no_question", "unknown"]
    assert m["stop_reasons"] == {"turn_cap": 2, "final_diagnosis": 1, "no_question": 1, "unknown": 1}
    assert "turn cap inferred from the release: 2 doctor turns" in (tmp_path / "imp" / "summary.md").read_text()


def test_missing_mcq_answer_is_recorded_wrong_and_shown(fixtures_dir, tmp_path):
    m, recs = _import(fixtures_dir, tmp_path)
    t4, g = recs["case_c/t4"]["answers"], grades(recs["case_c/t4"])
    for fmt in ("multiturn", "singleturn", "summarized"):
        assert g[(fmt, "mcq")].source == "unparsed" and g[(fmt, "mcq")].value == 0 and t4[fmt]["mcq"]["missing"] is True
        assert g[(fmt, "frq")].value == 0 and t4[fmt]["frq"]["published_evaluation"] == -1
    assert m["parse_errors"] >= 3  # the three missing MCQ answers, counted from the scores
    # counted: multi-turn MCQ right in t0 (letter B), t2, t3; wrong in t1 (Measles) and t4 (missing)
    assert m["accuracy"]["multiturn.mcq"]["n_answers"] == 5 and m["accuracy"]["multiturn.mcq"]["accuracy"] == 0.6
    assert {"id": "case_c/t4", "format": "multiturn", "answer": "(no answer in the file)"} in m["mcq_unmapped"]
    assert "(no answer in the file)" in (tmp_path / "imp" / "summary.md").read_text()


def test_gpt_release_shape_greeting_and_stop_rules():
    conv = [{"role": "system", "content": "You are an AI doctor."}, {"role": "assistant", "content": GREETING},
            {"role": "user", "content": "I have a rash."}, {"role": "assistant", "content": "Where is it?"},
            {"role": "user", "content": "On my arms."}, {"role": "assistant", "content": "**Final Diagnosis:** Eczema"}]
    t = parse_conversation(conv, "f.json")
    assert [(x["agent"], x["turn"]) for x in t] == [("doctor", 0), ("patient", 0), ("doctor", 1), ("patient", 1), ("doctor", 2)]
    assert infer_stop(t) == "final_diagnosis"
    asked = t[:-1] + [{"agent": "doctor", "content": "Any itching?", "turn": 2}]
    assert infer_stop(asked) == "unknown" and infer_stop(asked, cap=2) == "turn_cap" and infer_stop(asked, cap=3) == "unknown"
    assert infer_stop(t[:1]) == "unknown"  # only the greeting: the patient never answered


def test_import_computes_every_patient_check_with_rates_and_the_span_distribution(fixtures_dir, tmp_path):
    """A release file of our own in the authors' format (the open-model shape): per trial, a leak, a negation, a
    character break and a turn the vignette holds; the import checks each against the file's vignette and choices."""
    src = tmp_path / "release"
    src.mkdir()
    case = json.loads((fixtures_dir / "craftmd" / "published_open" / "case_c.json").read_text())
    said = ["I think it is scarlet fever.", "He hasn't had measles or rubella.", "The case vignette does not mention a cough.",
            "A fine sandpaper-like red rash appeared."]
    for k, text in enumerate(said):
        case[f"trial_{k}"]["multiturn_conversation"] = [
            {"role": "user", "content": "You are an AI doctor."}, {"role": "assistant", "content": GREETING},
            {"role": "user", "content": text}, {"role": "assistant", "content": "Anything else?"},
            {"role": "user", "content": "No."}, {"role": "assistant", "content": "**Final Diagnosis:** Scarlet fever"}]
    case.pop("trial_4")
    (src / "case_c.json").write_text(json.dumps(case))
    m = import_folder(src, "mine", tmp_path / "imp", str(fixtures_dir / "craftmd" / "cases.csv"))
    recs = [json.loads(line) for line in (tmp_path / "imp" / "records.jsonl").read_text().splitlines()]
    pc = [r["patient_checks"] for r in recs]
    assert [bool(p["leaks_diagnosis"]) for p in pc] == [True, False, False, False]  # the negated choices are no mention
    assert [bool(p["breaks_character"]) for p in pc] == [False, False, True, False]
    # "fever", "had", "a" alone; then "a fine sandpaper like red rash appeared", 7 of the vignette's words in a row
    assert [p["longest_span"] for p in pc] == [1, 1, 1, 7] and [len(p["copies_vignette"]) for p in pc] == [0, 0, 0, 1]
    assert not any(p["names_other_choice"] for p in pc)
    x = m["patient_checks"]
    assert (x["conversations"], x["leaks_diagnosis"]["conversations"], x["leaks_diagnosis"]["rate"]) == (4, 1, 0.25)
    assert x["longest_span"] == {1: 3, 7: 1}
    summary = (tmp_path / "imp" / "summary.md").read_text()
    assert "| mine | 4 | 25.00 [25.00, 25.00] (1/4) |" in summary and summary.count("(authors' release)") == 4
