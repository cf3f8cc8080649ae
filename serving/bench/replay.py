"""Replay a real run's calls: the speed-up a user gets on their own experiment.

A results directory holds ``config.yaml`` (with ``concurrency``) and ``records.jsonl``: one JSON object per case
(the last line per ``id`` wins), each with a ``calls`` list (serving.client's call log: ``index``, ``role``,
``step``, ``kind``, ``messages`` | ``prompt``, ``gen``, tokens, ``t_start``, ``after``, ``cached``, ``error``).
What is replayed and how: serving/bench/README.md, Replay. ``max_tokens`` = the recorded completion tokens
with ``ignore_eos`` and ``min_tokens`` and no ``stop``, so each call generates exactly what the run generated.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

import yaml

from models.errors import DataError
from models.registry import get_spec


@dataclass
class ReplayCall:
    case: str
    index: int
    role: str
    step: str
    kind: str
    messages: list | None
    prompt: str | None
    gen: dict
    prompt_tokens: int
    completion_tokens: int
    t_start: float
    after: int | None
    replay: bool
    """False for calls that did not reach the engine (cache hits, errors, no tokens): they only order others."""

    @property
    def n(self) -> int:
        return max(1, int(self.gen.get("n") or 1))

    @property
    def tokens_per_choice(self) -> int:
        return max(1, math.ceil(self.completion_tokens / self.n))


@dataclass
class ReplayWorkload:
    run_dir: str
    concurrency: int
    cases: dict[str, list[ReplayCall]] = field(default_factory=dict)
    failed_cases: int = 0
    skipped_calls: dict = field(default_factory=dict)

    @property
    def calls(self) -> list[ReplayCall]:
        return [c for calls in self.cases.values() for c in calls if c.replay]

    def in_call_order(self) -> list[ReplayCall]:
        """The replayed calls in the order the run started them (ties: case, index)."""
        return sorted(self.calls, key=lambda c: (c.t_start, c.case, c.index))

    def describe(self) -> dict:
        calls = self.calls
        return {
            "run_dir": self.run_dir, "concurrency": self.concurrency, "cases": len(self.cases), "failed_cases": self.failed_cases,
            "calls": len(calls), "skipped_calls": self.skipped_calls,
            "prompt_tokens": sum(c.prompt_tokens for c in calls), "completion_tokens": sum(c.completion_tokens for c in calls),
            "by_kind": {k: sum(1 for c in calls if c.kind == k) for k in sorted({c.kind for c in calls})},
        }


def _read_concurrency(run: Path) -> int:
    cfg_path = run / "config.yaml"
    try:
        cfg = yaml.safe_load(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise DataError(f"{cfg_path}: not a readable YAML file ({type(e).__name__}; is {run} a results directory?)") from None
    cfg = cfg if isinstance(cfg, dict) else {}
    conc = cfg.get("concurrency")
    if conc is None and isinstance(cfg.get("run"), dict):
        conc = cfg["run"].get("concurrency")
    if not isinstance(conc, int) or conc < 1:
        raise DataError(f"{cfg_path}: no positive integer 'concurrency'")
    return conc


def _call(case: str, raw: dict, where: str) -> ReplayCall:
    try:
        kind = raw["kind"]
        if kind not in ("chat", "completion"):
            raise DataError(f"{where}: call kind {kind!r} is neither 'chat' nor 'completion'")
        if kind == "chat" and not isinstance(raw.get("messages"), list):
            raise DataError(f"{where}: chat call {raw.get('index')} has no 'messages' list")
        if kind == "completion" and not isinstance(raw.get("prompt"), str):
            raise DataError(f"{where}: completion call {raw.get('index')} has no 'prompt' string")
        completion_tokens = int(raw.get("completion_tokens") or 0)
        after = raw.get("after")
        return ReplayCall(
            case=case, index=int(raw["index"]), role=str(raw.get("role", "")), step=str(raw.get("step", "")), kind=kind,
            messages=raw.get("messages"), prompt=raw.get("prompt"), gen=dict(raw.get("gen") or {}),
            prompt_tokens=int(raw.get("prompt_tokens") or 0), completion_tokens=completion_tokens,
            t_start=float(raw.get("t_start") or 0.0), after=None if after is None else int(after),
            replay=not raw.get("cached") and not raw.get("error") and completion_tokens > 0,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(f"{where}: malformed call ({type(e).__name__}: {e})") from None


def load_workload(run_dir: str | Path) -> ReplayWorkload:
    """Read a results directory's config.yaml and records.jsonl into the calls to replay."""
    run = Path(run_dir)
    if not run.is_dir():
        raise DataError(f"{run}: no such results directory")
    conc = _read_concurrency(run)
    rec_path = run / "records.jsonl"
    if not rec_path.exists():
        raise DataError(f"{rec_path}: no records.jsonl")
    wl = ReplayWorkload(run_dir=str(run), concurrency=conc)
    skipped = {"cached": 0, "error": 0, "no_tokens": 0}
    for case_id, (lineno, row) in latest_records(rec_path).items():
        if row.get("status") == "failed":
            wl.failed_cases += 1
        raw_calls = row.get("calls") or []
        if not isinstance(raw_calls, list):
            raise DataError(f"{rec_path}:{lineno}: 'calls' is not a list")
        calls = [_call(case_id, c, f"{rec_path}:{lineno}") for c in raw_calls]
        indices = {c.index for c in calls}
        if len(indices) != len(calls):
            raise DataError(f"{rec_path}:{lineno}: case {case_id} has duplicate call indices")
        for c in calls:
            if c.after is not None and c.after not in indices:
                raise DataError(f"{rec_path}:{lineno}: call {c.index} waits for call {c.after}, which case {case_id} does not have")
            if not c.replay:
                raw = next(r for r in raw_calls if int(r["index"]) == c.index)
                skipped["cached" if raw.get("cached") else "error" if raw.get("error") else "no_tokens"] += 1
        _check_acyclic(calls, f"{rec_path}:{lineno}")
        if calls:
            wl.cases[case_id] = sorted(calls, key=lambda c: c.index)
    wl.skipped_calls = skipped
    if not wl.calls:
        raise DataError(f"{rec_path}: no calls to replay (the run's records carry no 'calls', or every call was a cache hit)")
    return wl


def latest_records(path: Path, keep=lambda row: row) -> dict[str, tuple[int, object]]:
    """id -> (line number, ``keep(record)``) of the last record of that id (resumed / retried cases), read line by
    line (``keep`` may reduce each as it is read). A torn last line (a kill mid-write) is dropped, any other bad
    line named."""
    last: dict = {}
    pending = None  # a line that did not parse: an error unless it is the last one
    with open(path, "rb") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            if pending:
                raise pending
            try:
                row = json.loads(line)  # not orjson: it takes several times a long line's size in memory
            except ValueError as e:
                pending = DataError(f"{path}:{i}: not valid JSON ({e})")
                continue
            if not isinstance(row, dict) or "id" not in row:
                raise DataError(f"{path}:{i}: not a JSON object with an 'id'")
            last[str(row["id"])] = (i, keep(row))
    return last


def _check_acyclic(calls: list[ReplayCall], where: str) -> None:
    after = {c.index: c.after for c in calls}
    for start in after:
        seen, i = set(), start
        while i is not None:
            if i in seen:
                raise DataError(f"{where}: calls wait for each other in a cycle (call {start})")
            seen.add(i)
            i = after.get(i)


# ---------------------------------------------------------------- scheduling

async def schedule(cases: dict[str, list[ReplayCall]], send: Callable[[ReplayCall], Awaitable[dict]], concurrency: int) -> list[dict]:
    """Run every case, ``concurrency`` cases at a time; inside a case a call starts when the call
    it waits for (``after``) has finished. ``send(call)`` runs one call and returns its record;
    calls with ``replay=False`` are not sent but still release the calls waiting for them."""
    sem = asyncio.Semaphore(concurrency)
    results: list[dict] = []

    async def run_case(calls: list[ReplayCall]) -> None:
        async with sem:
            done = {c.index: asyncio.Event() for c in calls}

            async def run_call(c: ReplayCall) -> None:
                try:
                    if c.after is not None:
                        await done[c.after].wait()
                    if c.replay:
                        results.append(await send(c))
                finally:
                    done[c.index].set()

            await asyncio.gather(*(run_call(c) for c in calls))

    await asyncio.gather(*(run_case(calls) for calls in cases.values()))
    return results


# ---------------------------------------------------------------- endpoint

def _sampling(c: ReplayCall, send_seed: bool) -> dict:
    g = c.gen
    body = {"max_tokens": c.tokens_per_choice, "temperature": float(g.get("temperature") or 0.0), "n": c.n}
    if g.get("top_p") is not None:
        body["top_p"] = float(g["top_p"])
    if g.get("frequency_penalty"):
        body["frequency_penalty"] = float(g["frequency_penalty"])
    if send_seed and g.get("seed") is not None:
        body["seed"] = int(g["seed"])
    return body


def _new_record(c: ReplayCall) -> dict:
    """The result record of one replayed call, before it is sent (failures are data)."""
    return {"case": c.case, "index": c.index, "kind": c.kind, "role": c.role, "step": c.step, "expected_tokens": c.completion_tokens,
            "success": False, "error": "", "prompt_tokens": 0, "completion_tokens": 0}


async def send_call(sdk, model: str, c: ReplayCall, *, send_seed: bool = False) -> dict:
    """One replayed call against the endpoint (not streamed); failures are data."""
    body = _sampling(c, send_seed)
    extra = {"ignore_eos": True, "min_tokens": c.tokens_per_choice}
    rec = _new_record(c)
    t0 = time.perf_counter()
    rec["start"] = t0
    try:
        if c.kind == "chat":
            r = await sdk.chat.completions.create(model=model, messages=c.messages, extra_body=extra, **body)
        else:
            r = await sdk.completions.create(model=model, prompt=c.prompt, extra_body=extra, **body)
        rec["prompt_tokens"] = r.usage.prompt_tokens if r.usage else 0
        rec["completion_tokens"] = r.usage.completion_tokens if r.usage else 0
        rec["success"] = True
    except Exception as e:  # noqa: BLE001 - every failure becomes a record
        rec["error"] = f"{type(e).__name__}: {e}"
    rec["latency"] = time.perf_counter() - t0
    return rec


async def replay_endpoint(wl: ReplayWorkload, sdk, model: str, *, send_seed: bool = False, concurrency: int | None = None) -> tuple[dict, list[dict]]:
    t0 = time.perf_counter()
    records = await schedule(wl.cases, lambda c: send_call(sdk, model, c, send_seed=send_seed), concurrency or wl.concurrency)
    return figures(records, time.perf_counter() - t0, "vllm", concurrency or wl.concurrency), records


def figures(records: list[dict], wall: float, engine: str, concurrency: int) -> dict:
    ok = [r for r in records if r["success"]]
    out_tokens = sum(r["completion_tokens"] for r in ok)
    in_tokens = sum(r["prompt_tokens"] for r in ok)
    lat = sorted(r["latency"] for r in ok)
    return {
        "engine": engine, "concurrency": concurrency, "calls": len(records), "completed": len(ok), "failed": len(records) - len(ok),
        "wall_s": round(wall, 3), "prompt_tokens": in_tokens, "output_tokens": out_tokens,
        "expected_output_tokens": sum(r["expected_tokens"] for r in records),
        "output_tokens_per_s": round(out_tokens / wall, 3) if wall > 0 else None,
        "total_tokens_per_s": round((in_tokens + out_tokens) / wall, 3) if wall > 0 else None,
        "call_latency_s_mean": round(sum(lat) / len(lat), 3) if lat else None,
        "first_error": next((r["error"] for r in records if not r["success"]), None),
    }


# ---------------------------------------------------------------- transformers batch-1 loop

def _chat_template(alias: str) -> str | None:
    p = get_spec(alias).chat_template_path()
    return Path(p).read_text() if p else None


def replay_hf(wl: ReplayWorkload, model, tokenizer, chat_template: str | None, log=print) -> tuple[dict, list[dict]]:
    """Every replayed call, one at a time in the run's order, through ``generate`` with batch 1."""
    import torch

    records = []
    calls = wl.in_call_order()
    t0 = time.perf_counter()
    for i, c in enumerate(calls):
        rec = _new_record(c)
        start = time.perf_counter()
        rec["start"] = start
        try:
            if c.kind == "chat":
                text = tokenizer.apply_chat_template(c.messages, chat_template=chat_template, tokenize=False, add_generation_prompt=True)
                ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
            else:
                ids = tokenizer(c.prompt, return_tensors="pt").input_ids
            temp = float(c.gen.get("temperature") or 0.0)
            kw = {"do_sample": True, "temperature": temp, "top_p": float(c.gen.get("top_p") or 1.0)} if temp > 0 else {"do_sample": False}
            with torch.inference_mode():
                out = model.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=c.tokens_per_choice, min_new_tokens=c.tokens_per_choice,
                    num_return_sequences=c.n, pad_token_id=model.config.pad_token_id if model.config.pad_token_id is not None else 0, **kw,
                )
            rec["prompt_tokens"] = int(ids.shape[1])
            rec["completion_tokens"] = int((out.shape[1] - ids.shape[1]) * out.shape[0])
            rec["success"] = True
        except Exception as e:  # noqa: BLE001 - failures are data
            rec["error"] = f"{type(e).__name__}: {e}"
        rec["latency"] = time.perf_counter() - start
        records.append(rec)
        if (i + 1) % 25 == 0:
            log(f"  transformers replay: {i + 1}/{len(calls)} calls, {time.perf_counter() - t0:.0f} s")
    return figures(records, time.perf_counter() - t0, "hf", 1), records


def speedup(vllm: dict, hf: dict | None) -> dict | None:
    if not hf or not vllm.get("wall_s") or not hf.get("wall_s"):
        return None
    return {"wall_time": round(hf["wall_s"] / vllm["wall_s"], 2),
            "output_tokens_per_s": round(vllm["output_tokens_per_s"] / hf["output_tokens_per_s"], 2) if hf.get("output_tokens_per_s") else None}


def write_requests(path: Path, records: list[dict], engine: str) -> None:
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps({"engine": engine, **r}) + "\n")
