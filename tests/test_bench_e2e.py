"""End-to-end: `medstack bench` against the real server, with the transformers baseline, tiny settings."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e


def test_bench_both_engines_writes_json_md_png_and_compares_a_run(embedded_server, cli, tmp_path):
    out = tmp_path / "bench"
    model = f"embedded@{embedded_server['base_url']}"
    p = cli("bench", "--model", model, "--concurrency", "1,2", "--num-prompts", "2", "--input-len", "32", "--output-len", "8",
            "--baseline", "hf", "--baseline-batch", "1,2", "--warmups", "1", "--out", str(out), check=True)
    assert "vLLM / transformers" in p.stdout
    bench = json.loads((out / "bench.json").read_text())
    cfg = bench["config"]
    assert (cfg["model"], cfg["concurrency"], cfg["output_len"], cfg["baseline"]) == (model, [1, 2], 8, "hf")
    assert "dialogues.jsonl" in cfg["prompt_source"]
    assert bench["identity"]["vllm"]["base_url"] == embedded_server["base_url"] and "transformers" in bench["identity"]["hf"]["engine"]
    for engine in ("vllm", "hf"):
        levels = bench["results"][engine]
        assert [r["concurrency"] for r in levels] == [1, 2]
        for r in levels:
            assert (r["completed"], r["failed"]) == (2, 0)
            assert r["output_tokens"] == 2 * 8  # ignore_eos / min_new_tokens: exactly output-len tokens each
            assert r["input_tokens"] == 2 * 32
            assert r["output_tokens_per_s"] > 0 and r["ttft_ms_p99"] > 0 and r["itl_ms_p50"] > 0
            assert r["e2e_s_p99"] >= r["e2e_s_p50"] > 0
    assert [(r["concurrency"], r["baseline_batch"]) for r in bench["ratios"]] == [(1, 1), (2, 2)]
    assert all(v is not None for v in bench["ratios"][0]["figures"].values())
    assert bench["headline"]["ratio"] > 0
    png = out / "bench.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(r["success"] and len(r["itl"]) >= 1 for r in rows)

    # --compare-run against this bench, without measuring again
    run = tmp_path / "exp"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"run": {"output_tokens_per_s": 1.5, "concurrency": 2}}))
    cli("bench", "--model", model, "--from-json", str(out / "bench.json"), "--compare-run", str(run), check=True)
    again = json.loads((out / "bench.json").read_text())
    (cmp,) = again["compare_runs"]
    level2 = bench["results"]["vllm"][1]["output_tokens_per_s"]
    assert cmp["bench_concurrency"] == 2 and cmp["fraction"] == pytest.approx(1.5 / level2, abs=1e-3)
    assert "saturated figure" in (out / "bench.md").read_text()


def test_bench_replay_of_a_recorded_run_against_the_server_and_the_batch1_loop(embedded_server, cli, tmp_path, fixtures_dir):
    out = tmp_path / "replay"
    model = f"embedded@{embedded_server['base_url']}"
    p = cli("bench", "--model", model, "--replay", str(fixtures_dir / "bench" / "run"), "--baseline", "hf", "--out", str(out), check=True)
    assert "Speed-up" in p.stdout
    bench = json.loads((out / "bench.json").read_text())
    r = bench["replay"]
    assert r["workload"]["calls"] == 9 and r["workload"]["concurrency"] == 2
    for engine in ("vllm", "hf"):
        x = r[engine]
        assert (x["calls"], x["completed"], x["failed"]) == (9, 9, 0), x.get("first_error")
        assert x["output_tokens"] == x["expected_output_tokens"] == 39  # exactly the recorded completion tokens, both engines
        assert x["wall_s"] > 0
    assert r["speedup"]["wall_time"] > 0
    assert bench["host"]["cpu_model"] is not None and bench["host"]["usable_cpus"]
    assert "server" in r["vllm"]  # /metrics figures (None where the build does not export them)
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert sorted({row["engine"] for row in rows}) == ["hf", "vllm"] and len(rows) == 18
    png = out / "bench.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
