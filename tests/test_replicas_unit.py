"""Replica groups, vLLM's parallel options and the router's command line, without starting anything."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from models.errors import MedstackError
from serving import server_metrics
from serving.launcher import ServerSettings, build_command, kill_record, write_record
from serving.cpus import split_cpus
from serving.parallel import check_ray_cluster, parallel_args, rank_binding
from serving.replicas import (
    ROUTER_POLICIES, check_same_models, member_status, metrics_targets, plan_replicas, router_argv, served_models, worker_base,
)


def test_split_cpus_is_disjoint_contiguous_and_even():
    assert split_cpus([0, 1], 2) == [[0], [1]]
    assert split_cpus(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_cpus([5, 3, 4, 6], 2) == [[3, 4], [5, 6]]
    with pytest.raises(MedstackError, match="3 replicas need at least one core each, but only 2"):
        split_cpus([0, 1], 3, what="replica")


def test_rank_binding_gives_each_worker_process_its_own_cores():
    assert rank_binding([0, 1], 1) == "0-1"
    assert rank_binding([0, 1], 2) == "0|1"
    assert rank_binding(list(range(8)), 4) == "0-1|2-3|4-5|6-7"
    assert rank_binding([0, 1], 4) == "0|1|0|1"  # more ranks than cores: shared, never refused


def test_cpu_server_binding_follows_tensor_parallel_ranks(monkeypatch):
    monkeypatch.setattr("serving.launcher.usable_cpus", lambda: [0, 1, 2, 3])
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    argv, env = build_command(ServerSettings(alias="embedded", tensor_parallel_size=2), on_gpu=False)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1|2-3"
    joined = " ".join(argv)
    assert "--tensor-parallel-size 2" in joined and "--data-parallel-size" not in joined
    _, env = build_command(ServerSettings(alias="embedded"), on_gpu=False)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"
    argv, env = build_command(ServerSettings(alias="embedded", data_parallel_size=2, distributed_backend="mp"), on_gpu=False)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1|2-3"
    assert "--data-parallel-size 2" in " ".join(argv) and "--distributed-executor-backend mp" in " ".join(argv)


def test_parallel_args_on_both_builds():
    s = ServerSettings(alias="x", tensor_parallel_size=4, pipeline_parallel_size=2, distributed_backend="ray")
    assert parallel_args(s) == ["--tensor-parallel-size", "4", "--pipeline-parallel-size", "2", "--distributed-executor-backend", "ray"]


def test_cpu_replicas_split_cores_and_kv_cache():
    plans = plan_replicas(ServerSettings(alias="embedded", port=8110, host="0.0.0.0"), 2, on_gpu=False, cpus=[0, 1, 2, 3])
    assert [p["cpus"] for _, p in plans] == [[0, 1], [2, 3]]
    assert [s.cpu_threads_bind for s, _ in plans] == ["0-1", "2-3"]
    assert all(s.cpu_kvcache_gb == 1 and s.host == "127.0.0.1" for s, _ in plans)  # replicas are loopback-only; the router takes --host
    envs = [build_command(s, on_gpu=False)[1] for s, _ in plans]
    assert [e["VLLM_CPU_OMP_THREADS_BIND"] for e in envs] == ["0-1", "2-3"]
    assert all(e["VLLM_CPU_KVCACHE_SPACE"] == "1" for e in envs)
    # tensor parallel inside each replica: one core list per rank, replicas disjoint
    plans = plan_replicas(ServerSettings(alias="embedded", tensor_parallel_size=2, cpu_kvcache_gb=3), 2, on_gpu=False, cpus=list(range(8)))
    assert [s.cpu_threads_bind for s, _ in plans] == ["0-1|2-3", "4-5|6-7"] and all(s.cpu_kvcache_gb == 3 for s, _ in plans)


def test_replica_plans_refuse_what_cannot_work():
    with pytest.raises(MedstackError, match="at least one core each"):
        plan_replicas(ServerSettings(alias="embedded"), 3, on_gpu=False, cpus=[0, 1])
    with pytest.raises(MedstackError, match="--cpu-threads-bind"):
        plan_replicas(ServerSettings(alias="embedded", cpu_threads_bind="0-1"), 2, on_gpu=False, cpus=[0, 1])
    with pytest.raises(MedstackError, match="needs 8 GPUs; this machine has 4"):
        plan_replicas(ServerSettings(alias="x", tensor_parallel_size=4), 2, on_gpu=True, gpus=4)
    with pytest.raises(MedstackError, match="at least 2"):
        plan_replicas(ServerSettings(alias="x"), 1, on_gpu=False, cpus=[0, 1])


def test_gpu_replicas_get_their_own_devices():
    plans = plan_replicas(ServerSettings(alias="x", tensor_parallel_size=2), 4, on_gpu=True, gpus=8)
    assert [p["env"]["CUDA_VISIBLE_DEVICES"] for _, p in plans] == ["0,1", "2,3", "4,5", "6,7"]


def test_router_argv():
    argv = router_argv("127.0.0.1", 8110, ["http://127.0.0.1:1", "http://127.0.0.1:2"], "round_robin", 29555)
    joined = " ".join(argv)
    assert "-m serving.router_main" in joined and "--worker-urls http://127.0.0.1:1 http://127.0.0.1:2" in joined
    assert "--policy round_robin" in joined and "--port 8110" in joined and "--prometheus-port 29555" in joined
    assert "--health-check-interval-secs" in joined
    assert "cache_aware" in ROUTER_POLICIES
    with pytest.raises(MedstackError, match="expected one of"):
        router_argv("127.0.0.1", 1, ["http://x:1"], "fastest", 2)
    with pytest.raises(MedstackError, match=r"\$MEDSTACK_API_KEY"):  # a key never reaches the router's command line
        router_argv("127.0.0.1", 1, ["http://x:1"], "round_robin", 2, ["--api-key=k"])


def test_router_cli_knows_the_flags_we_pass():
    """The flags we build are the installed vllm-router's own (its argparse, not a guess)."""
    import argparse

    from vllm_router.router_args import RouterArgs

    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser)
    args = parser.parse_args(router_argv("127.0.0.1", 8110, ["http://127.0.0.1:1"], "cache_aware", 29555)[3:])
    assert args.policy == "cache_aware" and args.worker_urls == ["http://127.0.0.1:1"] and args.health_check_interval_secs == 5


def test_group_record_is_found_stopped_and_scraped_as_one(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDSTACK_HOME", str(tmp_path))
    import subprocess

    procs = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(3)]
    rec = {"alias": "embedded", "port": 8110, "pid": procs[0].pid, "base_url": "http://127.0.0.1:8110/v1",
           "replicas": [{"pid": p.pid, "base_url": f"http://127.0.0.1:{9000 + i}/v1"} for i, p in enumerate(procs[1:])]}
    write_record(rec)
    assert metrics_targets(["http://127.0.0.1:8110/v1", "http://127.0.0.1:8000/v1"]) == {
        "http://127.0.0.1:8110/v1": ["http://127.0.0.1:9000/v1", "http://127.0.0.1:9001/v1"],
        "http://127.0.0.1:8000/v1": ["http://127.0.0.1:8000/v1"]}
    kill_record(rec)  # the router's process group and every replica's
    for p in procs:  # each ended (a survivor would make wait() time out); kill_group reaps them, so no status is left
        p.wait(timeout=30)


def test_group_figures_sum_the_replicas_that_answered():
    q, h = server_metrics.PREFIX_QUERIES[0], server_metrics.PREFIX_HITS[0]
    before = {"a": {q: 0, h: 0}, "b": {q: 100, h: 10}}
    after = {"a": {q: 100, h: 80}, "b": {q: 200, h: 30}}
    figs = server_metrics.endpoint_figures({"router": ["a", "b"], "solo": ["solo"]}, before, after)
    assert figs["a"]["prefix_cache_hit_rate"] == 0.8 and figs["b"]["prefix_cache_hit_rate"] == 0.2
    assert figs["router"]["prefix_cache_hit_rate"] == 0.5 and figs["router"]["replicas_scraped"] == 2
    # a replica killed mid-run answers no second scrape: the group's figure is over the others
    figs = server_metrics.endpoint_figures({"router": ["a", "b"]}, before, {"a": after["a"], "b": {}})
    assert figs["router"]["prefix_cache_hit_rate"] == 0.8 and figs["router"]["replicas_scraped"] == 1


def test_ray_backend_without_a_cluster_is_one_line(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("serving.parallel.Path", lambda p: tmp_path / "no-such-file")
    with pytest.raises(MedstackError, match="ray start --head"):
        check_ray_cluster()
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # nothing listens on port 1
    with pytest.raises(MedstackError, match="does not answer"):
        check_ray_cluster()


def test_ray_on_the_cpu_build_is_refused_with_the_reason():
    """vllm-cpu declares no Ray device (the reason vLLM itself stops a Ray start on CPU); when a
    build does, this test fails and the refusal in serving/parallel.py should go."""
    from vllm.platforms import current_platform

    from serving.parallel import check_backend_supported

    if not current_platform.is_cpu():
        pytest.skip("GPU build: Ray is supported")
    assert current_platform.ray_device_key == ""
    with pytest.raises(MedstackError, match="CPU build of vLLM cannot run on Ray"):
        check_backend_supported(ServerSettings(alias="embedded", distributed_backend="ray"), on_gpu=False)
    check_backend_supported(ServerSettings(alias="embedded", distributed_backend="ray"), on_gpu=True)  # GPU: allowed
    check_backend_supported(ServerSettings(alias="embedded", tensor_parallel_size=2), on_gpu=False)


# ---------------------------------------------------------------- a router over running workers (`serve router`), refusals

class _Worker(BaseHTTPRequestHandler):
    """A stand-in for a vLLM server's /v1/models (keyed like vLLM: 401 without the key) and /metrics. Its dtype, when
    set, is on /v1/models as a server medstack starts sends it (``dtype``), or on /server_info as vLLM's development
    mode gives it (``dev_dtype``, e.g. "torch.float16"); else it names none, like a plain vLLM server."""
    models: list[dict] = []
    key: str | None = None
    served = 0
    dtype: str | None = None
    dev_dtype: str | None = None

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path.startswith("/v1") and self.key and self.headers.get("Authorization") != f"Bearer {self.key}":
            return self._send(401, b'{"error": "Unauthorized"}')
        if self.path == "/v1/models":
            return self._send(200, json.dumps({"object": "list", "data": self.models}).encode(),
                              {"X-Medstack-Dtype": self.dtype} if self.dtype else {})
        if self.path == "/metrics":
            return self._send(200, f"vllm:request_success_total{{model_name=\"m\",finished_reason=\"stop\"}} {self.served}\n"
                                   f"vllm:num_requests_running{{model_name=\"m\"}} 1\n".encode())
        if self.path == "/server_info?config_format=json" and self.dev_dtype:
            return self._send(200, json.dumps({"vllm_config": {"model_config": {"dtype": self.dev_dtype}}}).encode())
        self._send(404, b"{}")

    def _send(self, code, body, headers=None):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def workers():
    """start(models, key=None, served=0, dtype=None, dev_dtype=None) -> a stand-in worker's base URL (http://127.0.0.1:PORT);
    all shut down after."""
    servers = []

    def start(models, key=None, served=0, dtype=None, dev_dtype=None):
        handler = type("W", (_Worker,), {"models": models, "key": key, "served": served, "dtype": dtype, "dev_dtype": dev_dtype})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


BASE = {"id": "embedded", "object": "model", "parent": None}
ADAPTER = {"id": "nlu", "object": "model", "parent": "embedded"}


def test_worker_urls_are_normalised_or_refused():
    assert worker_base("http://nodeA:8000/v1") == "http://nodeA:8000"
    assert worker_base("http://nodeA:8000/v1/") == "http://nodeA:8000"
    assert worker_base("https://10.0.0.2:8000") == "https://10.0.0.2:8000"
    for bad in ("nodeA:8000", "ftp://nodeA:8000", "http://nodeA:8000/v2", "http://:8000"):
        with pytest.raises(MedstackError, match="--worker"):
            worker_base(bad)


def test_workers_must_serve_the_same_model_and_adapter_names():
    assert check_same_models({"http://a:1": [BASE, ADAPTER], "http://b:1": [ADAPTER, BASE]}) == ("embedded", ["nlu"])
    with pytest.raises(MedstackError, match=r"http://b:1/v1 serves model 'embedded' \(no adapters\), but http://a:1/v1 serves model 'embedded' with adapters nlu"):
        check_same_models({"http://a:1": [BASE, ADAPTER], "http://b:1": [BASE]})
    with pytest.raises(MedstackError, match="serves model 'other'"):
        check_same_models({"http://a:1": [BASE], "http://b:1": [{"id": "other", "parent": None}]})


def test_worker_models_are_asked_with_the_key(workers):
    url = workers([BASE, ADAPTER], key="k1")
    assert served_models(url, "k1") == [BASE, ADAPTER]
    with pytest.raises(MedstackError, match="wants an API key: set \\$MEDSTACK_API_KEY"):
        served_models(url, None)
    with pytest.raises(MedstackError, match="refused the key"):
        served_models(url, "wrong")
    from serving.launcher import free_port

    with pytest.raises(MedstackError, match="does not answer /v1/models .*start it first"):
        served_models(f"http://127.0.0.1:{free_port()}", "k1", timeout=2)


def test_serve_router_refuses_a_worker_serving_other_names_before_starting(workers, cli, tmp_path):
    a, b = workers([BASE], key="k1"), workers([BASE, ADAPTER], key="k1")
    proc = cli("serve", "router", "--worker", a + "/v1", "--worker", b + "/v1", "--port", "8299", env={"MEDSTACK_API_KEY": "k1"})
    assert proc.returncode == 2, proc.stderr
    said = " ".join(proc.stderr.split())  # one message (the console wraps it at the terminal's width)
    assert said.count("error:") == 1 and "must serve the same model and adapter names" in said and f"--worker {b}/v1 serves" in said, said
    assert "Traceback" not in proc.stderr and "starting vllm-router" not in said
    proc = cli("serve", "router", "--worker", a, "--port", "8299", env={"MEDSTACK_API_KEY": ""})  # the workers' key is missing
    assert proc.returncode == 2 and "wants an API key" in proc.stderr, proc.stderr


def test_exposed_group_or_router_without_a_key_is_refused(cli):
    env = {"MEDSTACK_API_KEY": ""}
    for args in (["serve", "--model", "embedded", "--replicas", "2", "--host", "0.0.0.0", "--port", "8298"],
                 ["serve", "router", "--worker", "http://127.0.0.1:1/v1", "--host", "0.0.0.0", "--port", "8298"]):
        proc = cli(*args, env=env)
        assert proc.returncode == 2 and "--host 0.0.0.0 makes the server reachable from other machines" in proc.stderr, proc.stderr


def test_member_status_reads_each_replicas_own_metrics(workers):
    a, b = workers([BASE], served=7), workers([BASE], served=3)
    from serving.launcher import free_port

    dead = f"http://127.0.0.1:{free_port()}/v1"
    rec = {"replicas": [{"base_url": a + "/v1"}, {"base_url": b + "/v1"}, {"base_url": dead}]}
    st = member_status(rec)
    assert [m["requests_finished"] for m in st] == [7, 3, None] and [m["healthy"] for m in st] == [True, True, False]
    assert st[0]["running"] == 1


def test_a_router_over_remote_workers_stops_alone(tmp_path, monkeypatch):
    """`serve stop` on a `serve router` record kills the router's process group; the workers were started elsewhere."""
    monkeypatch.setenv("MEDSTACK_HOME", str(tmp_path))
    import subprocess

    router, worker = (subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(2))
    kill_record({"pid": router.pid, "replicas": [{"pid": None, "base_url": "http://nodeA:8000/v1", "remote": True}]})
    router.wait(timeout=30)
    assert worker.poll() is None
    worker.kill()
    worker.wait()


# ---------------------------------------------------------------- the workers' dtype, asked of each worker

HOW = "asked of the server: its /v1/models header X-Medstack-Dtype"


def test_a_servers_dtype_is_asked_of_it(workers):
    from serving.launcher import free_port
    from serving.served_dtype import UNKNOWN_WHY, ask_dtype

    keyed = workers([BASE], key="k1", dtype="bfloat16")
    assert ask_dtype(keyed + "/v1", "k1") == ("bfloat16", HOW)
    assert ask_dtype(keyed, None) == (None, "its /v1/models answered HTTP 401 (the key)")  # told only to a key holder
    assert ask_dtype(workers([BASE], dev_dtype="torch.float16")) == ("float16", "asked of the server: vLLM's /server_info (development mode)")
    assert ask_dtype(workers([BASE])) == (None, UNKNOWN_WHY)  # a plain vLLM server names none
    dead = ask_dtype(f"http://127.0.0.1:{free_port()}", timeout=2)
    assert dead[0] is None and dead[1].startswith("its /v1/models did not answer"), dead


def test_workers_must_compute_in_the_same_dtype():
    from serving.replicas import check_same_dtype
    from serving.served_dtype import UNKNOWN_WHY

    a, b = "http://a:1", "http://b:1"
    assert check_same_dtype({a: ("float32", HOW), b: ("float32", HOW)}) == ("float32", "asked of each worker (its /v1/models header X-Medstack-Dtype)")
    with pytest.raises(MedstackError, match=r"dtypes differ \(http://a:1/v1 bfloat16, http://b:1/v1 float32\): .*--allow-mixed-dtype"):
        check_same_dtype({a: ("bfloat16", HOW), b: ("float32", HOW)})
    with pytest.raises(MedstackError, match=r"dtypes cannot be compared \(http://a:1/v1 bfloat16, http://b:1/v1 unknown\): --worker http://b:1/v1 names none"):
        check_same_dtype({a: ("bfloat16", HOW), b: (None, UNKNOWN_WHY)})
    dtype, why = check_same_dtype({a: ("bfloat16", HOW), b: ("float32", HOW)}, allow_mixed=True)
    assert dtype == "bfloat16+float32" and why == "mixed, allowed with --allow-mixed-dtype: http://a:1/v1 bfloat16, http://b:1/v1 float32"
    assert check_same_dtype({a: ("bfloat16", HOW), b: (None, UNKNOWN_WHY)}, allow_mixed=True)[0] == "bfloat16+unknown"
    assert check_same_dtype({a: (None, UNKNOWN_WHY)}) == (None, "the worker names none: " + UNKNOWN_WHY)  # one worker: nothing to mix


def test_router_refuses_mixed_dtypes_and_with_the_flag_records_each_workers(workers, cli, tmp_path, monkeypatch):
    import subprocess

    import serving.replicas as R
    from serving.launcher import free_port, server_identity

    a, b = workers([BASE], key="k1", dtype="bfloat16"), workers([BASE], key="k1", dtype="float32")
    proc = cli("serve", "router", "--worker", a + "/v1", "--worker", b + "/v1", "--port", "8299", env={"MEDSTACK_API_KEY": "k1"})
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and said.count("error:") == 1, said
    assert f"dtypes differ ({a}/v1 bfloat16, {b}/v1 float32)" in said and "--allow-mixed-dtype" in said, said
    assert "Traceback" not in proc.stderr and "starting vllm-router" not in said

    # with the flag it starts (vllm-router stood in by a sleeping process) and the record names each worker's dtype
    monkeypatch.setenv("MEDSTACK_HOME", str(tmp_path))
    stand_in = subprocess.Popen(["sleep", "300"], start_new_session=True)
    monkeypatch.setattr(R, "start_router", lambda host, port, alias, urls, policy, args, key, timeout: {
        "pid": stand_in.pid, "argv": ["vllm-router"], "log": str(tmp_path / "router.log"),
        "router": {"policy": policy, "log": str(tmp_path / "router.log"), "prometheus_port": 1}})
    try:
        said = []
        rec = R.start_remote_router([a, b], "127.0.0.1", free_port(), "k1", allow_mixed_dtype=True, log=said.append)
        assert rec["dtype"] == "bfloat16+float32" and [m["dtype"] for m in rec["replicas"]] == ["bfloat16", "float32"]
        assert "dtype bfloat16+float32: mixed, allowed with --allow-mixed-dtype" in said[0], said
        ident = server_identity(rec)  # what identity.json and each record's server facts are built from
        assert ident["dtype"] == "bfloat16+float32" and [m["dtype"] for m in ident["replicas"]] == ["bfloat16", "float32"]
        status = json.loads(cli("serve", "status", "--json", check=True, env={"MEDSTACK_API_KEY": "k1"}).stdout)
        assert [(r["dtype"], [m["dtype"] for m in r["replicas"]]) for r in status] == [("bfloat16+float32", ["bfloat16", "float32"])]
        # the same dtype on every worker: started without the flag, recorded as that dtype
        same = R.start_remote_router([a, workers([BASE], key="k1", dtype="bfloat16")], "127.0.0.1", free_port(), "k1", log=said.append)
        assert same["dtype"] == "bfloat16" and same["dtype_reason"].startswith("asked of each worker")
        assert "bfloat16+float32" in cli("serve", "status", check=True).stdout.replace("\n", "")
    finally:
        stand_in.kill()
        stand_in.wait()
