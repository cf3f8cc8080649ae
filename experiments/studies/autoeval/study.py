"""`medstack autoeval` through the study runner (declared in __init__.py, with its paper tables): every stored dialogue
rated on every criterion by the self-CoT judge, its scorer ``rubric`` (experiments/studies/autoeval/scorers.py).

Cases are (dialogue, criterion) pairs, id ``<record id>::<criterion>``, the dialogue the case (the unit resampled).
``solve()`` makes the typed record of the pair, asking nothing; ``setup()`` makes step (a) once per run (cached in
``explained_examples.jsonl`` while the judge, the prompt and the settings match: a step-(a) request that gets no answer
raises RequestFailed, so no rating is made and the run exits 3); the scorer makes step (b).
"""

from __future__ import annotations

import time
from functools import lru_cache
from pathlib import Path

from experiments.core.config import ConfigError, config_dir
from experiments.core.record import RUNNER_FIELDS, is_typed, record
from experiments.core.study import CaseContext, Study
from experiments.tables.render import run_paper_tables
from models.errors import MedstackError
from serving.refs import model_name

from experiments.studies.autoeval import judge as J
from experiments.studies.autoeval.judge import judge_config, load_dialogues
from experiments.studies.autoeval.scorers import RUBRIC, explained_examples, rubric_grade
from experiments.studies.autoeval.metrics import agreement_metrics, load_reference, rating_metrics, summary_markdown
from experiments.studies.autoeval.settings import AutoevalSettings

CONFIGS = config_dir(__file__)
DEFAULT_CONFIG = CONFIGS / "default.yaml"


def default_out(results: str, judge: str) -> str:
    p = Path(results).resolve()
    name = p.name if p.is_dir() else p.parent.name
    return str(Path("runs") / "autoeval" / f"{name}-{model_name(judge)}")


@lru_cache(maxsize=4)
def _dialogues(data: str) -> dict[str, list[dict]]:
    return {d["source_id"]: d["transcript"] for d in load_dialogues(data)[0]}


def source_dialogue(data: str | None, source_id: str) -> list[dict]:
    """The dialogue ``source_id`` of a run's data (an older record did not keep the dialogue it rated); [] where gone."""
    try:
        return _dialogues(str(data)).get(source_id, []) if data else []
    except MedstackError:
        return []


# ------------------------------------------------------------------ the study

class AutoevalStudy(Study):
    settings_cls = AutoevalSettings
    roles = ("judge",)
    primary_role = "judge"
    prompts = J.PROMPTS
    case_noun = "dialogues"
    scorers = (RUBRIC,)

    def __init__(self):
        self.criteria: list[J.Criterion] = []
        self.examples: dict = {}
        self.reference: list[dict] | None = None
        self.counts: dict = {}
        self.ex_stats: dict = {}

    def default_config(self, overrides: dict) -> Path:
        return DEFAULT_CONFIG

    def prepare(self, s: AutoevalSettings) -> AutoevalSettings:
        if not s.data:
            raise ConfigError("no RESULTS directory given: `medstack autoeval RESULTS` or --data RESULTS")
        return s.model_copy(update={"out": s.out or default_out(s.data, s.roles["judge"])})

    def load_cases(self, s: AutoevalSettings) -> list[dict]:
        """The dialogues (--limit / --sample count dialogues: each is rated on every criterion)."""
        self.criteria = J.select_criteria(J.load_criteria(s.criteria_file), s.criteria)
        self.examples = J.load_examples(s.examples, self.criteria)
        self.reference = load_reference(s.reference, self.criteria) if s.reference else None
        dialogues, self.counts = load_dialogues(s.data)
        return [{**d, "id": d["source_id"]} for d in dialogues]

    def expand(self, dialogues: list[dict], s: AutoevalSettings) -> list[dict]:
        return [{"id": f"{d['source_id']}::{c.key}", "dialogue": d, "criterion": c} for d in dialogues for c in self.criteria]

    async def setup(self, client, s: AutoevalSettings, cases: list[dict], out: Path) -> None:
        t0 = time.perf_counter()
        _, self.ex_stats = await explained_examples(client, out, self.criteria, self.examples, judge_config(s), s.seed)
        self.ex_stats["wall_seconds"] = round(time.perf_counter() - t0, 2)

    async def solve(self, ctx: CaseContext, case: dict, s: AutoevalSettings) -> dict:
        d, c = case["dialogue"], case["criterion"]
        return record(case["id"], d["source_id"], transcript=d["transcript"],
                      inputs={"criterion": c.key, "criterion_name": c.name, "score_5": c.score_5, "score_1": c.score_1},
                      metadata={"model": d["model"], "turns": len(d["transcript"]),
                                "examples_used": [self.examples[c.key][r].id for r in J.RATINGS]})

    def upgrade(self, r: dict, s) -> dict:
        """An older record (the verdict's fields beside the rest: ``rating``, ``explanation``, ``raw``, ``parse_error``)."""
        if is_typed(r):
            return r
        key = str(r.get("criterion"))
        c = J.load_criteria(getattr(s, "criteria_file", None)).get(key)
        scores = r.get("scores") or {f"rubric/{key}": rubric_grade(r, r.get("source_id"), r.get("judge") or (getattr(s, "roles", None) or {}).get("judge")).to_json()}
        keep = ("judge", "model", "correct", "prompt_hash", "finish_reason", "examples_used", "turns", "dialogue_chars", "dialogue_truncated")
        source = r.get("source_id") or str(r["id"]).split("::")[0]
        out = record(r["id"], source, scores=scores, metadata={k: r[k] for k in keep if k in r}, transcript=source_dialogue(getattr(s, "data", None), source),
                     inputs={"criterion": key, "criterion_name": r.get("criterion_name") or (c.name if c else key),
                             "score_5": c.score_5 if c else "", "score_1": c.score_1 if c else ""})
        return {**{k: v for k, v in r.items() if k in RUNNER_FIELDS}, **out}

    def metrics(self, records: list[dict], s: AutoevalSettings) -> dict:
        metrics = {"judge": s.roles["judge"], **rating_metrics(records, self.criteria),
                   "dialogues": {**self.counts, "rated": len({r["case_id"] for r in records}), "limit": s.limit},
                   "examples": self.ex_stats}
        if self.reference is not None:
            metrics["agreement"] = agreement_metrics(records, self.reference, self.criteria)
            metrics["reference"] = {"path": s.reference, "rows": len(self.reference)}
        return metrics

    def summary(self, metrics: dict, s: AutoevalSettings, run) -> str:
        # the runner appends the run line (wall time, tokens, cache hits, failed cases)
        return summary_markdown({k: v for k, v in metrics.items() if k != "run"}, f"Rubric auto-evaluation of {s.data}") + "\n" + run_paper_tables(run, self)
