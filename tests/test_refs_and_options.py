"""Model references, --set parsing, the shared option layer, server records and vLLM pass-through."""

from __future__ import annotations

import os
import stat

import pytest

from experiments.core.config import ConfigError, deep_merge, parse_set
from serving.refs import ModelRef, ModelRefError, api_key_for, model_name


def test_model_refs_parse_in_one_place():
    assert ModelRef.parse("embedded") == ModelRef("embedded")
    r = ModelRef.parse("llama3-8b-instruct@http://127.0.0.1:8001/v1/")
    assert (r.alias, r.url, str(r)) == ("llama3-8b-instruct", "http://127.0.0.1:8001/v1", "llama3-8b-instruct@http://127.0.0.1:8001/v1")
    assert model_name("mistral@http://127.0.0.1:9/v1") == "mistral"
    for bad in ("", "@http://x/v1", "embedded@localhost:8000", "bad alias"):
        with pytest.raises(ModelRefError):
            ModelRef.parse(bad)


def test_api_key_comes_from_option_then_environment(monkeypatch):
    monkeypatch.delenv("MEDSTACK_API_KEY", raising=False)
    assert api_key_for(None) == "EMPTY"
    monkeypatch.setenv("MEDSTACK_API_KEY", "from-env")
    assert api_key_for(None) == "from-env" and api_key_for("given") == "given"


def test_set_items_become_nested_overrides_read_as_yaml():
    assert parse_set(["sampling.doctor.temperature=0", "trials=3", "formats=[vignette, multiturn]", "name=my run"]) == {
        "sampling": {"doctor": {"temperature": 0}}, "trials": 3, "formats": ["vignette", "multiturn"], "name": "my run"}
    with pytest.raises(ConfigError, match="SECTION.KEY=VALUE"):
        parse_set(["trials"])
    assert deep_merge({"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"b": 5}, "d": None}) == {"a": {"b": 5, "c": 2}, "d": 1}


def test_server_record_is_private_and_vllm_args_pass_through(tmp_path, monkeypatch):
    (tmp_path / "models").symlink_to(os.path.join(os.environ["MEDSTACK_HOME"], "models"), target_is_directory=True)
    monkeypatch.setenv("MEDSTACK_HOME", str(tmp_path))
    from serving.launcher import ServerSettings, build_command, write_record

    path = write_record({"alias": "embedded", "port": 1234, "api_key": "secret"})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    argv, _ = build_command(ServerSettings(alias="embedded", extra_args=["--max-num-batched-tokens=4096"]), on_gpu=False)
    assert argv[-1] == "--max-num-batched-tokens=4096"
