"""The one scorer per answer kind (experiments/common): MC mapper, verdict parser, P/R/F1, typed grades — hand-worked."""

from __future__ import annotations

import pytest

from experiments.core.results import ConfigView
from experiments.common.choice import LETTERS, map_choice, pick_letter
from experiments.common.grade import Grade, aggregate, grades, to_disk
from experiments.common.parsing import extract_verdict
from experiments.common.stats import prf
from experiments.studies.craftmd import metrics as craft_metrics
from experiments.studies.craftmd.data import answer_index
from experiments.core.scorers import figures
from experiments.studies.craftmd.scorers import MCQ_RULE
from experiments.studies.craftmd.study import old_scores
from experiments.studies.dera.scorers import GPTF1, gptf1_grades

CHOICES = ["Melanoma", "Psoriasis", "Lichen planus", "Tinea corporis"]


@pytest.mark.parametrize("reply, strict, loose", [
    ("Answer: C", "C", "C"),
    ("(B) because of the scale", "B", "B"),
    ("I think the answer is probably D here", None, "D"),  # strict wants the letter right after the label
    ("Given the history, E fits best", None, "E"),                 # loose: the first standalone capital letter
    ("A 40-year-old woman", None, "A"),                             # strict: an article, not a letter answer
    ("b", None, None),                                              # lower case is no letter
    ("", None, None),
])
def test_pick_letter_strict_and_loose(reply, strict, loose):
    assert pick_letter(reply, "ABCDE") == strict
    assert pick_letter(reply, "ABCDE", loose=True) == loose


def test_map_choice_steps_and_switches():
    assert map_choice("psoriasis", CHOICES) == (1, "exact")
    assert map_choice("The most likely diagnosis is lichen planus.", CHOICES) == (2, "stated")
    assert map_choice("Answer: D", CHOICES) == (3, "letter")
    assert map_choice("Answer: A) Psoriasis", CHOICES) == (1, "stated")        # an invented letter loses to the named choice
    assert map_choice("melanoma or psoriasis", CHOICES) == (None, "unparsed")  # a hedge
    assert map_choice("Melanoma; psoriasis less likely", CHOICES) == (0, "first")
    assert map_choice("Psoriasis vulgaris", CHOICES) == (1, "contains")
    assert map_choice("Lichen planuss", CHOICES) == (2, "fuzzy")               # one-letter slip, texts >= 95 % alike
    assert map_choice("Tinea corporus", CHOICES) == (None, "unparsed")         # a slip, but only 93 % alike
    assert map_choice("Answer: D", CHOICES, letters=False) == (None, "unparsed")
    # a token_set_ratio threshold instead of spelling slips: "tinea" alone is a subset of "tinea corporis" (ratio 100)
    assert map_choice("tinea", CHOICES) == (None, "unparsed")
    assert map_choice("tinea", CHOICES, fuzzy=90.0) == (3, "fuzzy")
    assert LETTERS.startswith("ABCD")


def test_answer_index_uses_the_mapper_by_text_alone():
    assert answer_index("Melanoma ", CHOICES) == 0
    assert answer_index("Tinea", CHOICES) == 3                # token_set_ratio >= 90
    assert answer_index("B", CHOICES) is None                 # a letter names no choice text
    assert answer_index("Eczema", CHOICES) is None


@pytest.mark.parametrize("reply, verdict", [("Yes", True), ("Verdict: different", False), ("It is correct", None), ("", None)])
def test_extract_verdict_first_word(reply, verdict):
    assert extract_verdict(reply) is verdict


@pytest.mark.parametrize("reply, verdict", [("POSITIVE", True), ("the pair is negative", False), ("not positive, negative", True),
                                            ("same", None), ("", None)])
def test_extract_verdict_anywhere(reply, verdict):
    assert extract_verdict(reply, ("positive",), ("negative",), anywhere=True) is verdict


def test_prf_hand_worked():
    # 3 of 4 predictions right, 3 of 6 gold found: P = 0.75, R = 0.5, F1 = 2 * 0.375 / 1.25 = 0.6
    assert prf(3, 4, 3, 6) == pytest.approx((0.75, 0.5, 0.6))
    assert prf(0, 0, 0, 0) == (0.0, 0.0, 0.0) and prf(0, 0, 0, 0, both_empty=1.0) == (1.0, 1.0, 1.0)
    assert prf(0, 0, 0, 3) == (0.0, 0.0, 0.0)
    # GPT-F1 counts the two directions apart: 2 of 5 predicted concepts in the reference, 3 of 4 reference concepts found
    assert prf(2, 5, 3, 4, both_empty=1.0) == pytest.approx((0.4, 0.75, 0.6 / 1.15))


def test_typed_grades_read_the_record_shapes():
    rec = {"case_id": "c1", "answers": {"vignette": {"mcq": {"answer": "B", "choice": 1, "correct": 1, "parsed_by": "letter"},
                                                     "frq": {"answer": "x", "correct": None, "grade_source": "unscored_verdict",
                                                             "extraction_status": "ok", "grader_reasks": 2}}}}
    rec = {"case_id": "c1", "scores": to_disk(old_scores(rec, ConfigView({})))}  # an old record, upgraded
    g = craft_metrics.grades(rec)
    assert list(g) == [("vignette", "mcq"), ("vignette", "frq")]
    assert g["vignette", "mcq"] == Grade(value=1, answer="B", source="letter", metadata={"choice": 1}, judge={"rule": MCQ_RULE})
    assert not g["vignette", "frq"].scored and g["vignette", "frq"].metadata["grader_reasks"] == 2
    acc = aggregate([rec], "frq/vignette")
    assert acc.n == 0 and acc.unscored == 1 and acc.value is None
    sec = {"scored": True, "precision": 0.5, "recall": 1.0, "f1": 2 / 3, "concepts_cut": {"gt": 1, "pred": 0}}
    dera = {"gptf1": {"dera": {"sections": {"Plan": sec, "Assessment": {"scored": False, "precision": None, "recall": None, "f1": None}},
                               "average": {"precision": 0.5, "recall": 1.0, "f1": 2 / 3}}}}
    dera = {"id": "e1", "scores": to_disk({f"gptf1/{n}": x for n, x in gptf1_grades("dera", dera["gptf1"]["dera"], {"model": "judge-model"}).items()})}
    g = grades(dera)  # the record's typed scores, as DERA's gptf1 scorer gives them
    assert g["gptf1/dera/Plan"].named("f1") == pytest.approx(2 / 3) and g["gptf1/dera/Plan"].metadata["concepts_cut"]
    assert not g["gptf1/dera/Assessment"].scored and g["gptf1/dera/Assessment"].named("f1") is None
    assert g["gptf1/dera"].named("recall") == 1.0 and g["gptf1/dera"].judge["model"] == "judge-model"
    f = {x.score: x for x in figures([dera], (GPTF1,))}
    assert f["gptf1/dera/Plan[f1]"].n == 1 and (f["gptf1/dera/Assessment"].n, f["gptf1/dera/Assessment"].unscored) == (0, 1)  # never scored: one unscored row
