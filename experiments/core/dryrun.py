"""``--dry-run`` for every study command (docs/running-studies.md): the one runner with a :class:`RecordingClient`.

Every call is answered with the study's stand-in reply for that role (``Study.standins``: the k-th request of a role in
a case gets the k-th, the last repeats; an empty text where a role has none), so the study's own loop takes each of its
branches and the requests every branch sends are written; requests a study makes once per run before its cases come
first, with ``case_id`` null. The dry run says each kind of request (role, step) with its count and which replies stood
in. A dry run that builds no request for a non-empty case list exits 2 naming the cause.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from experiments.core.deviations import protocol_lines, protocol_stats
from experiments.core.results import read_jsonl
from experiments.core.plan import plan_lines
from experiments.core.runner import context_check, run_study
from experiments.core.scope import scope_line
from experiments.core.study import CURRENT_CASE
from models.errors import DataError, MedstackError
from serving.client import ChatResult, GenConfig

DRY_RUN_FILE = "dry-run.jsonl"


class RecordingClient:
    """Stands in for :class:`serving.client.LLMClient`: records each request, answers with the stand-in reply of its
    role (``standins``: role -> replies in turn, per case; none: an empty text)."""

    endpoints: dict = {}

    def __init__(self, standins: dict[str, tuple[str, ...]] | None = None):
        self.calls: list[dict] = []
        self.standins = dict(standins or {})
        self._asked: Counter = Counter()  # (case, role) -> requests so far

    def _reply(self, role: str, gen: GenConfig, request: str) -> ChatResult:
        replies = self.standins.get(role) or ("",)
        k = self._asked[(CURRENT_CASE.get(), role)]
        self._asked[(CURRENT_CASE.get(), role)] += 1
        text = replies(request) if callable(replies) else replies[min(k, len(replies) - 1)]
        return ChatResult(texts=[text] * max(gen.n, 1), finish_reasons=["stop"] * max(gen.n, 1))

    async def chat(self, messages: list[dict], role: str = "default", gen: GenConfig = GenConfig()) -> ChatResult:
        self.calls.append({"role": role, "kind": "chat", "messages": messages, "gen": _gen(gen)})
        return self._reply(role, gen, str(messages[-1].get("content") if messages else ""))

    async def complete(self, prompt: str, role: str = "default", gen: GenConfig = GenConfig()) -> ChatResult:
        self.calls.append({"role": role, "kind": "completion", "prompt": prompt, "gen": _gen(gen)})
        return self._reply(role, gen, prompt)

    def endpoint(self, role: str = "default") -> SimpleNamespace:
        """What a study reads of its endpoint (autoeval keys its explained examples on the judge's identity)."""
        return SimpleNamespace(identity=f"dry-run:{role}", base_url=None, model=role)

    async def check_structured_outputs(self, roles=None) -> list[dict]:
        return []  # no server to probe: a constrained dry run writes each request with its constraint

    async def served_context_length(self, role: str = "default") -> int | None:
        return None  # no server: the registry's context length applies

    def usage_summary(self) -> dict:
        zero = {"requests": 0, "failed": 0, "prompt_tokens": 0, "completion_tokens": 0, "cache_hits": 0, "seconds": 0.0}
        return {"total": dict(zero, requests=len(self.calls))}


def _gen(gen: GenConfig) -> dict:
    """The sampling of a set-up request (a case's requests carry the call log's own ``gen``)."""
    return {"temperature": gen.temperature, "top_p": gen.top_p, "max_tokens": gen.max_tokens, "n": gen.n,
            "stop": list(gen.stop) if gen.stop else None, "seed": gen.seed,
            **({"structured": json.loads(gen.structured)} if gen.structured else {})}


def request_line(case_id, call: dict) -> dict:
    """One line of ``dry-run.jsonl``: a recorded call of a case (``case_id`` None: a set-up call)."""
    row = {"case_id": case_id, "role": call["role"], "step": call.get("step", "setup"), "kind": call["kind"]}
    if "gen" in call:
        row["gen"] = call["gen"]
    row["messages" if call["kind"] == "chat" else "prompt"] = call["messages" if call["kind"] == "chat" else "prompt"]
    for key in ("constraint", "protocol"):  # the reply format sent (or declared, in a free run); what the request carries less of
        if call.get(key):
            row[key] = call[key]
    return row


def write_requests(out: Path, rows: list[dict]) -> Path:
    """``OUT/dry-run.jsonl``, one request a line; its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / DRY_RUN_FILE
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


async def dry_run(study, settings, cases: list[dict], *, log=print, gpu_memory: int | None = None, plan_from: str | None = None) -> Path:
    """Run the study against a :class:`RecordingClient`; write ``<settings.out>/dry-run.jsonl``; return its path; then
    the plan of the full run (experiments/core/plan.py: the protocol's worst case, a typical unit from ``plan_from``'s
    call log or the study's own figures, units at once and hours on a GPU of ``gpu_memory`` GB, else 24, 48 and 80).
    A dry run that writes no request for its cases is bad input: :class:`DataError` (exit 2) naming the cause."""
    from experiments.core.plan import measured

    if plan_from:
        measured(plan_from)  # a folder without a call log: refused before anything is written
    out = Path(settings.out)
    client = RecordingClient(study.standins)
    cause = None
    with tempfile.TemporaryDirectory(prefix="medstack-dry-run-") as tmp:
        scratch = settings.model_copy(update={"out": tmp, "use_cache": False})
        try:
            await run_study(study, scratch, cases, client=client, log=lambda *_: None)
        except MedstackError:
            raise  # bad input met on the way (a prompt placeholder, a constraint): as in a real run
        except Exception as e:  # noqa: BLE001 - metrics over empty answers may not compute; the requests are what we want
            cause = f"{type(e).__name__}: {e}"
            log(f"(dry run: the study's metrics over empty answers did not compute: {cause})")
        records = {str(r["id"]): r for r in read_jsonl(Path(tmp) / "records.jsonl")} if (Path(tmp) / "records.jsonl").exists() else {}
    failed = [r for r in records.values() if r.get("status") == "failed"]
    per_case = sum(len(r.get("calls") or []) for r in records.values())
    rows = [request_line(None, c) for c in client.calls[: max(0, len(client.calls) - per_case)]]
    for c in cases:
        rec = records.get(str(c["id"]))
        rows += [request_line(c["id"], call) for call in (rec or {}).get("calls") or []]
    if cases and not rows:
        why = f"case {failed[0]['id']}: {failed[0].get('error')}" if failed else (cause or "the study made no request")
        raise DataError(f"dry run: no request was built for {len(cases)} case(s) ({why})")
    if failed:
        log(f"dry run: {len(failed)} case(s) stopped before their last request; the first: {failed[0]['id']}: {failed[0].get('error')}")
    path = write_requests(out, rows)
    if study.scope:  # which cases: all, the first N or a stratified sample, with their composition
        log(scope_line(study.scope, study.scope.get("noun", "cases")))
    for line in study.describe(settings):
        log(line)
    constrained = sum(1 for r in rows if (r.get("constraint") or {}).get("applied"))
    unit = getattr(study, "unit_noun", "cases")
    log(f"dry run: {len(rows)} request(s) of {len(cases)} {unit if len(cases) != 1 else unit[:-1]} written to {path}"
        + (f" ({constrained} with their reply format as structured outputs)" if settings.answers == "constrained" else "")
        + "; nothing was sent")
    for line in protocol_lines(protocol_stats([r for r in records.values() if r.get("status") != "failed"])):
        log(line)
    for line in request_kinds(rows, study.standins):
        log(line)
    if study.standins and len(cases) and any(r.get("case_id") is not None for r in rows):
        log(f"dry run: those replies were stand-ins, not a model's: they end each conversation early, so the {len(rows)} request(s) "
            "above are this dry run's own count, not a run's (the plan below estimates a run's)")
    fit = context_check(study, settings, cases)
    if fit:
        log(fit)
    for line in plan_lines(study, settings, cases, gpu_memory=gpu_memory, plan_from=plan_from):
        log(line)
    return path


def request_kind(row: dict) -> str:
    """``role step`` with a step's running number left out (``doctor_turn_3`` -> ``doctor_turn``, ``adjudicate:0`` -> ``adjudicate``)."""
    return f"{row['role']}: {re.sub(r'[:_/][0-9]+$', '', str(row.get('step')))}"


def request_kinds(rows: list[dict], standins: dict) -> list[str]:
    """The dry run's kinds of request with their counts, and the replies that stood in for each role's."""
    counts = Counter(request_kind(r) for r in rows)
    lines = ["dry run: requests by kind (role: step): " + ", ".join(f"{k} x{n}" for k, n in counts.items())]
    said = {r["role"] for r in rows}
    stood = [f"{role}: " + (getattr(replies, "__doc__", None) or "by request" if callable(replies) else " / ".join(repr(x) for x in replies))
             for role, replies in standins.items() if role in said]
    lines.append("dry run: replies stood in for the models' (each role's in turn, per case): " + ("; ".join(stood) if stood else "none (every reply empty)")
                 + (f"; empty for {', '.join(sorted(said - set(standins)))}" if said - set(standins) else ""))
    return lines
