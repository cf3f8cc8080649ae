"""The runner at paper scale: the pieces changed for it, and the benchmark itself at a small size."""

from __future__ import annotations

import json
import sqlite3

import pytest

from serving.bench import instant_endpoint as ie
from serving.bench.paper_estimate import estimate, workload
from experiments.core.concurrency import AUTO_CPU, AUTO_PER_GPU, resolve_concurrency
from experiments.core.results import RunDir
from experiments.tools.report.build import build_report
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


def test_cache_store_commits_each_loop_turn_once_before_returning(tmp_path):
    """store(): every answer is visible to another connection when its await returns (a kill -9 then loses none),
    and the answers stored in one turn of the event loop go out in one commit."""
    import asyncio

    from models.errors import StorageError

    cache = ResponseCache(tmp_path / "c.sqlite")
    commits = []
    real_flush = cache.flush
    cache.flush = lambda: (commits.append(len(cache._pending)), real_flush())[1]

    async def one(i):
        await asyncio.sleep(0)
        await cache.store(f"k{i}", {"texts": [str(i)]})
        return _rows(tmp_path / "c.sqlite")  # read by another connection the moment store() returned

    async def go():
        return await asyncio.gather(*(one(i) for i in range(50)))

    seen = asyncio.run(go())
    assert seen == [50] * 50 and commits == [50]  # one commit for the 50 answers of the same turn, before any returned
    assert cache.get("k7") == {"texts": ["7"]}

    def refuse():
        raise StorageError("cannot write the response cache: the disk is full")

    cache.flush = refuse

    async def full():
        return await asyncio.gather(*(cache.store(f"x{i}", {"texts": ["x"]}) for i in range(3)), return_exceptions=True)

    assert [type(e) for e in asyncio.run(full())] == [StorageError] * 3  # a refused write reaches every waiter
    cache.flush = real_flush
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
    assert opening.startswith(ie.ANSWERS["opening"])
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
    spread = {ie.turns_for(f"{ie.ANSWERS['opening']} case {i}") for i in range(200)}
    assert spread == set(range(5, 14))


def _call(i, messages, prompt_tokens, completion_tokens=10, **kw):
    return {"index": i, "kind": "chat", "messages": messages, "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, **kw}


def test_paper_estimate_prefix_caching_and_scaling(tmp_path):
    """Hand-worked: a call is cached up to the longest run of leading messages an earlier call sent, by characters."""
    sys_m, q1, a1, q2 = ({"role": "user", "content": c * 26} for c in "suav")  # messages of one length: shares are counts
    first = [_call(0, [sys_m, q1], 100), _call(1, [sys_m, q1, a1, q2], 200)]  # turn 2 re-uses turn 1's two messages: half
    # another case with the same first message: half; a failed call and one with no tokens: not counted
    other = [_call(0, [sys_m, q2], 100), _call(1, [q1], 50, error="timeout"), _call(2, [q1], 50, completion_tokens=0)]
    rd = RunDir(tmp_path / "run", {"x": 1})
    rd.append_many([{"id": "a", "status": "ok", "calls": first}, {"id": "b", "status": "ok", "calls": other},
                    {"id": "c", "status": "failed", "calls": first}])
    w = workload(tmp_path / "run")
    assert w == {"case_trials": 2, "calls": 3, "prompt": 400, "output": 30, "uncached": 100 + 100 + 50}
    e = estimate(w, 2000)
    assert e["per_case_trial"] == {"calls": 1.5, "prompt": 200.0, "uncached": 125.0, "output": 15.0}
    assert e["total"]["calls"] == 3000 and e["prefix_cache_saving"] == pytest.approx(1 - 250 / 400)
    one, two = e["replicas"][0], e["replicas"][1]
    assert two["wall_h"] == pytest.approx(one["wall_h"] / 2, abs=0.01) and two["concurrency"] == 2 * one["concurrency"]
    assert estimate(w)["case_trials"] == 2  # by default the run's own size


def test_paper_estimate_streams_the_call_logs(tmp_path):
    """The last record per id counts, and the call logs are never held together."""
    import tracemalloc

    def rec(i, status="ok", prompt=300):
        pad = "x" * 500_000  # a paper-scale call log is ~100 KB a record; 20 MB over the run
        return {"id": f"c{i}", "status": status, "calls": [_call(0, [{"role": "user", "content": pad + str(i)}], prompt)]}

    rd = RunDir(tmp_path / "run", {"x": 1})
    rd.append(rec(1, prompt=999))  # c1's first line: replaced by its second
    rd.append(rec(2, "failed"))
    rd.append_many([rec(i) for i in range(1, 41)])
    rd.append(rec(3, "failed"))  # c3 failed last: not counted
    tracemalloc.start()
    try:
        w = workload(tmp_path / "run")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert w == {"case_trials": 39, "calls": 39, "prompt": 39 * 300, "output": 390, "uncached": 39 * 300}
    assert peak < 5_000_000  # a few lines' worth at a time, never the run's 20 MB of call logs


def test_runner_scale_benchmark_small(tmp_path):
    """The benchmark end to end at 12 case-trials: every case-trial finished, one record each, a resume runs none."""
    from experiments.tools.bench.runner_scale import run_scale

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
    row = json.loads((tmp_path / "b" / "runner-scale.json").read_text())
    assert row["calls_per_s"] > 0 and row["peak_rss_mb_run"] > 0
    assert row["peak_rss_mb_report"] > 0 and (tmp_path / "b" / "report.html").read_text().count("case_0/t") >= 3  # the report's own process


def test_cache_key_unchanged_by_shallow_gen_dict():
    """Existing caches stay valid: the key built from the shallow field dict equals the one from asdict."""
    from dataclasses import asdict

    from serving.cache import request_key
    from serving.client import GenConfig, shallow_dict

    g = GenConfig(temperature=0.7, stop=("\nA:", "B"), seed=5)
    payload = {"kind": "chat", "model": "m", "content": [{"role": "user", "content": "x"}]}
    assert request_key({**payload, "gen": shallow_dict(g)}) == request_key({**payload, "gen": asdict(g)})
    assert g.replace(seed=9) == GenConfig(temperature=0.7, stop=("\nA:", "B"), seed=9)


# -- flat memory at the end of a run and in reports: call logs are never held together ---------------------------

def _big_run(path, n: int = 40, call_kb: int = 500):
    """A results directory whose records carry call logs of ``call_kb`` KB each (a paper-scale record is ~100 KB);
    case c1 failed first and was run again, so it has two lines."""
    rd = RunDir(path, {"x": 1})
    log = lambda i: [{"index": 0, "messages": [{"role": "user", "content": f"CALLLOG-{i}-" + "x" * (call_kb * 1000)}]}]
    rd.append({"id": "c1", "status": "failed", "error": "gave up", "calls": log("old")})
    rd.append_many([{"id": f"c{i}", "status": "ok", "correct": i % 2, "transcript": [{"agent": "doctor", "content": f"turn of c{i}"}],
                     "calls": log(i)} for i in range(1, n + 1)])
    return rd


def test_read_run_keeps_no_call_log_and_stays_flat(tmp_path):
    import tracemalloc

    from experiments.core.results import read_run, value_at

    _big_run(tmp_path / "run")
    tracemalloc.start()
    try:
        run = read_run(tmp_path / "run").as_dict()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [r["id"] for r in run["records"]] == [f"c{i}" for i in range(1, 41)] and run["failed"] == []  # the last line per id wins
    assert not any("calls" in r for r in run["records"])
    assert peak < 5_000_000  # the file holds 20 MB of call logs; a few lines' worth is held at a time, never all
    from experiments.core.results import latest_records

    records, offsets = latest_records(tmp_path / "run" / "records.jsonl")
    whole = value_at(tmp_path / "run" / "records.jsonl", offsets[5])
    assert whole["id"] == records[5]["id"] == "c6" and whole["calls"][0]["messages"][0]["content"].startswith("CALLLOG-6-")


def test_report_reads_call_logs_of_rendered_cases_only(tmp_path):
    import tracemalloc

    from experiments.tools.report.collect import load_run_dir

    _big_run(tmp_path / "runs" / "big")
    tracemalloc.start()
    try:
        run = load_run_dir(tmp_path / "runs" / "big")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(run["records"]) == 40 and not any("calls" in r for r in run["records"]) and peak < 5_000_000
    html = build_report([str(tmp_path / "runs")], tmp_path / "r.html", max_cases=3).read_text()
    assert all(f"CALLLOG-{i}-" in html for i in (1, 2, 3))  # a rendered case shows its call log
    assert "CALLLOG-4-" not in html and "CALLLOG-old-" not in html  # the others are counted, not read
    assert "turn of c3" in html and "40" in html


def test_run_async_runs_on_uvloop():
    import asyncio

    from experiments.core.concurrency import run_async

    async def loop_module():
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__

    assert run_async(loop_module()).startswith("uvloop")


def test_opening_a_large_results_dir_is_flat_and_moves_torn_lines_aside(tmp_path):
    import tracemalloc

    rd = _big_run(tmp_path / "run")
    tracemalloc.start()
    try:
        RunDir(tmp_path / "run", {"x": 1})  # the torn-line check of a resume
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000  # 20 MB of records, read line by line
    lines = rd.records_path.read_bytes().splitlines(keepends=True)
    lines.insert(3, b'{"id": "c3", "sta\n')  # a torn line in the middle, and a last line that lost its newline
    rd.records_path.write_bytes(b"".join(lines)[:-1])
    again = RunDir(tmp_path / "run", {"x": 1})
    assert again.notes and "1 torn line(s) (line 4)" in again.notes[0]
    assert (tmp_path / "run" / "records.jsonl.torn").read_bytes() == b'{"id": "c3", "sta\n'
    assert rd.records_path.read_bytes() == b"".join(lines[:3] + lines[4:]) and len(again.latest(drop=("calls",))) == 40
