"""MediTOD scorers on hand-made gold/prediction pairs; every expected number is worked out by hand below."""

from __future__ import annotations

import math

import pytest

from experiments.common.normalize import normalize
from experiments.studies.meditod.metrics import (adjudication_pairs, nlu_tuples, pol_tuples, precision_at_k, score)

# ------------------------------------------------------------------ NLU unrolling


def test_nlu_unrolling_rules():
    gold = [{"intent": "inform", "slots": {
        "positive_symptom": [{"value": "cough", "onset": "2 weeks ago", "location": ["chest", "throat"]}, {"onset": "yesterday"}],
        "occupation": [{"status": "employed", "value": "teacher"}],
        "negative_medication": [{"value": "aspirin", "respone_to": "headache", "frequency": "daily"}],
        "basic_information": [{"age": "45"}],
        "made_up_slot": [{"value": "ignored"}],
    }}, {"intent": "chit-chat"}]
    canon, noncanon = nlu_tuples(gold)
    assert canon == {
        ("inform", "positive_symptom", "cough"),                             # head: canonical
        ("inform", "positive_symptom", "cough", "location", "chest"),        # location: canonical for symptoms, list expanded
        ("inform", "positive_symptom", "cough", "location", "throat"),
        ("inform", "occupation", "status", "employed"),                      # status: canonical for occupation
        ("inform", "negative_medication", "aspirin"),
        ("inform", "negative_medication", "aspirin", "respone_to", "headache"),  # respone_to: canonical for medications
        ("inform", "basic_information", "age", "45"),                        # basic_information: all canonical
        ("chit-chat",),                                                      # no slots
    }
    assert noncanon == {
        ("inform", "positive_symptom", "cough", "onset", "2 weeks ago"),
        ("inform", "positive_symptom", "dummy", "onset", "yesterday"),       # no head value -> "dummy"
        ("inform", "occupation", "value", "teacher"),
        ("inform", "negative_medication", "aspirin", "frequency", "daily"),
    }


# Turn A: gold canon {cough, cough/location/chest, cough/location/throat}, noncanon {cough/onset/2 weeks ago}
#         pred canon {cough, cough/location/chest} -> TP 2 FP 0 FN 1; noncanon {cough/onset/two weeks} -> TP 0 FP 1 FN 1
# Turn B: gold canon {occupation/status/employed, aspirin, aspirin/respone_to/headache}, noncanon {occupation/value/teacher}
#         pred canon {occupation/status/employed, (chit-chat,)} -> TP 1 FP 1 FN 2; noncanon {teacher} -> TP 1
# Turn C: gold a lone slot-less inform -> skipped (not scored), still counted in the joint/format denominators
# Turn D: gold {(nod_prompt_salutations,)}, prediction unparseable (None) -> format error, FN 1
# Turn E: gold {(chit-chat,)} predicted exactly -> TP 1, joint match
# canonical:      TP 2+1+0+1 = 4, FP 0+1+0+0 = 1, FN 1+2+1+0 = 4 -> P 4/5 = 0.8, R 4/8 = 0.5, F1 = 2*4/(8+1+4) = 8/13
# non-canonical:  TP 0+1 = 1, FP 1+0 = 1, FN 1+0 = 1 -> P = R = F1 = 0.5
# all:            TP 5, FP 2, FN 5 -> P 5/7, R 5/10, F1 = 10/(10+2+5) = 10/17
# joint accuracy: 1 (turn E) / 5 turns = 0.2; format-error rate 1/5 = 0.2
NLU_GOLDS = [
    [{"intent": "inform", "slots": {"positive_symptom": [{"value": "cough", "onset": "2 weeks ago", "location": ["chest", "throat"]}]}}],
    [{"intent": "inform", "slots": {"occupation": [{"status": "employed", "value": "teacher"}],
                                    "negative_medication": [{"value": "aspirin", "respone_to": "headache"}]}}],
    [{"intent": "inform"}],
    [{"intent": "nod_prompt_salutations"}],
    [{"intent": "chit-chat"}],
]
NLU_PREDS = [
    [{"intent": "inform", "slots": {"positive_symptom": [{"value": "cough", "onset": "two weeks", "location": ["chest"]}]}}],
    [{"intent": "inform", "slots": {"occupation": [{"status": "employed", "value": "teacher"}]}}, {"intent": "chit-chat"}],
    [{"intent": "chit-chat"}],
    None,
    [{"intent": "chit-chat"}],
]


def test_nlu_scores_by_hand():
    m = score("nlu", NLU_GOLDS, NLU_PREDS)
    assert m["turns"] == 5 and m["scored_turns"] == 4
    assert m["medical_precision"] == pytest.approx(0.8)
    assert m["medical_recall"] == pytest.approx(0.5)
    assert m["medical_f1"] == pytest.approx(8 / 13)
    assert (m["non_medical_precision"], m["non_medical_recall"], m["non_medical_f1"]) == pytest.approx((0.5, 0.5, 0.5))
    assert m["precision"] == pytest.approx(5 / 7)
    assert m["recall"] == pytest.approx(0.5)
    assert m["f1"] == pytest.approx(10 / 17)
    assert m["joint_accuracy"] == pytest.approx(0.2)
    assert m["format_errors"] == 1 and m["format_error_rate"] == pytest.approx(0.2)


def test_nlu_malformed_predictions_are_format_errors():
    gold = [[{"intent": "chit-chat"}]] * 4
    preds = [{"intent": "chit-chat"},                                  # not a list
             [{"slots": {}}],                                           # no intent
             [{"intent": "inform", "slots": {"positive_symptom": "cough"}}],  # slot data not a list of objects
             [{"intent": "inform", "slots": {"positive_symptom": [{"value": {"x": 1}}]}}]]  # unhashable value
    m = score("nlu", gold, preds)
    assert m["format_errors"] == 4 and m["f1"] == 0.0 and m["recall"] == 0.0


EDGE_GOLD = [{"intent": "inform", "slots": {"positive_symptom": [{"value": "cough", "duration": "2 days"}]}},
             {"intent": "greet", "slots": {}}]
# gold tuples: canonical {(inform, positive_symptom, cough), (greet,)}; non-canonical {(..., cough, duration, 2 days)}


@pytest.mark.parametrize("empty", [[], {}])
def test_nlu_empty_slots_are_the_bare_intent(empty):
    """The authors' scorer: an entry with "slots": [] or {} is its bare (intent,)."""
    assert nlu_tuples([{"intent": "greet", "slots": empty}]) == ({("greet",)}, set())
    m = score("nlu", [EDGE_GOLD], [[{"intent": "greet", "slots": empty}]])
    # canonical: TP 1 (greet), FN 1 (cough); non-canonical: FN 1 (duration). All: TP 1, FP 0, FN 2.
    assert m["format_errors"] == 0 and m["joint_accuracy"] == 0.0
    assert (m["precision"], m["recall"], m["f1"]) == pytest.approx((1.0, 1 / 3, 0.5))
    assert (m["medical_precision"], m["medical_recall"], m["medical_f1"]) == pytest.approx((1.0, 0.5, 2 / 3))
    assert (m["non_medical_precision"], m["non_medical_recall"], m["non_medical_f1"]) == (0.0, 0.0, 0.0)
    full = [dict(EDGE_GOLD[0]), {"intent": "greet", "slots": empty}]
    assert score("nlu", [EDGE_GOLD], [full])["joint_accuracy"] == 1.0


@pytest.mark.parametrize("bad", [None, "cough", ["cough"], 3])
def test_nlu_slot_that_is_not_a_list_of_objects_voids_the_whole_turn(bad):
    """A null, non-empty string or number slot value (or element) makes the whole turn a format error, even beside a correct entry."""
    pred_ok = [{"intent": "greet", "slots": []}]
    pred_bad = [{"intent": "greet", "slots": {}}, {"intent": "inform", "slots": {"positive_symptom": bad}}]
    m = score("nlu", [EDGE_GOLD, EDGE_GOLD], [pred_ok, pred_bad])
    # turn 1 as above (TP 1, FN 1 canonical + FN 1 non-canonical); turn 2 scored as empty: FN 2 + FN 1.
    # canonical TP 1 FP 0 FN 3; non-canonical TP 0 FP 0 FN 2; all TP 1 FP 0 FN 5.
    assert m["format_errors"] == 1 and m["format_error_rate"] == pytest.approx(0.5)
    assert (m["precision"], m["recall"], m["f1"]) == pytest.approx((1.0, 1 / 6, 2 / 7))
    assert (m["medical_precision"], m["medical_recall"], m["medical_f1"]) == pytest.approx((1.0, 0.25, 0.4))
    assert m["non_medical_recall"] == 0.0 and m["joint_accuracy"] == 0.0


@pytest.mark.parametrize("empty", ["", [""], [[]]])
def test_nlu_empty_slot_values_add_nothing_and_are_no_format_error(empty):
    """The authors' scorer loops over an empty value (and empty list elements) without adding a tuple or failing."""
    assert nlu_tuples([{"intent": "inform", "slots": {"positive_symptom": empty}}]) == (set(), set())
    pred_1 = [{"intent": "greet", "slots": {}}, {"intent": "inform", "slots": {"positive_symptom": empty}}]
    pred_2 = [{"intent": "greet", "slots": {}}, {"intent": "inform", "slots": {**EDGE_GOLD[0]["slots"], "negative_symptom": empty}}]
    m = score("nlu", [EDGE_GOLD, EDGE_GOLD], [pred_1, pred_2])
    # turn 1: only (greet,) predicted -> canonical TP 1 FN 1 (cough), non-canonical FN 1 (duration)
    # turn 2: the gold plus an empty slot -> exact: canonical TP 2, non-canonical TP 1, joint match
    # canonical TP 3 FP 0 FN 1 -> P 1, R 3/4, F1 6/7; non-canonical TP 1 FN 1 -> P 1, R 1/2, F1 2/3
    # all TP 4 FP 0 FN 2 -> P 1, R 2/3, F1 0.8; joint 1/2; no format error
    assert m["format_errors"] == 0 and m["joint_accuracy"] == pytest.approx(0.5)
    assert (m["medical_precision"], m["medical_recall"], m["medical_f1"]) == pytest.approx((1.0, 0.75, 6 / 7))
    assert (m["non_medical_precision"], m["non_medical_recall"], m["non_medical_f1"]) == pytest.approx((1.0, 0.5, 2 / 3))
    assert (m["precision"], m["recall"], m["f1"]) == pytest.approx((1.0, 2 / 3, 0.8))


def test_nlu_null_slots_is_a_format_error_and_gold_edge_shapes_score_perfectly():
    m = score("nlu", [EDGE_GOLD], [[{"intent": "greet", "slots": None}]])
    assert m["format_errors"] == 1 and m["f1"] == 0.0
    golds = [EDGE_GOLD, [{"intent": "deny", "slots": []}, {"intent": "inform", "slots": {"occupation": []}}]]
    g = score("nlu", golds, golds)
    assert (g["f1"], g["medical_f1"], g["joint_accuracy"], g["format_error_rate"]) == (1.0, 1.0, 1.0, 0.0)


def test_nlu_gold_on_gold_is_perfect():
    golds = [g for g in NLU_GOLDS]
    m = score("nlu", golds, golds)
    assert m["f1"] == 1.0 and m["medical_f1"] == 1.0 and m["non_medical_f1"] == 1.0
    # joint accuracy divides by all turns, the skipped one included (authors' scorer): 4/5
    assert m["joint_accuracy"] == pytest.approx(0.8)
    assert m["format_error_rate"] == 0.0


# ------------------------------------------------------------------ POL

G0 = [{"action": "inquire", "symptom": [{"value": "cough", "checks": [{"type": "onset"}]}]}]
G1 = [{"action": "inquire", "symptom": [{"value": "cough", "checks": [{"type": "location", "values": ["chest"]}]}]}]
G2 = [{"action": "inquire"}]
G3 = [{"action": "inquire", "habit": [{"value": "smoking", "checks": [{"type": "frequency", "values": ["daily"]}]}],
       "travel": [{"value": "abroad", "checks": [{"type": "status", "values": ["traveled"]}]}]}]
P3 = [{"action": "inquire", "habit": [{"value": "smoking", "checks": [{"type": "frequency", "values": ["daily"]}]}]}]


def test_pol_unrolling_rules():
    canon, noncanon = pol_tuples(G3 + [{"action": "diagnosis", "disease": [{"value": "asthma"}]},
                                       {"action": "inquire", "basic_information": [{"value": "age", "checks": [{"type": "x"}]}]}])
    assert canon == {
        ("inquire", "habit", "smoking"), ("inquire", "habit", "smoking", "frequency"),   # head and check type: canonical
        ("inquire", "travel", "status"), ("inquire", "travel", "status", "traveled"),     # travel status values: canonical
        ("diagnosis", "disease", "asthma"),                                               # disease: a medical slot
    }
    assert noncanon == {
        ("inquire", "habit", "smoking", "frequency", "daily"),   # frequency is not canonical for habits
        ("inquire", "travel", "abroad"),                         # social slot value: non-canonical
        ("inquire", "basic_information", "age"),                 # basic_information: value only, non-canonical
    }
    # location values are canonical for symptoms
    assert pol_tuples(G1)[0] == {("inquire", "symptom", "cough"), ("inquire", "symptom", "cough", "location"),
                                 ("inquire", "symptom", "cough", "location", "chest")}


# Turns (one dialogue): gold G0, G1, G2, G3; predictions G1, G1, chit-chat, P3.
# turn 0: gold canon {cough, cough/onset}; pred canon {cough, cough/location, cough/location/chest} -> TP 1 FP 2 FN 1
# turn 1: exact -> canon TP 3, joint match
# turn 2: gold a lone slot-less inquire -> skipped
# turn 3: gold canon {smoking, smoking/frequency, travel/status, travel/status/traveled}, noncanon {smoking/frequency/daily, travel/abroad}
#         pred canon {smoking, smoking/frequency} -> TP 2 FN 2; noncanon {smoking/frequency/daily} -> TP 1 FN 1
# canonical: TP 6 FP 2 FN 3 -> P 6/8, R 6/9, F1 12/17; non-canonical: TP 1 FP 0 FN 1 -> P 1, R 1/2, F1 2/3
# all: TP 7 FP 2 FN 4 -> P 7/9, R 7/11, F1 14/20 = 0.7; joint 1/4
POL_GOLDS = [G0, G1, G2, G3]
POL_PREDS = [G1, G1, [{"action": "chit-chat"}], P3]


def test_pol_scores_by_hand():
    m = score("pol", POL_GOLDS, POL_PREDS)
    assert m["scored_turns"] == 3
    assert (m["medical_precision"], m["medical_recall"], m["medical_f1"]) == pytest.approx((0.75, 6 / 9, 12 / 17))
    assert (m["non_medical_precision"], m["non_medical_recall"], m["non_medical_f1"]) == pytest.approx((1.0, 0.5, 2 / 3))
    assert (m["precision"], m["recall"], m["f1"]) == pytest.approx((7 / 9, 7 / 11, 0.7))
    assert m["joint_accuracy"] == pytest.approx(0.25)
    # Precision@K over all 4 turns: pred0 == gold1 (hit from K=2 on), pred1 == gold1 (hit at K=1), pred2/pred3 never
    # P@1 = 1/4, P@4 = P@8 = P@inf = 2/4
    assert (m["p@1"], m["p@4"], m["p@8"], m["p@inf"]) == pytest.approx((0.25, 0.5, 0.5, 0.5))


def test_precision_at_k_stays_within_a_dialogue():
    # dialogue X as above plus dialogue Y with one turn (chit-chat, predicted exactly).
    golds = POL_GOLDS + [[{"action": "chit-chat"}]]
    preds = POL_PREDS + [[{"action": "chit-chat"}]]
    # grouped: X gives 1 hit at K=1 and 2 at K>=2, Y gives 1 -> P@1 = 2/5, P@4 = 3/5
    grouped = precision_at_k(golds, preds, ["X"] * 4 + ["Y"], ks=(1, 4, math.inf))
    assert grouped == pytest.approx({"p@1": 0.4, "p@4": 0.6, "p@inf": 0.6})
    # one long dialogue instead: X's chit-chat prediction (turn 2) would now match Y's gold turn 4 within K=4 -> 4/5
    assert precision_at_k(golds, preds, None, ks=(4,))["p@4"] == pytest.approx(0.8)


def test_pol_gold_on_gold_is_perfect():
    m = score("pol", POL_GOLDS, POL_GOLDS, dialog_ids=["X"] * 4)
    assert m["f1"] == 1.0 and m["medical_f1"] == 1.0 and m["non_medical_f1"] == 1.0
    assert all(m[k] == 1.0 for k in ("p@1", "p@4", "p@8", "p@inf"))


def test_pol_malformed_action_voids_only_itself():
    pred = [{"action": "inquire", "symptom": "cough"}, {"action": "chit-chat"}]   # first action malformed
    assert pol_tuples(pred) == ({("chit-chat",)}, set())
    m = score("pol", [[{"action": "chit-chat"}]], [None])
    assert m["format_errors"] == 1 and m["recall"] == 0.0


# ------------------------------------------------------------------ adjudication


def test_adjudication_counts_judged_matches():
    gold = [[{"intent": "inform", "slots": {"positive_symptom": [{"value": "cough", "onset": "2 weeks ago"}]}}]]
    pred = [[{"intent": "inform", "slots": {"positive_symptom": [{"value": "cough", "onset": "two weeks ago"}]}}]]
    assert adjudication_pairs("nlu", gold, pred) == [("2 weeks ago", "two weeks ago")]
    exact = score("nlu", gold, pred)
    assert exact["non_medical_f1"] == 0.0          # TP 0, FP 1, FN 1
    judged = score("nlu", gold, pred, judgments={("2 weeks ago", "two weeks ago"): True})
    assert judged["non_medical_f1"] == 1.0 and judged["f1"] == 1.0   # now TP 1 (+ head TP 1)
    refused = score("nlu", gold, pred, judgments={("2 weeks ago", "two weeks ago"): False})
    assert refused["non_medical_f1"] == 0.0


# ------------------------------------------------------------------ NLG


def test_normalization_is_lowercase_and_punctuation_split():
    assert normalize("  Hello,\tWorld! Don't  ", split="punct") == "hello , world ! don ' t"


def test_nlg_bleu_rouge_by_hand():
    # pred "the cat sat on a mat" vs gold "the cat sat on the mat" (6 tokens each, brevity penalty 1)
    # unigrams: 5/6 (the, cat, sat, on, mat; "the" clipped to 1... pred has one "the"), bigrams 3/5, trigrams 2/4, 4-grams 1/3
    # BLEU-2 = sqrt(5/6 * 3/5) = sqrt(1/2) -> 70.71; BLEU-4 = (5/6*3/5*2/4*1/3)^(1/4) = (1/12)^(1/4) -> 53.73
    # ROUGE-1 F = 5/6 (5 shared unigrams of 6 each); ROUGE-L F = LCS 5 ("the cat sat on mat") / 6 -> 5/6
    m = score("nlg", ["the cat sat on the mat"], ["The cat sat on a mat"], bertscore=False)
    assert m["bleu2"] == pytest.approx(100 * math.sqrt(0.5))
    assert m["bleu4"] == pytest.approx(100 * (1 / 12) ** 0.25)
    assert m["rouge1"] == pytest.approx(5 / 6) and m["rougeL"] == pytest.approx(5 / 6)


def test_nlg_bleu_is_corpus_level_with_nltk_short_sentence_rule():
    # add the pair "do you smoke" / "do you smoke" (3 tokens): corpus counts are pooled, not averaged.
    # unigrams (5+3)/(6+3) = 8/9, bigrams (3+2)/(5+2) = 5/7, trigrams (2+1)/(4+1) = 3/5,
    # 4-grams (1+0)/(3+1) = 1/4  -- nltk counts a sentence with no 4-grams as denominator 1 (as the authors' scorer does)
    # BLEU-2 = sqrt(8/9*5/7) -> 79.68; BLEU-4 = (8/9*5/7*3/5*1/4)^(1/4) = (2/21)^(1/4) -> 55.55
    m = score("nlg", ["the cat sat on the mat", "do you smoke"], ["the cat sat on a mat", "do you smoke"], bertscore=False)
    assert m["bleu2"] == pytest.approx(100 * math.sqrt(40 / 63))
    assert m["bleu4"] == pytest.approx(100 * (2 / 21) ** 0.25)
    assert m["bleu2"] == pytest.approx(79.68, abs=0.01) and m["bleu4"] == pytest.approx(55.55, abs=0.01)


def test_nlg_gold_on_gold():
    golds = ["How long have you had the cough?", "Do you smoke cigarettes at all?"]
    m = score("nlg", golds, golds)
    assert m["bleu2"] == pytest.approx(100.0) and m["bleu4"] == pytest.approx(100.0)
    assert m["rouge1"] == pytest.approx(1.0) and m["rougeL"] == pytest.approx(1.0)
    assert m["bertscore_f1"] == pytest.approx(1.0, abs=1e-4)
    worse = score("nlg", golds, ["Hello there.", ""])
    assert worse["bertscore_f1"] < 0.9 and worse["bleu2"] < 10 and worse["empty_predictions"] == 1
