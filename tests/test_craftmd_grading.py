"""CRAFT-MD scoring logic: MCQ parsing, grader replies (Multiple/None = 0), the subtype rule, case loading."""

from __future__ import annotations

import pytest

from experiments.studies.craftmd import grading
from experiments.studies.craftmd.data import answer_index, load_cases
from experiments.common.choice import map_choice, same_but_typos
from experiments.common.parsing import extract_verdict
from models.errors import DataError

CHOICES = ["Lymphogranuloma venereum", "Herpes", "Chancroid", "Syphilis"]


@pytest.mark.parametrize("reply, expected, how", [
    ("B", 1, "letter"),
    ("Answer: C", 2, "letter"),
    ("**Answer:** (A)", 0, "letter"),
    ("D) Syphilis", 3, "letter"),
    ("B\n>\nB", 1, "letter"),
    ("syphilis", 3, "exact"),
    ("I think this is chancroid.", 2, "contains"),
    ("A 22-year-old man with herpes", 1, "contains"),  # 'A' + a word is not a letter answer
    ("Lymphogranulomavenereum", 0, "fuzzy"),
    ("herpes or syphilis", None, "unparsed"),  # two choices named: a refusal to pick
    ("I cannot choose without an examination.", None, "unparsed"),
    ("", None, "unparsed"),
])
def test_map_choice(reply, expected, how):
    assert map_choice(reply, CHOICES) == (expected, how)


def test_parse_mcq_scores_refusal_as_wrong_and_flags_unscorable_cases():
    assert grading.parse_mcq("Chancroid", CHOICES, 2)["correct"] == 1
    assert grading.parse_mcq("Chancroid", CHOICES, 0)["correct"] == 0
    refused = grading.parse_mcq("I would need more information.", CHOICES, 0)
    assert refused["choice"] is None and refused["correct"] == 0 and refused["parsed_by"] == "unparsed"
    unscorable = grading.parse_mcq("B", CHOICES, None)
    assert unscorable["correct"] is None and unscorable["unscored_reason"] == "answer_not_in_choices"


@pytest.mark.parametrize("reply, expected", [
    ("Diagnosis: Plaque psoriasis", ("Plaque psoriasis", "ok")),
    (" Iron deficiency anaemia\nDoctor's answer: ...", ("Iron deficiency anaemia", "ok")),
    ("Multiple", (None, "multiple")),
    ("Diagnosis: Multiple.", (None, "multiple")),
    ("None", (None, "none")),
    ("Diagnosis: none", (None, "none")),
    ("Read a doctor's answer and copy out the diagnosis it gives.", (None, "unparsed")),  # prompt echo
    ("", (None, "unparsed")),
])
def test_parse_extraction(reply, expected):
    assert grading.parse_extraction(reply) == expected


def test_multiple_and_none_score_zero_without_a_verdict():
    for status in ("multiple", "none"):
        g = grading.grade_frq(None, status, "Gout", None)
        assert g == {"correct": 0, "grade_source": f"extraction_{status}"}
        assert not grading.match_targets(None, status, "Gout")


@pytest.mark.parametrize("given, correct, relation", [
    ("psoriasis", "Plaque psoriasis", "given_broader"),       # correct is a subtype of the given -> accept
    ("Guttate psoriasis", "Psoriasis", "given_narrower"),     # given is a more specific subtype -> reject
    ("Myocardial infarction", "myocardial infarction.", "equal"),
    ("Graves' disease", "Graves disease", "equal"),
    ("Heart attack", "Myocardial infarction", None),         # synonyms need the grader
    ("Contact dermatitis", "Acute contact dermatitis", "given_broader"),
])
def test_lexical_subtype_relation(given, correct, relation):
    assert grading.lexical_relation(given, correct) == relation


def test_grade_frq_subtype_rule_and_verdicts():
    # exact (after normalisation) needs no grader call
    assert grading.grade_frq("Scarlet fever", "ok", "scarlet fever", None) == {"correct": 1, "grade_source": "exact"}
    assert not grading.match_targets("Scarlet fever", "ok", "scarlet fever")
    # the grader's verdict decides when it parses
    assert grading.grade_frq("Heart attack", "ok", "Myocardial infarction", "Verdict: Yes") == {"correct": 1, "grade_source": "grader"}
    assert grading.grade_frq("Guttate psoriasis", "ok", "Psoriasis", " No") == {"correct": 0, "grade_source": "grader"}
    # an unparseable verdict falls back to the lexical subtype rule...
    assert grading.grade_frq("Psoriasis", "ok", "Plaque psoriasis", "Decide whether a given diagnosis matches the correct one")["correct"] == 1
    assert grading.grade_frq("Guttate psoriasis", "ok", "Psoriasis", "hmm")["correct"] == 0
    # ...and is unscored (None, counted) when the rule cannot decide
    assert grading.grade_frq("Heart attack", "ok", "Myocardial infarction", "hmm") == {"correct": None, "grade_source": "unscored_verdict"}
    assert grading.grade_frq(None, "unparsed", "Gout", None)["correct"] is None


@pytest.mark.parametrize("reply, verdict", [
    ("Yes", True), (" yes.", True), ("**Yes**", True), ("No, they differ", False), ("Verdict: No", False),
    ("Correct: gout. Given: x.\nVerdict: Yes", True),
    ("Correct: gout. Given: septic arthritis.", None),  # few-shot echo is no verdict
    ("Decide whether a given diagnosis matches the correct diagnosis.", None), ("", None),
])
def test_extract_verdict_is_strict(reply, verdict):
    assert extract_verdict(reply) is verdict


def test_answer_index_tolerates_published_whitespace():
    assert answer_index("Melanoma ", ["Intradermal nevus", "Solar lentigo", "Seborrheic keratosis", "Melanoma"]) == 3
    assert answer_index("Henoch-Scholein vasculitis", ["IgA vasculitis", "Bacterial endocarditis", "Meningococcemia", "Thrombocytopenic purpura"]) is None


def test_load_csv_fixture(fixtures_dir):
    cases = load_cases(fixtures_dir / "craftmd" / "cases.csv")
    assert [c["case_id"] for c in cases] == ["case_a", "case_b", "case_c", "case_d"]
    assert cases[2]["answer_index"] == 1 and cases[2]["answer"] == "Scarlet fever"  # trailing space in the file
    assert cases[0]["specialty"] == "Dermatology" and len(cases[0]["choices"]) == 4
    assert [c["case_id"] for c in load_cases(fixtures_dir / "craftmd" / "cases.csv", specialty="endocrinology")] == ["case_d"]


def test_load_osce_fixture(fixtures_dir):
    cases = load_cases(fixtures_dir / "craftmd" / "osce.jsonl")
    assert [c["answer"] for c in cases] == ["Migraine", "Community-acquired pneumonia"]
    assert cases[0]["choices"] == [] and cases[0]["specialty"] == "OSCE"
    v = cases[1]["vignette"]
    assert v.startswith("A 70-year-old man.") and "yellow sputum" in v and "Inhaled salbutamol" in v
    assert "consolidation" not in v  # test results are not the patient's knowledge


def test_bad_case_files_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("case_vignette,answer\nx,y\n")
    with pytest.raises(DataError, match=r"bad.csv:1: missing column"):
        load_cases(bad)
    dup = tmp_path / "dup.csv"
    row = '"v",a,b,c,d,a,Neurology,x,case_1\n'
    dup.write_text("case_vignette,choice_1,choice_2,choice_3,choice_4,answer,category,dataset,case_id\n" + row + row)
    with pytest.raises(DataError, match=r"dup.csv:3: duplicate case_id"):
        load_cases(dup)
    osce = tmp_path / "o.jsonl"
    osce.write_text('{"OSCE_Examination": {"Patient_Actor": {}}}\n{oops\n')
    with pytest.raises(DataError, match=r"o.jsonl:1"):
        load_cases(osce)
    with pytest.raises(DataError, match=r"no case of specialty"):
        load_cases(_ok_csv(tmp_path), specialty="Nope")


def _ok_csv(tmp_path):
    p = tmp_path / "ok.csv"
    p.write_text("case_vignette,choice_1,choice_2,choice_3,choice_4,answer,category,dataset,case_id\n\"v\",a,b,c,d,a,Neurology,x,case_1\n")
    return p


# -- the case question, MCQ mapping of verbose answers, no shortcut past the subtype rule, concurrent rule

from experiments.studies.craftmd.data import split_question


# The authors' rule (src/utils.py get_case_without_question), quirks included: the first "?" sentence of the last
# line, a sentence being a letter up to . ! ? (and an ASCII closing quote), every copy of it removed from the text,
# "of the following" (lower case) removed from it; no "?" sentence there: the default question.
@pytest.mark.parametrize("text, vignette, question, source", [
    ("A 40-year-old man has a rash. Which of the following is the most likely diagnosis?",
     "A 40-year-old man has a rash.", "Which is the most likely diagnosis?", "vignette"),  # their double space collapsed
    # a curly-quoted remark with "?" comes first: it is taken as the question (as theirs), the real one stays in the text
    ("He says “why are you asking me that?” He is adopted. Which of the following is the most likely diagnosis?",
     "” He is adopted. Which of the following is the most likely diagnosis?", "He says “why are you asking me that?", "vignette"),
    # a trailing line break leaves the last line blank: no question found there (theirs), the default asked
    ("A smear is shown in Figure A. Which of the following is the most appropriate next step?\n ",
     "A smear is shown in Figure A. Which of the following is the most appropriate next step?", "What is the final diagnosis?", "default"),
    ("Biopsy shows spike and dome deposits. Which of the following is the most likely diagnosis:",
     "Biopsy shows spike and dome deposits. Which of the following is the most likely diagnosis:", "What is the final diagnosis?", "default"),
    ("Labs: CK 3,120 U/L. Of the following options, which test helps make the diagnosis?",  # capital "Of": not removed
     "Labs: CK 3,120 U/L.", "Of the following options, which test helps make the diagnosis?", "vignette"),
    ("Is this new? she asked.\nA man has a rash. Which of the following is the cause?",  # only the last line is searched
     "Is this new? she asked.\nA man has a rash.", "Which is the cause?", "vignette"),
    ("Red-brown papules with a mica-like scale on the arms.", "Red-brown papules with a mica-like scale on the arms.",
     "What is the final diagnosis?", "default"),  # dermatology: no question
])
def test_split_question_is_the_authors(text, vignette, question, source):
    assert split_question(text) == (vignette, question, source)


def test_loaded_cases_carry_question_and_vignette_without_it(tmp_path):
    p = tmp_path / "q.csv"
    p.write_text('case_vignette,choice_1,choice_2,choice_3,choice_4,answer,category,dataset,case_id\n'
                 '"A man has gout. Which of the following is the best next step in management?",a,b,c,d,a,Rheumatology,x,case_1\n')
    c = load_cases(p)[0]
    assert c["question"] == "Which is the best next step in management?" and c["vignette"] == "A man has gout."
    assert c["vignette_full"].endswith("management?") and c["question_source"] == "vignette"


@pytest.mark.parametrize("reply, expected, how", [
    ("Chancroid", 2, "exact"),
    ("**Final Diagnosis:** Syphilis", 3, "stated"),
    ("Based on the symptoms, the most likely diagnosis is herpes, although chancroid is possible.", 1, "stated"),
    ("The answer is (B) Syphilis.", 3, "stated"),                # invented letter: the named choice wins
    ("Syphilis. Herpes and chancroid are less likely.", 3, "first"),  # commits first, then names others
    ("herpes or syphilis", None, "unparsed"),                    # a hedge is no pick
    ("Answer: C", 2, "letter"),
    ("The correct answer is: A history of travel", None, "unparsed"),  # 'A' is an article
    ("I cannot choose without an examination.", None, "unparsed"),
])
def test_map_choice_rules(reply, expected, how):
    assert map_choice(reply, CHOICES) == (expected, how)


def test_fuzzy_mcq_rule_takes_spelling_slips_not_other_diagnoses():
    gyn = ["Endometritis", "Adenomyosis", "Leiomyoma", "Ovarian torsion"]
    # a different diagnosis spelled alike is no pick (it used to map to Endometritis and score correct)
    assert map_choice("Endometriosis.", gyn) == (None, "unparsed")
    assert map_choice("The most likely diagnosis is endometriosis.", gyn) == (None, "unparsed")
    assert grading.parse_mcq("Endometriosis", gyn, 0)["correct"] == 0
    assert not same_but_typos("acute hepatitis a infection", "acute hepatitis b infection")
    # slips in the answer or in the published choice text still map
    assert map_choice("Central retinal artery occlusion", ["Central retinal artery occulsion", "Central retinal vein occlusion", "Giant cell arteritis", "Retinal detachment"]) == (0, "fuzzy")
    assert map_choice("Pityriasis rubra pilaris", ["Psoriasis", "Pityriasis ruba pilaris", "Pityriasis rosea", "Lichen planus"]) == (1, "fuzzy")
    assert map_choice("Lymphogranulomavenereum", CHOICES) == (0, "fuzzy")
    assert map_choice("Alzheimer's disease", ["Alzheimer disease", "Vascular dementia", "Lewy body dementia", "Delirium"]) == (0, "fuzzy")


def test_cushing_disease_is_never_scored_correct_by_a_shortcut():
    g, c = "Cushing disease", "Cushing syndrome"
    assert grading.match_targets(g, "ok", c) and grading.match_targets(g, "ok", c) == [g]
    assert grading.lexical_relation(g, c) is None  # disease/syndrome are words, not stop words
    assert grading.grade_frq(g, "ok", c, "Verdict: No") == {"correct": 0, "grade_source": "grader"}
    assert grading.grade_frq(g, "ok", c, "hmm")["correct"] is None  # unreadable verdict: unscored, not 1
    assert grading.match_targets("cushing's syndrome", "ok", "Cushing syndrome")  # asked, not assumed
    assert grading.grade_frq("Cushing  Syndrome.", "ok", "cushing syndrome", None) == {"correct": 1, "grade_source": "exact"}


def test_concurrent_rule_zero_vs_any():
    value, status = grading.parse_extraction("Diagnosis: tinea manuum, tinea pedis")
    assert status == "concurrent" and grading.split_concurrent(value) == ["tinea manuum", "tinea pedis"]
    assert grading.classify_extracted("hand, foot, and mouth disease") == ("hand, foot, and mouth disease", "ok")
    assert grading.split_concurrent("delusional disorder, erotomanic type") == ["delusional disorder, erotomanic type"]
    assert grading.grade_frq(value, status, "Tinea pedis", None, rule="zero") == {"correct": 0, "grade_source": "extraction_concurrent"}
    assert grading.match_targets(value, status, "Tinea pedis", "zero") == []
    assert grading.grade_frq(value, status, "Tinea pedis", None, rule="any") == {"correct": 1, "grade_source": "exact"}
    # any: each named diagnosis graded; one Yes is enough, all No is 0
    v2, s2 = grading.classify_extracted("eczema, athlete's foot")
    assert grading.match_targets(v2, s2, "Tinea pedis", "any") == ["eczema", "athlete's foot"]
    assert grading.grade_frq(v2, s2, "Tinea pedis", {"eczema": "Verdict: No", "athlete's foot": "Verdict: Yes"}, rule="any")["correct"] == 1
    assert grading.grade_frq(v2, s2, "Tinea pedis", ["Verdict: No", "Verdict: No"], rule="any")["correct"] == 0
    with pytest.raises(ValueError):
        grading.grade_frq(v2, s2, "x", None, rule="some")
