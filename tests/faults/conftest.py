"""The fault matrix's shared parts: ONE keyed vLLM server for every fault test that needs a model.

The server is the real one (embedded model), started through the CLI as a user would, with an API
key given in $MEDSTACK_API_KEY and bound to every interface (0.0.0.0): so the same server shows
that a key never leaks (argv, logs, records, results, report) and that an exposed server refuses
requests without the key. Runs reach it as ``embedded@http://127.0.0.1:PORT/v1``.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli

KEY = os.environ.get("MEDSTACK_TEST_KEYED_KEY") or "fault-matrix-key-5bd1c0e9a7"
FAULT_CASES = Path(__file__).resolve().parent.parent / "fixtures" / "faults" / "cases.csv"


def ps_args() -> str:
    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def keyed_server(medstack_home):
    """Yields {"url", "port", "pid", "log", "ps_during_start"}; stopped (by pid, ours only) at the end of the module using it.

    Module scope, not package: tests/faults has no __init__.py, so a "package" fixture here lives for the whole
    session, and this server beside the session server and a replica group ran `make test` out of memory.
    """
    from serving.launcher import kill_group, free_port, running_servers, servers_dir

    dev_url = os.environ.get("MEDSTACK_TEST_KEYED_SERVER")
    if dev_url:  # developer convenience (a busy box): a keyed server started with `MEDSTACK_API_KEY=K medstack serve --host 0.0.0.0`,
        port = int(dev_url.rsplit(":", 1)[1].split("/")[0])  # its key in $MEDSTACK_TEST_KEYED_KEY
        log = os.environ.get("MEDSTACK_TEST_KEYED_LOG", "")
        yield {"url": dev_url, "port": port, "pid": None, "log": log, "ps_during_start": "", "stderr": ""}
        return
    port = free_port()
    proc = subprocess.Popen(
        [*__import__("tests.conftest", fromlist=["MEDSTACK"]).MEDSTACK, "serve", "--model", "embedded", "--host", "0.0.0.0",
         "--port", str(port), "--cpu-kvcache-gb", "1", "--detach"],
        cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "MEDSTACK_API_KEY": KEY, "COLUMNS": "200"},
    )
    seen = []
    while proc.poll() is None:  # look at every process's command line while the server starts up
        seen.append(ps_args())
        time.sleep(2)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"could not start the keyed server:\n{err[-4000:]}")
    rec = next(r for r in running_servers() if r["port"] == port)
    try:
        yield {"url": f"http://127.0.0.1:{port}/v1", "port": port, "pid": rec["pid"], "log": rec["log"],
               "ps_during_start": "\n".join(seen), "stderr": err}
    finally:
        kill_group(rec["pid"])
        (servers_dir() / f"{rec['alias']}-{rec['port']}.json").unlink(missing_ok=True)


def craftmd_run(url: str, out: Path, *extra: str, limit: int = 4) -> list[str]:
    """A small CRAFT-MD run (vignette MCQ only: a few calls a case) against ``url``."""
    return ["run", "craftmd", "--data", str(FAULT_CASES), "--limit", str(limit), "--trials", "1", "--formats", "vignette",
            "--no-frq", "--model", f"embedded@{url}", "--config", "experiments/studies/craftmd/configs/embedded-small.yaml",
            "--concurrency", "1", "--set", "retries=1", "--out", str(out), *extra]


def records(out: Path) -> dict[str, dict]:
    import json

    p = out / "records.jsonl"
    if not p.exists():
        return {}
    out = {}
    for line in p.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:  # a torn line (the run under test was stopped mid-write): not a record
            continue
        out[r["id"]] = r
    return out
