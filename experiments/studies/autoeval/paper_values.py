"""Rubric auto-evaluation for the paper tables (paper_tables.yaml): per-dialogue ratings per criterion (1-5)."""

from __future__ import annotations

from experiments.studies.autoeval.metrics import rating_of
from experiments.tables.adapter import PaperAdapter


class AutoevalPaper(PaperAdapter):
    def label(self, run: dict, default: str) -> str:
        rated = sorted({str(r.get("model")) for r in run.get("records") or [] if r.get("model")})
        judge = str(((run.get("config") or {}).get("roles") or {}).get("judge") or default).split("@", 1)[0]
        return f"{', '.join(rated) or '?'} rated by {judge}"

    def attrs(self, run: dict, records: list[dict]) -> dict:
        cfg = run.get("config") or {}
        return {"answers": cfg.get("answers") or "free", "judge": str((cfg.get("roles") or {}).get("judge") or "?").split("@", 1)[0]}

    def case_values(self, run: dict, records: list[dict]) -> dict[str, dict[str, float]]:
        """<criterion key> -> {dialogue id: rating}; unscored ratings are left out (never 0)."""
        out: dict[str, dict[str, float]] = {}
        for r in records:
            if (v := rating_of(r).value) is not None and r.get("criterion"):
                out.setdefault(r["criterion"], {})[str(r.get("source_id"))] = float(v)
        return out


ADAPTER = AutoevalPaper()
