"""How one vLLM server spreads over cores, GPUs and nodes: vLLM's own parallel options.

- ``parallel_args(s)``: ``--tensor-parallel-size`` / ``--pipeline-parallel-size`` /
  ``--data-parallel-size`` / ``--distributed-executor-backend`` for either build.
- ``rank_binding(cpus, ranks)``: the CPU build runs one worker process per local rank
  (data x pipeline x tensor parallel) and reads ``VLLM_CPU_OMP_THREADS_BIND`` as one core
  list per rank separated by ``|`` (``vllm/utils/ompmultiprocessing.py``: a server with 2
  ranks and the single list ``0-1`` fails its start with "number of CPU id list ... doesn't
  match local world size"). ``split_cpus`` (serving/cpus.py) hands each rank (or each replica) its own cores.
- ``check_ray_cluster()``: ``--distributed-backend ray`` joins a running Ray cluster
  (``ray start --head``); without one the start is refused with one line.
- ``check_backend_supported()``: Ray on the CPU build is refused up front (vllm-cpu 0.32 cannot run it).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from models.errors import MedstackError
from serving.cpus import cpu_list, split_cpus


def local_ranks(s) -> int:
    """Worker processes one server runs on this machine: data x pipeline x tensor parallel."""
    return max(1, s.data_parallel_size) * max(1, s.pipeline_parallel_size) * max(1, s.tensor_parallel_size)


def rank_binding(cpus: list[int], ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for ``ranks`` worker processes: ``0-1`` for one, ``0|1`` for two on two cores."""
    if ranks <= 1:
        return cpu_list(cpus)
    if len(cpus) < ranks:  # more ranks than cores: they take turns on the cores (slow, but it runs)
        return "|".join(str(sorted(cpus)[i % len(cpus)]) for i in range(ranks))
    return "|".join(cpu_list(g) for g in split_cpus(cpus, ranks, what="parallel rank"))


def parallel_args(s) -> list[str]:
    """vLLM's own parallel options, as the user set them (both builds take the same flags)."""
    argv = ["--tensor-parallel-size", str(s.tensor_parallel_size), "--pipeline-parallel-size", str(s.pipeline_parallel_size)]
    if s.data_parallel_size > 1:
        argv += ["--data-parallel-size", str(s.data_parallel_size)]
    if s.distributed_backend:
        argv += ["--distributed-executor-backend", s.distributed_backend]
    return argv


def check_backend_supported(s, on_gpu: bool) -> None:
    """Refuse, before anything starts, what the installed vLLM build cannot run.

    vllm-cpu 0.32 has no Ray executor: its CPU platform declares no Ray device key
    (``vllm/platforms/interface.py``: ``ray_device_key = ""``; ``CpuPlatform`` keeps it), so
    ``initialize_ray_cluster`` (``vllm/v1/executor/ray_utils.py``) stops every Ray-backed start,
    after the model config is built (~2 min here), with "current platform cpu does not support ray".
    """
    if s.distributed_backend != "ray" or on_gpu:
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu() and not current_platform.ray_device_key:
        raise MedstackError("--distributed-backend ray: the CPU build of vLLM cannot run on Ray (its CPU platform declares no Ray "
                            "device; vLLM stops with 'current platform cpu does not support ray'); on CPU use vLLM's own "
                            "processes: --tensor-parallel-size / --data-parallel-size without --distributed-backend, or --replicas")


def ray_address() -> str | None:
    """The Ray cluster ``ray.init()`` would join: ``$RAY_ADDRESS``, else the one `ray start --head` recorded in /tmp/ray."""
    addr = os.environ.get("RAY_ADDRESS")
    if addr:
        return addr
    current = Path("/tmp/ray/ray_current_cluster")
    try:
        return current.read_text().strip() or None
    except OSError:
        return None


def check_ray_cluster(timeout: float = 3.0) -> str:
    """The address of a reachable Ray cluster, or a one-line error saying to start one."""
    addr = ray_address()
    if not addr or addr in ("auto", "local"):
        raise MedstackError("--distributed-backend ray: no Ray cluster found (RAY_ADDRESS is unset and `ray start --head` "
                            "has not recorded one in /tmp/ray); start one first: `ray start --head` (other nodes: `ray start --address=HEAD:6379`)")
    host, _, port = addr.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return addr
    except (OSError, ValueError):
        raise MedstackError(f"--distributed-backend ray: the Ray cluster at {addr} does not answer; "
                            f"start it with `ray start --head` (or set RAY_ADDRESS to a running head)") from None
