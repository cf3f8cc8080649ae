"""End-to-end, in `make test`: a keyed replica group (2 embedded vLLM replicas + vllm-router) as users run it.

One group serves the whole module (module-scoped fixture: starting it is the expensive part):

- with the key a request through the router gets 200, without it 401; the key is on no process's
  command line (``/proc/PID/cmdline`` of the router, the replicas and their children) nor in any file
  we wrote; ``bench --replay`` and ``serve status`` read each replica's own /metrics;
- ``serve router`` over the group's two replicas, given by URL as already-running workers (keyed):
  it answers, routes to both (each worker's request count grows over 20 requests), records the dtype
  it asked of each worker, and refuses at start a worker serving other names (the session's server,
  which also serves an adapter);
- a 2-case CRAFT-MD study runs through the group while one replica is killed with SIGKILL: every
  case finishes; the router over workers keeps answering with one worker dead; ``serve stop``
  leaves no process of the group or the router.

Tensor parallel and Ray stay in `make test-distributed` (tests/test_distributed_e2e.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from serving import server_metrics
from serving.client import Endpoint, GenConfig, LLMClient
from serving.launcher import free_port, running_servers
from serving.replicas import metrics_targets

from tests.conftest import MEDSTACK, REPO

# In `make test`: at most 3 vLLM servers at once (the session server + this group's 2 replicas); the faults tests' keyed
# server is stopped at the end of its module (tests/faults/conftest.py), it once ran the 24 GiB machine out of memory here.
pytestmark = pytest.mark.e2e

KEY = "mst-test-" + secrets.token_hex(12)
PROMPTS = [
    "The patient is a 54-year-old man with crushing chest pain. The most likely diagnosis is",
    "A child presents with a barking cough and stridor. The first step in management is",
    "Common side effects of metformin include",
    "Question: What causes iron deficiency anemia? Answer:",
]
SERVED = "vllm:request_success_total"


def _post(base_url: str, key: str | None, prompt: str = "Patient: I have a cough.\nDoctor:", max_tokens: int = 4) -> int:
    req = urllib.request.Request(base_url + "/completions", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": "embedded", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode())
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _served(url: str) -> float:
    return server_metrics.scrape(url).get(SERVED, 0.0)


def _group_pids(pgids: list[int]) -> list[int]:
    """Every live process in these process groups (a vLLM server's API process and its engine children)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) in pgids and fields[0] != "Z":
                out.append(int(d.name))
    return out


def _wait_gone(pgids: list[int], seconds: float = 60) -> list[int]:
    deadline = time.time() + seconds
    while time.time() < deadline and _group_pids(pgids):
        time.sleep(0.5)
    return _group_pids(pgids)


@pytest.fixture(scope="module")
def group(cli, medstack_home):
    """A keyed group of 2 embedded replicas behind vllm-router, started as a user would (`serve --replicas 2 --detach`)."""
    port = free_port()
    proc = cli("serve", "--model", "embedded", "--replicas", "2", "--port", str(port), "--max-num-seqs", "16", "--detach",
               env={"MEDSTACK_API_KEY": KEY}, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [r for r in running_servers() if r["port"] == port]
    assert len(recs) == 1, recs  # the group is one record
    yield recs[0]
    cli("serve", "stop", "--port", str(port))


@pytest.fixture(scope="module")
def worker_router(cli, group):
    """`serve router` over the group's two replicas, given by URL as already-running (keyed) workers."""
    port = free_port()
    workers = [m["base_url"] for m in group["replicas"]]
    proc = cli("serve", "router", *[a for w in workers for a in ("--worker", w)], "--port", str(port), "--router-policy", "round_robin",
               "--detach", env={"MEDSTACK_API_KEY": KEY}, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = next(r for r in running_servers() if r["port"] == port)
    yield rec
    cli("serve", "stop", "--port", str(port))


def test_keyed_group_answers_with_the_key_only_and_the_key_stays_out_of_argv_and_files(group, cli, medstack_home, fixtures_dir, tmp_path):
    rec = group
    assert rec["router"]["policy"] == "cache_aware" and len(rec["replicas"]) == 2 and rec["api_key_sha256"]
    cores = [m["cpus"] for m in rec["replicas"]]
    assert not set(cores[0]) & set(cores[1])  # each replica on its own cores
    for m in rec["replicas"]:
        assert f"core ids={m['cpus']}" in open(m["log"]).read()  # vLLM's own log says where its worker runs
    assert _post(rec["base_url"], None) == 401
    assert _post(rec["base_url"], "not-the-key") == 401
    assert _post(rec["base_url"], KEY) == 200
    for m in rec["replicas"]:  # each replica wants the key too (nothing reaches one around the router)
        assert _post(m["base_url"], None) == 401

    pgids = [rec["pid"]] + [m["pid"] for m in rec["replicas"]]
    pids = _group_pids(pgids)
    assert len(pids) >= 3
    for pid in pids:
        assert KEY.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), f"the key is on the command line of pid {pid}"
    for f in medstack_home.rglob("*"):
        if f.is_file() and f.stat().st_size < 50_000_000:
            assert KEY.encode() not in f.read_bytes(), f"the key was written to {f}"

    # through the router, with the key, counted by the replicas' own /metrics
    targets = metrics_targets([rec["base_url"]])[rec["base_url"]]
    assert targets == [m["base_url"] for m in rec["replicas"]]
    before = server_metrics.combine([server_metrics.scrape(u) for u in targets])

    async def go():
        client = LLMClient({"default": Endpoint(rec["base_url"], "embedded", "replicas-test", api_key=KEY)}, concurrency=4, retries=3)
        try:
            return await asyncio.gather(*(client.complete(p, gen=GenConfig(temperature=0.0, max_tokens=16)) for p in PROMPTS))
        finally:
            await client.aclose()

    results = asyncio.run(go())
    assert all(r.ok and r.text.strip() for r in results), [r.error for r in results]
    after = server_metrics.combine([server_metrics.scrape(u) for u in targets])
    assert server_metrics.delta(before, after, SERVED) == len(PROMPTS)

    # a replay through the group reads each replica's /metrics too (the router has none of its own)
    out = tmp_path / "replay"
    cli("bench", "--model", f"embedded@{rec['base_url']}", "--replay", str(fixtures_dir / "bench" / "run"), "--out", str(out),
        check=True, env={"MEDSTACK_API_KEY": KEY})
    vllm = json.loads((out / "bench.json").read_text())["replay"]["vllm"]
    assert (vllm["completed"], vllm["failed"]) == (9, 0), vllm.get("first_error")
    assert vllm["server"]["replicas"] == 2 and vllm["server"]["replicas_scraped"] == 2, vllm["server"]
    assert sorted(vllm["server_replicas"]) == sorted(targets)
    queried = [vllm["server_replicas"][u]["prefix_cache_queried_tokens"] for u in targets]
    assert vllm["server"]["prefix_cache_queried_tokens"] == sum(queried) > 0  # the group's figure is its replicas' sum

    status = json.loads(cli("serve", "status", "--json", check=True, env={"MEDSTACK_API_KEY": KEY}).stdout)
    mine = next(r for r in status if r["port"] == rec["port"])
    assert [m["healthy"] for m in mine["replica_status"]] == [True, True]
    assert sum(m["requests_finished"] for m in mine["replica_status"]) >= len(PROMPTS) + 1  # read from each replica's /metrics


def test_router_over_running_workers_routes_to_both_and_refuses_other_names(group, worker_router, embedded_server, cli):
    rec = worker_router
    workers = [m["base_url"] for m in group["replicas"]]
    assert rec["alias"] == "embedded" and rec["remote_workers"] and [m["base_url"] for m in rec["replicas"]] == workers
    # the dtype asked of each worker (the replicas' engines) is the group's, recorded and shown like a local server's
    assert group["dtype"] and [m["dtype"] for m in group["replicas"]] == [group["dtype"]] * 2
    assert rec["dtype"] == group["dtype"] and [m["dtype"] for m in rec["replicas"]] == [group["dtype"]] * 2
    assert rec["dtype_reason"] == "asked of each worker (its /v1/models header X-Medstack-Dtype)"
    status = json.loads(cli("serve", "status", "--json", check=True, env={"MEDSTACK_API_KEY": KEY}).stdout)
    assert next(r for r in status if r["port"] == rec["port"])["dtype"] == group["dtype"]
    assert KEY.encode() not in Path(f"/proc/{rec['pid']}/cmdline").read_bytes()
    assert _post(rec["base_url"], None) == 401
    before = {w: _served(w) for w in workers}
    codes = [_post(rec["base_url"], KEY, prompt=f"Patient {i}: I have had a fever for {i} days.\nDoctor:") for i in range(20)]
    assert codes == [200] * 20
    after = {w: _served(w) for w in workers}
    assert all(after[w] - before[w] > 0 for w in workers), (before, after)  # both workers got requests
    assert sum(after[w] - before[w] for w in workers) == 20

    # a worker serving other names (the session's server also serves the adapter test-lora): refused before anything starts
    port = free_port()
    proc = cli("serve", "router", "--worker", workers[0], "--worker", embedded_server["base_url"], "--port", str(port),
               env={"MEDSTACK_API_KEY": KEY})
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "must serve the same model and adapter names" in said and "test-lora" in said, said
    assert "Traceback" not in proc.stderr and not [r for r in running_servers() if r["port"] == port]


def test_study_through_the_group_survives_a_replica_killed_and_stop_leaves_nothing(group, worker_router, cli, fixtures_dir, tmp_path):
    rec = group
    replicas = [m["base_url"] for m in rec["replicas"]]
    out = tmp_path / "run"
    args = ["run", "craftmd", "--data", str(fixtures_dir / "craftmd" / "cases.csv"), "--limit", "2", "--trials", "1", "--max-turns", "2",
            "--formats", "vignette,multiturn", "--no-frq", "--model", f"embedded@{rec['base_url']}", "--no-cache", "--concurrency", "2",
            "--config", "experiments/studies/craftmd/configs/embedded-small.yaml", "--out", str(out)]
    start = sum(_served(u) for u in replicas)
    run = subprocess.Popen([*MEDSTACK, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "COLUMNS": "200", "MEDSTACK_API_KEY": KEY})
    # kill by progress, not by time: once the run has had 2 answers, the replica with a request in flight (else the second)
    deadline = time.time() + 1200
    while run.poll() is None and time.time() < deadline and sum(_served(u) for u in replicas) < start + 2:
        time.sleep(0.2)
    assert run.poll() is None, "the run finished before a replica could be killed: give it more work"
    running = [i for i, u in enumerate(replicas) if server_metrics.scrape(u).get("vllm:num_requests_running", 0) > 0]
    victim = rec["replicas"][running[0] if running else 1]
    os.killpg(victim["pid"], signal.SIGKILL)  # kill -9 of the replica: its API server and engine processes
    stdout, stderr = run.communicate(timeout=1800)
    assert run.returncode == 0, stderr[-3000:]
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines() if x.strip()]
    assert len(recs) == 2 and all(r["status"] == "ok" for r in recs), [r.get("error") for r in recs]
    assert json.loads((out / "identity.json").read_text())["models"]["clinical"]["replicas"]  # ran through the group's record

    # the router over workers: the same replica is its worker; it keeps answering through the one left
    ok, deadline = 0, time.time() + 120
    while ok < 6 and time.time() < deadline:
        ok = ok + 1 if _post(worker_router["base_url"], KEY) == 200 else 0
    assert ok == 6, "the router over workers did not keep answering with one worker dead"

    pgids = [rec["pid"], worker_router["pid"]] + [m["pid"] for m in rec["replicas"]]
    for port in (worker_router["port"], rec["port"]):
        stop = cli("serve", "stop", "--port", str(port))
        assert "stopped embedded" in stop.stderr, stop.stderr
    assert not _wait_gone(pgids), "a router or replica process survived `serve stop`"
    assert not [r for r in running_servers() if r["port"] in (rec["port"], worker_router["port"])]
