"""CRAFT-MD for the paper tables (paper_tables.yaml): per-case accuracy per format and mode, setting attributes."""

from __future__ import annotations

from experiments.craftmd.compare import grading_of
from experiments.craftmd.metrics import case_scores, formats_modes
from experiments.craftmd.settings import CraftSettings, deviations
from experiments.tables.adapter import PaperAdapter


class CraftmdPaper(PaperAdapter):
    def attrs(self, run: dict, records: list[dict]) -> dict:
        cfg, m = run.get("config") or {}, run.get("metrics") or {}
        g = grading_of(run)
        return {"grades": g["grades"], "concurrent_rule": g["concurrent_rule"], "answers": cfg.get("answers") or "free",
                "cases": len({r.get("case_id") for r in records}), "turn_cap_inferred": m.get("turn_cap_inferred"),
                "trials": cfg.get("trials") or max((int(r.get("trial") or 0) + 1 for r in records), default=None),
                "grader": (cfg.get("roles") or {}).get("grader"), **self.requests(run)}

    @staticmethod
    def requests(run: dict) -> dict:
        """loop and deviations (joined; absent when none) of a local run that records its loop; nothing for an
        imported run or one made before requests followed the authors' code (no ``loop`` in its config)."""
        cfg = run.get("config") or {}
        if cfg.get("experiment") != "craftmd" or cfg.get("imported_from") or "loop" not in cfg:
            return {}
        try:
            s = CraftSettings.model_validate({k: v for k, v in cfg.items() if k in CraftSettings.model_fields})
        except ValueError:
            return {}
        devs = deviations(s)
        return {"loop": s.loop, **({"deviations": "; ".join(devs)} if devs else {})}

    def case_values(self, run: dict, records: list[dict]) -> dict[str, dict[str, float]]:
        """`<format>.<mode>` -> {case_id: correctness averaged over the case's scored trials}."""
        return {f"{f}.{m}": case_scores(records, f, m) for f, m in formats_modes(records)}


ADAPTER = CraftmdPaper()
