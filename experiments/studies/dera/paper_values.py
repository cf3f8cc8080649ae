"""DERA for the paper tables (paper_tables.yaml): per-case GPT-F1 per section and arm, QA scores per arm."""

from __future__ import annotations

from experiments.studies.dera.qa_metrics import ARMS, STEPS, arm_values
from experiments.studies.dera.report import gptf1_of, mcq_option_counts, options_label
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

    def case_values(self, run: dict, records: list[dict]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        ok = [r for r in records if "error" not in r]
        for r in ok:  # GPT-F1: f1.<arm>.<section> and f1.<arm>.average
            for arm, (sections, average) in gptf1_of(r).items():
                for sec, g in sections.items():
                    if g.scored and g.named("f1") is not None:
                        out.setdefault(f"f1.{arm}.{sec}", {})[str(r["id"])] = float(g.named("f1"))
                avg = average.named("f1")
                if avg is not None:
                    out.setdefault(f"f1.{arm}.average", {})[str(r["id"])] = float(avg)
        for arm in ARMS:  # QA: <metric>.<arm>
            for name in STEPS:
                vals = {str(r["id"]): float(v) for r, v in zip(ok, arm_values(ok, name, arm)) if v is not None}
                if vals:
                    out[f"{name}.{arm}"] = vals
        return out


ADAPTER = DeraPaper()
