"""A toy study declared in this one file, as a study folder's ``__init__.py`` declares one: its settings, its Study
(roles, strata, results: typed scores, a judge, a comparison), its paper tables' adapter, and its declaration.
Loaded by the tests through the registry's search path: $MEDSTACK_STUDIES names this folder."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field

from experiments.common.grade import Grade
from experiments.core.config import RunSettings, Sampling, role_flag
from experiments.core.judging import BINARY, Judge
from experiments.core.registry import Command, StudyDeclaration
from experiments.core.results import read_run
from experiments.core.study import CaseContext, Study, StudyResults
from experiments.tables.adapter import PaperAdapter
from experiments.tables.render import run_paper_tables


class ToySettings(RunSettings):
    cli_flags = (role_flag("echo", "Echo model (alias of --role echo=REF)."),)

    experiment: str = "toy"
    roles: dict[str, str] = {"echo": "embedded"}
    word: str = Field("hello", description="The word the model is asked to repeat.")
    repeats: int = Field(1, ge=1, description="Requests per case.")
    shout: bool = Field(False, description="Ask for the word in capitals.")
    sampling: Sampling = Field(Sampling(max_tokens=8), description="Sampling of the one step.", json_schema_extra={"cli": False})  # no flag


def toy_scores(record: dict, settings) -> dict[str, Grade]:
    """The toy's one decision, typed: did every answer repeat the word (a rule of ours, not a model)."""
    return {"echo-judge": Grade(value=record["correct"], answer=" ".join(record["answers"]), source="exact",
                                judge={"rule": f"every answer equals the word {settings.word}"})}


def toy_show(record: dict, part: str | None, config: dict) -> dict:
    return {"the word asked for": config.get("word"), "the answers": record["answers"]}


async def toy_ask(ctx: CaseContext, record: dict, part: str | None, s: ToySettings, role: str) -> Grade:
    """Ask ``role`` again whether the stored answers repeat the word (for `medstack rescore`): yes -> 1, no -> 0, else unscored."""
    answer = " ".join(record["answers"])
    reply = await ctx.chat([{"role": "user", "content": f"{record['id']}: is {answer!r} the word {s.word}? yes or no"}], role=role,
                           gen=s.sampling.gen(), step="echo-judge")
    first = (reply.text or "").strip().lower().split()[:1]
    return Grade(value={"yes": 1, "no": 0}.get(first[0]) if first else None, answer=answer, explanation=reply.text,
                 judge={"model": s.roles[role], "rule": "first word yes / no"})


def toy_compare(run_dirs: list[str], out) -> dict:
    """The toy's own comparison: accuracy per run."""
    rows = [{"run": d, "accuracy": sum(r["correct"] for r in run.finished) / len(run.finished)} for d in run_dirs for run in [read_run(d)]]
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "summary.md").write_text("# Toy comparison\n\n" + "".join(f"- {Path(r['run']).name}: accuracy {r['accuracy']:.3f}\n" for r in rows))
    return {"runs": rows, "warnings": []}


TOY_RESULTS = StudyResults(
    experiment="toy", scores=toy_scores, compare=toy_compare,
    judges=(Judge("echo-judge", BINARY, "Did the model repeat the word it was asked for, in every answer?", role="echo", show=toy_show, ask=toy_ask),))


class ToyStudy(Study):
    name = "toy"
    results = TOY_RESULTS
    settings_cls = ToySettings
    roles = ("echo",)
    primary_role = "echo"
    strata = ("group",)  # --sample keeps the groups' mix

    def load_cases(self, s: ToySettings) -> list[dict]:
        lines = Path(s.data).read_text(encoding="utf-8").splitlines()
        return self.select([json.loads(x) for x in lines if x.strip()], s)

    async def solve(self, ctx: CaseContext, case: dict, s: ToySettings) -> dict:
        word = s.word.upper() if s.shout else s.word
        answers = [(await ctx.chat([{"role": "user", "content": f"{case['id']}: say {word}"}], role="echo",
                                   gen=s.sampling.gen(), step=f"ask{i}")).text for i in range(s.repeats)]
        return {"answers": answers, "correct": int(all(a.strip() == word for a in answers))}

    def metrics(self, records: list[dict], s: ToySettings) -> dict:
        return {"accuracy": sum(r["correct"] for r in records) / len(records) if records else None}

    def summary(self, metrics: dict, s: ToySettings, run) -> str:
        return f"# toy\n\naccuracy: {metrics['accuracy']}\n\n" + run_paper_tables(run)


class ToyTables(PaperAdapter):
    def case_values(self, run: dict, records: list[dict]) -> dict[str, dict[str, float]]:
        return {"correct": {r["id"]: float(r["correct"]) for r in records}}


STUDY = StudyDeclaration(
    commands=(Command("toy", "Toy: ask each case to repeat a word.", ToyStudy, more="One record per case."),),
    tables="paper_tables.yaml", adapter=ToyTables(),
)
