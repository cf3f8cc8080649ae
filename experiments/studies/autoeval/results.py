"""The rubric auto-evaluation's results for the tools over results (experiments/core/study.py, ``StudyResults``).

A record is one (dialogue, criterion) pair (id ``<dialogue>::<criterion>``); its typed score is ``rubric/<criterion>``
(the judge's rating 1-5, None when its reply had none). The judge ``rubric`` shows a reviewer what the judge rated and
asks again over the stored dialogue for ``medstack rescore`` (step (a), then step (b), with the run's prompts).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from experiments.studies.autoeval import judge as J
from experiments.studies.autoeval.settings import AutoevalSettings
from experiments.common.grade import Grade, grades, split_name
from experiments.core.judging import RATING, Judge
from experiments.core.study import CaseContext, StudyResults
from models.errors import DataError

TEMPLATES = ("explain", "example", "rate")


def rubric_grade(verdict: dict, source_id, model: str | None) -> Grade:
    """Step (b)'s verdict on one dialogue (``rating``, the notes ``explanation``, the reply ``raw``, ``parse_error``:
    experiments/studies/autoeval/judge.py, ``rate_dialogue``) as its typed score."""
    notes = verdict.get("explanation") if isinstance(verdict.get("explanation"), dict) else {}
    return Grade(value=verdict.get("rating"), answer=source_id, source="Rating: N", explanation=verdict.get("raw"),
                 metadata={k: v for k, v in {"notes": notes, "parse_error": verdict.get("parse_error")}.items() if v},
                 judge={"model": model, "prompt_hash": J.PROMPTS.hash(*TEMPLATES)})


def scores(record: dict, settings) -> dict[str, Grade]:
    """A record written before typed scores kept the verdict's fields (:func:`rubric_grade`) beside the rest."""
    model = record.get("judge") or (settings.roles or {}).get("judge")
    return {f"rubric/{record.get('criterion')}": rubric_grade(record, record.get("source_id"), model)}


# ------------------------------------------------------------------ the judge

@lru_cache(maxsize=4)
def _dialogues(src: str, mtime: float) -> dict[str, list[dict]]:
    return {d["source_id"]: d["transcript"] for d in J.load_dialogues(src)[0]}


def dialogue(config: dict, source_id: str, where: str) -> list[dict]:
    """The dialogue ``source_id`` of the run's data (what the judge rated); bad input naming ``where`` when it is not there."""
    src = config.get("data")
    transcript = _dialogues(str(src), Path(src).stat().st_mtime).get(source_id) if src and Path(src).exists() else None
    if transcript is None:
        raise DataError(f"{where}: the dialogue {source_id!r} is not in the run's data {src!r}: "
                        "the page shows, and a new judge rates, the dialogue the judge rated")
    return transcript


@lru_cache(maxsize=4)
def _criteria(path: str | None) -> dict:
    return J.load_criteria(path)


def show(record: dict, part: str | None, config: dict) -> dict:
    c = _criteria(config.get("criteria_file")).get(str(record.get("criterion")))
    transcript = dialogue(config, str(record.get("source_id") or ""), f"record {record['id']!r}")
    return {"criterion": c.name if c else record.get("criterion"), "a 5 means": c.score_5 if c else "", "a 1 means": c.score_1 if c else "",
            "dialogue": [f"{t.get('agent')}: {t.get('content')}" for t in transcript]}


def items(records: list[dict], config: dict, path: Path) -> tuple[dict, list[dict]]:
    """One item per rated record, its id the record's (``<dialogue>::<criterion>``), as the review always had it."""
    out = []
    for r in records:
        for name, g in grades(r).items():
            step, _, by = split_name(name)
            if step != "rubric" or by is not None or g.value not in (1, 2, 3, 4, 5):
                continue
            try:
                shown = show(r, None, config)
            except DataError as e:
                raise DataError(f"{path}: {e}") from None
            out.append({"id": str(r["id"]), "verdict": int(g.value), "stratum": f"{g.value}|{r.get('criterion')}", "show": shown})
    return dict(RATING), out


async def ask(ctx: CaseContext, record: dict, part: str | None, settings: AutoevalSettings, role: str) -> Grade:
    """Rate the stored dialogue again: the five examples of the criterion explained (step a), then the rating (step b)."""
    cfg = J.judge_config(settings, role)
    c = J.select_criteria(J.load_criteria(settings.criteria_file), [str(record.get("criterion"))])[0]
    examples = J.load_examples(settings.examples, [c])[c.key]
    identity = ctx.client.endpoint(role).identity
    explained = {r: await J.explain_example(ctx, c, examples[r], cfg, identity) for r in J.RATINGS}
    transcript = dialogue(settings.model_dump(mode="json"), str(record.get("source_id") or ""), f"record {record['id']!r}")
    text, shown = J.render_dialogue(transcript, cfg.max_dialogue_chars)
    verdict = await J.rate_dialogue(ctx, c, J.rate_prompt(c, examples, explained, text, cfg), cfg,
                                    protocol={"dialogue_turns": (shown, len(transcript))})
    return rubric_grade(verdict, record.get("source_id"), settings.roles[role])


RUBRIC = Judge("rubric", RATING, "Rate the doctor in this dialogue on the criterion, from 1 to 5 (the definitions of 5 and 1 are given).",
               show=show, items=items, ask=ask)
RESULTS = StudyResults(experiment="autoeval", scores=scores, judges=(RUBRIC,))
