"""``concurrency: auto`` lowered to what the servers' KV caches hold: the capacity read from vLLM's start-up log (the
CPU build's one-line report, the CUDA build's two lines), and the bound taken from it."""

from __future__ import annotations

from pathlib import Path

from experiments.core.registry import named
from experiments.core.concurrency import TOKENS_PER_CASE, kv_bound
from serving.launcher import kv_cache_tokens, server_identity

LOGS = Path(__file__).parent / "fixtures" / "vllm-logs"


def test_the_capacity_is_read_from_either_build_s_log(tmp_path):
    assert kv_cache_tokens(LOGS / "cpu-0.32.log") == 110_733  # "CPU KV cache size: 110,733 tokens, Maximum concurrency ..."
    assert kv_cache_tokens(LOGS / "gpu.log") == 24_656  # "GPU KV cache size: 24,656 tokens"
    restarted = tmp_path / "twice.log"
    restarted.write_text((LOGS / "gpu.log").read_text() + (LOGS / "cpu-0.32.log").read_text())
    assert kv_cache_tokens(restarted) == 110_733  # the last report wins
    (tmp_path / "none.log").write_text("INFO starting\n")
    assert kv_cache_tokens(tmp_path / "none.log") is None and kv_cache_tokens(tmp_path / "absent.log") is None
    assert kv_cache_tokens(None) is None


def test_auto_is_lowered_to_the_smallest_cache():
    said = []
    assert TOKENS_PER_CASE == 2048
    assert kv_bound(256, [24_656], said.append) == 12  # 24,656 // 2,048: an 8B model on a 24 GB GPU
    assert "12 cases in flight" in said[0] and "24,656 tokens" in said[0]
    assert kv_bound(256, [110_733, 24_656, None]) == 12  # the smallest reported cache bounds every case
    assert kv_bound(16, [110_733]) == 16  # a cache that holds more leaves the device's limit
    assert kv_bound(16, [None]) == 16 and kv_bound(16, []) == 16  # nothing reported: the device's limit
    assert kv_bound(16, [1000]) == 1  # never below one case


def test_a_replica_group_reports_its_replicas_caches_together(tmp_path, monkeypatch):
    import serving.launcher as launcher

    monkeypatch.setattr(launcher, "resolve_weights", lambda alias: (None, None))
    group = {"alias": "remote", "argv": None, "replicas": [{"log": str(LOGS / "gpu.log")}, {"log": str(LOGS / "gpu.log")}]}
    assert server_identity(group)["kv_cache_tokens"] == 2 * 24_656
    group["replicas"].append({"remote": True})  # a member without a log here: the group's capacity is unknown
    assert server_identity(group)["kv_cache_tokens"] is None
    assert server_identity({"alias": "one", "argv": None, "log": str(LOGS / "cpu-0.32.log")})["kv_cache_tokens"] == 110_733


def test_a_run_records_auto_and_the_number_it_took(tmp_path, monkeypatch):
    import asyncio
    import json

    import yaml

    from experiments.core.concurrency import AUTO_CPU
    from experiments.core.config import load_settings
    from experiments.core.runner import run_study
    from experiments.studies.craftmd.settings import CraftSettings
    from experiments.studies.craftmd.study import CONFIGS, CraftmdStudy
    from tests.scripted import ScriptedLLM

    monkeypatch.setenv("MEDSTACK_FORCE_CPU", "1")
    cases = Path(__file__).parent / "fixtures" / "craftmd" / "requests_cases.csv"
    s = load_settings(CraftSettings, CONFIGS / "embedded-small.yaml", {"data": str(cases), "out": str(tmp_path / "run"),
                                                                        "concurrency": "auto", "limit": 2})
    llm = ScriptedLLM(lambda role, content, gen: "**Final Diagnosis:** Gout" if role == "clinical" else "Yes",
                      roles=("clinical", "patient", "grader", "summarizer", "assessor"))
    asyncio.run(run_study(named(CraftmdStudy)(), s, client=llm, log=lambda m: None))
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["concurrency"] == "auto"  # as asked
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["run"]["concurrency"] == AUTO_CPU  # as taken
