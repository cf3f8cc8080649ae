"""MediTOD for the paper tables (paper_tables.yaml): corpus figures come from metrics.json; attributes here."""

from __future__ import annotations

from experiments.tables.adapter import PaperAdapter


class MeditodPaper(PaperAdapter):
    def label(self, run: dict, default: str) -> str:
        s = (run.get("metrics") or {}).get("settings") or {}
        cfg = run.get("config") or {}
        mode = s.get("mode") or cfg.get("mode")
        lora = s.get("lora") or cfg.get("lora") or {}
        name = s.get("model") or default
        return f"{name}{' + LoRA ' + ','.join(lora) if lora else ''} ({'in-context' if mode == 'icl' else mode or '?'})"

    def attrs(self, run: dict, records: list[dict]) -> dict:
        cfg, m = run.get("config") or {}, run.get("metrics") or {}
        return {"answers": cfg.get("answers") or "free", "dialogs": len({r.get("case_id") for r in records}),
                "retrieval_encoder": cfg.get("encoder") or "all-MiniLM-L6-v2",
                "adjudicated": bool(cfg.get("adjudicate_model")),
                "bertscore_encoder": m.get("bertscore_encoder"), "bertscore_layer": m.get("bertscore_layer")}


ADAPTER = MeditodPaper()
