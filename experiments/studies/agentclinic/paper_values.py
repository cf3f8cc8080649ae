"""AgentClinic for the paper tables (paper_tables.yaml): the run's setting (the figures are its scores')."""

from __future__ import annotations

from experiments.tables.adapter import PaperAdapter


class AgentClinicPaper(PaperAdapter):
    def attrs(self, run: dict, records: list[dict]) -> dict:
        cfg = run.get("config") or {}
        roles = cfg.get("roles") or {}
        return {"cases": len(records), "patient": roles.get("patient") or roles.get("default"),
                "moderator": roles.get("moderator") or roles.get("default"), "answers": cfg.get("answers") or "free"}


ADAPTER = AgentClinicPaper()
