"""Foundation logic that needs no model: registry, config, results directory, cache, parsing, locality."""

from __future__ import annotations

import asyncio

import pytest

from experiments.core.config import ConfigError, RunSettings, load_settings
from experiments.common.parsing import extract_after, extract_json, extract_tag, has_marker, split_sections
from experiments.core.results import ResultsError, RunDir, read_jsonl
from models.errors import DataError
from models.registry import RegistryError, get_spec, load_registry, resolve_weights
from serving.cache import ResponseCache
from serving.client import Endpoint, GenConfig, LLMClient, RemoteEndpointError, is_local_url
from serving.launcher import ServeError, ServerSettings, build_command, choose_cpu_dtype, cpu_flags, parse_lora


def test_registry_has_required_aliases():
    reg = load_registry()
    for alias in ["embedded", "llama3-8b-instruct", "mistral-7b-instruct-v0.2", "mistral-7b-instruct-v0.1", "llama2-7b-chat", "openbiollm-8b"]:
        assert alias in reg
    assert reg["embedded"].chat_template_path().exists()


def test_unknown_alias_lists_known():
    with pytest.raises(RegistryError, match="unknown model alias 'gpt-9'.*embedded"):
        get_spec("gpt-9")


def test_missing_weights_say_where(monkeypatch, tmp_path):
    monkeypatch.setenv("MEDSTACK_WEIGHTS", str(tmp_path))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(RegistryError, match=r"weights for 'openbiollm-8b' not found.*MEDSTACK_WEIGHTS"):
        resolve_weights("openbiollm-8b")


def test_local_weights_from_medstack_weights(monkeypatch, tmp_path):
    (tmp_path / "llama2-7b-chat").mkdir()
    (tmp_path / "llama2-7b-chat" / "config.json").write_text("{}")
    monkeypatch.setenv("MEDSTACK_WEIGHTS", str(tmp_path))
    _, path = resolve_weights("llama2-7b-chat")
    assert path == tmp_path / "llama2-7b-chat"


def test_cpu_and_gpu_command_lines(monkeypatch, tmp_path):
    (tmp_path / "mistral-7b-instruct-v0.2").mkdir()
    (tmp_path / "mistral-7b-instruct-v0.2" / "config.json").write_text("{}")
    monkeypatch.setenv("MEDSTACK_WEIGHTS", str(tmp_path))
    s = ServerSettings(alias="mistral-7b-instruct-v0.2", port=8123, tensor_parallel_size=2, pipeline_parallel_size=2, gpu_memory_utilization=0.8)
    gpu_argv, _ = build_command(s, on_gpu=True)
    joined = " ".join(gpu_argv)
    assert "--tensor-parallel-size 2" in joined and "--pipeline-parallel-size 2" in joined and "--gpu-memory-utilization 0.8" in joined
    assert "--host 127.0.0.1" in joined
    cpu_argv, env = build_command(s, on_gpu=False)
    assert "--enforce-eager" in cpu_argv and cpu_argv[cpu_argv.index("--dtype") + 1] == choose_cpu_dtype(cpu_flags())[0]
    assert env["VLLM_CPU_KVCACHE_SPACE"] and env["HF_HUB_OFFLINE"] == "1"


def test_parse_lora_names_bad_item(tmp_path):
    with pytest.raises(ServeError, match="expected NAME=PATH"):
        parse_lora(["no-equals-sign"])
    with pytest.raises(ServeError, match="no adapter_config.json"):
        parse_lora([f"x={tmp_path}"])


def test_locality():
    assert is_local_url("http://127.0.0.1:8000/v1") and is_local_url("http://localhost:1/v1") and is_local_url("http://[::1]:8/v1")
    assert not is_local_url("http://10.0.0.5:8000/v1") and not is_local_url("https://api.example.com/v1")
    with pytest.raises(RemoteEndpointError, match="--allow-remote"):
        LLMClient({"default": Endpoint("http://192.168.1.2:8000/v1", "m", "m")})
    LLMClient({"default": Endpoint("http://192.168.1.2:8000/v1", "m", "m")}, allow_remote=True)


def test_config_yaml_overrides_and_errors(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("version: 1\nconcurrency: 4\nroles: {default: embedded}\n")
    s = load_settings(RunSettings, cfg, {"concurrency": 9, "limit": None, "roles": {"grader": "embedded"}})
    assert s.concurrency == 9 and s.limit is None and s.roles == {"default": "embedded", "grader": "embedded"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("concurrency: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_settings(RunSettings, bad)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("concurrency: many\nbogus: 1\n")
    with pytest.raises(ConfigError, match=r"wrong.yaml:2: bogus: unknown setting 'bogus' at the top level"):
        load_settings(RunSettings, wrong)  # an unknown key first, by its file and line
    wrong.write_text("concurrency: many\n")
    with pytest.raises(ConfigError, match=r"invalid settings in .*wrong.yaml[\s\S]*concurrency"):
        load_settings(RunSettings, wrong)


def test_rundir_resume_and_torn_line(tmp_path):
    run = RunDir(tmp_path / "r", {"experiment": "x", "seed": 1})
    run.append({"id": "a", "v": 1})
    run.append({"id": "b", "v": 2})
    with open(run.records_path, "a") as f:
        f.write('{"id": "c", "v"')  # killed mid-write
    again = RunDir(tmp_path / "r", {"experiment": "x", "seed": 1, "limit": 5})  # limit may change on resume
    assert again.done_ids() == {"a", "b"}
    assert again.records_path.read_text().endswith("\n")
    with pytest.raises(ResultsError, match="different settings \\(seed\\)"):
        RunDir(tmp_path / "r", {"experiment": "x", "seed": 2})


def test_read_jsonl_names_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(DataError, match=r"d.jsonl:2: not valid JSON"):
        read_jsonl(p)


def test_cache_roundtrip(tmp_path):
    c = ResponseCache(tmp_path / "c.sqlite")
    assert c.get("k") is None
    c.put("k", {"texts": ["x"]})
    assert c.get("k") == {"texts": ["x"]} and c.hits == 1 and c.misses == 1


def test_sampled_requests_without_seed_are_not_cached(tmp_path):
    calls = []

    class Fake(LLMClient):
        async def _send_with_retries(self, kind, content, ep, gen):
            from serving.client import ChatResult

            calls.append(gen)
            return ChatResult(texts=[f"r{len(calls)}"], completion_tokens=1)

    async def go():
        cl = Fake({"default": Endpoint("http://127.0.0.1:1/v1", "m", "m")}, cache=ResponseCache(tmp_path / "c.sqlite"))
        msgs = [{"role": "user", "content": "hi"}]
        a = await cl.chat(msgs, gen=GenConfig(temperature=0.7))
        b = await cl.chat(msgs, gen=GenConfig(temperature=0.7))
        c = await cl.chat(msgs, gen=GenConfig(temperature=0.7, seed=3))
        d = await cl.chat(msgs, gen=GenConfig(temperature=0.7, seed=3))
        return a, b, c, d, cl

    a, b, c, d, cl = asyncio.run(go())
    assert a.text != b.text and c.text == d.text and d.cached and len(calls) == 3
    assert cl.usage["default"].cache_hits == 1


def test_parsing_helpers():
    assert extract_tag('ok [RESPONSE: "fine, thanks"] [SCRATCHPAD: "add fever"]', "SCRATCHPAD") == "add fever"
    assert extract_tag("no tags here", "RESPONSE") is None
    assert has_marker("I am done. [STOP]", "[STOP]") and not has_marker("STOPPING", "STOP")
    assert extract_after("**Final Diagnosis:** Psoriasis", "Final Diagnosis") == "Psoriasis"
    assert extract_json('Sure!\n```json\n[{"intent": "inform"}]\n```\nbye') == [{"intent": "inform"}]
    assert extract_json('prefix {"a": [1, 2]} trailing') == {"a": [1, 2]}
    assert extract_json("not json at all") is None
    secs = split_sections("Patient Intent: wants help\n## Medical History\nasthma", ["Patient Intent", "Medical History", "Pertinent Negatives"])
    assert secs == {"Patient Intent": "wants help", "Medical History": "asthma", "Pertinent Negatives": ""}
