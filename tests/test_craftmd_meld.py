"""MELD pieces: halves, truncation and similarity = 1 - normalized Levenshtein (hand-worked)."""

from experiments.core.registry import named
from experiments.common.grade import to_disk
from experiments.studies.craftmd.meld import meld_grades, meld_metrics, similarity, split_halves, truncate_words


def test_split_and_truncate():
    assert split_halves("a b c d e") == ("a b", "c d e")
    assert truncate_words("one two three four", 2) == "one two"


def test_similarity_hand_worked():
    assert similarity("kitten", "kitten") == 1.0
    # kitten -> sitting: 3 edits, longer string 7 characters -> 1 - 3/7
    assert abs(similarity("kitten", "sitting") - (1 - 3 / 7)) < 1e-12
    assert similarity("", "abc") == 0.0


def test_meld_metrics_share_at_threshold():
    recs = [{"scores": to_disk(meld_grades(s, "", 0.95))} for s in (0.2, 0.95, 0.99, 0.5)]
    assert [r["scores"]["memorized"]["value"] for r in recs] == [0, 1, 1, 0]
    m = meld_metrics(recs, 0.95)
    assert m["n"] == 4 and m["share_ge_threshold"] == 0.5 and m["max_similarity"] == 0.99
    assert abs(m["mean_similarity"] - 0.66) < 1e-12


def test_meld_failed_request_is_a_failed_case_never_a_zero_similarity(tmp_path):
    """MELD: a request that got no answer is recorded failed, left out of the mean, retried on resume."""
    import asyncio
    import json
    from pathlib import Path

    from experiments.studies.craftmd.meld import MeldSettings, MeldStudy
    from experiments.core.runner import prepare_run, run_study
    from tests.scripted import ScriptedLLM, down

    cases = Path(__file__).parent / "fixtures" / "craftmd" / "cases.csv"
    study, out = named(MeldStudy)(), tmp_path / "meld"

    def respond(role, messages, gen):  # the second case's request never gets an answer, retries included
        if "crushing chest pain" in messages[-1]["content"]:
            raise down()
        return messages[-1]["content"]  # echoes: a similarity between 0 and 1, never a failure

    def run(respond_fn):
        s, c = prepare_run(study, MeldSettings(data=str(cases), out=str(out), limit=3, use_cache=False, concurrency=1))
        return asyncio.run(run_study(study, s, c, client=ScriptedLLM(respond_fn, roles=("model",), retries=1), log=lambda m: None))

    outcome = run(respond)
    assert outcome.exit_code == 3 and outcome.failed == 1 and outcome.finished == 2
    m = json.loads((out / "metrics.json").read_text())
    assert m["n"] == 2 and m["case_status"] == {"total": 3, "finished": 2, "failed": 1, "not_started": 0}
    assert "1 failed cases" in (out / "summary.md").read_text()

    again = run(lambda role, messages, gen: messages[-1]["content"])
    assert again.exit_code == 0 and again.finished == 3
    assert json.loads((out / "metrics.json").read_text())["n"] == 3
