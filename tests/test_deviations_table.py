"""Every setting of every study is compared with the authors' through one table (experiments/core/deviations.py):
each settings field, nested ones field by field, is either an ``Authors`` row (their value and how a run that
differs reads) or ``Unpaired`` (no authors' counterpart, and why). A new field without a row fails here."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from experiments.core import registry
from experiments.core.config import RunSettings, Sampling, load_settings
from experiments.core.deviations import Authors, Unpaired, _expand, deviations_line, settings_deviations, table_of, uncovered
from experiments.core.runner import answers_line
from experiments.studies.craftmd.settings import CraftSettings

CRAFT = Path(__file__).resolve().parent.parent / "experiments" / "studies" / "craftmd" / "configs"


def settings_models() -> dict[str, type]:
    return {name: entry.make().settings_cls for name, entry in registry.studies().items()}


def test_every_settings_field_of_every_study_is_in_its_table():
    models = settings_models()
    assert {"craftmd", "meld", "dera-summarize", "dera-qa", "meditod-nlu", "autoeval"} <= set(models)
    missing = {name: uncovered(cls) for name, cls in models.items() if uncovered(cls)}
    assert not missing, f"settings with neither the authors' value nor 'no authors' counterpart' (add a row to authors_table): {missing}"


def test_every_row_names_a_setting_and_says_why():
    for name, cls in settings_models().items():
        s = cls.model_validate(dict(registry.get(name).fixed))
        for key, row in table_of(cls).items():
            assert isinstance(row, (Authors, Unpaired)), (name, key)
            assert list(_expand(s, key.split("."), [], [])) or "*" in key, f"{name}: row {key} names no setting"
            if isinstance(row, Unpaired):
                assert len(row.why) > 15, (name, key)


def test_a_new_field_without_a_row_is_caught_and_a_row_is_compared():
    class Toy(RunSettings):
        authors_table: ClassVar[dict] = {"turns": Authors(14, says="turn cap {ours} (authors: {authors})"),
                                         "steps.*.temperature": Authors(1.0), "steps.*.max_tokens": Unpaired("a bound the paper left open")}
        turns: int = 14
        depth: int = 3
        steps: dict[str, Sampling] = {"doctor": Sampling(temperature=1.0)}

    assert uncovered(Toy) == ["depth", "steps.*.top_p", "steps.*.frequency_penalty", "steps.*.n", "steps.*.stop"]
    assert settings_deviations(Toy()) == []
    toy = Toy(turns=4, steps={"doctor": Sampling(temperature=0.0), "patient": Sampling(temperature=1.0)})
    assert settings_deviations(toy) == ["turn cap 4 (authors: 14)", "steps.doctor.temperature 0 (authors: 1)"]


def test_the_craftmd_configs_against_the_authors():
    paper = load_settings(CraftSettings, CRAFT / "paper.yaml")
    assert settings_deviations(paper) == [] and (paper.verdict_rule, paper.empty_turn, paper.max_turns) == ("anywhere", "", 14)
    emb = settings_deviations(load_settings(CraftSettings, CRAFT / "embedded-small.yaml"))
    for named in ("turn cap 4 doctor turns (authors: 14)", "an empty turn sent as ... (authors: sent empty)",
                  "grader re-asked at most 0 time(s) (authors: 11)", "doctor max_tokens 48 (authors: 250)"):
        assert named in emb
    assert any(d.startswith("grader verdict read from the reply's first word (authors: yes anywhere") for d in emb)
    gpt = settings_deviations(load_settings(CraftSettings, CRAFT / "paper.yaml", {"loop": "gpt"}))
    assert "turn cap 14 doctor turns (authors: none)" in gpt and "doctor max_tokens 250 (authors: 150)" in gpt
    constrained = settings_deviations(load_settings(CraftSettings, CRAFT / "paper.yaml", {"answers": "constrained"}))
    assert constrained == ["answers constrained: steps with a declared format decoded under structured outputs (authors: free text, parsed after)"]


@pytest.mark.parametrize("devs, shown", [([], "none differs"), (["a (authors: b)", "c"], "2 — a (authors: b); c.")])
def test_summary_md_counts_and_names_them(devs, shown):
    line = answers_line({"answers": "free", "deviations": devs})
    assert shown in line and "docs/protocols.md" in line and line == answers_line({"answers": "free", "deviations": devs})
    assert deviations_line(devs) in line.replace("**S", "**s")
