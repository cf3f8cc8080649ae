"""CRAFT-MD's studies: `medstack run craftmd` (cases × trials through the study runner: records, metrics,
summary; resumable) and `medstack meld` (experiments/craftmd/meld.py), registered with their paper tables."""

from __future__ import annotations

from pathlib import Path

from experiments.core.config import ConfigError, config_dir
from experiments.core.registry import register_study, register_tables
from experiments.craftmd.data import load_cases
from experiments.craftmd.meld import MeldStudy
from experiments.craftmd.metrics import per_specialty, run_metrics, summary_markdown
from experiments.craftmd.paper_values import ADAPTER
from experiments.craftmd.prompts import PROMPTS
from experiments.craftmd.protocol import solve
from experiments.craftmd.settings import CraftSettings, loop_line, requests_line
from experiments.core.study import CaseContext, Study
from experiments.tables.render import run_paper_tables
from serving.refs import model_name

CONFIGS = config_dir(__file__)


def units_for(cases: list[dict], trials: int) -> list[dict]:
    """One unit of work per (case, trial), id ``<case_id>/t<trial>``."""
    return [{"id": f"{c['case_id']}/t{t}", "case": c, "trial": t} for c in cases for t in range(trials)]


class CraftmdStudy(Study):
    name = "craftmd"
    settings_cls = CraftSettings
    roles = ("clinical", "patient", "grader", "summarizer")
    primary_role = "clinical"
    prompts = PROMPTS
    sweep_roles = ("clinical",)  # the doctor-AI varies; patient-AI and grader-AI stay fixed (Johri et al.)
    role_follows = {"summarizer": "grader"}

    def fixed_roles(self, s: CraftSettings) -> tuple[str, ...]:
        talks = any(f != "vignette" for f in s.formats)  # every format but the vignette has a patient-AI
        return (("patient",) if talks else ()) + (("grader",) if s.frq else ()) + (("summarizer",) if "summarized" in s.formats else ())

    def default_config(self, overrides: dict) -> Path:
        return CONFIGS / "paper.yaml"

    def prepare(self, s: CraftSettings) -> CraftSettings:
        if not s.data:
            raise ConfigError("no case file: pass --data CASES.csv (or a registered name such as craftmd-cases), or an AgentClinic OSCE .jsonl")
        if not (s.mcq or s.frq):
            raise ConfigError("nothing to ask: --no-mcq and --no-frq together leave no question")
        return s.model_copy(update={"name": s.name or model_name(s.roles["clinical"])})

    def load_cases(self, s: CraftSettings) -> list[dict]:
        return units_for(load_cases(s.data, specialty=s.specialty, limit=s.limit), s.trials)

    async def solve(self, ctx: CaseContext, unit: dict, s: CraftSettings) -> dict:
        return await solve(ctx, unit, s)

    def metrics(self, records: list[dict], s: CraftSettings) -> dict:
        metrics = run_metrics(records)
        metrics["per_specialty"] = per_specialty(records)
        metrics["grades"] = "local grader"
        metrics["concurrent_rule"] = s.concurrent_rule
        metrics["requests"] = loop_line(s)  # the settings unlike the authors' follow under the title (the runner's metrics["deviations"])
        return metrics

    def describe(self, s: CraftSettings) -> list[str]:
        return [requests_line(s)]

    def summary(self, metrics: dict, s: CraftSettings) -> str:
        return summary_markdown(s.name, metrics) + "\n" + run_paper_tables(s.out, metrics)


register_study("craftmd", CraftmdStudy, help="""CRAFT-MD: simulated doctor–patient conversations, summaries, MCQ/FRQ in 4 formats, two-step grading, N trials.

    One record per (case, trial), id CASE/tK. Writes records.jsonl, metrics.json, summary.md in --out.
    Exit 0 done, 2 bad input, 3 some cases failed (run the same command again to retry them).
    """)
register_study("meld", MeldStudy, top_level=True,
               help="MELD contamination check: first half of each vignette -> model writes the second half; similarity = 1 − normalized Levenshtein.")
register_tables(Path(__file__).with_name("paper_tables.yaml"), ADAPTER)
