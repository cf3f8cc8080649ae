"""AgentClinic for the paper tables (paper_tables.yaml): the run's setting (the figures are its scores')."""

from __future__ import annotations

from experiments.core.conditions import Effect
from experiments.studies.agentclinic.settings import IMPLICIT
from experiments.tables.adapter import PaperAdapter

# The paper's bias effects (arXiv 2405.07960, as its text states them, one decimal): diagnostic accuracy with a bias over
# accuracy without (= 100), GPT-4 / Mixtral-8x7B doctor, per agent and group of kinds (per-kind figures are not given).
BIAS_PAPER = {("doctor", "cognitive"): (95.7, 74.2), ("doctor", "implicit"): (97.7, 85.8),
              ("patient", "cognitive"): (93.9, 90.0), ("patient", "implicit"): (97.2, 82.0)}


def bias_paper(cond: dict) -> str | None:
    """The paper's figure for a run's bias (one agent biased), by the group of its kind."""
    biased = [(agent, cond.get(f"{agent}_bias")) for agent in ("doctor", "patient") if cond.get(f"{agent}_bias", "none") != "none"]
    if len(biased) != 1:
        return None
    agent, kind = biased[0]
    group = "implicit" if kind in IMPLICIT else "cognitive"
    gpt4, mixtral = BIAS_PAPER[(agent, group)]
    return f"GPT-4 {gpt4}, Mixtral {mixtral} ({agent} {group} biases)"


BIAS_EFFECTS = (Effect("diagnosis", {"doctor_bias": "none", "patient_bias": "none"}, "bias effect on diagnostic accuracy", bias_paper),)


class AgentClinicPaper(PaperAdapter):
    def attrs(self, run: dict, records: list[dict]) -> dict:
        cfg = run.get("config") or {}
        roles = cfg.get("roles") or {}
        return {"cases": len(records), "patient": roles.get("patient") or roles.get("default"),
                "moderator": roles.get("moderator") or roles.get("default"), "answers": cfg.get("answers") or "free"}


ADAPTER = AgentClinicPaper()
