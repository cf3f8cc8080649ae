"""`medstack autoeval`: rate every stored dialogue of a results directory with the self-CoT judge.

Steps: read dialogues (records with a ``transcript``) -> step (a) explain the example
dialogues once per judge model (cached in ``explained_examples.jsonl`` in the output
directory) -> step (b) one rating per (dialogue, criterion) case through ``run_cases``
(resumable) -> metrics (mean rating per criterion with 95% CI, unscored counts, agreement
with reference ratings) -> summary.md.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from experiments.config import RunSettings, config_dir, load_settings
from experiments.results import RunDir, read_jsonl
from experiments.runner import run_cases
from models.errors import DataError
from serving.client import GenConfig
from serving.session import open_client

from experiments.autoeval import judge as J
from experiments.autoeval.metrics import agreement_metrics, load_reference, rating_metrics, summary_markdown

CONFIGS = config_dir(__file__)
DEFAULT_CONFIG = CONFIGS / "default.yaml"
EXPLAINED_FILE = "explained_examples.jsonl"


class AutoevalRunDir(RunDir):
    """A results directory whose failed requests are asked again on re-run.

    Records stay append-only: a retried case appends a new line and the last line per id wins.
    """

    def done_ids(self) -> set[str]:
        return {str(r["id"]) for r in self.latest() if not r.get("error")}

    def latest(self) -> list[dict]:
        return list({str(r["id"]): r for r in self.records()}.values())


class Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 200
    seed: int | None = None


class AutoevalSettings(RunSettings):
    experiment: str = "autoeval"
    roles: dict[str, str] = {"judge": "embedded"}
    criteria: list[str] = ["empathy", "concerns", "welfare", "understanding"]
    criteria_file: str | None = None  # default: experiments/autoeval/criteria.yaml
    examples: str | None = None  # default: experiments/autoeval/examples.jsonl
    reference: str | None = None  # CSV id,criterion,rating
    api: Literal["chat", "completion"] = "chat"
    explain: Sampling = Sampling(max_tokens=160)
    rate: Sampling = Sampling(max_tokens=200)
    stop: list[str] = ["==="]
    max_dialogue_chars: int | None = 1600
    max_note_chars: int = 240


def judge_config(s: AutoevalSettings) -> J.JudgeConfig:
    stop = tuple(s.stop) or None
    gen = lambda x: GenConfig(temperature=x.temperature, top_p=x.top_p, max_tokens=x.max_tokens, seed=x.seed, stop=stop)  # noqa: E731
    return J.JudgeConfig(api=s.api, role="judge", explain_gen=gen(s.explain), rate_gen=gen(s.rate),
                         max_dialogue_chars=s.max_dialogue_chars, max_note_chars=s.max_note_chars)


# ------------------------------------------------------------------ input dialogues

def load_dialogues(results: str | Path) -> tuple[list[dict], dict]:
    """Records of a results directory (or a records.jsonl file) that carry a ``transcript``.

    Returns (dialogues, counts). A record without ``id`` or with a malformed transcript is
    bad input (DataError naming file:line); one without a transcript is skipped and counted.
    """
    p = Path(results)
    path = p / "records.jsonl" if p.is_dir() else p
    if not path.exists():
        raise DataError(f"{p} is not a results directory (no records.jsonl)")
    dialogues, seen = [], {}
    skipped = empty = 0
    for lineno, rec in enumerate(read_jsonl(path), 1):
        where = f"{path}:{lineno}"
        if not isinstance(rec, dict) or "id" not in rec:
            raise DataError(f"{where}: record has no 'id'")
        rid = str(rec["id"])
        if "transcript" not in rec or rec["transcript"] is None:
            skipped += 1
            continue
        transcript = J.check_transcript(rec["transcript"], f"{where} (record '{rid}')")
        if not transcript:
            empty += 1
            continue
        if rid in seen:
            raise DataError(f"{where}: record id '{rid}' repeats line {seen[rid]}; ids must be unique")
        seen[rid] = lineno
        dialogues.append({"source_id": rid, "transcript": transcript, "model": rec.get("model"), "correct": rec.get("correct")})
    return dialogues, {"records_in_results": len(seen) + skipped + empty, "with_transcript": len(dialogues),
                       "skipped_no_transcript": skipped, "skipped_empty_transcript": empty}


# ------------------------------------------------------------------ step (a), cached

async def explained_examples(client, out: Path, criteria, examples, cfg: J.JudgeConfig, judge_identity: str, log=print) -> tuple[dict, dict]:
    """{criterion: {rating: cache entry}}. Entries are reused from ``explained_examples.jsonl`` when the
    judge identity, prompt and settings match; failed requests are not cached (retried next run)."""
    path = out / EXPLAINED_FILE
    cached = {e["key"]: e for e in (read_jsonl(path) if path.exists() else []) if not e.get("error")}
    todo, result = [], {c.key: {} for c in criteria}
    for c in criteria:
        for r in J.RATINGS:
            ex = examples[c.key][r]
            key = J.explanation_key(judge_identity, J.explain_prompt(c, ex), cfg)
            if key in cached:
                result[c.key][r] = cached[key]
            else:
                todo.append((c, ex))
    if todo:
        log(f"step (a): the judge explains {len(todo)} example rating(s) ({len(cached)} cached in {path.name})")
    fresh = await asyncio.gather(*(J.explain_example(client, c, ex, cfg, judge_identity) for c, ex in todo))
    with open(path, "a", encoding="utf-8") as f:
        for (c, ex), entry in zip(todo, fresh):
            result[c.key][ex.rating] = entry
            if not entry["error"]:
                f.write(json.dumps(entry, ensure_ascii=False) + "\n")
    entries = [e for per in result.values() for e in per.values()]
    stats = {"explained": len(entries), "from_cache_file": len(entries) - len(todo),
             "unparsed": sum(1 for e in entries if not e["parsed"] and not e["error"]),
             "request_errors": sum(1 for e in entries if e["error"])}
    return result, stats


# ------------------------------------------------------------------ the run

def default_out(results: str, judge: str) -> str:
    name = Path(results).resolve().name if Path(results).is_dir() else Path(results).resolve().parent.name
    return str(Path("runs") / "autoeval" / f"{name}-{judge.split('@')[0]}")


async def run_autoeval(s: AutoevalSettings, log=print, client=None) -> dict:
    if not s.data:
        raise DataError("no RESULTS directory given")
    all_criteria = J.load_criteria(s.criteria_file)
    criteria = J.select_criteria(all_criteria, s.criteria)
    examples = J.load_examples(s.examples, criteria)
    reference = load_reference(s.reference, criteria) if s.reference else None
    dialogues, counts = load_dialogues(s.data)
    if s.limit is not None:
        dialogues = dialogues[: s.limit]
    out = Path(s.out or default_out(s.data, s.roles.get("judge", "embedded")))
    cfg = judge_config(s)
    config = s.model_dump(exclude={"reference"})
    config.update(out=str(out), criteria=[c.key for c in criteria], template_hashes=J.template_hashes())
    rundir = AutoevalRunDir(out, config)

    if client is None:
        session = open_client(s.roles, concurrency=s.concurrency, timeout=s.timeout, retries=s.retries,
                              use_cache=s.use_cache, allow_remote=s.allow_remote, log=log)
    else:  # a caller-supplied client (tests: a scripted stand-in)
        session = nullcontext((client, {"judge": {"alias": s.roles.get("judge"), "injected": type(client).__name__}}))
    async with session as (client, identities):
        rundir.write_identity(identities)
        judge_identity = client.endpoint("judge").identity
        t0 = time.perf_counter()
        explained, ex_stats = await explained_examples(client, out, criteria, examples, cfg, judge_identity, log=log)
        ex_stats["wall_seconds"] = round(time.perf_counter() - t0, 2)

        cases = [{"id": f"{d['source_id']}::{c.key}", "dialogue": d, "criterion": c} for d in dialogues for c in criteria]

        async def solve(case: dict) -> dict:
            d, c = case["dialogue"], case["criterion"]
            text, truncated = J.render_dialogue(d["transcript"], cfg.max_dialogue_chars)
            prompt = J.rate_prompt(c, examples[c.key], explained[c.key], text, cfg)
            verdict = await J.rate_dialogue(client, c, prompt, cfg)
            return {"id": case["id"], "source_id": d["source_id"], "criterion": c.key, "criterion_name": c.name,
                    "judge": s.roles.get("judge"), "model": d["model"], "correct": d["correct"],
                    **verdict, "examples_used": [examples[c.key][r].id for r in J.RATINGS],
                    "turns": len(d["transcript"]), "dialogue_chars": len(text), "dialogue_truncated": truncated}

        run_stats = await run_cases(cases, solve, rundir, client, concurrency=s.concurrency, description="autoeval ratings")
    # token counts cover both steps (one client), so throughput is over both steps' wall time
    run_stats["rating_wall_seconds"] = run_stats["wall_seconds"]
    run_stats["wall_seconds"] = round(run_stats["wall_seconds"] + ex_stats["wall_seconds"], 2)
    wall = run_stats["wall_seconds"]
    run_stats["output_tokens_per_s"] = round(run_stats["completion_tokens"] / wall, 2) if wall > 0 else None

    wanted = {c["id"] for c in cases}
    records = [r for r in rundir.latest() if r["id"] in wanted]
    for r in records:  # a case whose solve raised has only id + error: it is an unscored rating
        if "criterion" not in r:
            r["source_id"], _, r["criterion"] = str(r["id"]).rpartition("::")
            r["rating"] = None
    metrics = {"judge": s.roles.get("judge"), **rating_metrics(records, criteria),
               "dialogues": {**counts, "rated": len({r['source_id'] for r in records}), "limit": s.limit},
               "examples": ex_stats}
    if reference is not None:
        metrics["agreement"] = agreement_metrics(records, reference, criteria)
        metrics["reference"] = {"path": s.reference, "rows": len(reference)}
    metrics["run"] = run_stats
    rundir.write_metrics(metrics)
    rundir.write_summary(summary_markdown(metrics, f"Rubric auto-evaluation of {s.data}"))
    return {"out": str(out), "metrics": metrics}


def settings_from_cli(config: str | None, overrides: dict) -> AutoevalSettings:
    return load_settings(AutoevalSettings, config or DEFAULT_CONFIG, overrides)
