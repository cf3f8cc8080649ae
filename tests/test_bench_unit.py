"""Benchmark: metrics on hand-made request records, ratios, prompts, compare-run, tables."""

from __future__ import annotations

import json

import pytest

from serving.bench.compare import against_bench, compare_run
from serving.bench.measure import calculate_metrics, nearest, ratios
from serving.bench.send import RequestOutput
from serving.bench.summary import fixed_width, render_markdown, summarize
from models.errors import DataError, MedstackError


def outputs():
    return [
        RequestOutput(success=True, prompt_len=10, output_tokens=4, ttft=0.1, itl=[0.2, 0.2, 0.4], latency=0.9),
        RequestOutput(success=True, prompt_len=10, output_tokens=3, ttft=0.3, itl=[0.1, 0.5], latency=0.9),
        RequestOutput(success=False, error="HTTP 500", prompt_len=10),
    ]


def test_calculate_metrics_hand_computed():
    m = calculate_metrics(outputs(), duration=2.0)
    assert (m["requests"], m["completed"], m["failed"]) == (3, 2, 1)
    assert (m["input_tokens"], m["output_tokens"]) == (20, 7)  # the failed request counts nowhere
    assert m["requests_per_s"] == 1.0 and m["output_tokens_per_s"] == 3.5 and m["total_tokens_per_s"] == 13.5
    # TTFT 100, 300 ms: p99 = 100 + 0.99 * 200 (linear interpolation between closest ranks)
    assert (m["ttft_ms_mean"], m["ttft_ms_p50"], m["ttft_ms_p99"]) == pytest.approx((200, 200, 298))
    # ITL pooled, sorted 100 200 200 400 500 ms: p50 = 200; p99 at rank 3.96 = 400 + 0.96 * 100
    assert (m["itl_ms_mean"], m["itl_ms_p50"], m["itl_ms_p99"]) == pytest.approx((280, 200, 496))
    # TPOT per request: (0.9 - 0.1) / 3 and (0.9 - 0.3) / 2
    assert m["tpot_ms_mean"] == pytest.approx((266.6667 + 300) / 2, abs=1e-3)
    assert m["tpot_ms_p99"] == pytest.approx(266.6667 + 0.99 * 33.3333, abs=1e-3)
    assert (m["e2e_s_mean"], m["e2e_s_p50"], m["e2e_s_p99"]) == pytest.approx((0.9, 0.9, 0.9))


def test_calculate_metrics_accepts_dicts_and_all_failed():
    m = calculate_metrics([o.to_dict() for o in outputs()], 2.0)
    assert m["output_tokens_per_s"] == 3.5
    none = calculate_metrics([RequestOutput(error="x")], 1.0)
    assert none["completed"] == 0 and none["failed"] == 1 and none["ttft_ms_p99"] is None and none["output_tokens_per_s"] == 0
    assert calculate_metrics([], 0.0)["requests_per_s"] is None


def test_ratios_nearest_and_headline():
    v = [{"concurrency": 1, "output_tokens_per_s": 9.0, "e2e_s_p99": 2.0}, {"concurrency": 32, "output_tokens_per_s": 90.0, "e2e_s_p99": 4.0}]
    h = [{"concurrency": 1, "output_tokens_per_s": 8.0, "e2e_s_p99": 8.0}, {"concurrency": 8, "output_tokens_per_s": 30.0, "e2e_s_p99": 16.0}]
    assert nearest(h, 32)["concurrency"] == 8 and nearest(h, 4)["concurrency"] == 1 and nearest([], 3) is None
    r = ratios(v[1], h[1])
    assert r["output_tokens_per_s"] == 3.0 and r["e2e_s_p99"] == 0.25 and r["ttft_ms_p50"] is None
    s = summarize(v, h, [])
    assert [x["baseline_batch"] for x in s["ratios"]] == [1, 8]
    assert s["headline"] == {"vllm_concurrency": 32, "vllm_output_tokens_per_s": 90.0, "best_hf_batch": 8,
                             "best_hf_output_tokens_per_s": 30.0, "ratio": 3.0}


def test_compare_run_fraction_and_bad_inputs(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"accuracy": 0.4, "run": {"output_tokens_per_s": 22.5, "concurrency": 16, "wall_seconds": 80}}))
    c = against_bench(compare_run(run), [{"concurrency": 8, "output_tokens_per_s": 40.0}, {"concurrency": 32, "output_tokens_per_s": 90.0}])
    assert c["bench_concurrency"] == 8 and c["fraction"] == round(22.5 / 40.0, 3)
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(DataError, match="no metrics.json"):
        compare_run(bad)
    (bad / "metrics.json").write_text(json.dumps({"accuracy": 1}))
    with pytest.raises(DataError, match="'run' section"):
        compare_run(bad)
    (bad / "metrics.json").write_text("{\n oops")
    with pytest.raises(DataError, match=r"metrics.json:2"):
        compare_run(bad)


def test_fixed_width_table_aligns_and_markdown_has_ratios():
    t = fixed_width(["a", "bbb"], [["1", "2"], ["333", "4"]]).splitlines()
    assert len({len(line) for line in t}) == 1
    lvl = {k: 1.0 for k in ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s", "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99",
                            "itl_ms_mean", "itl_ms_p50", "itl_ms_p99", "e2e_s_mean", "e2e_s_p50", "e2e_s_p99")}
    v = [{"engine": "vllm", "concurrency": 2, "completed": 2, "failed": 0, **lvl, "output_tokens_per_s": 6.0}]
    h = [{"engine": "hf", "concurrency": 1, "completed": 2, "failed": 0, **lvl, "output_tokens_per_s": 2.0}]
    bench = {"config": {"model": "embedded", "input_len": 8, "output_len": 4, "temperature": 0.0, "prompt_source": "x"},
             "results": {"vllm": v, "hf": h}, **summarize(v, h, [])}
    md = render_markdown(bench)
    assert "transformers" in md and "3.00x" in md and "Headline" in md


def test_prompts_exact_length_distinct_and_bos(tmp_path):
    from transformers import AutoTokenizer

    from serving.bench.prompts import build_prompts, load_texts, random_prompts
    from models.registry import resolve_weights

    tok = AutoTokenizer.from_pretrained(str(resolve_weights("embedded")[1]))
    texts = load_texts()
    assert len(texts) >= 10 and all("Doctor:" in t and "Patient:" in t for t in texts)
    ps = build_prompts(tok, texts, 30, 100)  # more prompts than snippets: still all distinct
    assert all(len(p) == 100 and p[0] == tok.bos_token_id for p in ps)
    assert len({tuple(p) for p in ps}) == 30
    rs = random_prompts(tok, 3, 50, seed=1)
    assert all(len(p) == 50 for p in rs) and rs == random_prompts(tok, 3, 50, seed=1)
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "Chest pain for two days."}\n{"text": 3}\n')
    with pytest.raises(DataError, match=r"p.jsonl:2"):
        load_texts(f)
    g = tmp_path / "p.txt"
    g.write_text("one prompt\n\nanother prompt\n")
    assert load_texts(g) == ["one prompt", "another prompt"]


def test_cli_rejects_bad_levels_and_compare_paths(cli, tmp_path):
    from experiments.tools.bench.cli import parse_levels

    assert parse_levels("1, 8,32", "--concurrency") == [1, 8, 32]
    with pytest.raises(MedstackError, match="'x'"):
        parse_levels("1,x", "--concurrency")
    p = cli("bench", "--model", "embedded", "--concurrency", "1,0", "--out", str(tmp_path / "b"))
    assert p.returncode == 2 and "--concurrency" in p.stderr
    p = cli("bench", "--model", "embedded", "--compare-run", str(tmp_path / "nope"), "--out", str(tmp_path / "b"))
    assert p.returncode == 2 and "no metrics.json" in p.stderr and "Traceback" not in p.stderr


# ---------------------------------------------------------------- replay, server metrics, serve settings

REPLAY_RUN = __import__("pathlib").Path(__file__).parent / "fixtures" / "bench" / "run"


def test_replay_workload_reads_last_line_per_id_and_skips_what_never_reached_the_engine():
    from serving.bench.replay import load_workload

    wl = load_workload(REPLAY_RUN)
    d = wl.describe()
    assert wl.concurrency == 2 and d["cases"] == 3 and d["failed_cases"] == 1  # torn last line dropped; b's last line wins
    assert [c.prompt or c.messages[0]["content"] for c in wl.cases["b"]][0] == "Headache since this morning."
    assert d["calls"] == 9 and d["skipped_calls"] == {"cached": 1, "error": 1, "no_tokens": 0}
    assert d["by_kind"] == {"chat": 4, "completion": 5} and d["completion_tokens"] == 6 + 5 + 6 + 4 + 2 + 5 + 4 + 5 + 2
    order = [(c.case, c.index) for c in wl.in_call_order()]
    assert order[:3] == [("a", 0), ("b", 0), ("c", 0)] and order[-1] == ("c", 3)


def _fake_send(events):
    import asyncio

    async def send(call):
        events.append(("start", call.case, call.index))
        for _ in range(3):
            await asyncio.sleep(0)
        events.append(("end", call.case, call.index))
        return {"case": call.case, "index": call.index}

    return send


def test_replay_schedule_honours_after_and_case_concurrency():
    import asyncio

    from serving.bench.replay import load_workload, schedule

    wl = load_workload(REPLAY_RUN)
    events: list = []
    done = asyncio.run(schedule(wl.cases, _fake_send(events), concurrency=2))
    assert len(done) == 9
    pos = {e: i for i, e in enumerate(events)}

    def replayed_ancestor(case, idx):
        calls = {c.index: c for c in wl.cases[case]}
        a = calls[idx].after
        while a is not None and not calls[a].replay:
            a = calls[a].after
        return a

    for case, calls in wl.cases.items():
        for c in calls:
            if not c.replay:
                assert ("start", case, c.index) not in pos  # cache hits and errors are not sent
                continue
            a = replayed_ancestor(case, c.index)
            if a is not None:
                assert pos[("end", case, a)] < pos[("start", case, c.index)]
    # c's two independent answers run side by side; c's grader 3 waits (through the cached grader 2) for answer 1
    assert pos[("start", "c", 1)] < pos[("end", "c", 0)]
    # at most 2 cases in flight: case c (third) starts only after case a or b has finished all its calls
    first_c = min(pos[("start", "c", i)] for i in (0, 1, 3))
    last = {k: max(pos[("end", k, c.index)] for c in wl.cases[k] if c.replay) for k in ("a", "b")}
    assert first_c > min(last.values())


def test_replay_schedule_concurrency_one_runs_cases_one_after_another():
    import asyncio

    from serving.bench.replay import load_workload, schedule

    wl = load_workload(REPLAY_RUN)
    events: list = []
    asyncio.run(schedule(wl.cases, _fake_send(events), concurrency=1))
    cases_in_order = [e[1] for e in events]
    # each case's events form one contiguous block
    blocks = [k for i, k in enumerate(cases_in_order) if i == 0 or cases_in_order[i - 1] != k]
    assert blocks == ["a", "b", "c"]


def test_replay_rejects_bad_runs(tmp_path):
    from serving.bench.replay import load_workload

    with pytest.raises(DataError, match="no such results directory"):
        load_workload(tmp_path / "nope")
    (tmp_path / "config.yaml").write_text("experiment: x\n")
    with pytest.raises(DataError, match="concurrency"):
        load_workload(tmp_path)
    (tmp_path / "config.yaml").write_text("concurrency: 4\n")
    call = {"index": 0, "kind": "chat", "messages": [], "gen": {}, "completion_tokens": 3, "after": 5}
    (tmp_path / "records.jsonl").write_text(json.dumps({"id": 1, "calls": [call]}) + "\n")
    with pytest.raises(DataError, match="waits for call 5"):
        load_workload(tmp_path)
    cyc = [{**call, "index": 0, "after": 1}, {**call, "index": 1, "after": 0}]
    (tmp_path / "records.jsonl").write_text(json.dumps({"id": 1, "calls": cyc}) + "\n")
    with pytest.raises(DataError, match="cycle"):
        load_workload(tmp_path)
    (tmp_path / "records.jsonl").write_text(json.dumps({"id": 1, "result": "no calls recorded"}) + "\n")
    with pytest.raises(DataError, match="no calls to replay"):
        load_workload(tmp_path)
    (tmp_path / "records.jsonl").write_text("{oops\n" + json.dumps({"id": 1, "calls": [call]}) + "\n")
    with pytest.raises(DataError, match=r"records.jsonl:1"):
        load_workload(tmp_path)


def test_replay_markdown_and_speedup():
    from serving.bench.replay import figures, speedup
    from serving.bench.summary import render_replay_markdown

    recs = [{"success": True, "completion_tokens": 10, "prompt_tokens": 5, "latency": 1.0, "expected_tokens": 10, "error": ""}]
    v, h = figures(recs, 2.0, "vllm", 4), figures(recs, 10.0, "hf", 1)
    assert v["output_tokens_per_s"] == 5.0 and speedup(v, h) == {"wall_time": 5.0, "output_tokens_per_s": 5.0}
    bench = {"config": {"model": "embedded"}, "replay": {"workload": {"run_dir": "r", "cases": 1, "failed_cases": 0, "calls": 1, "by_kind": {"chat": 1},
             "skipped_calls": {"cached": 0}, "prompt_tokens": 5, "completion_tokens": 10, "concurrency": 4}, "vllm": v, "hf": h, "speedup": speedup(v, h)}}
    md = render_replay_markdown(bench)
    assert "5.00x faster" in md and "transformers (batch 1)" in md


PROM = """# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="embedded"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="embedded"} 250.0
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="embedded"} 3.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="embedded"} 2.0
vllm:request_queue_time_seconds_count{engine="0",model_name="embedded"} 4.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="embedded"} 1.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="embedded"} 4.0
vllm:num_requests_running{engine="0",model_name="embedded"} NaN
"""


def test_server_metrics_parse_hit_rate_and_ttft_split():
    from serving.server_metrics import metrics_url, parse, prefix_cache_hit_rate, scrape, summary, ttft_split

    before = parse(PROM)
    assert before["vllm:prefix_cache_queries_total"] == 1000.0 and not any(k.endswith("_bucket") for k in before)
    assert "vllm:num_requests_running" not in before
    after = dict(before, **{"vllm:prefix_cache_queries_total": 1400.0, "vllm:prefix_cache_hits_total": 550.0,
                            "vllm:request_queue_time_seconds_sum": 5.0, "vllm:request_queue_time_seconds_count": 6.0,
                            "vllm:request_prefill_time_seconds_sum": 1.5, "vllm:request_prefill_time_seconds_count": 6.0})
    assert prefix_cache_hit_rate(before, after) == 0.75  # (550 - 250) / (1400 - 1000)
    assert prefix_cache_hit_rate(before, before) is None and prefix_cache_hit_rate({}, {}) is None
    assert ttft_split(before, after) == {"queue_ms_mean": 1500.0, "prefill_ms_mean": 250.0, "server_ttft_ms_mean": None}
    assert summary({}, {})["prefix_cache_hit_rate"] is None
    assert metrics_url("http://127.0.0.1:8123/v1") == "http://127.0.0.1:8123/metrics"
    assert scrape("http://127.0.0.1:9/v1", timeout=0.5) == {}  # nothing listens: empty, never an exception


def test_cpu_serve_settings_bind_every_core_and_gpu_keeps_vllm_defaults(monkeypatch):
    from serving.cpus import cpu_list, machine_facts, parse_cpu_list
    from serving.launcher import CPU_DEFAULTS, ServerSettings, effective_serve_settings

    assert cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and cpu_list([3]) == "3"
    assert parse_cpu_list("0-2,5,7-8") == [0, 1, 2, 5, 7, 8] and parse_cpu_list("") == []
    for var in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "OMP_NUM_THREADS", "VLLM_CPU_NUM_OF_RESERVED_CPU", "LD_PRELOAD"):
        monkeypatch.delenv(var, raising=False)
    import os

    cpu = effective_serve_settings(ServerSettings(alias="embedded"), on_gpu=False)
    assert cpu["env"]["VLLM_CPU_OMP_THREADS_BIND"] == cpu_list(os.sched_getaffinity(0))
    assert cpu["settings"]["cpu_threads_bind"] == CPU_DEFAULTS["cpu_threads_bind"]
    assert cpu["argv"] == ["--no-enable-chunked-prefill"]  # the CPU default: seeded sampling crashes vLLM-cpu with it on
    on = effective_serve_settings(ServerSettings(alias="embedded", chunked_prefill=True), on_gpu=False)
    assert on["argv"] == ["--enable-chunked-prefill"]
    custom = effective_serve_settings(ServerSettings(alias="embedded", cpu_threads_bind="auto", cpu_reserved=0, cpu_kvcache_gb=1,
                                                     preload_iomp=False, max_num_seqs=32, chunked_prefill=False, prefix_caching=False), on_gpu=False)
    assert custom["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "auto" and custom["env"]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert custom["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1" and "LD_PRELOAD" not in custom["env"]
    assert custom["argv"] == ["--max-num-seqs", "32", "--no-enable-chunked-prefill", "--no-enable-prefix-caching"]
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "6")  # the caller's environment beats our default, not an explicit setting
    assert effective_serve_settings(ServerSettings(alias="embedded"), on_gpu=False)["env"]["VLLM_CPU_KVCACHE_SPACE"] == "6"
    gpu = effective_serve_settings(ServerSettings(alias="embedded"), on_gpu=True)
    assert gpu["env"] == {} and gpu["argv"] == []
    m = machine_facts()
    assert m["logical_cpus"] and m["usable_cpus"]


def test_cli_replay_names_a_missing_run(cli, tmp_path):
    p = cli("bench", "--model", "embedded", "--replay", str(tmp_path / "nope"), "--out", str(tmp_path / "b"))
    assert p.returncode == 2 and "no such results directory" in p.stderr and "Traceback" not in p.stderr
