"""`medstack models fetch ALIAS`: the permission path and where the files go. The hub is never called:
the download function is a local stand-in that writes a checkpoint the way snapshot_download would."""

from __future__ import annotations

import stat

import pytest

from models.fetch import PATTERNS, FetchError, destination, fetch
from models.registry import resolve_weights

ALIAS, HF_ID = "llama3-8b-instruct", "meta-llama/Meta-Llama-3-8B-Instruct"
COMMAND = f"MEDSTACK_ALLOW_DOWNLOAD=1 medstack models fetch {ALIAS}"


def fake_hub(calls: list, files=("config.json", "model-00001-of-00002.safetensors", "tokenizer.json")):
    def download(*, repo_id, local_dir, allow_patterns):
        calls.append({"repo_id": repo_id, "local_dir": local_dir, "allow_patterns": allow_patterns})
        from pathlib import Path

        Path(local_dir).mkdir(parents=True, exist_ok=True)
        for name in files:
            (Path(local_dir) / name).write_text("{}")
        return local_dir
    return download


def test_refused_without_permission(cli, tmp_path):
    """No MEDSTACK_ALLOW_DOWNLOAD: exit 2 with the licence note and the exact command; nothing written."""
    p = cli("models", "fetch", ALIAS, env={"MEDSTACK_WEIGHTS": str(tmp_path / "w"), "MEDSTACK_ALLOW_DOWNLOAD": ""})
    out = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 2 and "Traceback" not in out
    assert COMMAND in out and "needs your permission" in out
    assert "licence: Meta Llama 3 Community License — https://huggingface.co/meta-llama/Meta-Llama-3-8B-Instruct" in out and "gated" in out
    assert not (tmp_path / "w").exists()


def test_bad_aliases_and_unset_weights_root(cli, tmp_path):
    p = cli("models", "fetch", "embedded", env={"MEDSTACK_WEIGHTS": str(tmp_path)})
    assert p.returncode == 2 and "medstack models prepare embedded" in " ".join(p.stderr.split())
    p = cli("models", "fetch", "nosuch", env={"MEDSTACK_WEIGHTS": str(tmp_path)})
    assert p.returncode == 2 and "unknown model alias 'nosuch'" in p.stderr
    p = cli("models", "fetch", ALIAS, env={"MEDSTACK_WEIGHTS": ""})
    assert p.returncode == 2 and "$MEDSTACK_WEIGHTS is not set" in " ".join(p.stderr.split())


def test_fetch_into_weights_root_then_found(monkeypatch, tmp_path):
    """Allowed: the hub id of the registry, into $MEDSTACK_WEIGHTS/<alias> by way of a partial folder, files
    private; a run then resolves the weights there; a second fetch downloads nothing."""
    monkeypatch.setenv("MEDSTACK_WEIGHTS", str(tmp_path / "weights"))
    monkeypatch.setenv("MEDSTACK_ALLOW_DOWNLOAD", "1")
    calls, lines = [], []
    dest = fetch(ALIAS, log=lines.append, download=fake_hub(calls))
    assert dest == tmp_path / "weights" / ALIAS == destination(ALIAS)
    assert calls == [{"repo_id": HF_ID, "local_dir": str(tmp_path / "weights" / f".{ALIAS}.partial"), "allow_patterns": PATTERNS}]
    assert not (tmp_path / "weights" / f".{ALIAS}.partial").exists()
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "model-00001-of-00002.safetensors", "tokenizer.json"]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in dest.iterdir())
    assert any(line.startswith("licence: Meta Llama 3 Community License") for line in lines)
    assert resolve_weights(ALIAS)[1] == dest
    fetch(ALIAS, log=lines.append, download=fake_hub(calls))
    assert len(calls) == 1 and "already at" in lines[-1]


def test_hub_failures_are_environment_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("MEDSTACK_WEIGHTS", str(tmp_path))
    monkeypatch.setenv("MEDSTACK_ALLOW_DOWNLOAD", "1")

    def offline(**kw):
        raise OSError("Cannot reach https://huggingface.co: no network\nmore detail")

    with pytest.raises(FetchError) as e:
        fetch(ALIAS, log=lambda m: None, download=offline)
    assert e.value.exit_code == 3 and "no network" in str(e.value) and "\n" not in str(e.value) and "nothing was fetched" in str(e.value)

    def cut_off(*, repo_id, local_dir, allow_patterns):  # a part fetched, then the network went
        from pathlib import Path

        Path(local_dir).mkdir(parents=True, exist_ok=True)
        (Path(local_dir) / "config.json").write_text("{}")
        raise OSError("connection reset")

    with pytest.raises(FetchError) as e:
        fetch(ALIAS, log=lambda m: None, download=cut_off)
    assert "1 file(s) fetched so far are kept in" in str(e.value) and "resumes" in str(e.value)
    with pytest.raises(FetchError) as e:  # no safetensors: not taken for weights, nothing moved into place
        fetch(ALIAS, log=lambda m: None, download=fake_hub([], files=("config.json", "pytorch_model.bin")))
    assert e.value.exit_code == 3 and "no config.json + *.safetensors" in str(e.value) and not (tmp_path / ALIAS).exists()


def test_missing_weights_error_names_the_fetch_command(monkeypatch, tmp_path):
    monkeypatch.setenv("MEDSTACK_WEIGHTS", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    from models.errors import MedstackError

    with pytest.raises(MedstackError) as e:
        resolve_weights(ALIAS)
    assert f"`{COMMAND}`" in str(e.value)
