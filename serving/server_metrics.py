"""Read a vLLM server's Prometheus ``/metrics`` and turn two snapshots into run figures.

``scrape(base_url)`` returns ``{sample name: value}`` with label sets summed (a server serves
one model, so summing over ``model_name`` / ``engine`` labels loses nothing); histogram
buckets are dropped, their ``_sum`` and ``_count`` kept. Two snapshots taken before and after
a workload give its figures as differences:

- ``prefix_cache_hit_rate(before, after)``: prefix-cache hit tokens / queried tokens
  (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``; older builds call them
  ``vllm:gpu_prefix_cache_*``). ``None`` when nothing was queried or the server has no such
  counter.
- ``ttft_split(before, after)``: mean queueing time (``vllm:request_queue_time_seconds``)
  and mean prefill time (``vllm:request_prefill_time_seconds``) per request, and the
  server-side mean TTFT (``vllm:time_to_first_token_seconds``), each in ms.

Scraping never raises: an unreachable server or a build without ``/metrics`` gives ``{}``,
and every figure computed from an empty snapshot is ``None``.
"""

from __future__ import annotations

import math
import re

from serving.secrets import open_keyed

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$")

PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits")
QUEUE = "vllm:request_queue_time_seconds"
PREFILL = "vllm:request_prefill_time_seconds"
TTFT = "vllm:time_to_first_token_seconds"


def metrics_url(base_url: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port/metrics``."""
    return base_url.rstrip("/").rsplit("/v1", 1)[0] + "/metrics"


def parse(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {name: value summed over label sets}; ``_bucket`` samples dropped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m or m.group(1).endswith("_bucket"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def scrape(base_url: str, api_key: str | None = None, timeout: float = 5.0) -> dict[str, float]:
    """One snapshot of the server's counters; ``{}`` if it cannot be read."""
    try:
        with open_keyed(metrics_url(base_url), api_key, timeout) as r:
            return parse(r.read().decode("utf-8", errors="replace"))
    except Exception:  # noqa: BLE001 - metrics are optional extras, never fatal
        return {}


def _first(snapshot: dict, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in snapshot), None)


def delta(before: dict, after: dict, name: str) -> float | None:
    if name not in after:
        return None
    return after[name] - before.get(name, 0.0)


def prefix_cache_hit_rate(before: dict, after: dict) -> float | None:
    """Prefix-cache hit tokens / queried tokens between two snapshots (None if unknown or nothing queried)."""
    q, h = _first(after, PREFIX_QUERIES), _first(after, PREFIX_HITS)
    if q is None or h is None:
        return None
    queries, hits = delta(before, after, q), delta(before, after, h)
    if not queries or queries <= 0:
        return None
    return round(hits / queries, 4)


def _mean_ms(before: dict, after: dict, hist: str) -> float | None:
    s, c = delta(before, after, hist + "_sum"), delta(before, after, hist + "_count")
    if s is None or not c or c <= 0:
        return None
    return round(1000.0 * s / c, 2)


def ttft_split(before: dict, after: dict) -> dict:
    """Server-side mean queueing, prefill and TTFT per request (ms) between two snapshots."""
    return {
        "queue_ms_mean": _mean_ms(before, after, QUEUE),
        "prefill_ms_mean": _mean_ms(before, after, PREFILL),
        "server_ttft_ms_mean": _mean_ms(before, after, TTFT),
    }


def summary(before: dict, after: dict) -> dict:
    """Everything a run or a bench level records from two snapshots."""
    q, h = _first(after, PREFIX_QUERIES), _first(after, PREFIX_HITS)
    return {
        "prefix_cache_hit_rate": prefix_cache_hit_rate(before, after),
        "prefix_cache_queried_tokens": delta(before, after, q) if q else None,
        "prefix_cache_hit_tokens": delta(before, after, h) if h else None,
        **ttft_split(before, after),
    }


def combine(snapshots: list[dict]) -> dict[str, float]:
    """Several servers' snapshots summed (a replica group's counters as one server's)."""
    out: dict[str, float] = {}
    for snap in snapshots:
        for name, value in snap.items():
            out[name] = out.get(name, 0.0) + value
    return out


def endpoint_figures(targets: dict[str, list[str]], before: dict[str, dict], after: dict[str, dict]) -> dict:
    """``summary`` per scraped server; for an endpoint backed by several (a replica group) also the group's
    figures over the servers that answered both scrapes, under the endpoint's own URL."""
    out = {}
    for url, members in targets.items():
        answered = [m for m in members if before.get(m) and after.get(m)]
        if members != [url] and answered:
            out[url] = {**summary(combine([before[m] for m in answered]), combine([after[m] for m in answered])),
                        "replicas": len(members), "replicas_scraped": len(answered)}
        for m in members:
            if before.get(m):
                out[m] = summary(before[m], after.get(m) or {})
    return out
