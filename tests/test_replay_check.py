"""scripts/replay_check.py diff: volatile keys ignored, fields moved into typed scores reported apart, anything else fails."""

from __future__ import annotations

import json

from scripts.replay_check import RUNS, diff


def tree(root, record_extra: dict, metrics_extra: dict):
    for name in RUNS:
        d = root / name
        d.mkdir(parents=True)
        recs = [{"id": f"{name}-1", "answer": "x", "calls": [{"t_start": 1.0, "t_end": 2.0, "latency": 1.0, "cached": False}],
                 "usage": {"total": {"calls": 1, "cached": 0, "seconds": 1.0}}, **record_extra}]
        (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (d / "metrics.json").write_text(json.dumps({"f1": 0.5, "run": {"wall_seconds": 3.0, "requests": 1, "cache_hits": 0}, **metrics_extra}))
    return root


def test_volatile_keys_alone_are_no_difference(tmp_path, capsys):
    a = tree(tmp_path / "a", {}, {})
    b = tree(tmp_path / "b", {"calls": [{"t_start": 5.0, "t_end": 5.1, "latency": 0.1, "cached": True}],
                              "usage": {"total": {"calls": 1, "cached": 1, "seconds": 0.0}}},
             {"run": {"wall_seconds": 0.2, "requests": 0, "cache_hits": 1}})
    assert diff(a, b) == 0 and "unexpected differences: 0" in capsys.readouterr().out


def test_fields_moved_into_scores_are_expected_and_other_keys_fail(tmp_path, capsys):
    grade = {"value": 1, "answer": "b", "explanation": "True, the same", "metadata": {"f1": 0.5}}
    a = tree(tmp_path / "a", {"scores": {"exact": grade}, "correct": 1, "f1": 0.5, "per_arm": {"dera": {"answer": "b", "exact": 1}},
                              "why": "True, the same", "note": None}, {})
    b = tree(tmp_path / "b", {"scores": {"exact": grade}}, {})
    assert diff(a, b) == 0
    out = capsys.readouterr().out
    assert "  dera-qa: correct (1 records), f1 (1 records), note (1 records), per_arm (1 records), why (1 records)" in out
    changed = tree(tmp_path / "c", {"scores": {"exact": {**grade, "value": 0}}}, {})  # a value no score holds; scores differ
    assert diff(a, changed) == 1
    out = capsys.readouterr().out
    assert "dera-qa dera-qa-1: .correct (one side only)" in out and "dera-qa dera-qa-1: .scores.exact.value" in out
    assert "dera-qa dera-qa-1: .f1" not in out  # 0.5 is still held (metadata)
    added = tree(tmp_path / "d", {"scores": {"exact": grade}, "correct": 1, "f1": 0.5, "per_arm": {}, "why": "", "note": None, "new": 1}, {})
    assert diff(a, added) == 1 and "dera-qa dera-qa-1: .new (one side only)" in capsys.readouterr().out  # only BEFORE's fields move
    c = tree(tmp_path / "e", {"answer": "y"}, {"f1": 0.6})
    assert diff(tree(tmp_path / "f", {}, {}), c) == 1
    out = capsys.readouterr().out
    assert "craftmd craftmd-1: .answer" in out and "dera-qa metrics.json: .f1" in out


def test_without_scores_nothing_moves_but_on_an_unscored_case(tmp_path, capsys):
    a = tree(tmp_path / "a", {"correct": 1}, {})
    assert diff(a, tree(tmp_path / "b", {}, {})) == 1
    assert "autoeval autoeval-1: .correct (one side only)" in capsys.readouterr().out
    unscored = tree(tmp_path / "c", {"correct": 1, "scores": {}}, {})  # both sides without a score: nothing it restated
    assert diff(unscored, tree(tmp_path / "d", {"scores": {}}, {})) == 0
    assert "meditod-pol: correct on a record without scores (1 records)" in capsys.readouterr().out
    assert diff(unscored, tree(tmp_path / "e", {"scores": {"x": {"value": 0}}}, {})) == 1  # AFTER scores it: must hold it


def test_a_scored_flag_moves_with_its_grade(tmp_path, capsys):
    a = tree(tmp_path / "a", {"scored": False, "rating": None, "scores": {"rubric": {"value": None}}}, {})
    assert diff(a, tree(tmp_path / "b", {"scores": {"rubric": {"value": None}}}, {})) == 0
    assert "autoeval: rating (1 records), scored (1 records)" in capsys.readouterr().out
    rated = tree(tmp_path / "c", {"scored": True, "scores": {"rubric": {"value": 4}}}, {})
    assert diff(rated, tree(tmp_path / "d", {"scores": {"rubric": {"value": 4}}}, {})) == 0
    wrong = tree(tmp_path / "e", {"scored": True, "scores": {"rubric": {"value": None}}}, {})
    assert diff(wrong, tree(tmp_path / "f", {"scores": {"rubric": {"value": None}}}, {})) == 1


def test_call_log_order_and_nan_are_no_difference(tmp_path, capsys):
    calls = [{"index": 0, "step": "a", "after": None, "texts": ["x"]}, {"index": 1, "step": "b", "after": 0, "texts": ["y"]},
             {"index": 2, "step": "b", "after": 0, "texts": ["z"]}]
    replayed = [{**calls[1], "index": 0, "after": None}, {**calls[2], "index": 1, "after": 0}, {**calls[0], "index": 2, "after": 1}]
    a = tree(tmp_path / "a", {"calls": calls}, {"exact": {"mean": float("nan")}})
    b = tree(tmp_path / "b", {"calls": replayed}, {"exact": {"mean": float("nan")}})
    assert diff(a, b) == 0
    swapped = tree(tmp_path / "c", {"calls": [calls[0], calls[2], calls[1]]}, {"exact": {"mean": float("nan")}})
    assert diff(a, swapped) == 1  # a step's repeats keep their issue order
    assert "calls[1].texts[0]" in capsys.readouterr().out


def test_nested_fields_and_names_of_scores_move_too(tmp_path, capsys):
    grade = {"value": 0, "source": "unparsed"}
    a = tree(tmp_path / "a", {"scores": {"mcq/vignette": grade}, "main": "vignette.mcq", "errors": ["vignette.mcq: unparsed choice"],
                              "answers": {"vignette": {"mcq": {"answer": "x", "correct": 0, "parsed_by": "unparsed"}}}}, {})
    b = tree(tmp_path / "b", {"scores": {"mcq/vignette": grade}, "answers": {"vignette": {"mcq": {"answer": "x"}}}}, {})
    assert diff(a, b) == 0
    out = capsys.readouterr().out
    assert "answers.vignette.mcq.correct (1 records), answers.vignette.mcq.parsed_by (1 records)" in out
    assert "errors (1 records), main (1 records)" in out
    other = tree(tmp_path / "c", {"scores": {"mcq/vignette": grade}, "answers": {"vignette": {"mcq": {"answer": "y"}}}}, {})
    assert diff(a, other) == 1 and ".answers.vignette.mcq.answer" in capsys.readouterr().out  # what is not a score still compares


def test_paths_of_a_moved_folder_are_read_at_their_place_today(tmp_path, capsys):
    a = tree(tmp_path / "a", {"formats": {"experiments/meditod/ontology.yaml": 1}, "src": "experiments/bench/data/x.jsonl"}, {})
    b = tree(tmp_path / "b", {"formats": {"experiments/studies/meditod/ontology.yaml": 1}, "src": "serving/bench/data/x.jsonl"}, {})
    assert diff(a, b) == 0
    c = tree(tmp_path / "c", {"formats": {"experiments/core/ontology.yaml": 1}, "src": "serving/bench/data/x.jsonl"}, {})
    assert diff(a, c) == 1 and "experiments/studies/meditod/ontology.yaml (one side only)" in capsys.readouterr().out
