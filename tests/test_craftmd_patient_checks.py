"""CRAFT-MD's deterministic patient checks, one hand-worked fixture per rule (experiments/common/patient_checks.py;
the rules in docs/protocols.md, CRAFT-MD patient checks), and their table beside the authors' released patients."""

from __future__ import annotations

import pytest

from experiments.common.grade import to_disk
from experiments.common.patient_checks import CHECKS, check_conversation, diagnosis_mentions, is_diagnosis, longest_copied_run
from experiments.core.patient import check_grades
from experiments.core.scorers import figures, scores_markdown
from experiments.studies.craftmd.scorers import PATIENT, released_reference

VIGNETTE = ("A 30-year-old woman has silvery scaly plaques on her elbows and knees that began two months ago and itch at night. "
            "Her father died of colon cancer at 62.")
CHOICES = ["Plaque psoriasis", "Eczema", "Colon cancer", "Lichen planus"]


def mentions(patient: str, correct: str = "Plaque psoriasis", choices=CHOICES, doctor: str = "Anything else?", vignette: str = VIGNETTE) -> dict:
    """One doctor question, the patient's answer, then the doctor's final turn."""
    return diagnosis_mentions([("doctor", doctor), ("patient", patient), ("doctor", "Final Diagnosis: X")], vignette, correct, choices)


def test_a_leak_is_the_correct_diagnosis_named_before_the_final_turn():
    assert mentions("My aunt said it is plaque psoriasis.")["leaks_diagnosis"] == [{"patient_turn": 1, "named": "Plaque psoriasis"}]
    # after the doctor's last turn: nothing the doctor could use
    late = diagnosis_mentions([("doctor", "Final Diagnosis: X"), ("patient", "So it is plaque psoriasis.")], VIGNETTE, "Plaque psoriasis", CHOICES)
    assert late["leaks_diagnosis"] == []


def test_another_choice_is_reported_under_its_own_name_never_as_a_leak():
    m = mentions("I think it is eczema.")
    assert m["names_other_choice"] == [{"patient_turn": 1, "named": "Eczema"}] and m["leaks_diagnosis"] == []
    assert mentions("I think it is eczema.", choices=None)["names_other_choice"] == []  # without the MCQ: no choices checked


def test_a_negated_term_is_not_a_mention():
    m = mentions("I haven't had eczema, psoriasis, or dermatitis.")
    assert m == {"leaks_diagnosis": [], "names_other_choice": [], "confirms_unsupported": []}
    assert mentions("Psoriasis? I don't know what that is.")["leaks_diagnosis"] == []
    # the negation holds for its clause only
    assert mentions("No fever. It is plaque psoriasis.")["leaks_diagnosis"] == [{"patient_turn": 1, "named": "Plaque psoriasis"}]


def test_history_the_vignette_gives_is_not_flagged():
    assert mentions("My father died of colon cancer at 62.")["names_other_choice"] == []
    assert mentions("My father died of colon cancer at 62.", vignette="A woman has plaques.")["names_other_choice"] == [
        {"patient_turn": 1, "named": "Colon cancer"}]


def test_an_affirmed_diagnosis_the_doctor_put_in_the_question_is_an_unsupported_confirmation():
    doctor = "Has your baby ever been told he has bronchopulmonary dysplasia?"
    m = mentions("Yes, the doctors have mentioned Bronchopulmonary Dysplasia.", "Bronchopulmonary dysplasia", [], doctor, "A premature infant coughs.")
    assert m == {"leaks_diagnosis": [], "names_other_choice": [], "confirms_unsupported": [{"patient_turn": 1, "named": "Bronchopulmonary dysplasia"}]}
    # denied, or given by the vignette: no confirmation
    assert mentions("No, never.", "Bronchopulmonary dysplasia", [], doctor)["confirms_unsupported"] == []
    assert mentions("No, he hasn't been told he has bronchopulmonary dysplasia.", "Bronchopulmonary dysplasia", [], doctor,
                    "A premature infant coughs.")["confirms_unsupported"] == []
    assert mentions("Yes, bronchopulmonary dysplasia.", "Bronchopulmonary dysplasia", [], doctor,
                    "A premature infant with bronchopulmonary dysplasia coughs.")["confirms_unsupported"] == []


@pytest.mark.parametrize("answer", ["70%", "0.25", "BRAF", "CA-125", "Urine porphyrin levels", "Genetic testing", "Itraconazole",
                                    "MRI of the brain", "He grew up in Ecuador, where he worked outdoors as a farmer for 30 years"])
def test_an_answer_that_is_not_a_diagnosis_is_not_checkable_never_matched(answer):
    assert not is_diagnosis(answer)
    m = mentions(f"It is {answer}.", answer, [answer, "Eczema", "Lichen planus", "Plaque psoriasis"])
    assert m["leaks_diagnosis"] is None and m["names_other_choice"] == [] and m["confirms_unsupported"] == []


@pytest.mark.parametrize("answer", ["Plaque psoriasis", "Neurofibromatosis type 1", "G6PD deficiency", "Crohn's disease", "Eczema"])
def test_diagnoses_are_checkable(answer):
    assert is_diagnosis(answer)


def test_matching_tolerates_word_order_plurals_and_partial_names():
    assert mentions("My skin has dermatitis that is atopic.", "Atopic dermatitis", [])["leaks_diagnosis"] != []  # order
    assert mentions("I keep getting kidney stones.", "Kidney stone", [])["leaks_diagnosis"] != []               # plural
    assert mentions("crohns DISEASE runs in my family", "Crohn's disease", [], vignette="")["leaks_diagnosis"] != []  # apostrophe, case
    assert mentions("It might be psoriasis...", choices=[])["leaks_diagnosis"] == []                            # hedged: not affirmed
    assert mentions("It's psoriasis, I'm told.", choices=[])["leaks_diagnosis"] == [{"patient_turn": 1, "named": "Plaque psoriasis"}]  # partial
    assert mentions("My sister has lupus too.", "Systemic lupus erythematosus", [], vignette="")["leaks_diagnosis"] != []
    # a partial name shared with another choice tells them apart no more: not a mention
    assert mentions("It's dermatitis.", "Atopic dermatitis", ["Atopic dermatitis", "Contact dermatitis"])["leaks_diagnosis"] == []
    assert mentions("I eat eczematous food.", "Eczema", [])["leaks_diagnosis"] == []                          # a word inside a word


def test_breaking_character():
    turns = [("patient", "The case vignette does not mention that."), ("doctor", "?"), ("patient", "As an AI, I cannot say."),
             ("doctor", "?"), ("patient", "In that case I would rest; in the case of rain I stay in."), ("doctor", "?"),
             ("patient", "The information provided doesn't say.")]
    c = check_conversation(turns, vignette=VIGNETTE, correct="Plaque psoriasis")
    assert [(x["patient_turn"], x["said"].lower()) for x in c["breaks_character"]] == [(1, "the case"), (2, "as an ai"), (4, "information provided")]


def test_copied_spans_and_empty_turns():
    turns = [("patient", "Well, silvery scaly plaques on her elbows!"), ("doctor", "?"), ("patient", "  "), ("doctor", "?"),
             ("patient", "I am a 30-year-old woman.")]
    assert longest_copied_run(turns[0][1], VIGNETTE) == (6, "silvery scaly plaque on her elbow")  # the words as compared: plurals singular
    c = check_conversation(turns, vignette=VIGNETTE, correct="Plaque psoriasis", n_words=6)
    assert c["copies_vignette"] == [{"patient_turn": 1, "words": 6, "span": "silvery scaly plaque on her elbow"}]
    assert c["longest_span"] == 6 and c["empty_turn"] == [2] and c["patient_turns"] == 3
    assert check_conversation(turns, vignette=VIGNETTE, correct="Plaque psoriasis", n_words=7)["copies_vignette"] == []
    assert [k for k in CHECKS if c.get(k)] == ["copies_vignette", "empty_turn"] and "turn_cap" not in c and "turn_cap" not in CHECKS


def checked(case: str, turns, correct="Plaque psoriasis", choices=None) -> dict:
    """A record of ``case`` with the patient checks' grades, as the scorer gives them."""
    return {"id": case, "case_id": case, "scores": to_disk({f"patient-check/{c}": g for c, g in check_grades(
        check_conversation(turns, vignette=VIGNETTE, correct=correct, choices=choices), choices).items()})}


def test_rates_per_conversation_and_per_patient_turn_with_cis_over_cases_and_the_not_checkable():
    leak = [("patient", "It's plaque psoriasis."), ("doctor", "?")]
    quiet = [("patient", "It itches."), ("doctor", "?"), ("patient", "At night."), ("doctor", "?")]
    recs = [checked("a", leak), checked("a", quiet), checked("b", quiet), checked("c", leak, correct="70%"), {"id": "d", "case_id": "d"}]
    f = {(x.score, x.metric): x for x in figures(recs, (PATIENT,))}
    per_conv, per_turn = f[("patient-check/leaks_diagnosis", "per conversation")], f[("patient-check/leaks_diagnosis", "per patient turn")]
    # per conversation: case a 1 of 2, case b 0 of 1 -> 0.25 over the two checkable cases; case c's answer is not a diagnosis
    assert (per_conv.n, per_conv.values, per_conv.not_checkable) == (2, 3, 1) and per_conv.value == pytest.approx(0.25)
    assert 0 <= per_conv.low <= 0.25 <= per_conv.high <= 0.5
    # per patient turn: 1 flagged turn of the 1 + 2 + 2 patient turns of cases a and b
    assert per_turn.value == pytest.approx(1 / 5) and per_turn.n == 2
    # no choices offered: the check of another choice cannot apply, and says so
    x = f[("patient-check/names_other_choice", "per conversation")]
    assert x.value is None and x.not_checkable == 4 and x.text() == "not checkable"


def test_the_table_puts_a_run_beside_the_four_released_patients():
    rel = released_reference()
    assert len(rel) == 4 and all(f"patient-check/{c}|per conversation" in figs for figs in rel.values() for c in CHECKS)
    md = scores_markdown([x.json() for x in figures([checked("a", [("patient", "It's plaque psoriasis."), ("doctor", "?")])], (PATIENT,))], (PATIENT,))
    assert "| patient-check/leaks_diagnosis: the patient names the correct diagnosis before the doctor's final turn | 1.000 [1.000, 1.000] (n=1) | 1.000 [1.000, 1.000] (n=1) |" in md
    assert md.count("(authors' release): per conversation") == 4
