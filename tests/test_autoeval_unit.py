"""Rubric auto-evaluation without a model: parsing, prompts, examples, metrics, and a scripted-judge run."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from experiments.studies.autoeval import judge as J
from experiments.studies.autoeval.metrics import agreement_metrics, load_reference, rank_agreement, rating_metrics
from experiments.studies.autoeval.scorers import RUBRIC
from experiments.studies.autoeval.study import load_dialogues
from experiments.common.parsing import extract_rating
from models.errors import DataError, MedstackError
from serving.client import ChatResult

FIX = Path(__file__).parent / "fixtures" / "autoeval"
CRITERIA = J.select_criteria(J.load_criteria(), ["empathy", "concerns", "welfare", "understanding"])


# ------------------------------------------------------------------ parsing

@pytest.mark.parametrize("text,expected", [
    ("Good: kind\nBad: rushed\nSummary: fine\nRating: 4", 4),
    ("**Rating:** 5/5", 5),
    ("rating: [2]", 2),
    ("Rating: three", 3),
    ("Rating: 4 out of 5\nRating: 1", 4),  # the first rating counts
    ("Rating: 3.5", None),  # not a whole number
    ("Rating: 0", None),  # out of range
    ("Rating: 7", None),
    ("Rating: 45", None),
    ("Rating: <a whole number from 1 to 5>", None),  # the format line echoed back
    ("Good: kind\nBad: rushed\nSummary: I would give it a 4", None),  # no label: unscored, never guessed
    ("", None),
])
def test_extract_rating(text, expected):
    assert extract_rating(text) == expected


def test_parse_notes_sections():
    notes = J.parse_notes("Good: asks about worry\nBad: no safety net\nadvice\nSummary: mixed\nRating: 3\n")
    assert notes == {"good": "asks about worry", "bad": "no safety net advice", "summary": "mixed", "rating": 3}
    assert J.parse_notes("garbage")["rating"] is None


# ------------------------------------------------------------------ criteria, examples, dialogues

def test_default_criteria_have_both_anchors():
    names = [c.name for c in CRITERIA]
    assert names == ["Showing Empathy", "Seeking and Addressing Concerns", "Maintaining Patient Welfare",
                     "Confirming Knowledge and Understanding"]
    assert all(len(c.score_5) > 40 and len(c.score_1) > 40 for c in CRITERIA)
    assert J.select_criteria(J.load_criteria(), ["showing empathy"])[0].key == "empathy"
    with pytest.raises(DataError, match="unknown criterion 'kindness'; valid: empathy, concerns, welfare, understanding"):
        J.select_criteria(J.load_criteria(), ["kindness"])


def test_default_examples_one_per_rating_point():
    ex = J.load_examples(None, CRITERIA)
    for c in CRITERIA:
        assert sorted(ex[c.key]) == [1, 2, 3, 4, 5]
        assert all(e.criterion == c.key and e.rating == r for r, e in ex[c.key].items())


def _write_examples(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _ex(rating, crit="empathy", id_=None):
    return {"id": id_ or f"{crit}-{rating}", "criterion": crit, "rating": rating,
            "transcript": [{"agent": "doctor", "content": f"line {rating}", "turn": 0}]}


def test_examples_errors_name_line(tmp_path):
    emp = J.select_criteria(J.load_criteria(), ["empathy"])
    with pytest.raises(DataError, match="no example for rating\\(s\\) 5"):
        J.load_examples(_write_examples(tmp_path / "a.jsonl", [_ex(r) for r in (1, 2, 3, 4)]), emp)
    with pytest.raises(DataError, match=r"b\.jsonl:3: second example for empathy rating 2"):
        J.load_examples(_write_examples(tmp_path / "b.jsonl", [_ex(1), _ex(2), _ex(2, id_="dup")]), emp)
    with pytest.raises(DataError, match=r"c\.jsonl:2: example 'x' has rating 6"):
        J.load_examples(_write_examples(tmp_path / "c.jsonl", [_ex(1), {**_ex(6), "id": "x"}]), emp)


def test_render_dialogue_cuts_and_marks():
    tr = [{"role": "doctor", "text": "How are you feeling today?"}, {"role": "patient", "text": "Tired " * 30}, {"role": "doctor", "text": "Any fever?"}]
    full, shown = J.render_dialogue(tr)
    assert shown == 3 and full.splitlines()[0] == "Doctor: How are you feeling today?" and full.splitlines()[2] == "Doctor: Any fever?"
    short, shown = J.render_dialogue(tr, max_chars=100)
    assert shown == 1 and short.startswith("Doctor: How are you") and "2 more turn(s) not shown" in short
    assert len(short) < 160


def test_load_dialogues_fixture_and_errors(tmp_path):
    dialogues, counts = load_dialogues(FIX / "results")  # typed records of no study's folder
    assert [(d["source_id"], d["case_id"], d["model"]) for d in dialogues] == \
        [("case-001/trial-0", "case-001", "embedded"), ("case-002/trial-0", "case-002", "embedded"), ("case-004/trial-0", "case-004", "embedded")]
    assert dialogues[0]["transcript"][0] == {"role": "doctor", "text": "Hello, I'm Dr. Lee. What brings you in today?"}
    assert counts == {"records_in_results": 4, "with_transcript": 3, "skipped_no_transcript": 1}
    bad = tmp_path / "bad"
    bad.mkdir()
    typed = {"case_id": "a", "inputs": {}, "metadata": {}}
    (bad / "records.jsonl").write_text(json.dumps({"id": "a", **typed, "transcript": []}) + "\n" + json.dumps({"id": "b", **typed, "transcript": "Doctor: hi"}) + "\n")
    with pytest.raises(DataError, match=r"records\.jsonl \(record 'b'\): 'transcript' must be a list"):
        load_dialogues(bad)
    # a record of no study's shape (the transcript under a name a study chose) is bad input naming it, never guessed at
    (bad / "records.jsonl").write_text('{"id": "a", "transcript": [{"agent": "doctor", "content": "hi"}]}\n')
    with pytest.raises(DataError, match=r"records\.jsonl \(record 'a'\): not a typed record"):
        load_dialogues(bad)
    (bad / "records.jsonl").write_text(json.dumps({"id": "a", **typed, "transcript": [{"role": "doctor", "text": "hi"}]}) + "\n{\"transcript\": []}\n")
    with pytest.raises(MedstackError, match=r"records\.jsonl:2: record without an 'id'"):
        load_dialogues(bad)


def test_load_dialogues_of_a_study_run_read_through_its_upgrade():
    """An older CRAFT-MD folder (tests/fixtures/old_runs: records before the typed shape) is read through CRAFT-MD's
    upgrade: its transcripts as [{role, text}] (the doctor's fixed greeting, which those records left out, first), its
    cases the CRAFT-MD cases, the model the one its study tests."""
    dialogues, counts = load_dialogues(FIX.parent / "old_runs" / "craftmd")
    raw = {r["id"]: r for r in map(json.loads, (FIX.parent / "old_runs" / "craftmd" / "records.jsonl").read_text().splitlines())}
    assert counts["with_transcript"] == len(dialogues) == 2
    for d in dialogues:
        old = raw[d["source_id"]]
        assert d["case_id"] == old["case_id"] and d["model"] == "embedded"
        said = [(t["role"], t["text"]) for t in d["transcript"]]
        assert said[0][0] == "doctor" and said[1:] == [(t["agent"], t["content"]) for t in old["transcript"]]


# ------------------------------------------------------------------ the few-shot prompt

def test_rate_prompt_has_one_explained_example_per_rating_point():
    crit = CRITERIA[0]
    examples = J.load_examples(None, [crit])[crit.key]
    explained = {r: {"explanation": {"good": f"good{r}", "bad": f"bad{r}", "summary": f"sum{r}"}} for r in J.RATINGS}
    prompt = J.rate_prompt(crit, examples, explained, "Doctor: NEW DIALOGUE HERE", J.JudgeConfig())
    assert crit.name in prompt and crit.score_5 in prompt and crit.score_1 in prompt
    heads = re.findall(r"^=== Example (\d) ===$", prompt, flags=re.M)
    assert heads == ["1", "2", "3", "4", "5"]
    # each example block carries its own dialogue, the judge's notes and the KNOWN rating, in rating order
    ratings = [int(x) for x in re.findall(r"^Rating: (\d)$", prompt, flags=re.M)]
    assert ratings == [1, 2, 3, 4, 5]
    for r in J.RATINGS:
        assert examples[r].dialogue() in prompt and f"Good: good{r}\nBad: bad{r}\nSummary: sum{r}\nRating: {r}" in prompt
    assert prompt.index("=== Example 5 ===") < prompt.index("NEW DIALOGUE HERE")
    assert prompt.rstrip().endswith("Rating: a whole number from 1 to 5")


def test_unparsed_explanation_falls_back_to_raw_words():
    crit = CRITERIA[0]
    ex = J.load_examples(None, [crit])[crit.key][3]
    block = J.example_block(3, ex, {"explanation": {"good": "", "bad": "", "summary": ""}, "raw": "some   free text"}, 100)
    assert "Summary: some free text" in block and "Good: (none noted)" in block and block.endswith("Rating: 3")


# ------------------------------------------------------------------ metrics, hand-worked

def test_rank_agreement_hand_worked_no_ties():
    # judge [1,2,3,4,5] vs reference [2,1,3,5,4]: of the 10 pairs, (1,2) and (4,5) are discordant,
    # the other 8 concordant -> Kendall tau = (8 - 2) / 10 = 0.6.
    # Spearman: rank differences d = (-1, 1, 0, -1, 1), sum d^2 = 4 -> rho = 1 - 6*4 / (5*(25-1)) = 1 - 24/120 = 0.8.
    a = rank_agreement([1, 2, 3, 4, 5], [2, 1, 3, 5, 4])
    assert a["n"] == 5 and a["kendall_tau"] == pytest.approx(0.6) and a["spearman_rho"] == pytest.approx(0.8)


def test_rank_agreement_hand_worked_with_ties():
    # judge x = [1,1,2,3], reference y = [1,2,2,3]. Pairs (6): (0,1) tied in x only; (1,2) tied in y only;
    # the 4 others concordant, none discordant. tau-b = (C - D) / sqrt((n0 - tx)(n0 - ty)) = 4 / sqrt(5*5) = 0.8.
    # Spearman on average ranks: x -> [1.5,1.5,3,4], y -> [1,2.5,2.5,4]; centred (mean 2.5):
    # dx = [-1,-1,.5,1.5], dy = [-1.5,0,0,1.5]; sum dx*dy = 3.75, sum dx^2 = sum dy^2 = 4.5 -> rho = 3.75/4.5 = 0.8333.
    a = rank_agreement([1, 1, 2, 3], [1, 2, 2, 3])
    assert a["kendall_tau"] == pytest.approx(0.8) and a["spearman_rho"] == pytest.approx(0.8333, abs=1e-4)


def test_rank_agreement_undefined_cases():
    assert rank_agreement([3], [4])["kendall_tau"] is None  # n < 2
    const = rank_agreement([2, 2, 2], [1, 2, 3])  # a constant judge ranks nothing
    assert const["n"] == 3 and const["kendall_tau"] is None and const["spearman_rho"] is None


def test_agreement_matches_ids_and_counts_unscored(tmp_path):
    ref = load_reference(FIX / "reference.csv", CRITERIA)
    assert ref[("case-001/trial-0", "welfare")] == 3.0  # full name mapped to key
    def rated(dialogue, crit, value):  # a record's target is the reference rating of its dialogue on its criterion
        return {"id": f"{dialogue}::{crit}", "case_id": dialogue.split("/")[0], "inputs": {"criterion": crit, "source_id": dialogue},
                "target": ref.get((dialogue, crit)), "scores": {f"rubric/{crit}": {"value": value}}}

    recs = [rated("case-001/trial-0", "empathy", 5), rated("case-002/trial-0", "empathy", 1), rated("case-004/trial-0", "empathy", 3),
            rated("case-001/trial-0", "welfare", None), rated("case-002/trial-0", "welfare", 2), rated("case-004/trial-0", "welfare", 5)]
    ag = agreement_metrics(recs, ref, CRITERIA)
    # empathy: judge [5,1,3] vs ref [4,1,4]: pairs (0,1) C, (0,2) ref tie, (1,2) C -> tau-b = 2/sqrt(3*2) = 0.8165
    assert ag["empathy"]["n"] == 3 and ag["empathy"]["kendall_tau"] == pytest.approx(0.8165, abs=1e-4)
    assert ag["welfare"]["n"] == 2 and ag["welfare"]["judge_unscored"] == 1 and ag["welfare"]["reference_unmatched"] == 1
    assert ag["all"]["n"] == 5 and ag["concerns"]["n"] == 0


def test_reference_errors_name_file_and_line(tmp_path):
    p = tmp_path / "r.csv"
    p.write_text("id,criterion,rating\na,empathy,4\nb,empathy,high\n")
    with pytest.raises(DataError, match=r"r\.csv:3: rating 'high' is not a number"):
        load_reference(p, CRITERIA)
    p.write_text("id,score\na,4\n")
    with pytest.raises(DataError, match="missing column\\(s\\) criterion, rating"):
        load_reference(p, CRITERIA)
    p.write_text("id,criterion,rating\na,empathy,4\na,Showing Empathy,2\n")
    with pytest.raises(DataError, match=r"r\.csv:3: a second rating of 'a' on empathy"):
        load_reference(p, CRITERIA)


def test_rating_metrics_counts_unscored_never_zero():
    def rated(value, **grade):
        return {"rubric/empathy": {"value": value, **grade}}

    recs = [{"id": f"d{i}", "case_id": f"d{i}", "inputs": {"criterion": "empathy"}, "metadata": {"model": m}, "scores": sc}
            for i, (sc, m) in enumerate([(rated(4), "m"), (rated(2), "m"), (rated(None, metadata={"parse_error": "x"}), "m"), (rated(None), "m"),
                                         (rated(5), "other")])]
    m = rating_metrics(recs, CRITERIA[:1], (RUBRIC,))
    e = m["criteria"]["empathy"]
    assert e == {"name": "Showing Empathy", "unscored": 2, "parse_errors": 1, "distribution": {"1": 0, "2": 1, "3": 0, "4": 1, "5": 1}}
    assert m["unscored_rate"] == 0.4 and m["ratings"] == 5
    # the mean per rated model is the one aggregation over that model's records (unscored ones left out, never 0)
    by = {k: next(f for f in v if f["metric"] == "mean") for k, v in m["by_model"].items()}
    assert (by["m"]["value"], by["m"]["n"], by["m"]["unscored"]) == (3.0, 2, 2) and (by["other"]["value"], by["other"]["n"]) == (5.0, 1)


# ------------------------------------------------------------------ command line (the scripted-judge runs: tests/test_autoeval_runner.py)

def test_cli_bad_input_exits_2(cli, tmp_path):
    proc = cli("autoeval", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "no such file or registered data set" in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = cli("autoeval", str(tmp_path / "empty"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "is not a results directory" in proc.stderr
    proc = cli("autoeval", str(FIX / "results"), "--criteria", "empathy,kindness", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "unknown criterion 'kindness'" in proc.stderr


def test_completion_api_prefills_good():
    class Completer:
        prompt = step = None

        async def complete(self, prompt, role="default", gen=None, step=None, constraint=None, protocol=None):
            Completer.prompt, Completer.step = prompt, step
            return ChatResult(texts=[" kind\nBad: slow\nSummary: ok\nRating: 4"])

    res, text = asyncio.run(J.ask(Completer(), "PROMPT", J.JudgeConfig(api="completion"), J.JudgeConfig().rate_gen, step="rate"))
    assert Completer.prompt == "PROMPT\n\nGood:" and Completer.step == "rate"
    assert text.startswith("Good: kind") and J.parse_notes(text)["rating"] == 4
