"""The runner at paper scale (SPEC 8): the pieces changed for it, and the benchmark itself at a small size."""

from __future__ import annotations

import json
import sqlite3

import pytest

from experiments.bench import instant_endpoint as ie
from experiments.bench.paper_estimate import LLAMA2_SHAPE, case_trial_calls, estimate
from experiments.core.concurrency import AUTO_CPU, AUTO_PER_GPU, resolve_concurrency
from experiments.core.results import RunDir
from serving.cache import ResponseCache


def _rows(path) -> int:
    db = sqlite3.connect(str(path))
    try:
        return db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
    finally:
        db.close()


def test_cache_puts_wait_for_flush_and_are_readable_before(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite", commit_every=100)
    cache.put("a", {"texts": ["x"]})
    assert cache.get("a") == {"texts": ["x"]}  # this process sees its own pending answer
    assert _rows(tmp_path / "c.sqlite") == 0  # another connection does not, until the flush
    cache.flush()
    assert _rows(tmp_path / "c.sqlite") == 1
    for i in range(100):  # commit_every puts commit by themselves
        cache.put(f"k{i}", {"texts": [str(i)]})
    assert _rows(tmp_path / "c.sqlite") == 101
    cache.put("last", {"texts": ["y"]})
    cache.close()  # close commits what is pending
    assert _rows(tmp_path / "c.sqlite") == 102


def test_cache_default_commits_every_put_when_asked(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite", commit_every=1)
    cache.put("a", {"texts": ["x"]})
    assert _rows(tmp_path / "c.sqlite") == 1
    cache.close()


def test_append_many_latest_drop_and_start(tmp_path):
    rd = RunDir(tmp_path / "run", {"x": 1})
    rd.append_many([{"id": "a", "status": "failed", "calls": [1]}, {"id": "b", "status": "ok", "calls": [2, 3]}])
    offset = rd.size()
    rd.append({"id": "a", "status": "ok", "calls": [4]})
    assert {i: r["status"] for i, r in rd.latest().items()} == {"a": "ok", "b": "ok"}  # last line wins
    assert rd.latest(drop=("calls",), start=offset) == {"a": {"id": "a", "status": "ok"}}  # only what came after
    assert rd.latest(drop=("calls",)) == {"a": {"id": "a", "status": "ok"}, "b": {"id": "b", "status": "ok"}}
    assert rd.latest()["b"]["calls"] == [2, 3]


def test_torn_last_line_still_dropped(tmp_path):
    rd = RunDir(tmp_path / "run", {"x": 1})
    rd.append({"id": "a", "status": "ok"})
    with open(rd.records_path, "a") as f:
        f.write('{"id": "b", "sta')
    rd = RunDir(tmp_path / "run", {"x": 1})
    assert list(rd.latest()) == ["a"]
    assert rd.records_path.read_bytes().endswith(b"}\n")


def test_concurrency_auto_by_device():
    assert resolve_concurrency(12) == 12
    assert resolve_concurrency("auto", gpus=0) == AUTO_CPU
    assert resolve_concurrency("auto", gpus=4) == 4 * AUTO_PER_GPU


def test_instant_endpoint_conversation_shape():
    """A doctor's view gets questions until turn T (5..13), then a final diagnosis; single prompts a short line."""
    patient_view = [{"role": "system", "content": "You are a patient. Case: rash."}, {"role": "user", "content": "Hello! What brings you here?"}]
    opening = ie.answer_chat(patient_view)
    assert opening.startswith(ie.OPENING)
    t = ie.turns_for(opening)
    assert 5 <= t <= 13
    # the doctor's chat as CRAFT-MD builds it: instructions, its own greeting, the patient's opening
    doctor = [{"role": "user", "content": "You are a doctor."}, {"role": "assistant", "content": "Hello! What brings you here?"},
              {"role": "user", "content": opening}]
    for turn in range(1, t + 1):
        reply = ie.answer_chat(doctor)
        if turn < t:
            assert "?" in reply and "Final Diagnosis" not in reply
        else:
            assert "Final Diagnosis" in reply
        doctor += [{"role": "assistant", "content": reply}, {"role": "user", "content": "It hurts."}]
    patient = patient_view + [{"role": "assistant", "content": opening}, {"role": "user", "content": "Where?"}]
    assert "Final Diagnosis" not in ie.answer_chat(patient)
    assert ie.answer_chat([{"role": "user", "content": "Which one?"}]).startswith("Diagnosis:")
    assert ie.answer_chat([{"role": "user", "content": "Same disease?\nVerdict:"}]) == "Verdict: No"  # the grader is not re-asked
    spread = {ie.turns_for(f"{ie.OPENING} case {i}") for i in range(200)}
    assert spread == set(range(5, 14))


def test_paper_estimate_call_count_and_caching():
    tpl = {"patient_system+opening": 400, "doctor_system": 80, "summary": 300, "extract": 150, "match": 120,
           **{f"{f}_{m}": 60 for f in ("vignette", "multiturn", "singleturn", "summarized") for m in ("mcq", "frq")}}
    calls = case_trial_calls(tpl, LLAMA2_SHAPE, 9)
    assert len(calls) == 2 * 9 + 17
    e = estimate(tpl, LLAMA2_SHAPE)
    assert e["per_case_trial"]["calls"] == pytest.approx(2 * 8.41 + 17, abs=0.06)
    assert 0 < e["total"]["uncached"] < e["total"]["prompt"]
    one, two = e["replicas"][0], e["replicas"][1]
    assert two["wall_h"] == pytest.approx(one["wall_h"] / 2, abs=0.01) and two["concurrency"] == 2 * one["concurrency"]


def test_runner_scale_benchmark_small(tmp_path):
    """The benchmark end to end at 12 case-trials: every case-trial finished, one record each, a resume runs none."""
    from experiments.bench.runner_scale import run_scale

    row = run_scale(12, 3, 4, tmp_path / "b", profile=False, log=lambda m: None)
    assert row["finished"] == 12 and row["failed"] == 0 and row["resume_ran_cases"] == 0
    assert 25 <= row["calls_per_case_trial"] <= 45  # CRAFT-MD-shaped: 2T + 17 with T in 5..13
    records = [json.loads(line) for line in (tmp_path / "b" / "run" / "records.jsonl").read_text().splitlines()]
    assert len({r["id"] for r in records}) == len(records) == 12
    keys = {c["cache_key"] for r in records for c in r["calls"]}
    db = sqlite3.connect(str(tmp_path / "b" / "cache.sqlite"))
    stored = {k for (k,) in db.execute("SELECT key FROM responses")}
    db.close()
    assert keys and keys <= stored  # every answer a record refers to is in the cache
    assert json.loads((tmp_path / "b" / "runner-scale.json").read_text())["calls_per_s"] > 0


def test_cache_key_unchanged_by_shallow_gen_dict():
    """Existing caches stay valid: the key built from the shallow field dict equals the one from asdict."""
    from dataclasses import asdict

    from serving.cache import request_key
    from serving.client import GenConfig, shallow_dict

    g = GenConfig(temperature=0.7, stop=("\nA:", "B"), seed=5)
    payload = {"kind": "chat", "model": "m", "content": [{"role": "user", "content": "x"}]}
    assert request_key({**payload, "gen": shallow_dict(g)}) == request_key({**payload, "gen": asdict(g)})
    assert g.replace(seed=9) == GenConfig(temperature=0.7, stop=("\nA:", "B"), seed=9)
