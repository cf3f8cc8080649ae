"""Benchmark: metrics on hand-made request records, ratios, prompts, compare-run, tables."""

from __future__ import annotations

import json

import pytest

from experiments.bench.compare import against_bench, compare_run
from experiments.bench.measure import calculate_metrics, nearest, ratios
from experiments.bench.send import RequestOutput
from experiments.bench.summary import fixed_width, render_markdown, summarize
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

    from experiments.bench.prompts import build_prompts, load_texts, random_prompts
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
    from experiments.bench.cli import parse_levels

    assert parse_levels("1, 8,32", "--concurrency") == [1, 8, 32]
    with pytest.raises(MedstackError, match="'x'"):
        parse_levels("1,x", "--concurrency")
    p = cli("bench", "--model", "embedded", "--concurrency", "1,0", "--out", str(tmp_path / "b"))
    assert p.returncode == 2 and "--concurrency" in p.stderr
    p = cli("bench", "--model", "embedded", "--compare-run", str(tmp_path / "nope"), "--out", str(tmp_path / "b"))
    assert p.returncode == 2 and "no metrics.json" in p.stderr and "Traceback" not in p.stderr
