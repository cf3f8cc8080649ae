"""Shared fixtures.

The test session gets its own MEDSTACK_HOME (server records, cache, logs) that links to
the real prepared models, so tests never touch a user's running servers or cache.
End-to-end tests share ONE real vLLM server (embedded model, started through the CLI with
`--detach`, with a test LoRA adapter and runtime adapter loading) for the whole session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
MEDSTACK = [sys.executable, "-m", "scripts.cli"]


def _real_home() -> Path:
    return Path(os.environ.get("MEDSTACK_HOME") or Path.home() / ".cache" / "medstack")


@pytest.fixture(scope="session", autouse=True)
def medstack_home(tmp_path_factory) -> Path:
    real = _real_home()
    home = tmp_path_factory.mktemp("medstack_home")
    (home / "models").symlink_to(real / "models", target_is_directory=True) if (real / "models").exists() else None
    os.environ["MEDSTACK_HOME"] = str(home)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    return home


def run_cli(*args: str, check: bool = False, timeout: float = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `medstack ARGS` as a user would (a subprocess), capturing output."""
    proc = subprocess.run(
        [*MEDSTACK, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"medstack {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def cli():
    return run_cli


def make_random_lora(out: Path, seed: int = 0, r: int = 8) -> Path:
    """A peft LoRA adapter on the embedded model with non-zero (random) weights, so it changes the output."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from models.registry import resolve_weights

    _, weights = resolve_weights("embedded")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32)
    cfg = LoraConfig(r=r, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    peft_model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def lora_adapter(tmp_path_factory) -> Path:
    return make_random_lora(tmp_path_factory.mktemp("lora") / "test-lora")


@pytest.fixture(scope="session")
def embedded_server(medstack_home, lora_adapter):
    """The one real vLLM server of the test session. Yields its record (base_url, pid, ...)."""
    from serving.launcher import free_port, load_adapter, running_servers

    dev_url = os.environ.get("MEDSTACK_TEST_SERVER")
    if dev_url:  # developer convenience: reuse a server started with `medstack serve --runtime-lora`
        port = int(dev_url.rsplit(":", 1)[1].split("/")[0])
        rec = {"alias": "embedded", "base_url": dev_url, "port": port, "adapters": {}, "runtime_lora": True,
               "cli_stdout": dev_url, "cli_stderr": "log: (external dev server)"}
        try:
            load_adapter(rec, "test-lora", str(lora_adapter))
        except Exception as e:  # another developer's test session already loaded it into the shared dev server
            if "already been loaded" not in str(e):
                raise
        yield rec
        return

    port = free_port()
    proc = run_cli("serve", "--model", "embedded", "--port", str(port), "--lora", f"test-lora={lora_adapter}", "--runtime-lora", "--detach")
    if proc.returncode != 0:
        raise RuntimeError(f"could not start the embedded vLLM server:\n{proc.stderr[-4000:]}")
    recs = [r for r in running_servers() if r["port"] == port]
    assert recs, "serve --detach returned but left no server record"
    rec = recs[0]
    rec["cli_stdout"], rec["cli_stderr"] = proc.stdout, proc.stderr
    yield rec
    run_cli("serve", "stop", "embedded")


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def browser():
    """Headless Chromium under Playwright: Debian's `chromium`, never a downloaded build. A missing Playwright or
    Chromium FAILS the test that asks for it, with the reason (`make setup` installs both)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        pytest.fail(f"Playwright is not installed ({e}): run `make setup` (requirements.txt pins it)")
    from scripts.review_relabel import chromium_path, launch

    if chromium_path() is None:
        pytest.fail("Chromium is not installed (no `chromium` command): run `make setup` as root (it runs `apt-get install chromium`), "
                    "or `apt-get install chromium`")
    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


@pytest.fixture(scope="session", autouse=True)
def summaries_stand_alone(tmp_path_factory):
    """After the session: no summary.md any test wrote cites the design note, an issue number or a path outside the
    repository (tests/standalone.py)."""
    yield
    from tests.standalone import citations

    found = {}
    base, repo = Path(tmp_path_factory.getbasetemp()), Path(__file__).resolve().parent.parent
    for path in base.rglob("summary.md"):
        # the run's own inputs and results (the test's folders, the repository's fixtures) are the user's paths, not citations
        text = path.read_text(encoding="utf-8", errors="replace").replace(str(base.resolve()), "TMP").replace(str(base), "TMP")
        hits = citations(text.replace(str(repo), "REPO"), markdown=True)
        if hits:
            found[str(path)] = hits
    assert not found, f"summary.md files citing what users do not have: {found}"
