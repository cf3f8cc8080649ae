"""`medstack autoeval` through the study runner (declared in __init__.py, with its paper tables): every stored dialogue
rated on every criterion by the self-CoT judge, its scorer ``rubric`` (experiments/studies/autoeval/scorers.py).

The runner takes --limit / --sample of the dialogues (read through the one reader: any study's typed records); each
becomes one unit per criterion, id ``<record id>::<criterion>``, whose case is the dialogue's own case (the unit
resampled: the trials of a CRAFT-MD case together). ``solve()`` makes the typed record of the pair and asks nothing;
``setup()`` makes step (a) once per run (cached in ``explained_examples.jsonl`` while the judge, the prompt and the
settings match: a step-(a) request that gets no answer raises RequestFailed, so no rating is made and the run exits
3); the scorer asks step (b).
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from experiments.common.grade import Grade, to_disk
from experiments.core.config import ConfigError, config_dir
from experiments.core.record import RUNNER_FIELDS, is_typed, record
from experiments.core.study import CaseContext, Study
from experiments.tables.render import run_paper_tables
from models.errors import MedstackError
from serving.refs import model_name

from experiments.studies.autoeval import judge as J
from experiments.studies.autoeval.judge import judge_config, load_dialogues
from experiments.studies.autoeval.scorers import RUBRIC, criteria, explain_for_run, rubric_grade
from experiments.studies.autoeval.metrics import agreement_metrics, load_reference, rating_metrics, summary_markdown
from experiments.studies.autoeval.settings import AutoevalSettings

CONFIGS = config_dir(__file__)
DEFAULT_CONFIG = CONFIGS / "default.yaml"
GRADE_FIELDS = ("dialogue_chars", "dialogue_truncated", "finish_reason")  # an older record kept these beside its grade


def default_out(results: str, judge: str) -> str:
    p = Path(results).resolve()
    name = p.name if p.is_dir() else p.parent.name
    return str(Path("runs") / "autoeval" / f"{name}-{model_name(judge)}")


def pair(d: dict, c: J.Criterion, target=None, examples_used=(), scores: dict | None = None) -> dict:
    """The typed record of dialogue ``d`` (:func:`~experiments.studies.autoeval.judge.load_dialogues`) on criterion ``c``:
    the criterion and the rated record's id its inputs, the reference rating its target."""
    return record(f"{d['source_id']}::{c.key}", d["case_id"], transcript=d["transcript"], target=target, scores=scores,
                  inputs={"criterion": c.key, "criterion_name": c.name, "score_5": c.score_5, "score_1": c.score_1, "source_id": d["source_id"]},
                  metadata={"model": d["model"], "turns": len(d["transcript"]), "examples_used": list(examples_used)})


@lru_cache(maxsize=4)
def _read_again(data: str | None, reference: str | None, criteria_file: str | None) -> tuple[dict, dict]:
    """An older run's dialogues by id and reference ratings, read again from its data and reference (its records kept
    neither); empty where they are gone."""
    def read(load) -> dict:
        try:
            return load()
        except MedstackError:
            return {}
    return (read(lambda: {d["source_id"]: d for d in load_dialogues(data)[0]}) if data else {},
            read(lambda: load_reference(reference, list(criteria(criteria_file).values()))) if reference else {})


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
        self.reference: dict | None = None
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
        self.criteria = J.select_criteria(criteria(s.criteria_file), s.criteria)
        self.examples = J.load_examples(s.examples, self.criteria)
        self.reference = load_reference(s.reference, self.criteria) if s.reference else None
        dialogues, self.counts = load_dialogues(s.data)
        return [{**d, "id": d["source_id"]} for d in dialogues]

    def expand(self, dialogues: list[dict], s: AutoevalSettings) -> list[dict]:
        return [{"id": f"{d['source_id']}::{c.key}", "dialogue": d, "criterion": c} for d in dialogues for c in self.criteria]

    async def setup(self, client, s: AutoevalSettings, cases: list[dict], out: Path) -> None:
        t0 = time.perf_counter()
        self.ex_stats = await explain_for_run(client, out, self.criteria, self.examples, judge_config(s), s.seed)
        self.ex_stats["wall_seconds"] = round(time.perf_counter() - t0, 2)

    async def solve(self, ctx: CaseContext, case: dict, s: AutoevalSettings) -> dict:
        d, c = case["dialogue"], case["criterion"]
        return pair(d, c, (self.reference or {}).get((d["source_id"], c.key)), [self.examples[c.key][r].id for r in J.RATINGS])

    def upgrade(self, r: dict, s) -> dict:
        """An older record: its verdict's fields beside the rest (``rating``, ``explanation``, ``raw``, ``parse_error``),
        or its typed score beside the study's fields (``source_id``, ``criterion``, ``dialogue_chars``, ...). The
        dialogue, its case and the reference rating are read again from the run's data and reference, where still there."""
        if is_typed(r):
            return r
        key = str(r.get("criterion") or str(r["id"]).rpartition("::")[2])
        source = str(r.get("source_id") or str(r["id"]).rpartition("::")[0])
        c = criteria(getattr(s, "criteria_file", None)).get(key) or J.Criterion(key, str(r.get("criterion_name") or key), "", "")
        dialogues, reference = _read_again(getattr(s, "data", None), getattr(s, "reference", None), getattr(s, "criteria_file", None))
        d = dialogues.get(source) or {"source_id": source, "case_id": source, "transcript": [], "model": None}
        name = f"rubric/{key}"
        g = Grade.from_json(r["scores"][name]) if name in (r.get("scores") or {}) else \
            rubric_grade(r, source, r.get("judge") or (getattr(s, "roles", None) or {}).get("judge"))
        g = replace(g, metadata={**g.metadata, **{k: r[k] for k in GRADE_FIELDS if k in r}})
        out = pair({**d, "model": r.get("model", d["model"])}, c, reference.get((source, key)), r.get("examples_used") or (), to_disk({name: g}))
        if not d["transcript"] and "turns" in r:
            out["metadata"]["turns"] = r["turns"]
        return {**{k: v for k, v in r.items() if k in RUNNER_FIELDS}, **out}

    def metrics(self, records: list[dict], s: AutoevalSettings) -> dict:
        metrics = {"judge": s.roles["judge"], **rating_metrics(records, self.criteria, self.scorers),
                   "dialogues": {**self.counts, "rated": len({r["inputs"]["source_id"] for r in records}), "limit": s.limit},
                   "examples": self.ex_stats}
        if self.reference is not None:
            metrics["agreement"] = agreement_metrics(records, self.reference, self.criteria)
            metrics["reference"] = {"path": s.reference, "rows": len(self.reference)}
        return metrics

    def summary(self, metrics: dict, s: AutoevalSettings, run) -> str:
        # the runner appends the Scores section and the run line (wall time, tokens, cache hits, failed cases)
        return summary_markdown(metrics, f"Rubric auto-evaluation of {s.data}") + "\n" + run_paper_tables(run, self)
