"""DERA for the paper tables (paper_tables.yaml): the run's label and attributes (the rows are its scores')."""

from __future__ import annotations

from experiments.studies.dera.report import mcq_option_counts, options_label
from experiments.tables.adapter import PaperAdapter


class DeraPaper(PaperAdapter):
    def label(self, run: dict, default: str) -> str:
        level = (run.get("config") or {}).get("corruption_level")
        return f"{default}, level {level}" if level and (run.get("config") or {}).get("task") == "corrupt" else default

    def attrs(self, run: dict, records: list[dict]) -> dict:
        cfg, m = run.get("config") or {}, run.get("metrics") or {}
        out = {"answers": cfg.get("answers") or "free", "decider": (cfg.get("roles") or {}).get("decider"),
               "judge": (cfg.get("roles") or {}).get("judge")}
        bs = m.get("bertscore") or {}
        if bs:
            out.update(bertscore_encoder=bs.get("encoder"), bertscore_layer=bs.get("layer"))
        if cfg.get("mcq"):
            counts = mcq_option_counts(records)
            out.update(mcq_options=next(iter(counts)) if len(counts) == 1 else None, mcq_options_label=options_label(counts))
        return out


ADAPTER = DeraPaper()
