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

A key (``$MEDSTACK_API_KEY``) reaches every replica and the router through their environments, never
a command line; the replicas enforce it (401 without), the router passes each client's
``Authorization`` header on, and every readiness probe sends it.

``medstack serve router --worker URL ...`` (``start_remote_router``) puts the same router in front of
servers that already run, here or on other nodes: it first checks that every worker answers with the
key and serves the same model and adapter names, and asks each worker its dtype (``serving.served_dtype``):
workers of different (or unknown) dtypes are refused unless ``--allow-mixed-dtype``. It then records itself like
a group whose members have no pid, each with its dtype (``serve stop`` stops the router only). Two-node recipe:
docs/serving.md.

The runner, ``bench --replay`` and ``serve status`` read every replica's ``/metrics`` behind a group
(``metrics_targets``, ``scrape_targets``), not the router's, so a prefix-cache hit rate is the replicas' own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
from dataclasses import replace

from models.registry import get_spec, resolve_weights
from models.paths import private_file
from serving import server_metrics
from serving.cpus import machine_facts, split_cpus, usable_cpus
from serving.launcher import (
    CPU_DEFAULTS, ServeError, ServerSettings, kill_group, build_command, default_startup_timeout, effective_serve_settings,
    free_port, has_nvidia_gpu, healthy, logs_dir, port_free, running_servers, serving_dtype, wait_healthy, write_record,
)
from serving.parallel import local_ranks, rank_binding
from serving.secrets import SERVER_KEY_ENV, check_exposure, open_keyed, public_env, redact_argv
from serving.served_dtype import ask_dtype

# vllm-router's policies (vllm-router 0.1.17 --help); kv_aware and sticky_least_loaded need KV events / sessions we do not send.
ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "consistent_hash", "random")
# The router's own default. Against round_robin on one replayed 6-case CRAFT-MD workload through 2 CPU replicas,
# 6 replays each, alternated: 62.0 +- 13.4 s vs 68.7 +- 5.8 s, within noise (docs/measurements.md, "Routing policy A/B").
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
    groups = split_cpus(cpus if cpus is not None else usable_cpus(), n, what="replica")
    kv = base.cpu_kvcache_gb or max(1, CPU_DEFAULTS["cpu_kvcache_gb"] // n)
    for ids in groups:
        s = replace(base, host="127.0.0.1", port=0, cpu_threads_bind=rank_binding(ids, per), cpu_kvcache_gb=kv)
        out.append((s, {"cpus": ids, "env": {}}))
    return out


def router_argv(host: str, port: int, worker_urls: list[str], policy: str, prometheus_port: int, extra: list[str] = ()) -> list[str]:
    """vllm-router's command line (through :mod:`serving.router_main`, run with this interpreter); ``extra`` goes last, as given.

    It never holds a key: the router gets the workers' key through its environment (``VLLM_API_KEY``)."""
    if policy not in ROUTER_POLICIES:
        raise ServeError(f"--router-policy {policy!r}: expected one of {', '.join(ROUTER_POLICIES)}")
    if any(a == "--api-key" or a.startswith("--api-key=") for a in extra):
        raise ServeError("--router-arg --api-key: the key would be on the router's command line (visible in ps); "
                         "give it in $MEDSTACK_API_KEY instead")
    argv = [sys.executable, "-m", "serving.router_main", "--host", host, "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus_port)]
    for flag, value in ROUTER_HEALTH.items():
        argv += [flag, value]
    return argv + list(extra)


def _require_router() -> None:
    try:
        import vllm_router  # noqa: F401
    except ImportError:
        raise ServeError("a replica group or router needs the vLLM project's router: pip install vllm-router (requirements.txt)") from None


def start_router(host: str, port: int, alias: str, worker_urls: list[str], policy: str, router_args: list[str], api_key: str | None,
                 timeout: float) -> dict:
    """Start vllm-router in front of ``worker_urls`` (``http://host:port``) and wait until it answers /v1/models (with the key).

    Returns the router's part of a server record: pid, argv, log, policy, Prometheus port. Killed again if it does not come up."""
    rargv = router_argv(host, port, worker_urls, policy, free_port(), router_args)
    router_log = logs_dir() / f"serve-{alias}-{port}-router.log"
    private_file(router_log)
    env = {**os.environ, SERVER_KEY_ENV: api_key} if api_key else {k: v for k, v in os.environ.items() if k != SERVER_KEY_ENV}
    with open(router_log, "w") as logf:
        logf.write("$ " + " ".join(redact_argv(rargv)) + "\n")
        logf.flush()
        router = subprocess.Popen(rargv, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base_url = ServerSettings(alias=alias, host=host, port=port).base_url
    deadline = time.time() + timeout  # its Python launcher alone took ~110 s to import on a loaded 2-core box
    try:
        while not healthy(base_url, api_key):  # /v1/models, forwarded to a worker: answers once the router has registered them
            if router.poll() is not None or time.time() > deadline:
                tail = "\n".join(router_log.read_text(errors="replace").splitlines()[-15:])
                raise ServeError(f"vllm-router did not come up on {base_url}; last log lines ({router_log}):\n{tail}")
            time.sleep(0.5)
    except BaseException:
        kill_group(router.pid)
        raise
    return {"pid": router.pid, "argv": rargv, "log": str(router_log),
            "router": {"policy": policy, "log": str(router_log), "prometheus_port": int(rargv[rargv.index("--prometheus-port") + 1])}}


def start_group(base: ServerSettings, n: int, policy: str = DEFAULT_POLICY, router_args: list[str] = (), log=print) -> dict:
    """Start N replicas and the router in front of them; record and return the group's one server record."""
    _require_router()
    check_exposure(base.host, base.api_key, base.no_auth)  # the router is what faces the network
    on_gpu = base.device == "gpu" or (base.device == "auto" and has_nvidia_gpu())
    plans = plan_replicas(base, n, on_gpu)
    dtype, why = serving_dtype(base, on_gpu, get_spec(base.alias).dtype)
    log(f"dtype {dtype}: {why}")
    timeout = base.startup_timeout or default_startup_timeout(resolve_weights(base.alias)[1], on_gpu)
    if not port_free(base.host, base.port):
        raise ServeError(f"port {base.port} on {base.host} is already in use; pick another with --port")
    started: list[dict] = []
    try:
        for i, (s, placement) in enumerate(plans):
            s.port = free_port()
            argv, env = build_command(s, on_gpu)  # the key, if any, in env (VLLM_API_KEY): every replica requires it
            env.update(placement["env"])
            log_path = logs_dir() / f"serve-{base.alias}-{base.port}-replica{i}.log"
            private_file(log_path)
            where = f"cores {placement['cpus']}" if "cpus" in placement else f"GPUs {placement['gpus']}"
            log(f"starting replica {i} of {base.alias} on {s.base_url} ({where}); log: {log_path}")
            with open(log_path, "w") as logf:
                logf.write("$ " + " ".join(redact_argv(argv)) + "\n")
                logf.flush()
                proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True)
            started.append({"index": i, "pid": proc.pid, "port": s.port, "base_url": s.base_url, "dtype": dtype, "log": str(log_path), "argv": redact_argv(argv),
                            "env": public_env(env), **{k: v for k, v in placement.items() if k != "env"},
                            "serve_settings": effective_serve_settings(s, on_gpu)["settings"], "_proc": proc, "_settings": s})
        t0 = time.time()
        for m in started:
            wait_healthy(m["base_url"], m["_proc"], m["log"], timeout, base.api_key)
        log(f"{n} replicas ready in {time.time() - t0:.1f} s; starting vllm-router ({policy}) on {base.base_url}")
        router = start_router(base.host, base.port, base.alias, [m["base_url"].rsplit("/v1", 1)[0] for m in started], policy,
                              list(router_args), base.api_key, timeout)
    except BaseException:
        for m in started:
            kill_group(m["pid"])
        raise
    replicas = [{k: v for k, v in m.items() if not k.startswith("_")} for m in started]
    rec = {
        "alias": base.alias, "base_url": base.base_url, "port": base.port, "host": base.host,
        "adapters": base.lora, "api_key": base.api_key, "env": {},
        "device": "gpu" if on_gpu else "cpu", "started": time.time(), "runtime_lora": base.allow_runtime_lora,
        "serve_settings": replicas[0]["serve_settings"], "machine": machine_facts(), "dtype": dtype, "dtype_reason": why,
        **router, "replicas": replicas, "startup_seconds": round(time.time() - t0, 1),
    }
    write_record(rec)
    log(f"replica group ready: {base.base_url} -> {', '.join(r['base_url'] for r in replicas)}")
    return rec


# ---------------------------------------------------------------- a router over servers that run elsewhere

def worker_base(url: str) -> str:
    """``http://nodeA:8000/v1`` or ``http://nodeA:8000`` -> ``http://nodeA:8000``; anything else is refused."""
    u = url.strip().rstrip("/")
    u = u[:-3] if u.endswith("/v1") else u
    parts = urllib.parse.urlsplit(u)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query:
        raise ServeError(f"--worker {url!r}: expected a server's URL, e.g. http://nodeA:8000/v1")
    return u


def served_models(base: str, api_key: str | None, timeout: float = 10.0) -> list[dict]:
    """A worker's ``/v1/models`` entries (base model and adapters), asked with the key; a refusal or no answer is one line."""
    try:
        with open_keyed(base + "/v1/models", api_key, timeout) as r:
            return list(json.loads(r.read().decode("utf-8", errors="replace")).get("data") or [])
    except urllib.error.HTTPError as e:
        why = ("it wants an API key: set $MEDSTACK_API_KEY to the workers' key" if e.code == 401 and not api_key
               else "it refused the key in $MEDSTACK_API_KEY" if e.code in (401, 403) else f"HTTP {e.code}")
        raise ServeError(f"--worker {base}/v1 refused /v1/models: {why}") from None
    except (OSError, ValueError, AttributeError) as e:
        raise ServeError(f"--worker {base}/v1 does not answer /v1/models ({getattr(e, 'reason', e)}); start it first "
                         f"(on its machine: medstack serve --model ALIAS --host 0.0.0.0 --port PORT, with $MEDSTACK_API_KEY)") from None


def model_names(entries: list[dict]) -> tuple[str, list[str]]:
    """(base model name, sorted adapter names) from /v1/models entries: an adapter has a ``parent``."""
    bases = sorted(e["id"] for e in entries if not e.get("parent"))
    adapters = sorted(e["id"] for e in entries if e.get("parent"))
    return (bases[0] if len(bases) == 1 else ",".join(bases)), adapters


def check_same_models(workers: dict[str, list[dict]]) -> tuple[str, list[str]]:
    """Every worker serves the same model and adapter names (a router sends any request to any worker); else one line naming the odd one."""
    named = {w: model_names(entries) for w, entries in workers.items()}
    first, want = next(iter(named.items()))
    for w, got in named.items():
        if got != want:
            show = lambda n: f"model {n[0]!r}" + (f" with adapters {', '.join(n[1])}" if n[1] else " (no adapters)")  # noqa: E731
            raise ServeError(f"--worker {w}/v1 serves {show(got)}, but {first}/v1 serves {show(want)}: every worker behind one "
                             f"router must serve the same model and adapter names (start them with the same --model, --lora)")
    return want


def check_same_dtype(asked: dict[str, tuple[str | None, str]], allow_mixed: bool = False) -> tuple[str | None, str]:
    """(the record's dtype, why) from each worker's asked (dtype, how): one dtype for all, else refused in one line
    unless ``allow_mixed`` (then the dtypes joined with '+', e.g. 'bfloat16+float32'). A worker that names no dtype
    cannot be compared: refused too among several workers; a lone one is recorded as unknown."""
    dtypes = {w: d for w, (d, _) in asked.items()}
    known = sorted({d for d in dtypes.values() if d})
    if len(known) == 1 and None not in dtypes.values():
        return known[0], "asked of each worker (" + next(how for _, how in asked.values()).removeprefix("asked of the server: ") + ")"
    if len(dtypes) == 1:
        return None, "the worker names none: " + next(iter(asked.values()))[1]
    each = ", ".join(f"{w}/v1 {d or 'unknown'}" for w, d in dtypes.items())
    if not allow_mixed:
        unknown = [w for w, d in dtypes.items() if not d]
        what, why = (("cannot be compared", f"--worker {unknown[0]}/v1 names none: {asked[unknown[0]][1]}") if unknown else
                     ("differ", "a router sends any request to any worker, so one run's answers would mix number formats"))
        raise ServeError(f"the workers' dtypes {what} ({each}): {why}; start every worker with medstack and the same --dtype, "
                         f"or pass --allow-mixed-dtype (recorded)")
    return "+".join(known + (["unknown"] if None in dtypes.values() else [])), f"mixed, allowed with --allow-mixed-dtype: {each}"


def start_remote_router(workers: list[str], host: str, port: int, api_key: str | None, policy: str = DEFAULT_POLICY,
                        router_args: list[str] = (), no_auth: bool = False, timeout: float = 600.0, allow_mixed_dtype: bool = False,
                        log=print) -> dict:
    """vllm-router on this machine in front of servers already running (here or on other nodes), recorded like a replica group.

    Before it starts: every worker answers /v1/models with the key, serves the same model and adapter names, and
    computes in the same dtype (asked of each; ``allow_mixed_dtype`` lets different or unknown ones through, recorded).
    ``serve stop`` stops the router only (the workers are not ours to stop)."""
    _require_router()
    check_exposure(host, api_key, no_auth)
    bases = [worker_base(w) for w in workers]
    if len(set(bases)) != len(bases) or not bases:
        raise ServeError("serve router: give each worker once (--worker URL, repeatable)")
    if not port_free(host, port):
        raise ServeError(f"port {port} on {host} is already in use; pick another with --port")
    alias, adapters = check_same_models({b: served_models(b, api_key) for b in bases})
    asked = {b: ask_dtype(b, api_key) for b in bases}
    dtype, why = check_same_dtype(asked, allow_mixed_dtype)
    log(f"{len(bases)} workers serve {alias!r}" + (f" with adapters {', '.join(adapters)}" if adapters else "")
        + f"; dtype {dtype or 'unknown'}: {why}; starting vllm-router ({policy}) on port {port}")
    t0 = time.time()
    router = start_router(host, port, alias, bases, policy, list(router_args), api_key, timeout)
    rec = {
        "alias": alias, "base_url": ServerSettings(alias=alias, host=host, port=port).base_url, "port": port, "host": host,
        "adapters": {a: None for a in adapters}, "api_key": api_key, "env": {}, "device": "remote", "started": time.time(),
        "runtime_lora": False, "machine": machine_facts(), "remote_workers": True, "dtype": dtype, "dtype_reason": why, **router,
        "replicas": [{"index": i, "pid": None, "base_url": b + "/v1", "remote": True, "dtype": asked[b][0], "dtype_reason": asked[b][1]}
                     for i, b in enumerate(bases)],
        "startup_seconds": round(time.time() - t0, 1),
    }
    write_record(rec)
    log(f"router ready: {rec['base_url']} -> {', '.join(bases)}")
    return rec


def metrics_targets(urls: list[str]) -> dict[str, list[str]]:
    """Each endpoint URL -> the URLs whose /metrics describe it: a replica group's replicas, otherwise itself."""
    groups = {r["base_url"].rstrip("/"): [m["base_url"] for m in r["replicas"]] for r in running_servers() if r.get("replicas")}
    return {u: groups.get(u.rstrip("/"), [u]) for u in urls}


def scrape_targets(targets: dict[str, list[str]]) -> dict[str, dict]:
    """One ``/metrics`` snapshot of every server behind ``targets`` (``metrics_targets``): {server URL: snapshot}."""
    return {u: server_metrics.scrape(u) for members in targets.values() for u in members}


def member_status(rec: dict, api_key: str | None = None) -> list[dict]:
    """Each replica (or remote worker) of a group: URL, answers /v1/models, and from its own /metrics the requests it
    finished, is running and has waiting (None where its /metrics cannot be read)."""
    out = []
    for m in rec.get("replicas", []):
        snap = server_metrics.scrape(m["base_url"])
        out.append({"base_url": m["base_url"], "healthy": healthy(m["base_url"], api_key),
                    **{k: (round(snap[n]) if n in snap else None) for k, n in MEMBER_FIGURES.items()}})
    return out


MEMBER_FIGURES = {"requests_finished": "vllm:request_success_total", "running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"}
