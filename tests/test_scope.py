"""Which cases a run takes (experiments/core/scope.py): `--sample N --seed S` draws N stratified like the whole set,
`--limit N` the first N, and summary.md, the paper table's footnote and the dry run say which, with the composition.
Fixture: tests/fixtures/craftmd/strata_cases.csv, 20 cases in 5 strata (dataset x specialty): MedQA_USMLE
Neurology 7, Cardiovascular System 5, Dermatology 4; dermatology_public 2; dermatology_private 2 (these first in the
file, as in the authors' CSV)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
import yaml

from experiments.core.registry import named
from experiments.core.config import ConfigError
from experiments.core.runner import prepare_run, run_study
from experiments.core.scope import allocate, stratified_sample
from experiments.studies.craftmd.data import load_cases
from experiments.studies.craftmd.settings import CraftSettings
from experiments.studies.craftmd.study import CraftmdStudy
from tests.scripted import ScriptedLLM

CASES = Path(__file__).parent / "fixtures" / "craftmd" / "strata_cases.csv"
KEYS = ("dataset", "specialty")
ROLES = ("clinical", "patient", "grader", "summarizer")


def strata_of(cases) -> Counter:
    return Counter((c["dataset"], c["specialty"]) for c in cases)


def test_allocation_is_proportional_by_largest_remainder():
    # 7 of 20 by hand: quotas 7 x (7, 5, 4, 2, 2) / 20 = 2.45, 1.75, 1.4, 0.7, 0.7 -> floors 2, 1, 1, 0, 0 (4 cases);
    # the 3 left go to the largest remainders .75 (cardio), .7, .7 (the two dermatology sets), not to neurology's .45
    sizes = {"neuro": 7, "cardio": 5, "derm": 4, "pub": 2, "priv": 2}
    assert allocate(sizes, 7) == {"neuro": 2, "cardio": 2, "derm": 1, "pub": 1, "priv": 1}
    assert allocate(sizes, 20) == sizes and sum(allocate(sizes, 13).values()) == 13


def test_one_seed_draws_the_same_cases_another_seed_others():
    cases = load_cases(CASES)
    first = stratified_sample(cases, 7, 0, KEYS)
    again = stratified_sample(load_cases(CASES), 7, 0, KEYS)
    other = stratified_sample(cases, 7, 1, KEYS)
    ids = lambda cs: [c["case_id"] for c in cs]  # noqa: E731
    assert ids(first) == ids(again)
    assert ids(first) != ids(other)
    for drawn in (first, other):  # each seed: the hand-worked composition, cases in the file's order
        assert strata_of(drawn) == {("MedQA_USMLE", "Neurology"): 2, ("MedQA_USMLE", "Cardiovascular System"): 2,
                                    ("MedQA_USMLE", "Dermatology"): 1, ("dermatology_public", "Dermatology"): 1,
                                    ("dermatology_private", "Dermatology"): 1}
        assert ids(drawn) == [i for i in ids(cases) if i in ids(drawn)]
    # --limit is the first N: here every one of them dermatology
    s, units = prepare_run(named(CraftmdStudy)(), CraftSettings(data=str(CASES), limit=4, trials=1, out="x"))
    assert {u["case"]["dataset"] for u in units} == {"dermatology_public", "dermatology_private"}


def test_limit_and_sample_together_are_refused():
    with pytest.raises(ConfigError, match="give one of them"):
        prepare_run(named(CraftmdStudy)(), CraftSettings(data=str(CASES), limit=4, sample=4, out="x"))


def respond(role, content, gen):
    text = content if isinstance(content, str) else "\n".join(m["content"] for m in content)
    if role == "grader":
        return "Diagnosis: Diagnosis 1" if "copy out the diagnosis" in text else "Verdict: Yes"
    return "A"


def run(tmp_path, **kw):
    s = CraftSettings(**{"data": str(CASES), "out": str(tmp_path / "run"), "trials": 1, "formats": ["vignette"], "concurrency": 4,
                         "roles": {r: "other-model" if r in ("grader", "summarizer", "patient") else "model-under-test" for r in ROLES}, **kw})
    study = named(CraftmdStudy)()
    s, units = prepare_run(study, s)
    client = ScriptedLLM(respond, roles=ROLES)
    return asyncio.run(run_study(study, s, units, client=client, log=lambda *_: None)), client


def test_the_sample_is_in_config_summary_and_the_paper_tables_footnote_and_resumes(tmp_path):
    outcome, _ = run(tmp_path, sample=7, seed=0)
    summary = outcome.summary
    print(summary)
    assert ("Cases: 7 of 20, a random sample stratified by dataset and specialty (5 strata, each in proportion to the whole set; "
            "--sample 7 --seed 0): 5 MedQA_USMLE, 1 dermatology_public, 1 dermatology_private "
            "(the whole set: 16 MedQA_USMLE, 2 dermatology_public, 2 dermatology_private)") in summary
    assert ("Computed on 7 cases (a random sample stratified by dataset and specialty, seed 0): 5 MedQA_USMLE, 1 dermatology_public, "
            "1 dermatology_private; the paper's figures are over all 2,000") in summary
    assert "Caveat" not in summary  # the grader is another model
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["sample"] == 7 and config["seed"] == 0 and config["limit"] is None
    # the same command again: the same cases, all finished, nothing sent
    again, client = run(tmp_path, sample=7, seed=0)
    assert again.finished == 7 and client.sent == []


def test_limit_says_first_n_and_self_grading_gets_a_caveat(tmp_path):
    outcome, _ = run(tmp_path, limit=3, roles={r: "same-model" for r in ROLES})
    assert "Cases: the first 3 of 20 in the input's order (--limit 3: not a sample): 2 dermatology_public, 1 dermatology_private" in outcome.summary
    assert "Computed on 3 cases (the first cases of the input (--limit), not a sample): 2 dermatology_public, 1 dermatology_private" in outcome.summary
    assert "Caveat: the grader is the model under test (same-model): it grades its own answers" in outcome.summary
    assert outcome.metrics["self_judged"] == {"grader": "same-model"}
