"""The rubric auto-evaluation's one scorer (experiments/core/scorers.py): ``rubric/<criterion>``, the judge's rating 1-5 of
a dialogue on a criterion (None when its reply had none), by the self-CoT protocol (experiments/studies/autoeval/README.md):
step (a) explains the criterion's five examples with their known ratings, step (b) rates the dialogue with them.

In a run, step (a) is made once per judge model in the study's set-up (cached in the run folder's
``explained_examples.jsonl``) and handed to the scorer, so each record asks step (b) only. Asked again over a stored
record (``medstack rescore``), the scorer has no set-up of its run: it asks step (a), then step (b), through the
record's own call log. A record is one (dialogue, criterion) pair; its case is the rated dialogue's case.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from experiments.common.grade import RATING, Grade, grades, score_name
from experiments.core.results import read_jsonl, strict_json
from experiments.core.scorers import Scorer
from experiments.core.study import CaseContext, RequestFailed
from experiments.studies.autoeval import judge as J
from models.errors import DataError

TEMPLATES = ("explain", "example", "rate")
EXPLAINED_FILE = "explained_examples.jsonl"
QUESTION = "Rate the doctor in this dialogue on the criterion, from 1 to 5 (the definitions of 5 and 1 are given)."


def rubric_grade(verdict: dict, source_id, model: str | None, **metadata) -> Grade:
    """Step (b)'s verdict on one dialogue (``rating``, the notes ``explanation``, the reply ``raw``, ``parse_error``,
    ``finish_reason``: experiments/studies/autoeval/judge.py, ``rate_dialogue``) as its grade; ``metadata``: how much of
    the dialogue the judge was shown (``dialogue_chars``, ``dialogue_truncated``)."""
    notes = verdict.get("explanation") if isinstance(verdict.get("explanation"), dict) else {}
    kept = {"notes": notes, "parse_error": verdict.get("parse_error"), "finish_reason": verdict.get("finish_reason"), **metadata}
    return Grade(value=verdict.get("rating"), answer=source_id, source="Rating: N", explanation=verdict.get("raw"),
                 metadata={k: v for k, v in kept.items() if v not in (None, "", {})},
                 judge={"model": model, "prompt_hash": J.PROMPTS.hash(*TEMPLATES)})


def rating(record: dict) -> Grade:
    """The record's own rating ``rubric/<its criterion>`` (value None when it has none)."""
    return grades(record).get(score_name("rubric", (record.get("inputs") or {}).get("criterion") or None)) or Grade(value=None)


@lru_cache(maxsize=8)
def criteria(path: str | None) -> dict[str, J.Criterion]:
    return J.load_criteria(path)


@lru_cache(maxsize=8)
def examples(path: str | None, key: str, criteria_file: str | None) -> dict[int, J.Example]:
    return J.load_examples(path, [criteria(criteria_file)[key]])[key]


# ------------------------------------------------------------------ step (a), once per judge model, cached in the run folder

# the explained examples a run's set-up made, by the run's client: {(role, criterion): {rating: entry}}
_EXPLAINED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def explain_for_run(client, out: Path, chosen: list[J.Criterion], by_key: dict, cfg: J.JudgeConfig, seed: int = 0) -> dict:
    """Step (a) of a run (the study's set-up): :func:`explained_examples`, handed to the scorer of this run's records."""
    explained, stats = await explained_examples(client, out, chosen, by_key, cfg, seed)
    _EXPLAINED.setdefault(client, {}).update({(cfg.role, key): per for key, per in explained.items()})
    return stats


async def explained_examples(client, out: Path, chosen: list[J.Criterion], by_key: dict, cfg: J.JudgeConfig, seed: int = 0) -> tuple[dict, dict]:
    """{criterion: {rating: cache entry}}. Entries are reused from ``explained_examples.jsonl`` when the judge identity,
    prompt and settings match. Answered explanations are cached as they come; if any request got no answer,
    RequestFailed is raised after the others are cached (the next run asks only the missing ones), so no rating is
    ever made without its explained examples."""
    judge_identity = client.endpoint(cfg.role).identity
    path = Path(out) / EXPLAINED_FILE
    cached = {e["key"]: e for e in (read_jsonl(path) if path.exists() else []) if not e.get("error")}
    todo, result = [], {c.key: {} for c in chosen}
    for c in chosen:
        for r in J.RATINGS:
            ex = by_key[c.key][r]
            key = J.explanation_key(judge_identity, J.explain_prompt(c, ex), cfg)
            if key in cached:
                result[c.key][r] = cached[key]
            else:
                todo.append((c, ex))

    async def one(c, ex):
        return await J.explain_example(CaseContext(client, f"explain/{c.key}/{ex.rating}", seed), c, ex, cfg, judge_identity)

    fresh = await asyncio.gather(*(one(c, ex) for c, ex in todo), return_exceptions=True)
    if todo:
        Path(out).mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            for (c, ex), entry in zip(todo, fresh):
                if not isinstance(entry, BaseException):
                    result[c.key][ex.rating] = entry
                    f.write(strict_json(entry, ensure_ascii=False) + "\n")
    errors = [e for e in fresh if isinstance(e, BaseException)]
    for e in errors:
        if not isinstance(e, RequestFailed):
            raise e
    if errors:
        raise RequestFailed(errors[0].step, errors[0].role,
                            f"step (a): {len(errors)} of {len(todo)} example explanation(s) got no answer ({errors[0].error})", errors[0].kind)
    entries = [e for per in result.values() for e in per.values()]
    stats = {"explained": len(entries), "from_cache_file": len(entries) - len(todo),
             "unparsed": sum(1 for e in entries if not e["parsed"]), "request_errors": 0}
    return result, stats


# ------------------------------------------------------------------ step (b): the scorer

async def rate(ctx: CaseContext, record: dict, s, role: str) -> dict:
    """The judge's rating of the record's dialogue on its criterion, with the criterion's explained examples: the run's
    (its set-up's), else explained now through ``ctx`` (a rescore), one example after another."""
    cfg = J.judge_config(s, role)
    inputs = record.get("inputs") or {}
    c = J.select_criteria(criteria(s.criteria_file), [str(inputs.get("criterion"))])[0]
    shown_examples = examples(s.examples, c.key, s.criteria_file)
    transcript = J.check_transcript(record.get("transcript") or [], f"record {record['id']!r}")
    if not transcript:
        raise DataError(f"record {record['id']!r}: no dialogue to rate (its source record {inputs.get('source_id')!r} is not in "
                        f"the run's data {getattr(s, 'data', None)!r})")
    explained = _EXPLAINED.get(ctx.client, {}).get((role, c.key))
    if explained is None:
        identity = ctx.client.endpoint(role).identity
        explained = {r: await J.explain_example(ctx, c, shown_examples[r], cfg, identity) for r in J.RATINGS}
    text, shown = J.render_dialogue(transcript, cfg.max_dialogue_chars)
    verdict = await J.rate_dialogue(ctx, c, J.rate_prompt(c, shown_examples, explained, text, cfg), cfg,
                                    protocol={"dialogue_turns": (shown, len(transcript))})
    return {c.key: rubric_grade(verdict, inputs.get("source_id"), s.roles.get(role), dialogue_chars=len(text),
                                dialogue_truncated=shown < len(transcript))}


def show(record: dict, part: str | None) -> dict:
    """What the judge rated: the criterion with its definitions of 5 and 1, and the dialogue."""
    inputs = record.get("inputs") or {}
    return {"criterion": inputs.get("criterion_name") or part, "a 5 means": inputs.get("score_5", ""), "a 1 means": inputs.get("score_1", ""),
            "dialogue": [f"{t.get('role')}: {t.get('text')}" for t in record.get("transcript") or []]}


def items(records: list[dict], config: dict):
    """One item per rated record, its id the record's (``<dialogue>::<criterion>``: a record is one criterion's)."""
    out = []
    for r in records:
        g, key = rating(r), (r.get("inputs") or {}).get("criterion")
        if g.scored and g.value in J.RATINGS:
            out.append({"id": str(r["id"]), "verdict": int(g.value), "stratum": f"{g.value}|{key}", "show": show(r, key)})
    return RATING, out


RUBRIC = Scorer("rubric", RATING, QUESTION, decide=rate, role="judge", show=show, items=items,
                parts={c.key: c.name for c in J.load_criteria().values()})
RATINGS_ONLY = replace(RUBRIC, decide=None)  # a folder holding ratings made elsewhere (`calibrate autoeval`): never asked again
