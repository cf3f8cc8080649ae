"""A toy study declared in this one file, as a study folder's ``__init__.py`` declares one: its settings, its Study
(roles, strata, scorers, a comparison), its paper tables' adapter, and its declaration.
Loaded by the tests through the registry's search path: $MEDSTACK_STUDIES names this folder."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field

from experiments.common.grade import BINARY, Grade
from experiments.core.config import RunSettings, Sampling, role_flag
from experiments.core.record import record
from experiments.core.registry import Command, StudyDeclaration
from experiments.core.results import read_run
from experiments.core.scorers import Scorer
from experiments.core.study import CaseContext, Study
from experiments.tables.adapter import PaperAdapter
from experiments.tables.render import run_paper_tables


class ToySettings(RunSettings):
    cli_flags = (role_flag("echo", "Echo model (alias of --role echo=REF)."),)

    roles: dict[str, str] = {"echo": "embedded"}
    word: str = Field("hello", description="The word the model is asked to repeat.")
    repeats: int = Field(1, ge=1, description="Requests per case.")
    shout: bool = Field(False, description="Ask for the word in capitals.")
    sampling: Sampling = Field(Sampling(max_tokens=8), description="Sampling of the one step.", json_schema_extra={"cli": False})  # no flag


def exact(ctx, r: dict, s: ToySettings, role) -> dict:
    """The toy's rule: did every answer repeat the word."""
    return {None: Grade(value=int(all(a.strip() == r["target"] for a in r["answer"])), answer=" ".join(r["answer"]), source="exact",
                        judge={"rule": f"every answer equals the word {s.word}"})}


async def asked(ctx: CaseContext, r: dict, s: ToySettings, role: str) -> dict:
    """Ask ``role`` whether the answers repeat the word (for `medstack rescore`): yes -> 1, no -> 0, else unscored."""
    answer = " ".join(r["answer"])
    reply = await ctx.chat([{"role": "user", "content": f"{r['id']}: is {answer!r} the word {s.word}? yes or no"}], role=role,
                           gen=s.sampling.gen(), step="echo-judge")
    first = (reply.text or "").strip().lower().split()[:1]
    return {None: Grade(value={"yes": 1, "no": 0}.get(first[0]) if first else None, answer=answer, explanation=reply.text,
                        judge={"model": s.roles[role], "rule": "first word yes / no"})}


def toy_show(r: dict, part: str | None) -> dict:
    return {"the word asked for": r["target"], "the answers": r["answer"]}


class ToyStudy(Study):
    settings_cls = ToySettings
    roles = ("echo",)
    primary_role = "echo"
    strata = ("group",)  # --sample keeps the groups' mix
    scorers = (Scorer("echo-judge", BINARY, "Did the model repeat the word it was asked for, in every answer?", decide=exact, show=toy_show),
               Scorer("echo-asked", BINARY, "Did the model repeat the word it was asked for, in every answer?", decide=asked, role="echo",
                      show=toy_show, optional=True))

    def load_cases(self, s: ToySettings) -> list[dict]:
        lines = Path(s.data).read_text(encoding="utf-8").splitlines()
        return [json.loads(x) for x in lines if x.strip()]

    async def solve(self, ctx: CaseContext, case: dict, s: ToySettings) -> dict:
        word = s.word.upper() if s.shout else s.word
        answers = [(await ctx.chat([{"role": "user", "content": f"{case['id']}: say {word}"}], role="echo",
                                   gen=s.sampling.gen(), step=f"ask{i}")).text for i in range(s.repeats)]
        return record(case["id"], inputs={"word": word}, target=word, answer=answers, metadata={"group": case.get("group")})

    def compare(self, run_dirs: list[str], out) -> dict:
        """The toy's own comparison: accuracy per run."""
        rows = [{"run": d, "accuracy": sum(r["scores"]["echo-judge"]["value"] for r in run.finished) / len(run.finished)}
                for d in run_dirs for run in [read_run(d)]]
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "summary.md").write_text("# Toy comparison\n\n" + "".join(f"- {Path(r['run']).name}: accuracy {r['accuracy']:.3f}\n" for r in rows))
        return {"runs": rows, "warnings": []}

    def summary(self, metrics: dict, s: ToySettings, run) -> str:
        acc = next(f["value"] for f in metrics["scores"] if f["score"] == "echo-judge")
        return f"# toy\n\naccuracy: {acc}\n\n" + run_paper_tables(run, self)


STUDY = StudyDeclaration(
    commands=(Command("toy", "Toy: ask each case to repeat a word.", ToyStudy, more="One record per case."),),
    tables="paper_tables.yaml", adapter=PaperAdapter(),
)
