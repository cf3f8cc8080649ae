"""Several vLLM replicas behind the vLLM project's router (PyPI ``vllm-router``), as ONE endpoint.

``medstack serve --model A --replicas N`` runs, in order:

1. plan: one :class:`~serving.launcher.ServerSettings` per replica (``plan_replicas``). CPU: the
   usable cores are split between the replicas, each replica's worker(s) bound to its own
   (``VLLM_CPU_OMP_THREADS_BIND``), the KV cache divided between them (at least 1 GiB each).
   GPU: each replica gets its own ``tensor x pipeline`` GPUs (``CUDA_VISIBLE_DEVICES``).
   Replicas listen on free loopback ports; only the router listens on ``--host:--port``;
2. start every replica (own process group, own log), wait until each answers;
3. start ``vllm-router`` in front of them (``router_argv``): routing policy, health checks and
   retries are the router's own, its Prometheus port a free loopback port;
4. write one server record for the group: ``base_url``/``pid`` are the router's, ``replicas``
   lists each replica (pid, port, URL, log, command line, cores or GPUs). ``serve status``,
   ``serve stop`` (router and every replica's process group), ``find_server``/``ensure_server``,
   the runner and ``identity.json`` all read that one record.

The runner scrapes every replica's ``/metrics`` behind a group (``metrics_targets``), not only
the router's, so a run's prefix-cache hit rate is the replicas' own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace

from models.registry import get_spec, resolve_weights
from serving.launcher import (
    CPU_DEFAULTS, ServeError, ServerSettings, _kill_group, _usable_cpus, build_command, default_startup_timeout, effective_serve_settings,
    free_port, has_nvidia_gpu, logs_dir, machine_facts, port_free, running_servers, serving_dtype, wait_healthy, write_record,
)
from serving.parallel import local_ranks, rank_binding, split_cpus
from serving.secrets import check_exposure, public_env

# vllm-router's policies (vllm-router 0.1.17 --help); kv_aware and sticky_least_loaded need KV events / sessions we do not send.
ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "consistent_hash", "random")
# The router's own default, and the faster of the two on one replayed 10-case CRAFT-MD workload through 2 CPU
# replicas (405.6 s vs round_robin's 451.3 s, hit rate 22.1 vs 20.1 %; README "Replicas behind the vLLM router").
DEFAULT_POLICY = "cache_aware"
# A dead replica is found by the router's own health check within about interval x threshold seconds;
# until then a request that fails on it is retried by the router (and by our client).
ROUTER_HEALTH = {"--health-check-interval-secs": "5", "--health-failure-threshold": "2", "--health-check-timeout-secs": "5"}


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def plan_replicas(base: ServerSettings, n: int, on_gpu: bool, *, cpus: list[int] | None = None, gpus: int | None = None) -> list[tuple[ServerSettings, dict]]:
    """One (settings, placement) per replica. Placement: {"cpus": [...]} or {"gpus": [...]}, plus the environment it adds."""
    if n < 2:
        raise ServeError("--replicas needs at least 2 (one server needs no router)")
    per = local_ranks(base)
    out = []
    if on_gpu:
        gpus = gpu_count() if gpus is None else gpus
        if n * per > gpus:
            raise ServeError(f"--replicas {n} x {per} GPU(s) per replica (tensor x pipeline x data parallel) needs {n * per} GPUs; this machine has {gpus}")
        for i in range(n):
            ids = list(range(i * per, (i + 1) * per))
            s = replace(base, host="127.0.0.1", port=0)
            out.append((s, {"gpus": ids, "env": {"CUDA_VISIBLE_DEVICES": ",".join(map(str, ids))}}))
        return out
    if base.cpu_threads_bind not in (None, "all"):
        raise ServeError(f"--cpu-threads-bind {base.cpu_threads_bind} with --replicas: each replica is bound to its own share of the cores; leave it unset")
    groups = split_cpus(cpus if cpus is not None else _usable_cpus(), n, what="replica")
    kv = base.cpu_kvcache_gb or max(1, CPU_DEFAULTS["cpu_kvcache_gb"] // n)
    for ids in groups:
        s = replace(base, host="127.0.0.1", port=0, cpu_threads_bind=rank_binding(ids, per), cpu_kvcache_gb=kv)
        out.append((s, {"cpus": ids, "env": {}}))
    return out


def router_argv(host: str, port: int, worker_urls: list[str], policy: str, prometheus_port: int, extra: list[str] = ()) -> list[str]:
    """vllm-router's command line (its Python launcher, run with this interpreter); ``extra`` goes last, as given."""
    if policy not in ROUTER_POLICIES:
        raise ServeError(f"--router-policy {policy!r}: expected one of {', '.join(ROUTER_POLICIES)}")
    argv = [sys.executable, "-m", "vllm_router.launch_router", "--host", host, "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus_port)]
    for flag, value in ROUTER_HEALTH.items():
        argv += [flag, value]
    return argv + list(extra)


def _router_ready(base_url: str, timeout: float = 3.0) -> bool:
    """The router answers /v1/models (forwarded to a replica) once it has registered its workers."""
    try:
        with urllib.request.urlopen(base_url.rsplit("/v1", 1)[0] + "/v1/models", timeout=timeout) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001 - polled until the deadline
        return False


def start_group(base: ServerSettings, n: int, policy: str = DEFAULT_POLICY, router_args: list[str] = (), log=print) -> dict:
    """Start N replicas and the router in front of them; record and return the group's one server record."""
    try:
        import vllm_router  # noqa: F401
    except ImportError:
        raise ServeError("--replicas needs the vLLM project's router: pip install vllm-router (requirements.txt)") from None
    check_exposure(base.host, base.api_key, base.no_auth)  # the router is what faces the network
    on_gpu = base.device == "gpu" or (base.device == "auto" and has_nvidia_gpu())
    plans = plan_replicas(base, n, on_gpu)
    dtype, why = serving_dtype(base, on_gpu, get_spec(base.alias).dtype)
    log(f"dtype {dtype}: {why}")
    timeout = base.startup_timeout or default_startup_timeout(resolve_weights(base.alias)[1], on_gpu)
    if not port_free(base.host, base.port):
        raise ServeError(f"port {base.port} on {base.host} is already in use; pick another with --port")
    started: list[dict] = []
    router_pid = None
    try:
        for i, (s, placement) in enumerate(plans):
            s.port = free_port()
            argv, env = build_command(s, on_gpu)
            env.update(placement["env"])
            log_path = logs_dir() / f"serve-{base.alias}-{base.port}-replica{i}.log"
            where = f"cores {placement['cpus']}" if "cpus" in placement else f"GPUs {placement['gpus']}"
            log(f"starting replica {i} of {base.alias} on {s.base_url} ({where}); log: {log_path}")
            with open(log_path, "w") as logf:
                logf.write("$ " + " ".join(argv) + "\n")
                logf.flush()
                proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True)
            started.append({"index": i, "pid": proc.pid, "port": s.port, "base_url": s.base_url, "log": str(log_path), "argv": argv,
                            "env": public_env(env), **{k: v for k, v in placement.items() if k != "env"},
                            "serve_settings": effective_serve_settings(s, on_gpu)["settings"], "_proc": proc, "_settings": s})
        t0 = time.time()
        for m in started:
            wait_healthy(m["base_url"], m["_proc"], m["log"], timeout, base.api_key)
        log(f"{n} replicas ready in {time.time() - t0:.1f} s; starting vllm-router ({policy}) on {base.base_url}")
        rargv = router_argv(base.host, base.port, [m["base_url"].rsplit("/v1", 1)[0] for m in started], policy, free_port(), router_args)
        router_log = logs_dir() / f"serve-{base.alias}-{base.port}-router.log"
        with open(router_log, "w") as logf:
            logf.write("$ " + " ".join(rargv) + "\n")
            logf.flush()
            router = subprocess.Popen(rargv, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        router_pid = router.pid
        deadline = time.time() + timeout  # its Python launcher alone took ~110 s to import on a loaded 2-core box
        while not _router_ready(base.base_url):
            if router.poll() is not None or time.time() > deadline:
                tail = "\n".join(router_log.read_text(errors="replace").splitlines()[-15:])
                raise ServeError(f"vllm-router did not come up on {base.base_url}; last log lines ({router_log}):\n{tail}")
            time.sleep(0.5)
    except BaseException:
        if router_pid:
            _kill_group(router_pid)
        for m in started:
            _kill_group(m["pid"])
        raise
    replicas = [{k: v for k, v in m.items() if not k.startswith("_")} for m in started]
    rec = {
        "alias": base.alias, "base_url": base.base_url, "pid": router_pid, "port": base.port, "host": base.host,
        "adapters": base.lora, "log": str(router_log), "api_key": base.api_key, "argv": rargv, "env": {},
        "device": "gpu" if on_gpu else "cpu", "started": time.time(), "runtime_lora": base.allow_runtime_lora,
        "serve_settings": replicas[0]["serve_settings"], "machine": machine_facts(), "dtype": dtype, "dtype_reason": why,
        "router": {"policy": policy, "log": str(router_log), "prometheus_port": int(rargv[rargv.index("--prometheus-port") + 1])},
        "replicas": replicas, "startup_seconds": round(time.time() - t0, 1),
    }
    write_record(rec)
    log(f"replica group ready: {base.base_url} -> {', '.join(r['base_url'] for r in replicas)}")
    return rec


def metrics_targets(urls: list[str]) -> dict[str, list[str]]:
    """Each endpoint URL -> the URLs whose /metrics describe it: a replica group's replicas, otherwise itself."""
    groups = {r["base_url"].rstrip("/"): [m["base_url"] for m in r["replicas"]] for r in running_servers() if r.get("replicas")}
    return {u: groups.get(u.rstrip("/"), [u]) for u in urls}
