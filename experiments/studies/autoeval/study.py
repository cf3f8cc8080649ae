"""`medstack autoeval` through the study runner (declared in __init__.py, with its paper tables): rate every stored dialogue with the self-CoT judge.

Cases are (dialogue, criterion) pairs, id ``<record id>::<criterion>``. ``setup()`` runs step (a) once per run
(cached in ``explained_examples.jsonl`` while the judge, the prompt and the settings match); a step-(a) request
that gets no answer raises RequestFailed, so no rating is made and the run exits 3. ``solve()`` is step (b).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from experiments.common.grade import to_disk
from experiments.core.config import ConfigError, config_dir
from experiments.core.results import read_jsonl, strict_json
from experiments.core.study import CaseContext, RequestFailed, Study
from serving.refs import model_name

from experiments.studies.autoeval import judge as J
from experiments.studies.autoeval.judge import judge_config, load_dialogues  # noqa: F401 (load_dialogues: the study's input reader)
from experiments.studies.autoeval.results import RESULTS, rubric_grade
from experiments.studies.autoeval.metrics import agreement_metrics, load_reference, rating_metrics, summary_markdown
from experiments.tables.render import run_paper_tables
from experiments.studies.autoeval.settings import AutoevalSettings

CONFIGS = config_dir(__file__)
DEFAULT_CONFIG = CONFIGS / "default.yaml"
EXPLAINED_FILE = "explained_examples.jsonl"


def default_out(results: str, judge: str) -> str:
    p = Path(results).resolve()
    name = p.name if p.is_dir() else p.parent.name
    return str(Path("runs") / "autoeval" / f"{name}-{model_name(judge)}")


# ------------------------------------------------------------------ the study

class AutoevalStudy(Study):
    name = "autoeval"
    settings_cls = AutoevalSettings
    roles = ("judge",)
    primary_role = "judge"
    prompts = J.PROMPTS
    case_noun = "dialogues"
    results = RESULTS  # typed scores (rubric/<criterion>) and the rubric judge (experiments/studies/autoeval/results.py)

    def __init__(self):
        self.criteria: list[J.Criterion] = []
        self.examples: dict = {}
        self.reference: list[dict] | None = None
        self.counts: dict = {}
        self.explained: dict = {}
        self.ex_stats: dict = {}

    def default_config(self, overrides: dict) -> Path:
        return DEFAULT_CONFIG

    def prepare(self, s: AutoevalSettings) -> AutoevalSettings:
        if not s.data:
            raise ConfigError("no RESULTS directory given: `medstack autoeval RESULTS` or --data RESULTS")
        return s.model_copy(update={"out": s.out or default_out(s.data, s.roles["judge"])})

    def load_cases(self, s: AutoevalSettings) -> list[dict]:
        self.criteria = J.select_criteria(J.load_criteria(s.criteria_file), s.criteria)
        self.examples = J.load_examples(s.examples, self.criteria)
        self.reference = load_reference(s.reference, self.criteria) if s.reference else None
        dialogues, self.counts = load_dialogues(s.data)
        dialogues = self.select(dialogues, s)  # --limit / --sample count dialogues (each is rated on every criterion)
        return [{"id": f"{d['source_id']}::{c.key}", "dialogue": d, "criterion": c} for d in dialogues for c in self.criteria]

    async def setup(self, client, s: AutoevalSettings, cases: list[dict], out: Path) -> None:
        t0 = time.perf_counter()
        self.explained, self.ex_stats = await explained_examples(client, out, self.criteria, self.examples, judge_config(s), s.seed)
        self.ex_stats["wall_seconds"] = round(time.perf_counter() - t0, 2)

    async def solve(self, ctx: CaseContext, case: dict, s: AutoevalSettings) -> dict:
        d, c = case["dialogue"], case["criterion"]
        cfg = judge_config(s)
        text, shown = J.render_dialogue(d["transcript"], cfg.max_dialogue_chars)
        truncated = shown < len(d["transcript"])
        prompt = J.rate_prompt(c, self.examples[c.key], self.explained[c.key], text, cfg)
        verdict = await J.rate_dialogue(ctx, c, prompt, cfg, protocol={"dialogue_turns": (shown, len(d["transcript"]))})
        return {"source_id": d["source_id"], "criterion": c.key, "criterion_name": c.name,
                "judge": s.roles["judge"], "model": d["model"], "correct": d["correct"],
                "scores": to_disk({f"rubric/{c.key}": rubric_grade(verdict, d["source_id"], s.roles["judge"])}),
                "prompt_hash": verdict["prompt_hash"], "finish_reason": verdict["finish_reason"],
                "examples_used": [self.examples[c.key][r].id for r in J.RATINGS],
                "turns": len(d["transcript"]), "dialogue_chars": len(text), "dialogue_truncated": truncated}

    def metrics(self, records: list[dict], s: AutoevalSettings) -> dict:
        metrics = {"judge": s.roles["judge"], **rating_metrics(records, self.criteria),
                   "dialogues": {**self.counts, "rated": len({r["source_id"] for r in records}), "limit": s.limit},
                   "examples": self.ex_stats}
        if self.reference is not None:
            metrics["agreement"] = agreement_metrics(records, self.reference, self.criteria)
            metrics["reference"] = {"path": s.reference, "rows": len(self.reference)}
        return metrics

    def summary(self, metrics: dict, s: AutoevalSettings, run) -> str:
        # the runner appends the run line (wall time, tokens, cache hits, failed cases)
        return summary_markdown({k: v for k, v in metrics.items() if k != "run"}, f"Rubric auto-evaluation of {s.data}") + "\n" + run_paper_tables(run)


# ------------------------------------------------------------------ step (a), cached

async def explained_examples(client, out: Path, criteria, examples, cfg: J.JudgeConfig, seed: int = 0) -> tuple[dict, dict]:
    """{criterion: {rating: cache entry}}. Entries are reused from ``explained_examples.jsonl`` when the
    judge identity, prompt and settings match. Answered explanations are cached as they come; if any
    request got no answer, RequestFailed is raised after the others are cached (the next run asks
    only the missing ones), so no rating is ever made without its explained examples."""
    judge_identity = client.endpoint(cfg.role).identity
    path = Path(out) / EXPLAINED_FILE
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

    async def one(c, ex):
        return await J.explain_example(CaseContext(client, f"explain/{c.key}/{ex.rating}", seed), c, ex, cfg, judge_identity)

    fresh = await asyncio.gather(*(one(c, ex) for c, ex in todo), return_exceptions=True)
    with open(path, "a", encoding="utf-8") as f:
        for (c, ex), entry in zip(todo, fresh):
            if isinstance(entry, BaseException):
                continue
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
