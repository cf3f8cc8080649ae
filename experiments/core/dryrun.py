"""``--dry-run`` for every study command: every request built exactly as the run would send it, none sent.

The run goes through the one runner (:func:`experiments.core.runner.run_study`) with a
:class:`RecordingClient` in place of the model client: no server is started or contacted, no
response cache is read or written, and every call is answered with an empty text so the study's
own loop carries on. The runner's results files go to a throw-away directory; the only file written
to ``OUT`` is ``dry-run.jsonl``: one line per request, in case order, with ``case_id``, ``role``,
``step``, the sampling settings and either ``messages`` (chat) or ``prompt`` (completion).

Multi-turn studies (DERA, CRAFT-MD, autoeval) continue on empty answers, so the first request of
each conversation is exactly what a real run sends, and later ones show the shape of the turns that
follow (their content depends on answers a real model would have given; loops that stop on an empty
answer end early). Requests a study makes once per run before its cases (set-up) come first, with
``case_id`` null.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from serving.client import ChatResult, GenConfig

DRY_RUN_FILE = "dry-run.jsonl"


class RecordingClient:
    """Stands in for :class:`serving.client.LLMClient`: records each request, answers with an empty text."""

    endpoints: dict = {}

    def __init__(self):
        self.calls: list[dict] = []

    async def chat(self, messages: list[dict], role: str = "default", gen: GenConfig = GenConfig()) -> ChatResult:
        self.calls.append({"role": role, "kind": "chat", "messages": messages})
        return ChatResult(texts=[""] * max(gen.n, 1), finish_reasons=["stop"] * max(gen.n, 1))

    async def complete(self, prompt: str, role: str = "default", gen: GenConfig = GenConfig()) -> ChatResult:
        self.calls.append({"role": role, "kind": "completion", "prompt": prompt})
        return ChatResult(texts=[""] * max(gen.n, 1), finish_reasons=["stop"] * max(gen.n, 1))

    async def served_context_length(self, role: str = "default") -> int | None:
        return None  # no server: the registry's context length applies

    def usage_summary(self) -> dict:
        zero = {"requests": 0, "failed": 0, "prompt_tokens": 0, "completion_tokens": 0, "cache_hits": 0, "seconds": 0.0}
        return {"total": dict(zero, requests=len(self.calls))}


def _line(case_id, call: dict) -> dict:
    row = {"case_id": case_id, "role": call["role"], "step": call.get("step", "setup"), "kind": call["kind"]}
    if "gen" in call:
        row["gen"] = call["gen"]
    row["messages" if call["kind"] == "chat" else "prompt"] = call["messages" if call["kind"] == "chat" else "prompt"]
    return row


async def dry_run(study, settings, cases: list[dict], *, log=print) -> Path:
    """Run the study against a :class:`RecordingClient`; write ``<settings.out>/dry-run.jsonl``; return its path."""
    from experiments.core.results import read_jsonl
    from experiments.core.runner import run_study

    out = Path(settings.out)
    client = RecordingClient()
    with tempfile.TemporaryDirectory(prefix="medstack-dry-run-") as tmp:
        scratch = settings.model_copy(update={"out": tmp, "use_cache": False})
        try:
            await run_study(study, scratch, cases, client=client, log=lambda *_: None)
        except Exception as e:  # noqa: BLE001 - metrics over empty answers may not compute; the requests are what we want
            log(f"(dry run: the study's metrics over empty answers did not compute: {type(e).__name__}: {e})")
        records = {str(r["id"]): r for r in read_jsonl(Path(tmp) / "records.jsonl")} if (Path(tmp) / "records.jsonl").exists() else {}
    per_case = sum(len(r.get("calls") or []) for r in records.values())
    rows = [_line(None, c) for c in client.calls[: max(0, len(client.calls) - per_case)]]
    for c in cases:
        rec = records.get(str(c["id"]))
        rows += [_line(c["id"], call) for call in (rec or {}).get("calls") or []]
    out.mkdir(parents=True, exist_ok=True)
    path = out / DRY_RUN_FILE
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    for line in study.describe(settings):
        log(line)
    log(f"dry run: {len(rows)} request(s) of {len(cases)} case(s) written to {path}; nothing was sent")
    return path
