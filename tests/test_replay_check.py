"""scripts/replay_check.py diff: volatile keys ignored, scores/arm_scores reported apart, anything else fails."""

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


def test_scores_are_reported_apart_and_other_keys_fail(tmp_path, capsys):
    a = tree(tmp_path / "a", {"scores": {"oneshot": 1}}, {})
    b = tree(tmp_path / "b", {"arm_scores": {"oneshot": 1}, "scores": {"correct": 1}}, {})
    assert diff(a, b) == 0
    out = capsys.readouterr().out
    assert "craftmd craftmd-1: scores: scores.correct (one side only), scores.oneshot (one side only)" in out
    assert "arm_scores: arm_scores" in out
    c = tree(tmp_path / "c", {"answer": "y"}, {"f1": 0.6})
    assert diff(a, c) == 1
    out = capsys.readouterr().out
    assert "craftmd craftmd-1: .answer" in out and "dera-qa metrics.json: .f1" in out


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


def test_renamed_arm_scores_must_equal_the_old_scores(tmp_path, capsys):
    old = tree(tmp_path / "a", {"scores": {"dera": {"bertscore": 0.5}}}, {})
    renamed = tree(tmp_path / "b", {"arm_scores": {"dera": {"bertscore": 0.5}}, "scores": {"correct": None}}, {})
    assert diff(old, renamed) == 0
    changed = tree(tmp_path / "c", {"arm_scores": {"dera": {"bertscore": 0.6}}, "scores": {"correct": None}}, {})
    assert diff(old, changed) == 1
    assert "arm_scores.dera.bertscore (AFTER's arm_scores against BEFORE's scores)" in capsys.readouterr().out
