"""The DERA studies as the runner sees them: `run dera-summarize | dera-careplan | dera-corrupt | dera-qa`.

Roles: ``decider`` (the model under test), ``researcher``, ``judge`` (GPT-F1, QA judges). The protocol lives in
``dialogue`` / ``qa``; the scorers in ``scorers`` (with ``gptf1`` / ``qa_metrics``); metrics and summary tables in
``report``; older records in today's shape in ``results``. Everything else is the runner's.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from experiments.core.config import ConfigError, config_dir
from experiments.studies.dera import dialogue, qa, report
from experiments.studies.dera.calls import CaseLog
from experiments.studies.dera.data import load_encounters, load_medqa, resolve_qa_path
from experiments.studies.dera.prompts import PROMPTS
from experiments.studies.dera.results import upgrade_dialogue, upgrade_qa
from experiments.studies.dera.scorers import GPTF1, QA
from experiments.studies.dera.settings import CAREPLAN_SECTIONS, SUMMARY_SECTIONS, CareplanSettings, CorruptSettings, DialogueSettings, QASettings
from experiments.core.study import CaseContext, Study
from experiments.tables.render import run_paper_tables
from serving.refs import model_name

HERE = Path(__file__).parent
CONFIGS = config_dir(__file__)
SAMPLE_ENCOUNTERS = HERE / "data" / "sample_encounters.jsonl"
SAMPLE_QA = HERE / "data" / "sample_medqa_open.jsonl"
ROLES = ("decider", "researcher", "judge")


def _default_out(name: str, decider: str, suffix: str = "") -> str:
    return str(Path("runs") / f"{name}-{model_name(decider)}{suffix}")


class DeraDialogueStudy(Study):
    """dera-summarize / dera-careplan / dera-corrupt: one encounter per case."""

    settings_cls = DialogueSettings
    roles = ROLES
    primary_role = "decider"
    prompts = PROMPTS
    sweep_roles = ("decider", "researcher")  # both agents are the model under test; the GPT-F1 judge stays fixed
    scorers = (GPTF1,)

    def fixed_roles(self, s: DialogueSettings) -> tuple[str, ...]:
        return ("judge",)
    task: ClassVar[str] = "summarize"

    def default_config(self, overrides: dict) -> Path:
        return CONFIGS / f"{self.task}.yaml"

    def out_suffix(self, s: DialogueSettings) -> str:
        return ""

    def prepare(self, s: DialogueSettings) -> DialogueSettings:
        if s.task != self.task:
            raise ConfigError(f"{self.name} needs a config with task: {self.task}, this one has task: {s.task}")
        update: dict = {"data": s.data or str(SAMPLE_ENCOUNTERS)}
        if not s.out:
            update["out"] = _default_out(self.name, s.roles["decider"], self.out_suffix(s))
        return s.model_copy(update=update)

    def load_cases(self, s: DialogueSettings) -> list[dict]:
        return load_encounters(s.data)

    async def solve(self, ctx: CaseContext, case: dict, s: DialogueSettings) -> dict:
        return await dialogue.make_solver(s, model_name(s.roles["decider"]))(CaseLog(ctx), case)

    upgrade = staticmethod(upgrade_dialogue)  # an older record in today's shape (results.py)
    metrics = staticmethod(report.dialogue_metrics)  # what is not a score (the runner adds the scores' figures)

    def summary(self, metrics: dict, s: DialogueSettings, run) -> str:
        return report.dialogue_summary(metrics, s, self.name) + "\n" + run_paper_tables(run, self)


def dialogue_standins(sections: list[str], first: int = 1) -> dict[str, tuple[str, ...]]:
    """A dry run's replies (experiments/core/dryrun.py): the Decider's ``first`` outputs in sections (the corruption
    study's: its reference, then the corrupted one), the Researcher one point then [STOP], the Decider's dialogue turn,
    its rewrite in sections; the judge's concepts and which are found, so GPT-F1's requests follow."""
    text = "\n".join(f"{s}: (dry run) a stand-in finding." for s in sections)
    return {"decider": (*[text] * first, '[RESPONSE: "(dry run) Agreed."] [SCRATCHPAD: "(dry run) a stand-in edit"]', text),
            "researcher": ('[RESPONSE: "(dry run) a stand-in point"]', "[STOP]"),
            "judge": gptf1_standin}


def gptf1_standin(request: str) -> str:
    """the judge: a concept list to an extraction request (prompts/gptf1_extract.txt), item 1 found to a verification"""
    return '["(dry run) a stand-in finding"]' if "List the medical concepts" in request else "[1]"


class SummarizeStudy(DeraDialogueStudy):
    """`medstack run dera-summarize` (its help: __init__.py)."""

    task = "summarize"
    standins = dialogue_standins(SUMMARY_SECTIONS)


class CareplanStudy(DeraDialogueStudy):
    """`medstack run dera-careplan` (its help: __init__.py)."""

    task = "careplan"
    settings_cls = CareplanSettings
    standins = dialogue_standins(CAREPLAN_SECTIONS)


class CorruptStudy(DeraDialogueStudy):
    """`medstack run dera-corrupt` (its help: __init__.py)."""

    task = "corrupt"
    settings_cls = CorruptSettings
    standins = dialogue_standins(SUMMARY_SECTIONS, first=2)

    def out_suffix(self, s: DialogueSettings) -> str:
        return f"-level{s.corruption_level}"

    def prepare(self, s: DialogueSettings) -> DialogueSettings:
        if s.corruption_level is None:
            raise ConfigError("dera-corrupt needs --level (corruption strength out of 10; paper: 3, 5, 7)")
        return super().prepare(s)


class QAStudy(Study):
    """`medstack run dera-qa` (its help: __init__.py)."""

    settings_cls = QASettings
    roles = ROLES
    primary_role = "decider"
    prompts = PROMPTS
    sweep_roles = ("decider", "researcher")
    scorers = QA
    # a dry run's Researcher makes one point, then stops; the Decider's answer is a letter and a reason; the judge's
    # replies read as a verdict and a number
    standins = {"researcher": ("(dry run) Think about the timing of the symptoms.", "STOP"),
                "decider": ("A", "(dry run) a stand-in explanation.", "Answer: A\nResponse: (dry run) a stand-in reason", "A"),
                "judge": ("True\n(dry run) the same drug.",)}

    def fixed_roles(self, s: QASettings) -> tuple[str, ...]:
        return () if s.mcq else ("judge",)  # open-ended answers are judged against the gold; MCQ needs no judge

    def default_config(self, overrides: dict) -> Path:
        return CONFIGS / ("qa-mcq.yaml" if overrides.get("mcq") else "qa.yaml")

    def prepare(self, s: QASettings) -> QASettings:
        update: dict = {"data": str(resolve_qa_path(s.data or SAMPLE_QA, s.split))}
        if not s.out:
            update["out"] = _default_out(self.name, s.roles["decider"], "-mcq" if s.mcq else "")
        return s.model_copy(update=update)

    def load_cases(self, s: QASettings) -> list[dict]:
        return load_medqa(s.data, mcq=s.mcq)

    async def solve(self, ctx: CaseContext, case: dict, s: QASettings) -> dict:
        return await qa.make_solver(s, model_name(s.roles["decider"]))(CaseLog(ctx), case)

    upgrade = staticmethod(upgrade_qa)
    metrics = staticmethod(report.qa_metrics)

    def summary(self, metrics: dict, s: QASettings, run) -> str:
        return report.qa_summary(metrics, s, self.name) + "\n" + run_paper_tables(run, self)
