"""The mechanisms behind the fault matrix, unit by unit: redaction, the identity allow-list, key
fingerprints in server records, the exposure rule, the adapter-name rule, the storage and auth
faults in the runner (scripted backend for the protocol logic; the real server is in test_fault_runs)."""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest

from models.errors import MedstackError, StorageError
from serving.secrets import check_adapter_name, check_exposure, public_env, redact_argv

KEY = "unit-secret-0d3e"


def test_redact_argv_hides_every_secret_option_form():
    argv = ["medstack", "run", "x", "--api-key", KEY, "--api-key=" + KEY, "--hf-token", KEY, "--set", "formats=[a]"]
    red = redact_argv(argv)
    assert KEY not in " ".join(red)
    assert red == ["medstack", "run", "x", "--api-key", "***", "--api-key=***", "--hf-token", "***", "--set", "formats=[a]"]


def test_public_env_drops_secret_looking_variables():
    env = {"VLLM_API_KEY": KEY, "HF_TOKEN": KEY, "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "2"}
    assert public_env(env) == {"VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "2"}


def test_key_reaches_vllm_through_its_environment_never_argv():
    from serving.launcher import ServerSettings, build_command

    argv, env = build_command(ServerSettings(alias="embedded", api_key=KEY), on_gpu=False)
    assert KEY not in " ".join(argv) and env["VLLM_API_KEY"] == KEY


def test_server_record_holds_a_fingerprint_not_the_key_and_reuse_needs_the_key(tmp_path, monkeypatch):
    (tmp_path / "models").symlink_to(os.path.join(os.environ["MEDSTACK_HOME"], "models"), target_is_directory=True)
    monkeypatch.setenv("MEDSTACK_HOME", str(tmp_path))
    from serving import launcher

    path = launcher.write_record({"alias": "embedded", "port": 1, "pid": os.getpid(), "base_url": "http://127.0.0.1:1/v1", "api_key": KEY})
    assert KEY not in path.read_text() and json.loads(path.read_text())["api_key_sha256"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    monkeypatch.setattr(launcher, "healthy", lambda url, key=None, timeout=3.0: key == KEY)
    assert launcher.find_server("embedded") is None
    assert launcher.find_server("embedded", "other") is None
    assert launcher.find_server("embedded", KEY)["api_key"] == KEY


def test_server_identity_is_an_allow_list():
    from serving.launcher import server_identity

    rec = {"alias": "embedded", "base_url": "http://127.0.0.1:1/v1", "api_key": KEY, "argv": ["vllm", "--api-key", KEY],
           "env": {"VLLM_API_KEY": KEY, "OMP_NUM_THREADS": "2"}, "secret_field": KEY, "device": "cpu", "log": "/x.log"}
    ident = server_identity(rec)
    assert KEY not in json.dumps(ident)
    assert ident["keyed"] is True and ident["env"] == {"OMP_NUM_THREADS": "2"} and ident["argv"] == ["vllm", "--api-key", "***"]
    assert "secret_field" not in ident


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.2", "::", "example.org"])
def test_exposure_refused_without_key_unless_no_auth(host):
    with pytest.raises(MedstackError, match="--no-auth"):
        check_exposure(host, None)
    check_exposure(host, KEY)
    check_exposure(host, None, no_auth=True)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_needs_no_key(host):
    check_exposure(host, None)


@pytest.mark.parametrize("name,ok", [("nlu", True), ("a.b_c-1", True), ("_x", True), ("-x", False), ("--evil", False),
                                      ("a b", False), ("a=b", False), ("", False), ("a/b", False)])
def test_adapter_name_rule(name, ok):
    if ok:
        assert check_adapter_name(name) == name
    else:
        with pytest.raises(MedstackError, match="adapter name"):
            check_adapter_name(name)


def test_storage_error_names_the_reason():
    assert "the disk is full" in str(StorageError.from_os("/x", OSError(28, "No space left on device")))
    assert "read-only" in str(StorageError.from_os("/x", OSError(30, "Read-only file system")))
    assert "size limit" in str(StorageError.from_os("/x", OSError(27, "File too large")))
