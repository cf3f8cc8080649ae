"""AgentClinic for the paper tables (paper_tables.yaml): per-case diagnostic accuracy and the run's setting."""

from __future__ import annotations

from experiments.common.grade import grades
from experiments.tables.adapter import PaperAdapter


class AgentClinicPaper(PaperAdapter):
    def attrs(self, run: dict, records: list[dict]) -> dict:
        cfg = run.get("config") or {}
        roles = cfg.get("roles") or {}
        return {"cases": len(records), "patient": roles.get("patient") or roles.get("default"),
                "moderator": roles.get("moderator") or roles.get("default"), "answers": cfg.get("answers") or "free"}

    def case_values(self, run: dict, records: list[dict]) -> dict[str, dict[str, float]]:
        """``accuracy`` -> {case id: the moderator's 1/0 (0 without a diagnosis)}, unscored replies left out."""
        values = {r["case_id"]: g.value for r in records if (g := grades(r).get("diagnosis")) and g.scored}
        return {"accuracy": values}


ADAPTER = AgentClinicPaper()
