"""What a study gives the paper tables besides its YAML: a run's label, its setting attributes (for the
declaration's `when` conditions and footnotes) and its per-case values (for CIs and paired tests)."""

from __future__ import annotations


class PaperAdapter:
    def label(self, run: dict, default: str) -> str:
        """The run's name in the tables (default: config name, else the model under test)."""
        return default

    def attrs(self, run: dict, records: list[dict]) -> dict:
        """Setting attributes beyond config.yaml's keys (which are attributes already)."""
        return {}

    def case_values(self, run: dict, records: list[dict]) -> dict[str, dict[str, float]]:
        """row key -> {case id: value} over the finished records."""
        return {}
