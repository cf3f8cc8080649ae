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


# ------------------------------------------------------------------ the runner's storage and auth faults (scripted backend)

def _toy_run(tmp_path, respond, n=4, **kw):
    from experiments.core.runner import prepare_run, run_study
    from tests.scripted import ScriptedLLM
    from tests.test_runner import ToySettings, ToyStudy

    study = ToyStudy(n=n)
    settings, cases = prepare_run(study, ToySettings(out=str(tmp_path / "run"), concurrency=1, **kw))
    client = ScriptedLLM(respond, roles=ToyStudy.roles)
    logs: list[str] = []
    return asyncio.run(run_study(study, settings, cases, client=client, log=logs.append, resume_command="medstack run toy")), logs


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_refused_key_stops_the_run_at_once_without_recording_the_case(tmp_path):
    from experiments.core.study import EndpointAuthError
    from serving.client import StatusError

    sent = []

    def respond(role, content, gen):
        sent.append(content)
        raise StatusError(401, "invalid API key")

    with pytest.raises(EndpointAuthError, match=r"HTTP 401 .*refused the API key.*--api-key KEY or \$MEDSTACK_API_KEY"):
        _toy_run(tmp_path, respond)
    assert len(sent) == len({json.dumps(c) for c in sent})     # never retried (cases already waiting may send once)
    assert _lines(tmp_path / "run" / "records.jsonl") == []    # never a failed case: the next run with the key runs it


def test_a_disk_that_refuses_a_record_stops_new_cases_and_keeps_the_finished_ones(tmp_path, monkeypatch):
    from experiments.core.recordwriter import RecordWriter

    real = RecordWriter._write
    calls = {"n": 0}

    def write(self, records):
        calls["n"] += 1
        if calls["n"] == 3:  # the third record: the disk is full
            raise StorageError.from_os(self.rundir.records_path, OSError(28, "No space left on device"))
        return real(self, records)

    monkeypatch.setattr(RecordWriter, "_write", write)
    outcome, logs = _toy_run(tmp_path, lambda role, content, gen: "reply 0", n=6)
    kept = _lines(tmp_path / "run" / "records.jsonl")
    assert [r["id"] for r in kept] == ["c0", "c1"] and all(r["status"] == "ok" for r in kept)
    assert outcome.storage_error and "the disk is full" in outcome.storage_error and outcome.exit_code == 3
    assert outcome.finished == 2 and outcome.not_started == 4  # the refused record's case runs again on resume
    assert any("the run stopped" in m and "the disk is full" in m for m in logs)
    summary = (tmp_path / "run" / "summary.md").read_text()
    assert "**The run stopped: cannot write" in summary and "medstack run toy" in summary
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["case_status"] == {"total": 6, "finished": 2, "failed": 0, "not_started": 4}
