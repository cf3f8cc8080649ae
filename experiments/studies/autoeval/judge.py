"""The self-CoT rubric judge (docs/protocols.md, Auto-evaluation): criteria, example dialogues, prompts, and the two judge
steps, (a) ``explain_example`` and (b) ``rate_dialogue`` (experiments/studies/autoeval/README.md). A reply without a parseable
whole rating 1..5 is *unscored*; a call that gets no answer raises :class:`~experiments.core.study.RequestFailed` and
never becomes a rating. The call log keeps every prompt sent.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from experiments.common.parsing import extract_rating, split_sections
from experiments.core.prompts import PromptSet
from experiments.studies.autoeval.settings import AutoevalSettings
from experiments.core.config import Sampling
from experiments.core.results import iter_jsonl
from models.errors import DataError
from serving.client import ChatResult, GenConfig
from serving.refs import model_name

HERE = Path(__file__).parent
PROMPTS = PromptSet(HERE / "prompts")
DEFAULT_CRITERIA = HERE / "criteria.yaml"
DEFAULT_EXAMPLES = HERE / "examples.jsonl"
RATINGS = (1, 2, 3, 4, 5)
NOTE_SECTIONS = ["Good", "Bad", "Summary", "Rating"]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# ------------------------------------------------------------------ criteria

@dataclass(frozen=True)
class Criterion:
    key: str
    name: str
    score_5: str
    score_1: str


def load_criteria(path: str | Path | None = None) -> dict[str, Criterion]:
    p = Path(path or DEFAULT_CRITERIA)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise DataError(f"{p}: cannot read criteria ({e})") from None
    items = data.get("criteria") if isinstance(data, dict) else None
    if not isinstance(items, dict) or not items:
        raise DataError(f"{p}: expected a top-level 'criteria:' mapping of key -> {{name, score_5, score_1}}")
    out = {}
    for key, spec in items.items():
        missing = [f for f in ("name", "score_5", "score_1") if not isinstance(spec, dict) or not str(spec.get(f) or "").strip()]
        if missing:
            raise DataError(f"{p}: criterion '{key}' lacks {', '.join(missing)}")
        out[str(key)] = Criterion(str(key), spec["name"].strip(), " ".join(spec["score_5"].split()), " ".join(spec["score_1"].split()))
    return out


def select_criteria(all_criteria: dict[str, Criterion], wanted: list[str]) -> list[Criterion]:
    """Criteria by key (or full name, case-insensitive); unknown names list the valid ones."""
    by_name = {c.name.lower(): c for c in all_criteria.values()}
    out = []
    for w in wanted:
        c = all_criteria.get(w) or all_criteria.get(w.lower()) or by_name.get(w.lower())
        if c is None:
            raise DataError(f"unknown criterion '{w}'; valid: {', '.join(all_criteria)}")
        if c not in out:
            out.append(c)
    if not out:
        raise DataError(f"no criteria given; valid: {', '.join(all_criteria)}")
    return out


# ------------------------------------------------------------------ dialogues

def check_transcript(transcript, where: str) -> list[dict]:
    """A transcript as the typed record holds it, ``[{role, text}]`` (an example file's ``{agent, content}`` read alike)."""
    if not isinstance(transcript, list):
        raise DataError(f"{where}: 'transcript' must be a list of {{role, text}}, got {type(transcript).__name__}")
    out = []
    for i, t in enumerate(transcript):
        role, text = (t.get("role", t.get("agent")), t.get("text", t.get("content"))) if isinstance(t, dict) else (None, None)
        if not isinstance(role, str) or not isinstance(text, str):
            raise DataError(f"{where}: transcript item {i} must have string 'role' and 'text'")
        out.append({"role": role, "text": text})
    return out


def load_dialogues(results: str | Path) -> tuple[list[dict], dict]:
    """The conversations of a results directory, read by the one reader (``registry.open_run``: every study's records in
    the typed shape, older ones upgraded by their study): ``{source_id, case_id, transcript, model}`` of each finished
    record with a transcript; ``model`` the model its study tests (the record's model of that study's primary role, else
    its metadata's ``model``: an imported release). Returns (dialogues, counts); a record without a transcript is
    skipped and counted, a failed case has none; a record not in the typed shape, or a malformed transcript, is bad
    input naming it."""
    from experiments.core.record import is_typed
    from experiments.core.registry import open_run, study_of

    p = Path(results)
    p = p.parent if p.name == "records.jsonl" and p.is_file() else p  # the folder's records file named: its folder
    if not (p / "records.jsonl").exists():
        raise DataError(f"{p} is not a results directory (no records.jsonl)")
    run = open_run(p)
    study = study_of(run)
    primary = study.primary_role if study is not None else None
    dialogues, skipped = [], 0
    for rec in run.finished:
        where = f"{p / 'records.jsonl'} (record '{rec['id']}')"
        if not is_typed(rec):
            raise DataError(f"{where}: not a typed record (id, case_id, inputs, transcript [{{role, text}}], metadata: "
                            "docs/layout.md, Records), and no study of ours wrote the folder to read it as one")
        transcript = check_transcript(rec["transcript"], where)
        if not transcript:
            skipped += 1
            continue
        ref = (rec.get("roles") or {}).get(primary)
        dialogues.append({"source_id": str(rec["id"]), "case_id": str(rec["case_id"]), "transcript": transcript,
                          "model": model_name(ref) if ref else rec["metadata"].get("model")})
    counts = {"records_in_results": len(run.records), "with_transcript": len(dialogues), "skipped_no_transcript": skipped}
    if run.failed:
        counts["skipped_failed"] = len(run.failed)
    return dialogues, counts


def render_dialogue(transcript: list[dict], max_chars: int | None = None) -> tuple[str, int]:
    """(``Doctor: …`` lines in order, how many turns are shown whole); beyond ``max_chars`` later turns are
    cut and a marker says how many."""
    lines = [f"{t['role'].strip().capitalize() or 'Speaker'}: {' '.join(t['text'].split())}" for t in transcript]
    if max_chars is None or sum(len(x) + 1 for x in lines) <= max_chars:
        return "\n".join(lines), len(lines)
    kept, used = [], 0
    for line in lines:
        room = max_chars - used
        if len(line) + 1 > room:
            if room > 40:
                kept.append(line[: room - 1].rsplit(" ", 1)[0] + " …")
            break
        kept.append(line)
        used += len(line) + 1
    omitted = len(lines) - len(kept) + (1 if kept and kept[-1].endswith(" …") else 0)
    kept.append(f"[… dialogue cut here; {omitted} more turn(s) not shown]")
    return "\n".join(kept), len(lines) - omitted


@dataclass(frozen=True)
class Example:
    id: str
    criterion: str
    rating: int
    transcript: tuple  # of dicts

    def dialogue(self) -> str:
        return render_dialogue(list(self.transcript))[0]


def load_examples(path: str | Path | None, criteria: list[Criterion]) -> dict[str, dict[int, Example]]:
    """{criterion key: {rating: Example}}; each selected criterion needs exactly one example per rating 1..5."""
    p = Path(path or DEFAULT_EXAMPLES)
    if not p.exists():
        raise DataError(f"examples file {p} does not exist")
    wanted = {c.key for c in criteria}
    out: dict[str, dict[int, Example]] = {k: {} for k in wanted}
    for lineno, row in iter_jsonl(p):
        where = f"{p}:{lineno}"
        for field in ("id", "criterion", "rating", "transcript"):
            if field not in row:
                raise DataError(f"{where}: example lacks '{field}' (needs id, criterion, rating 1-5, transcript)")
        rating = row["rating"]
        if not isinstance(rating, int) or isinstance(rating, bool) or rating not in RATINGS:
            raise DataError(f"{where}: example '{row['id']}' has rating {rating!r}; expected a whole number 1-5")
        crit = str(row["criterion"])
        if crit not in wanted:
            continue
        if rating in out[crit]:
            raise DataError(f"{where}: second example for {crit} rating {rating} (first: '{out[crit][rating].id}'); one per rating point")
        out[crit][rating] = Example(str(row["id"]), crit, rating, tuple(check_transcript(row["transcript"], f"{where} (example '{row['id']}')")))
    for crit, by_rating in out.items():
        missing = [r for r in RATINGS if r not in by_rating]
        if missing:
            raise DataError(f"{p}: criterion '{crit}' has no example for rating(s) {', '.join(map(str, missing))}; one per rating 1-5 is needed")
    return out


# ------------------------------------------------------------------ judge calls

@dataclass(frozen=True)
class JudgeConfig:
    """How the judge is called. ``api='completion'`` sends the prompt as raw text followed by
    ``Good:`` (better for base models); ``'chat'`` sends it as one user message."""

    api: str = "chat"
    role: str = "judge"
    explain_gen: GenConfig = GenConfig(max_tokens=160)
    rate_gen: GenConfig = GenConfig(max_tokens=200)
    max_dialogue_chars: int | None = 1600
    max_note_chars: int = 240


def judge_config(s: AutoevalSettings, role: str = "judge") -> JudgeConfig:
    """How a run with settings ``s`` calls its judge (``role``: the run's judge role, or the one a rescore asks)."""
    def gen(x: Sampling):
        return x.gen(stop=x.stop or list(s.stop) or None)

    return JudgeConfig(api=s.api, role=role, explain_gen=gen(s.sampling.explain), rate_gen=gen(s.sampling.rate),
                       max_dialogue_chars=s.max_dialogue_chars, max_note_chars=s.max_note_chars)


async def ask(ctx, prompt: str, cfg: JudgeConfig, gen: GenConfig, step: str, constraint=None, protocol=None) -> tuple[ChatResult, str]:
    """Send one judge prompt through ``ctx`` (a CaseContext: raises RequestFailed when no answer came);
    return the result and the reply text (with the prefilled ``Good:`` in completion mode).
    ``constraint``: the step's declared reply format (prompts/constraints.yaml; the context applies it
    only with ``answers: constrained``); in completion mode the judge continues the prefilled ``Good:``."""
    if cfg.api == "completion":
        res = await ctx.complete(prompt.rstrip() + "\n\nGood:", role=cfg.role, gen=gen, step=step,
                                 constraint=constraint.continuing("Good:") if constraint else None, protocol=protocol)
        return res, "Good:" + res.text
    res = await ctx.chat([{"role": "user", "content": prompt}], role=cfg.role, gen=gen, step=step, constraint=constraint, protocol=protocol)
    return res, res.text


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rsplit(" ", 1)[0] + " …"


def parse_notes(text: str) -> dict:
    """Good/Bad/Summary sections and the rating of a judge reply (missing parts are empty / None)."""
    sections = split_sections(text or "", NOTE_SECTIONS)
    return {
        "good": " ".join(sections["Good"].split()),
        "bad": " ".join(sections["Bad"].split()),
        "summary": " ".join(sections["Summary"].split()),
        "rating": extract_rating(text or ""),
    }


def explain_prompt(criterion: Criterion, example: Example) -> str:
    return PROMPTS.render("explain", criterion_name=criterion.name, score_5=criterion.score_5, score_1=criterion.score_1,
                          dialogue=example.dialogue(), rating=example.rating)


def explanation_key(judge_identity: str, prompt: str, cfg: JudgeConfig) -> str:
    """Cache key of one step-(a) explanation: judge identity + exact prompt + output-affecting settings."""
    gen = cfg.explain_gen
    return sha(json.dumps([judge_identity, cfg.api, prompt, gen.temperature, gen.top_p, gen.max_tokens, gen.seed, gen.stop]))


async def explain_example(ctx, criterion: Criterion, example: Example, cfg: JudgeConfig, judge_identity: str) -> dict:
    """Step (a): the judge explains a known rating. Returns the cache entry written to explained_examples.jsonl.
    A request that got no answer raises RequestFailed (nothing is cached, no rating is made with it)."""
    prompt = explain_prompt(criterion, example)
    res, text = await ask(ctx, prompt, cfg, cfg.explain_gen, step="explain")
    notes = parse_notes(text)
    parsed = bool(notes["good"] or notes["bad"] or notes["summary"])
    return {
        "key": explanation_key(judge_identity, prompt, cfg), "judge": judge_identity, "example_id": example.id,
        "criterion": criterion.key, "rating": example.rating, "prompt_hash": sha(prompt),
        "explanation": {k: notes[k] for k in ("good", "bad", "summary")}, "parsed": parsed,
        "raw": text, "prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
        "latency": round(res.latency, 3), "cached": res.cached,
    }


def example_block(number: int, example: Example, explained: dict | None, max_note_chars: int) -> str:
    """One few-shot example: the dialogue, the judge's own notes, and the KNOWN rating."""
    exp = (explained or {}).get("explanation") or {}
    good, bad, summary = exp.get("good", ""), exp.get("bad", ""), exp.get("summary", "")
    if not (good or bad or summary):  # the judge's reply had no sections: keep its words as the summary
        summary = (explained or {}).get("raw", "")
    none = "(none noted)"
    return PROMPTS.render("example", number=number, dialogue=example.dialogue(), rating=example.rating,
                          good=_clip(good, max_note_chars) or none, bad=_clip(bad, max_note_chars) or none,
                          summary=_clip(summary, max_note_chars) or none)


def rate_prompt(criterion: Criterion, examples: dict[int, Example], explained: dict[int, dict], dialogue: str, cfg: JudgeConfig) -> str:
    blocks = [example_block(i, examples[r], explained.get(r), cfg.max_note_chars) for i, r in enumerate(RATINGS, 1)]
    return PROMPTS.render("rate", criterion_name=criterion.name, score_5=criterion.score_5, score_1=criterion.score_1,
                          examples="\n\n".join(blocks), dialogue=dialogue)


async def rate_dialogue(ctx, criterion: Criterion, prompt: str, cfg: JudgeConfig, protocol: dict | None = None) -> dict:
    """Step (b): one rating. ``rating`` is None (unscored) when the reply has no whole rating 1..5;
    a request that got no answer raises RequestFailed (the runner records the case as failed).
    ``protocol``: {"dialogue_turns": (shown, all)} (a cut dialogue is a protocol deviation, counted by the runner)."""
    res, text = await ask(ctx, prompt, cfg, cfg.rate_gen, step="rate", constraint=PROMPTS.constraint("rate"), protocol=protocol)
    notes = parse_notes(text)
    parse_error = "no 'Rating: N' with a whole number 1-5 in the reply" if notes["rating"] is None else None
    return {
        "rating": notes["rating"], "scored": notes["rating"] is not None,
        "explanation": {k: notes[k] for k in ("good", "bad", "summary")},
        "raw": text, "parse_error": parse_error, "prompt_hash": sha(prompt),
        "finish_reason": (res.finish_reasons or [None])[0],
    }

