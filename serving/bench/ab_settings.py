"""Side-by-side comparison of CPU serving settings (the measurements behind launcher.CPU_DEFAULTS).

    python -m serving.bench.ab_settings --arms auto,bind,bind+iomp --repeats 3 --out runs/ab.jsonl

Starts one server per arm (``--parallel`` of them alive at a time, idle while another is
measured), then interleaves: repeat 1 of every arm, repeat 2 of every arm, ..., with new prompts each repeat. Each round
measures three shapes on the same server: 1 request (64 in / 64 out), 32 concurrent
(64 in / 64 out) and long prompts (8 concurrent, 512 in / 32 out). One JSON line per
(arm, repeat, shape); ``--summarize FILE`` prints medians and spreads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from serving.bench import prompts as P
from serving.bench.measure import calculate_metrics
from serving.bench.send import send_completion
from serving.bench.summary import fixed_width
from models.registry import resolve_weights
from serving import server_metrics
from serving.launcher import (ServerSettings, kill_group, healthy, logs_dir, port_free, running_servers, servers_dir, start_server,
                              wait_healthy)

ARMS = {
    "auto": {"cpu_threads_bind": "auto", "preload_iomp": False},
    "auto+reserved0": {"cpu_threads_bind": "auto", "cpu_reserved": 0, "preload_iomp": False},
    "bind": {"cpu_threads_bind": "all", "preload_iomp": False},
    "bind+iomp": {"cpu_threads_bind": "all", "preload_iomp": True},
    "nobind+omp2": {"cpu_threads_bind": "nobind", "omp_threads": 2, "preload_iomp": False},
    "bind+iomp+kv1": {"cpu_threads_bind": "all", "preload_iomp": True, "cpu_kvcache_gb": 1},
    "bind+iomp+kv4": {"cpu_threads_bind": "all", "preload_iomp": True, "cpu_kvcache_gb": 4},
    "bind+iomp+seqs32": {"cpu_threads_bind": "all", "preload_iomp": True, "max_num_seqs": 32},
    "bind+iomp+seqs64": {"cpu_threads_bind": "all", "preload_iomp": True, "max_num_seqs": 64},
    "bind+iomp-chunked": {"cpu_threads_bind": "all", "preload_iomp": True, "chunked_prefill": False},
    "bind+iomp-prefix": {"cpu_threads_bind": "all", "preload_iomp": True, "prefix_caching": False},
}
SHAPES = [("c1", 1, 1, 64, 64), ("c32", 32, 32, 64, 32), ("long", 8, 8, 512, 16)]  # name, concurrency, requests, in, out


async def measure(base_url: str, prompts: dict, shape) -> dict:
    import openai

    name, conc, n, inp, out = shape
    sdk = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", timeout=1800, max_retries=0)
    sem = asyncio.Semaphore(conc)

    async def one(p):
        async with sem:
            return await send_completion(sdk, "embedded", p, out)

    try:
        await send_completion(sdk, "embedded", prompts[inp][-1], 4)  # wake the server
        before = server_metrics.scrape(base_url)
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(one(p) for p in prompts[inp][:n]))
        fig = calculate_metrics(outs, time.perf_counter() - t0)
        fig["server"] = server_metrics.summary(before, server_metrics.scrape(base_url))
    finally:
        await sdk.close()
    return fig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arms", default="auto,bind,bind+iomp")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--port", type=int, default=8150)
    ap.add_argument("--out", default="runs/ab.jsonl")
    ap.add_argument("--summarize")
    ap.add_argument("--keep", action="store_true", help="leave the servers running (stop them yourself, by pid)")
    a = ap.parse_args()
    if a.summarize:
        summarize(a.summarize)
        return
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(resolve_weights("embedded")[1]))
    texts = P.load_texts()
    # fresh prompts every repeat: with prefix caching on, a repeat of the same prompts would skip their
    # prefill and flatter every arm but the one with caching off
    prompt_sets = [{n: P.build_prompts(tok, texts, 40, n, seed=7 + rep) for n in (64, 512)} for rep in range(a.repeats)]
    arms = a.arms.split(",")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    for g in range(0, len(arms), a.parallel):
        group = arms[g:g + a.parallel]
        recs = {}
        try:
            from concurrent.futures import ThreadPoolExecutor

            def up(i_arm):
                i, arm = i_arm
                port = a.port + g + i
                old = next((r for r in running_servers() if r["port"] == port), None)
                if old is None and not port_free("127.0.0.1", port):  # started by an earlier invocation, not yet recorded
                    old = {"alias": "embedded", "port": port, "base_url": f"http://127.0.0.1:{port}/v1", "pid": None,
                           "log": str(logs_dir() / f"serve-embedded-{port}.log")}
                if old:  # a server left by an earlier invocation on this arm's port
                    if not healthy(old["base_url"]):
                        wait_healthy(old["base_url"], None, Path(old["log"]), 900)
                    return arm, old
                s = ServerSettings(alias="embedded", port=port, startup_timeout=900, **ARMS[arm])
                rec = start_server(s, log=lambda m: print(m, flush=True))
                return arm, rec

            with ThreadPoolExecutor(len(group)) as ex:  # start the group's servers side by side
                recs = dict(ex.map(up, enumerate(group)))
            for arm, rec in recs.items():
                log = Path(rec["log"]).read_text(errors="replace")
                bind_lines = [line.split("]", 1)[-1].strip() for line in log.splitlines() if "core ids" in line or "reserved_cpus" in line]
                print(arm, bind_lines, flush=True)
            for rep in range(a.repeats):
                for arm in group:
                    for shape in SHAPES:
                        fig = asyncio.run(measure(recs[arm]["base_url"], prompt_sets[rep], shape))
                        row = {"arm": arm, "repeat": rep, "shape": shape[0], "loadavg": os.getloadavg()[0], **fig}
                        with open(a.out, "a") as f:
                            f.write(json.dumps(row) + "\n")
                        print(f"{arm:22s} rep {rep} {shape[0]:5s} {fig['output_tokens_per_s']:8.2f} tok/s  ttft p50 {fig['ttft_ms_p50']} ms "
                              f"failed {fig['failed']} load {row['loadavg']:.1f}", flush=True)
        finally:
            for rec in ([] if a.keep else recs.values()):
                if rec.get("pid"):  # None: a server found on the port without a record (its owner stops it)
                    kill_group(rec["pid"])
                (servers_dir() / f"{rec['alias']}-{rec['port']}.json").unlink(missing_ok=True)


def summarize(path: str) -> None:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    def cell(v: list[float]) -> str:
        return f"{statistics.median(v):.1f} [{min(v):.1f}-{max(v):.1f}] ({len(v)})" if v else "-"

    print(fixed_width(["arm", *(f"{s} out tok/s median [min-max] (n)" for s in shapes)], [[arm, *(cell(
        [r["output_tokens_per_s"] for r in rows if r["arm"] == arm and r["shape"] == s and not r["failed"]]) for s in shapes)] for arm in arms]))


if __name__ == "__main__":
    main()
