"""What a run will ask of its models, before it runs: whether its longest request fits each model's context, and
what the whole run costs on a GPU of a given size (docs/running-studies.md, "Planning a run").

Each study declares its protocol's worst case once (:meth:`experiments.core.study.Study.worst_case`): per unit of
work (a case; a CRAFT-MD case-trial) the most requests its turn budget allows, their prompt and output tokens, and per
role the longest request (prompt + reply). Texts are counted at :data:`CHARS_PER_TOKEN` characters a token (an
estimate, no tokenizer is loaded). :func:`fit_warning` compares the longest request with each role's context (the
registry's ``context_length``, the ``--max-model-len`` a server started here gets) and names the study's configs
that fit; :func:`gpu_plan` turns a unit's tokens into cases at once and hours on one GPU: arithmetic, not a
measurement (every figure and assumption is printed beside the result).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHARS_PER_TOKEN = 4  # English text in a Llama/Mistral/Gemma tokenizer: about 4 characters a token
CONTEXT_HINT = "longer than the model's context"  # said in a failed case's error when the server refused a request for its length


def text_tokens(text: str) -> int:
    """Tokens of a text, estimated from its characters (rounded up)."""
    return math.ceil(len(text or "") / CHARS_PER_TOKEN)


@dataclass
class WorstCase:
    """One unit of work at its protocol's limit (every turn of the budget used, every reply at its max_tokens)."""

    longest: dict[str, int]  # role -> its longest request: prompt + reply, in tokens
    calls: int  # the most requests one unit sends
    prompt_tokens: int  # their prompts together (no prefix caching)
    output_tokens: int  # their replies together, each at its max_tokens
    budget: str = ""  # the limit that bounds it, in words ("20 doctor inferences, replies of at most 200 tokens")


@dataclass
class Typical:
    """A unit of work as a real run measured it (mean calls and tokens per unit), with where it was measured."""

    calls: float
    prompt_tokens: float
    output_tokens: float
    uncached_tokens: float | None = None  # prompt tokens left after prefix caching (None: not modelled)
    source: str = ""


def worst_of(study, settings, cases: list[dict]) -> WorstCase | None:
    """The worst case over ``cases`` (the longest of each role, the most calls and tokens), or None where the study
    declares none."""
    worst = [w for w in (study.worst_case(settings, c) for c in cases) if w is not None]
    if not worst:
        return None
    longest: dict[str, int] = {}
    for w in worst:
        for role, n in w.longest.items():
            longest[role] = max(longest.get(role, 0), n)
    top = max(worst, key=lambda w: w.prompt_tokens + w.output_tokens)
    return WorstCase(longest, max(w.calls for w in worst), top.prompt_tokens, top.output_tokens, worst[0].budget)


def context_of(ref: str) -> int | None:
    """The context a role's model is served with here (the registry's ``context_length``); None for an unknown alias."""
    from models.registry import get_spec
    from serving.refs import ModelRef

    try:
        return get_spec(ModelRef.parse(ref).alias).context_length
    except Exception:  # noqa: BLE001 - an endpoint elsewhere under a name the registry lacks: nothing to compare
        return None


def overflows(study, settings, cases: list[dict], served: dict[str, int] | None = None) -> list[tuple[str, str, int, int]]:
    """(role, model, longest request, context) for each role whose longest request exceeds its model's context
    (``served``: role -> the context its server reports, where known; else the registry's)."""
    worst = worst_of(study, settings, cases)
    if worst is None:
        return []
    out = []
    for role, need in worst.longest.items():
        ref = settings.roles.get(role)
        ctx = (served or {}).get(role) or (context_of(ref) if ref else None)
        if ctx and need > ctx:
            out.append((role, ref, need, ctx))
    return out


def fitting_configs(study, settings, cases: list[dict]) -> list[str]:
    """The study's shipped configs (its default config's folder) whose worst case fits these roles' models."""
    from experiments.core.config import load_settings

    default = study.default_config({})
    if default is None:
        return []
    out = []
    for path in sorted(Path(default).parent.glob("*.yaml")):
        try:
            other = load_settings(study.settings_cls, path, {"roles": dict(settings.roles), "data": settings.data})
            if worst_of(study, other, cases) is not None and not overflows(study, other, cases):
                out.append(str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path))
        except Exception:  # noqa: BLE001 - a config for other data or another loop: not one to offer
            continue
    return out


def fit_hint(study, settings, cases: list[dict]) -> str:
    """What fits, in a few words: the study's config made for these models, or the settings to shorten."""
    fits = fitting_configs(study, settings, cases)
    return (f"the config made for this model: --config {' or '.join(fits)}" if fits else
            "a shorter turn budget or max_tokens (--set), or a model with a longer context, fits it")


def fit_warning(study, settings, cases: list[dict], served: dict[str, int] | None = None) -> str | None:
    """One paragraph when a role's longest request under these settings exceeds its model's context: what, by how much,
    the configs that fit; None when everything fits (or the study declares no worst case)."""
    over = overflows(study, settings, cases, served)
    if not over:
        return None
    worst = worst_of(study, settings, cases)
    by_model: dict[tuple[str, int], list[str]] = {}
    for role, model, need, ctx in over:
        by_model.setdefault((model, ctx), []).append(f"{role} {need:,}")
    parts = [f"{model}'s context is {ctx:,} tokens, and the longest request (prompt and reply) may reach about: {', '.join(needs)}"
             for (model, ctx), needs in by_model.items()]
    return ("this configuration may not fit its model: " + "; ".join(parts)
            + (f" ({worst.budget}, the case text at {CHARS_PER_TOKEN} characters a token)" if worst and worst.budget else "")
            + ". A case whose conversation grows that long fails (HTTP 400 from the server) and is not scored; "
            + fit_hint(study, settings, cases) + ". The run goes on.")


def is_context_error(error: str) -> bool:
    """A server's refusal of a request longer than its context (vLLM: "maximum context length", HTTP 400)."""
    said = (error or "").lower()
    return any(x in said for x in ("context length", "max_model_len", "maximum context", "maximum model length", "too long"))


# ------------------------------------------------------------------ a run on one GPU, on paper

@dataclass(frozen=True)
class Gpu:
    """A GPU class, named by its memory: what `nvidia-smi` reports of it, its memory bandwidth and dense BF16 compute."""

    gb: int
    example: str
    gib: float  # memory nvidia-smi reports
    bandwidth: float  # bytes/s
    flops: float  # dense BF16 FLOP/s


GPUS = {24: Gpu(24, "A10", 22.5, 600e9, 125e12), 48: Gpu(48, "RTX A6000", 45.0, 768e9, 155e12),
        80: Gpu(80, "H100 SXM", 79.6, 3350e9, 989e12)}
H100_DECODE = 3958.4  # output tok/s, Llama 3.1 8B, 1x H100 SXM, 256 in flight (serving/bench/paper_estimate.py, cited)
H100_PARAMS = 8.03e9  # that model's parameters: the figure scales with compute per token
PREFILL_UTILISATION = 0.40  # of dense BF16 compute, assumed (serving/bench/paper_estimate.py)
DECODE_BANDWIDTH = 0.5  # of memory bandwidth a decode step achieves reading the weights, assumed


def gpu_of(gb: int) -> Gpu:
    """The named class, or one scaled from the nearest below (memory as named, bandwidth and compute of that class)."""
    if gb in GPUS:
        return GPUS[gb]
    base = GPUS[max([k for k in GPUS if k <= gb] or [24])]
    return Gpu(gb, f"{base.example}-class", round(gb * 0.9375, 1), base.bandwidth, base.flops)


@dataclass
class GpuPlan:
    gpu: Gpu
    model: str
    at_once: int  # units in flight (what concurrency: auto becomes)
    kv_gib: float
    kv_tokens: int
    decode_tok_s: float
    prefill_tok_s: float
    hours: float  # every prompt prefilled in full
    hours_cached: float | None = None  # with the prefix caching the typical figures model
    lines: list[str] = field(default_factory=list)


def gpu_plan(alias: str, dtype: str, gb: int, units: int, prompt_tokens: float, output_tokens: float,
             uncached_tokens: float | None = None) -> GpuPlan | None:
    """``units`` units of ``prompt_tokens`` / ``output_tokens`` each, served by ``alias`` alone on one GPU of ``gb``
    GB: units at once (the KV cache left by serving/gpu_memory.py's arithmetic / 2,048 tokens a unit, at most 256, as
    ``concurrency: auto``) and hours. None when the registry gives no size for the model or it does not fit."""
    from experiments.core.concurrency import AUTO_PER_GPU, TOKENS_PER_CASE
    from models.registry import get_spec
    from serving.gpu_memory import GIB, MAX_SHARE, RUNTIME_GIB, size_of

    spec = get_spec(alias)
    size = size_of(spec, dtype if dtype != "auto" else spec.dtype)
    if size is None:
        return None
    g = gpu_of(gb)
    kv_gib = MAX_SHARE * g.gib - size.weights_gib - RUNTIME_GIB
    per_token = size.kv_gib / size.context
    if kv_gib < size.kv_gib:  # vLLM refuses to start without one full-context sequence's cache
        return None
    kv_tokens = int(kv_gib / per_token)
    at_once = max(1, min(AUTO_PER_GPU, kv_tokens // TOKENS_PER_CASE))
    weights_bytes = size.weights_gib * GIB
    decode = min(at_once * DECODE_BANDWIDTH * g.bandwidth / weights_bytes, H100_DECODE * g.flops / GPUS[80].flops * H100_PARAMS / size.params)
    prefill = g.flops * PREFILL_UTILISATION / (2 * size.params)
    hours = (units * prompt_tokens / prefill + units * output_tokens / decode) / 3600
    cached = (units * uncached_tokens / prefill + units * output_tokens / decode) / 3600 if uncached_tokens is not None else None
    return GpuPlan(g, alias, at_once, kv_gib, kv_tokens, decode, prefill, hours, cached)


def plan_lines(study, settings, cases: list[dict], *, gpu_memory: int | None = None, plan_from: str | None = None) -> list[str]:
    """The dry run's plan: the full run's requests and tokens from the protocol's worst case, a typical unit (a
    previous run's call log with ``plan_from``, else the study's declared figures), and per GPU size the units at
    once and hours for the model under test."""
    from serving.refs import ModelRef

    noun = getattr(study, "unit_noun", "cases")
    n = len(cases)
    lines = []
    worst = worst_of(study, settings, cases)
    if worst is not None:
        lines.append(f"plan: {n:,} {noun if n != 1 else noun[:-1]}; at most {worst.calls} request(s) per {noun[:-1]} ({worst.budget}): at most {n * worst.calls:,} "
                     f"requests, {n * worst.prompt_tokens:,} prompt and {n * worst.output_tokens:,} output tokens in all")
    typical = measured(plan_from) if plan_from else study.typical(settings)
    if typical is not None and not plan_from and worst is not None and typical.calls > worst.calls:
        typical = None  # the study's figures are for another budget than these settings'
    if typical is not None:
        lines.append(f"plan: typical {noun[:-1]}: {typical.calls:.1f} requests, {typical.prompt_tokens:,.0f} prompt and {typical.output_tokens:,.0f} output "
                     f"tokens ({typical.source}): about {n * typical.calls:,.0f} requests in all")
    basis = typical or (Typical(worst.calls, worst.prompt_tokens, worst.output_tokens, source="the worst case") if worst else None)
    if basis is None:
        return lines
    ref = ModelRef.parse(settings.roles.get(study.primary_role) or next(iter(settings.roles.values())))
    if ref.url:
        return lines + [f"plan: {ref} is served elsewhere: no GPU plan here (give --concurrency N)"]
    from models.registry import get_spec

    if get_spec(ref.alias).gpus == 0 and not gpu_memory:
        return lines + [f"plan: {ref.alias} is served on the CPU (models/registry.yaml, gpus: 0): no GPU plan "
                        "(--gpu-memory GB plans it on a GPU all the same)"]
    sizes = [gpu_memory] if gpu_memory else sorted(GPUS)
    others = sorted({ModelRef.parse(r).alias for r in settings.roles.values()} - {ref.alias})
    for gb in sizes:
        p = gpu_plan(ref.alias, settings.dtype or "auto", gb, n, basis.prompt_tokens, basis.output_tokens, basis.uncached_tokens)
        if p is None:
            lines.append(f"plan: {ref.alias} on one {gb} GB GPU: does not fit (or the registry gives no size for it)")
            continue
        lines.append(f"plan: {ref.alias} alone on one {gb} GB GPU ({p.gpu.example}-class, {p.gpu.gib} GiB): {p.at_once} {noun} at once "
                     f"({p.kv_gib:.1f} GiB of KV cache = {p.kv_tokens:,} tokens / 2,048 a {noun[:-1]}); about {hours(p.hours)}"
                     + (f" ({hours(p.hours_cached)} with prefix caching)" if p.hours_cached is not None else "")
                     + f" for {n:,} {noun if n != 1 else noun[:-1]} of the {'typical' if typical else 'worst'} size: prompts at {p.prefill_tok_s:,.0f} tok/s, "
                     f"replies at {p.decode_tok_s:,.0f} tok/s")
    lines.append("plan: computed, not measured on a GPU: weights and KV cache from models/registry.yaml; replies at "
                 f"{DECODE_BANDWIDTH:.0%} of the GPU's memory bandwidth per step x {noun} at once, at most the cited H100 figure "
                 f"({H100_DECODE:,.0f} tok/s) scaled by compute; prompts at {PREFILL_UTILISATION:.0%} of its BF16 compute"
                 + (f"; the other roles' models ({', '.join(others)}) need a server of their own: docs/running-studies.md, one GPU or two" if others else "")
                 + " (docs/running-studies.md, planning a run)")
    return lines


def hours(h: float) -> str:
    return f"{h:.1f} GPU-hours" if h >= 1 else f"{h:.2f} GPU-hours" if h >= 0.1 else f"{max(1, round(h * 60))} GPU-minute(s)"


def measured(run_dir: str) -> Typical:
    """The mean calls and tokens per finished unit of a previous run's call log (``--plan-from RUN``)."""
    from models.errors import DataError
    from serving.bench.paper_estimate import workload

    if not (Path(run_dir) / "records.jsonl").exists():
        raise DataError(f"--plan-from {run_dir}: no records.jsonl there (a results folder of an earlier run)")
    try:
        w = workload(run_dir)
    except SystemExit as e:
        raise DataError(f"--plan-from {e}") from None
    k = w["case_trials"]
    return Typical(w["calls"] / k, w["prompt"] / k, w["output"] / k, w["uncached"] / k,
                   source=f"measured in {run_dir}: {k} finished unit(s)")
