"""`import craftmd` on the open-model release shape (fixture published_open/, written like the
authors' LLaMA-2 files): the doctor's prompt as the first `user` message, a fixed greeting, a turn cap."""

from __future__ import annotations

import json

from experiments.studies.craftmd.importer import import_folder, infer_stop, parse_conversation
from experiments.common.grade import grades as typed
from experiments.studies.craftmd.metrics import grades

GREETING = "Hi! What symptoms are you facing today?"


def _import(fixtures_dir, tmp_path):
    m = import_folder(fixtures_dir / "craftmd" / "published_open", "open", tmp_path / "imp", str(fixtures_dir / "craftmd" / "cases.csv"))
    recs = {r["id"]: r for r in map(json.loads, (tmp_path / "imp" / "records.jsonl").read_text().splitlines())}
    return m, recs


def test_instruction_dropped_and_greeting_not_a_doctor_turn(fixtures_dir, tmp_path):
    m, recs = _import(fixtures_dir, tmp_path)
    t0 = recs["case_c/t0"]["transcript"]
    assert t0[0] == {"role": "doctor", "text": GREETING, "turn": 0}
    assert t0[1]["role"] == "patient" and t0[1]["text"].startswith("My son has a sore throat")
    assert not any(t["text"].startswith("You are an AI doctor") for r in recs.values() for t in r["transcript"])
    assert [t["turn"] for t in t0] == [0, 0, 1, 1, 2]
    assert [recs[f"case_c/t{k}"]["metadata"]["n_doctor_turns"] for k in range(5)] == [2, 2, 2, 1, 1]
    assert m["mean_doctor_turns"] == 8 / 5


def test_stop_reasons_with_the_inferred_turn_cap(fixtures_dir, tmp_path):
    m, recs = _import(fixtures_dir, tmp_path)
    # a closing question without the marker: only a cap stops it -> the release's cap is 2 doctor turns
    assert m["turn_cap_inferred"] == 2
    assert [recs[f"case_c/t{k}"]["metadata"]["stop_reason"] for k in range(5)] == ["turn_cap", "turn_cap", "final_diagnosis", "no_question", "unknown"]
    assert m["stop_reasons"] == {"turn_cap": 2, "final_diagnosis": 1, "no_question": 1, "unknown": 1}
    assert "turn cap inferred from the release: 2 doctor turns" in (tmp_path / "imp" / "summary.md").read_text()


def test_missing_mcq_answer_is_recorded_wrong_and_shown(fixtures_dir, tmp_path):
    m, recs = _import(fixtures_dir, tmp_path)
    t4, g = recs["case_c/t4"]["answer"], grades(recs["case_c/t4"])
    for fmt in ("multiturn", "singleturn", "summarized"):
        assert g[(fmt, "mcq")].source == "unparsed" and g[(fmt, "mcq")].value == 0 and g[(fmt, "mcq")].metadata["missing"] is True
        assert t4[fmt]["mcq"] is None
        assert g[(fmt, "frq")].value == 0 and g[(fmt, "frq")].metadata["published_evaluation"] == -1
    assert m["parse_errors"] >= 3  # the three missing MCQ answers, counted from the scores
    # counted: multi-turn MCQ right in t0 (letter B), t2, t3; wrong in t1 (Measles) and t4 (missing)
    mt = next(f for f in m["scores"] if f["score"] == "mcq/multiturn")
    assert mt["values"] == 5 and mt["value"] == 0.6 and mt["n"] == 1  # one case: its five trials are one unit
    assert {"id": "case_c/t4", "format": "multiturn", "answer": "(no answer in the file)"} in m["mcq_unmapped"]
    assert "(no answer in the file)" in (tmp_path / "imp" / "summary.md").read_text()


def test_gpt_release_shape_greeting_and_stop_rules():
    conv = [{"role": "system", "content": "You are an AI doctor."}, {"role": "assistant", "content": GREETING},
            {"role": "user", "content": "I have a rash."}, {"role": "assistant", "content": "Where is it?"},
            {"role": "user", "content": "On my arms."}, {"role": "assistant", "content": "**Final Diagnosis:** Eczema"}]
    t = parse_conversation(conv, "f.json")
    assert [(x["role"], x["turn"]) for x in t] == [("doctor", 0), ("patient", 0), ("doctor", 1), ("patient", 1), ("doctor", 2)]
    assert infer_stop(t) == "final_diagnosis"
    asked = t[:-1] + [{"role": "doctor", "text": "Any itching?", "turn": 2}]
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
    pc = [{k.removeprefix("patient-check/"): g for k, g in typed(r).items() if k.startswith("patient-check/")} for r in recs]
    assert [p["leaks_diagnosis"].value for p in pc] == [1, 0, 0, 0]  # the negated choices are no mention
    assert [p["breaks_character"].value for p in pc] == [0, 0, 1, 0]
    # "fever", "had", "a" alone; then "a fine sandpaper like red rash appeared", 7 of the vignette's words in a row: the
    # longest run, a descriptive figure; no failure, as the run holds no clinical content (no listed term, unit, lab or chart word)
    assert [p["copies_vignette"].metadata["longest_span"] for p in pc] == [1, 1, 1, 7] and [p["copies_vignette"].value for p in pc] == [0, 0, 0, 0]
    assert not any(p["names_other_choice"].value for p in pc)
    x = {(f["score"], f["metric"]): f for f in m["scores"]}[("patient-check/leaks_diagnosis", "per conversation")]
    assert (x["values"], x["value"], x["n"]) == (4, 0.25, 1)  # one case, four trials: 1 of 4, its interval over the one case
    summary = (tmp_path / "imp" / "summary.md").read_text()
    assert "| patient-check/leaks_diagnosis: the patient names the correct diagnosis before the doctor's final turn | 0.250 [0.250, 0.250] (n=1) |" in summary
    assert summary.count("(authors' release): per conversation") == 4
