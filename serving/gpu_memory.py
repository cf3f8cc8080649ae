"""How much of one GPU's memory each vLLM server on it may take (``--gpu-memory-utilization``): pure arithmetic.

A server needs its weights (parameters x bytes per parameter), the KV cache of one sequence at its full context
(2 x layers x KV heads x head dim x bytes, per token; vLLM refuses to start with less) and a runtime allowance
(activations while profiling, CUDA graphs, the CUDA context: :data:`RUNTIME_GIB`, an estimate). The sizes are the
registry's (models/registry.yaml, ``size:``). Servers sharing one GPU split ``MAX_SHARE`` of its memory (vLLM's own
default for a server alone), less what other processes already hold (a server already running),
in proportion to their needs, so each gets its need and the rest goes to KV cache (more sequences in flight). When
the needs add up to more than is available, :func:`split_gpu` raises :class:`GpuMemoryError` with the numbers.

API (no I/O, usable by any planner of servers on one GPU)::

    size = ModelSize(params=8.03e9, dtype_bytes=2, layers=32, kv_heads=8, head_dim=128, context=8192)
    shares = split_gpu([need("a", size), need("b", size)], total_gib=79.6)   # -> [Share(name, need, fraction, gib)]
    shares[0].fraction                                                        # -> vLLM's --gpu-memory-utilization
    plan_lines(shares, total_gib)                                             # one line per server, for people
"""

from __future__ import annotations

from dataclasses import dataclass

from models.errors import MedstackError

GIB = 2**30
MAX_SHARE = 0.90  # vLLM's default --gpu-memory-utilization: what all servers on one GPU together may take
RUNTIME_GIB = 2.0  # per server: activations at the profiling batch, CUDA graphs, the CUDA context (estimate)
IDLE_GIB = 1.0  # memory in use below this: the GPU holds no other server (the driver's own part)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "half": 2}


class GpuMemoryError(MedstackError):
    """The servers asked for do not fit the GPU's memory (the message gives each one's need and what is available)."""


@dataclass(frozen=True)
class ModelSize:
    """What a model occupies on a GPU: the registry's ``size:`` plus its dtype and context length."""

    params: float  # parameters
    dtype_bytes: int  # bytes per weight and per KV-cache element
    layers: int
    kv_heads: int
    head_dim: int
    context: int  # tokens of one sequence (the server's --max-model-len)

    @property
    def weights_gib(self) -> float:
        return self.params * self.dtype_bytes / GIB

    @property
    def kv_gib(self) -> float:
        """KV cache of one sequence at full context: keys and values, every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes * self.context / GIB


@dataclass(frozen=True)
class Need:
    name: str
    weights: float  # GiB
    kv: float
    runtime: float

    @property
    def total(self) -> float:
        return self.weights + self.kv + self.runtime

    def text(self) -> str:
        return f"{self.name}: {self.total:.1f} GiB (weights {self.weights:.1f} + KV cache {self.kv:.1f} + runtime {self.runtime:.1f})"


@dataclass(frozen=True)
class Share:
    name: str
    need: Need
    fraction: float  # --gpu-memory-utilization
    gib: float  # fraction x the GPU's memory


def size_of(spec, dtype: str, context: int | None = None) -> ModelSize | None:
    """A registry entry (models.registry.ModelSpec) served in ``dtype`` at ``context`` tokens (default: the registry's
    context length) -> its :class:`ModelSize`; None when the registry gives no ``size``. ``auto`` counts 2 bytes (vLLM
    serves a checkpoint in half precision on a GPU unless told otherwise)."""
    if spec.size is None:
        return None
    return ModelSize(spec.size.params, DTYPE_BYTES.get(dtype, 2), spec.size.layers, spec.size.kv_heads, spec.size.head_dim,
                     context or spec.context_length)


def need(name: str, size: ModelSize, runtime_gib: float = RUNTIME_GIB) -> Need:
    return Need(name, size.weights_gib, size.kv_gib, runtime_gib)


def split_gpu(needs: list[Need], total_gib: float, free_gib: float | None = None, cap: float = MAX_SHARE) -> list[Share]:
    """Each server's share of one GPU of ``total_gib``. ``free_gib``: what is free now, when other processes (a
    server already running) hold some of it; all of them together stay within ``cap`` of the GPU. Shares are rounded
    down to 0.001 and are each at least the server's need; :class:`GpuMemoryError` with the numbers when that is
    impossible."""
    if not needs:
        return []
    available = cap * total_gib
    where = f"{cap:.2f} of the GPU's {total_gib:.1f} GiB = {available:.1f} GiB"
    used = total_gib - free_gib if free_gib is not None else 0.0
    if used >= IDLE_GIB:
        available = max(0.0, available - used)
        where = (f"{cap:.2f} of the GPU's {total_gib:.1f} GiB less the {used:.1f} GiB other processes hold now "
                 f"(a server already running: `medstack serve status`) = {available:.1f} GiB")
    wanted = sum(n.total for n in needs)
    if wanted > available:
        raise GpuMemoryError(f"{len(needs)} vLLM server(s) on one GPU need {wanted:.1f} GiB but {where} are available: "
                             + "; ".join(n.text() for n in needs)
                             + ". Use a GPU per model (CUDA_VISIBLE_DEVICES, docs/running-studies.md), stop a running server, "
                             "a smaller model, or a shorter context (--max-model-len)")
    out = []
    for n in needs:
        fraction = int(1000 * available * n.total / wanted / total_gib) / 1000  # rounded down: the sum stays within
        out.append(Share(n.name, n, fraction, fraction * total_gib))
    return out


def plan_lines(shares: list[Share], total_gib: float) -> list[str]:
    """'NAME: --gpu-memory-utilization 0.450 (35.8 GiB of 79.6; needs 18.0 GiB: weights ... )' per server."""
    return [f"{s.name}: --gpu-memory-utilization {s.fraction:.3f} ({s.gib:.1f} of {total_gib:.1f} GiB; needs {s.need.text().split(': ', 1)[1]})"
            for s in shares]
