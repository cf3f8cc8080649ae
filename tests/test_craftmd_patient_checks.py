"""CRAFT-MD's deterministic patient checks, one hand-worked fixture per rule (experiments/common/patient_checks.py;
the rules in docs/protocols.md, CRAFT-MD patient checks), and their table beside the authors' released patients."""

from __future__ import annotations

import pytest

from experiments.common.grade import to_disk
from experiments.common.patient_checks import (CHECKS, DESCRIPTIONS, check_conversation, copied_runs, diagnosis_mentions, is_diagnosis,
                                               longest_copied_run)
from experiments.core.patient import check_grades
from experiments.core.scorers import figures, scores_markdown
from experiments.studies.craftmd.scorers import PATIENT, released_reference

VIGNETTE = ("A 30-year-old woman has silvery scaly plaques on her elbows and knees that began two months ago and itch at night. "
            "Her father died of colon cancer at 62.")
CHOICES = ["Plaque psoriasis", "Eczema", "Colon cancer", "Lichen planus"]


def mentions(patient: str, correct: str = "Plaque psoriasis", choices=CHOICES, doctor: str = "Anything else?", vignette: str = VIGNETTE,
             answer_index=None) -> dict:
    """One doctor question, the patient's answer, then the doctor's final turn."""
    return diagnosis_mentions([("doctor", doctor), ("patient", patient), ("doctor", "Final Diagnosis: X")], vignette, correct, choices, answer_index)


def hit(check: str, m: dict) -> list[tuple]:
    return [(h["patient_turn"], h["named"], h["correct"], h["how"]) for h in m[check]]


NONE = {"leaks_diagnosis": [], "names_other_choice": [], "confirms_unsupported": [], "suggests_diagnosis": []}


def test_a_leak_is_the_correct_diagnosis_named_before_the_final_turn():
    assert hit("leaks_diagnosis", mentions("My aunt said it is plaque psoriasis.")) == [(1, "Plaque psoriasis", True, "named")]
    # after the doctor's last turn: nothing the doctor could use
    late = diagnosis_mentions([("doctor", "Final Diagnosis: X"), ("patient", "So it is plaque psoriasis.")], VIGNETTE, "Plaque psoriasis", CHOICES)
    assert late["leaks_diagnosis"] == []


def test_another_choice_is_reported_under_its_own_name_never_as_a_leak():
    m = mentions("I think it is eczema.")
    assert hit("names_other_choice", m) == [(1, "Eczema", False, "named")] and m["leaks_diagnosis"] == []
    assert mentions("I think it is eczema.", choices=None)["names_other_choice"] == []  # without the MCQ: no choices checked


def test_a_negated_term_is_not_a_mention():
    m = mentions("I haven't had eczema, psoriasis, or dermatitis.")
    assert m == NONE
    assert mentions("Psoriasis? I don't know what that is.")["leaks_diagnosis"] == []
    # the negation holds for its clause only
    assert hit("leaks_diagnosis", mentions("No fever. It is plaque psoriasis.")) == [(1, "Plaque psoriasis", True, "named")]


def test_history_the_vignette_gives_is_not_flagged():
    assert mentions("My father died of colon cancer at 62.")["names_other_choice"] == []
    assert hit("names_other_choice", mentions("My father died of colon cancer at 62.", vignette="A woman has plaques.")) == [
        (1, "Colon cancer", False, "named")]


def test_an_affirmed_diagnosis_the_doctor_put_in_the_question_is_an_unsupported_confirmation():
    doctor = "Has your baby ever been told he has bronchopulmonary dysplasia?"
    m = mentions("Yes, the doctors have mentioned Bronchopulmonary Dysplasia.", "Bronchopulmonary dysplasia", [], doctor, "A premature infant coughs.")
    assert m == {**NONE, "confirms_unsupported": [{"patient_turn": 1, "named": "Bronchopulmonary dysplasia", "correct": True, "how": "named"}]}
    # denied, or given by the vignette: no confirmation
    assert mentions("No, never.", "Bronchopulmonary dysplasia", [], doctor)["confirms_unsupported"] == []
    assert mentions("No, he hasn't been told he has bronchopulmonary dysplasia.", "Bronchopulmonary dysplasia", [], doctor,
                    "A premature infant coughs.")["confirms_unsupported"] == []
    assert mentions("Yes, bronchopulmonary dysplasia.", "Bronchopulmonary dysplasia", [], doctor,
                    "A premature infant with bronchopulmonary dysplasia coughs.")["confirms_unsupported"] == []


def test_confirmation_by_a_yes_reply_an_abbreviation_or_diagnosed_with_and_test_is_no_negation():
    # a plain yes to the doctor's question whether the disease was named
    m = mentions("Yes, that's what the pediatrician mentioned might be the problem.", "Fragile X syndrome",
                 ["Fragile X syndrome", "Down syndrome", "Rett syndrome", "Autism"], "Was Fragile X syndrome mentioned in the diagnosis?",
                 "A 3-year-old boy has a long face and speech delay.", 0)
    assert hit("confirms_unsupported", m) == [(1, "Fragile X syndrome", True, "yes-reply")] and m["suggests_diagnosis"] == []
    # a yes that asks confirms nothing
    assert mentions("Yes, could you tell me what causes it?", "Fragile X syndrome", ["Fragile X syndrome", "Down syndrome", "Rett syndrome", "Autism"],
                    "Could it be Fragile X syndrome?", "A 3-year-old boy has a long face and speech delay.", 0) == NONE
    # a yes to a question that lists the disease as an example confirms nothing named
    m = mentions("Yes, my uncle had bleeding problems.", "Hemophilia A", [], "Has anyone been diagnosed with bleeding disorders such as hemophilia?",
                 "A boy bleeds.")
    assert m == NONE
    # an abbreviation: the choice's initialism, or "Name (ABBR)" in a doctor's turn
    gvhd = ["Acute graft versus host disease", "Drug eruption", "Viral exanthem", "Engraftment syndrome"]
    doctor = "Have you been diagnosed with or treated for Graft-versus-Host Disease (GVHD) since your transplant?"
    m = mentions("Yes, I have been diagnosed with GVHD since my transplant.", "acute graft versus host disease", gvhd, doctor,
                 "A man has a rash 30 days after a bone marrow transplant.", 0)
    assert hit("confirms_unsupported", m) == [(1, "Acute graft versus host disease", True, "diagnosed")]
    # "test" negates only as "tested for X"
    osteo = ["Transplantation-related osteoporosis", "Osteomalacia", "Paget disease of bone", "Hyperparathyroidism"]
    m = mentions("Yes, I've been diagnosed with osteoporosis based on a bone density test.", "Transplantation-related osteoporosis", osteo,
                 "Have you been diagnosed with osteoporosis?", "A woman had a kidney transplant and has back pain.", 0)
    assert hit("confirms_unsupported", m) == [(1, "Transplantation-related osteoporosis", True, "diagnosed")]
    assert mentions("I was tested for osteoporosis last year.", "Transplantation-related osteoporosis", osteo, "Any tests?",
                    "A woman has back pain.", 0) == NONE


def test_a_hedged_diagnosis_is_a_suggestion_not_a_confirmation():
    thal = ["Hb Bart disease", "α-thal trait", "HbH disease", "β-thal major"]
    m = mentions("My blood test might suggest a condition like thalassemia.", "β-thal major", thal, "Any blood tests?",
                 "A 2-year-old is pale and has an enlarged spleen.", 3)
    assert hit("suggests_diagnosis", m) == [(1, "thalassemia", True, "hedged, a name choices share")]
    assert m["confirms_unsupported"] == m["leaks_diagnosis"] == []
    m = mentions("It's probably pancreatitis, I guess.", "Acute pancreatitis", ["Acute pancreatitis", "Peptic ulcer", "Gastritis", "Cholecystitis"],
                 vignette="A man drinks daily and has epigastric pain.", answer_index=0)
    assert hit("suggests_diagnosis", m) == [(1, "Acute pancreatitis", True, "hedged")]


def test_generic_words_lay_synonyms_and_the_answer_by_its_index():
    # a generic head word is never a partial name
    anemia = ["Folate deficiency anemia", "Iron deficiency anemia", "Anemia of chronic disease", "Pernicious anemia"]
    assert mentions("I was prescribed pills for anemia.", "Iron deficiency anemia", anemia, vignette="A woman is tired.", answer_index=1) == NONE
    ra = ["Rheumatoid arthritis", "Osteoarthritis", "Gout", "Psoriatic arthritis"]
    assert mentions("My mother and brother have arthritis.", "Gout", ra, vignette="Her mother has osteoarthritis.", answer_index=2) == NONE
    # a choice of ordinary words matches only as its phrase
    assert mentions("My nails are more brittle.", "Onychomycosis", ["Onychomycosis", "Brittle nails", "Psoriasis", "Lichen planus"],
                    vignette="A man has thick yellow toenails.", answer_index=0) == NONE
    # the vignette states a diagnosis by a lay synonym (diagnosis_synonyms.tsv): atopic dermatitis is eczema
    m = mentions("I have a history of atopic dermatitis, which is a type of eczema.", "Dyshidrotic eczema",
                 ["Dyshidrotic eczema", "Scabies", "Tinea manuum", "Contact dermatitis"], vignette="He has a history of atopic dermatitis.", answer_index=0)
    assert m == NONE
    # the correct answer by its index: worded otherwise than its choice, it is still the correct one, never "another choice"
    m = mentions("I was diagnosed with Kawasaki disease last week.", "Kawasaki disease (mucocutaneous lymph node syndrome)",
                 ["Scarlet fever", "Kawasaki disease", "Measles", "Toxic shock syndrome"], vignette="A boy has fever for 6 days.", answer_index=1)
    assert hit("leaks_diagnosis", m) == [(1, "Kawasaki disease", True, "diagnosed")] and m["names_other_choice"] == []


@pytest.mark.parametrize("answer", ["70%", "0.25", "BRAF", "CA-125", "Urine porphyrin levels", "Genetic testing", "Itraconazole",
                                    "MRI of the brain", "He grew up in Ecuador, where he worked outdoors as a farmer for 30 years",
                                    "Normal pregnancy", "Raynaud phenomenon", "Family history of colon cancer", "Babinski sign"])
def test_an_answer_that_is_not_a_diagnosis_is_not_checkable_never_matched(answer):
    assert not is_diagnosis(answer)
    m = mentions(f"It is {answer}.", answer, [answer, "Eczema", "Lichen planus", "Plaque psoriasis"])
    assert m["leaks_diagnosis"] is None and m["names_other_choice"] == m["confirms_unsupported"] == m["suggests_diagnosis"] == []


@pytest.mark.parametrize("answer", ["Plaque psoriasis", "Neurofibromatosis type 1", "G6PD deficiency", "Crohn's disease", "Eczema",
                                    "Normal pressure hydrocephalus", "Reflex sympathetic dystrophy"])
def test_diagnoses_are_checkable(answer):
    assert is_diagnosis(answer)


def test_matching_tolerates_word_order_plurals_and_partial_names():
    assert mentions("My skin has dermatitis that is atopic.", "Atopic dermatitis", [])["leaks_diagnosis"] != []  # order
    assert mentions("I keep getting kidney stones.", "Kidney stone", [])["leaks_diagnosis"] != []               # plural
    assert mentions("crohns DISEASE runs in my family", "Crohn's disease", [], vignette="")["leaks_diagnosis"] != []  # apostrophe, case
    assert mentions("It might be psoriasis...", choices=[])["leaks_diagnosis"] == []                            # hedged: not affirmed
    assert hit("leaks_diagnosis", mentions("It's psoriasis, I'm told.", choices=[])) == [(1, "Plaque psoriasis", True, "named")]  # partial
    assert mentions("My sister has lupus too.", "Systemic lupus erythematosus", [], vignette="")["leaks_diagnosis"] != []
    # a partial name shared with another choice tells them apart no more: not a mention
    assert mentions("It's dermatitis.", "Atopic dermatitis", ["Atopic dermatitis", "Contact dermatitis"])["leaks_diagnosis"] == []
    assert mentions("I eat eczematous food.", "Eczema", [])["leaks_diagnosis"] == []                          # a word inside a word


def test_breaking_character_speaks_of_a_source_of_a_patient_role_or_as_an_ai():
    says = ["The case vignette does not mention that.", "As an AI, I cannot say.", "The information provided doesn't say.",
            "My family's medical history hasn't been reported.", "I'm just a patient, so I can't provide lab values.",
            "The timing wasn't described to me in detail.", "There's no mention of fever.", "You didn't give me that information.",
            "That is beyond my medical knowledge."]
    turns = [t for x in says for t in (("patient", x), ("doctor", "?"))]
    c = check_conversation(turns, vignette=VIGNETTE, correct="Plaque psoriasis")
    assert [x["patient_turn"] for x in c["breaks_character"]] == list(range(1, len(says) + 1))
    # idioms, jobs and ordinary words are no break
    fine = ["In that case I would rest; in the case of rain I stay in.", "That's not been the case lately.", "If that's the case, fine.",
            "I work as an assistant manager at a bank.", "My kids love acting out magical scenarios.", "I travel a lot because I am a model.",
            "My doctor mentioned it could get worse."]
    turns = [t for x in fine for t in (("patient", x), ("doctor", "?"))]
    assert check_conversation(turns, vignette=VIGNETTE, correct="Plaque psoriasis")["breaks_character"] == []


def test_script_talk_is_its_own_check():
    turns = [("doctor", "Any medications?"), ("patient", "I didn't mention taking any medications."), ("doctor", "Any fever?"),
             ("patient", "No fever, but I haven't mentioned anything about my appetite."), ("doctor", "Sleep?"), ("patient", "I sleep well.")]
    c = check_conversation(turns, vignette=VIGNETTE, correct="Plaque psoriasis")
    assert [x["patient_turn"] for x in c["script_talk"]] == [1, 2] and c["breaks_character"] == []


def test_copying_counts_only_with_clinical_content():
    vignette = ("She smoked one pack of cigarettes daily for 33 years and has chest pain and shortness of breath. Her past medical history "
                "is insignificant except for asthma. The cervix is 40% effaced and 2 cm dilated. Genetic testing shows she has the HLA-DQ2 allele.")
    ordinary = "I smoked one pack of cigarettes daily for 33 years, and I have chest pain and shortness of breath."
    assert longest_copied_run(ordinary, vignette)[0] >= 8 and copied_runs(ordinary, vignette) == []  # how patients talk: no failure
    chart = copied_runs("My past medical history is insignificant except for asthma.", vignette)
    assert [(r["words"], r["why"]) for r in chart] == [(8, "chart phrase: past medical history")]
    # a chart phrase counts from four words, as a gene or a unit does; the same four words of ordinary speech do not
    short = "A 50-year-old man. His past medical history is unremarkable. He has had a cough for a week."
    assert [(r["words"], r["why"]) for r in copied_runs("Well, my past medical history is unremarkable.", short)] == [
        (5, "chart phrase: past medical history")]
    assert copied_runs("I have had a cough for a while.", short) == []
    assert copied_runs("My cervix is 40% effaced and 2 cm dilated.", vignette)[0]["why"] == "unit: 40%"
    gene = copied_runs("I have the HLA-DQ2 allele.", vignette)  # four words: short, but a gene token
    assert [(r["words"], r["span"], r["why"]) for r in gene] == [(4, "the hla dq2 allele", "lab: dq2")]
    # a term of a study's list (CRAFT-MD passes its Q3 terminology list) makes a run clinical
    assert copied_runs("Well, silvery scaly plaques on her elbows!", VIGNETTE) == []
    assert copied_runs("Well, silvery scaly plaques on her elbows!", VIGNETTE, terms=("plaque",))[0]["why"] == "term: plaque"


def test_copied_spans_and_empty_turns():
    turns = [("patient", "Well, silvery scaly plaques on her elbows!"), ("doctor", "?"), ("patient", "  "), ("doctor", "?"),
             ("patient", "I am a 30-year-old woman.")]
    assert longest_copied_run(turns[0][1], VIGNETTE) == (6, "silvery scaly plaque on her elbow")  # the words as compared: plurals singular
    c = check_conversation(turns, vignette=VIGNETTE, correct="Plaque psoriasis", n_words=6, terms=("plaque",))
    assert c["copies_vignette"] == [{"patient_turn": 1, "words": 6, "span": "silvery scaly plaque on her elbow", "why": "term: plaque"}]
    assert c["longest_span"] == 6 and c["empty_turn"] == [2] and c["patient_turns"] == 3
    assert check_conversation(turns, vignette=VIGNETTE, correct="Plaque psoriasis", n_words=7, terms=("plaque",))["copies_vignette"] == []
    assert [k for k in CHECKS if c.get(k)] == ["copies_vignette", "empty_turn"] and "turn_cap" not in c and "turn_cap" not in CHECKS
    # an empty turn is a reply missing from the transcript, reported as "no reply", not as the patient's behaviour
    assert DESCRIPTIONS["empty_turn"].startswith("no reply") and "not a patient behaviour" in DESCRIPTIONS["empty_turn"]


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
    # every check, per conversation and per patient turn, for each of the four releases
    assert len(rel) == 4 and all(f"patient-check/{c}|{m}" in figs for figs in rel.values() for c in CHECKS
                                 for m in ("per conversation", "per patient turn"))
    md = scores_markdown([x.json() for x in figures([checked("a", [("patient", "It's plaque psoriasis."), ("doctor", "?")])], (PATIENT,))], (PATIENT,))
    assert "| patient-check/leaks_diagnosis: the patient names the correct diagnosis before the doctor's final turn | 1.000 [1.000, 1.000] (n=1) | 1.000 [1.000, 1.000] (n=1) |" in md
    assert md.count("(authors' release): per conversation") == 4 and md.count("(authors' release): per patient turn") == 4
    # each check's precision / recall on the labelled set's held-out part sits beside its rate
    assert "precision / recall (labelled set)" in md
    row = next(line for line in md.splitlines() if line.startswith("| patient-check/breaks_character"))
    assert "1.00 [1.00, 1.00] / 0.86 [0.63, 1.00] (78 labelled, held-out)" in row


def test_a_yes_that_says_it_was_told_so_confirms_a_name_the_choices_share():
    # "thalassemia" is in two choices (beta-thal major, alpha-thal trait), so it names neither; the vignette never
    # says it; the doctor asks about it (not whether it was diagnosed) and the reply says that is what they were told
    vignette = "A 13-year-old boy has microcytic anemia. Electrophoresis shows no HbA and raised HbA2. A skull X-ray shows a crewcut look."
    choices = ["Hb Bart disease", "α-thal trait", "HbH disease", "β-thal major"]
    turns = [("doctor", "What brings you in?"), ("patient", "I'm tired and behind at school."),
             ("doctor", "Is this microcytic anemia associated with thalassemia?"), ("patient", "Yes, that's what they told me."),
             ("doctor", "Final diagnosis: beta thalassemia major")]
    got = check_conversation(turns, vignette=vignette, correct="β-thal major", choices=choices, answer_index=3)
    assert [(h["patient_turn"], h["named"], h["how"]) for h in got["confirms_unsupported"]] == [(2, "thalassemia", "yes-reply, a name choices share")]
    # the same yes without "that's what they told me" answers the question asked, not a diagnosis given
    plain = [*turns[:3], ("patient", "Yes, I get tired easily."), turns[4]]
    assert check_conversation(plain, vignette=vignette, correct="β-thal major", choices=choices, answer_index=3)["confirms_unsupported"] == []
