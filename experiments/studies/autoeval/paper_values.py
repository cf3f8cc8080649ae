"""Rubric auto-evaluation for the paper tables (paper_tables.yaml): the run's label and attributes (the rows are its scores')."""

from __future__ import annotations

from experiments.tables.adapter import PaperAdapter


class AutoevalPaper(PaperAdapter):
    def label(self, run: dict, default: str) -> str:
        rated = sorted({str(m) for r in run.get("records") or [] if (m := (r.get("metadata") or {}).get("model"))})
        judge = str(((run.get("config") or {}).get("roles") or {}).get("judge") or default).split("@", 1)[0]
        return f"{', '.join(rated) or '?'} rated by {judge}"

    def attrs(self, run: dict, records: list[dict]) -> dict:
        cfg = run.get("config") or {}
        return {"answers": cfg.get("answers") or "free", "judge": str((cfg.get("roles") or {}).get("judge") or "?").split("@", 1)[0]}


ADAPTER = AutoevalPaper()
