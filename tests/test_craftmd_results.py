"""CRAFT-MD on the results contract: a run's typed records carry every grade in ``scores`` only (the answers are what
was said), a folder written before typed records is read in today's shape through the registry's reader, an imported
release's records carry the published grades, the scorers are declared for the tools, and ``rescore``'s ``frq`` and
``assess-Q1`` asked again over a stored answer send only the judge's requests (scripted model)."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from experiments.core.registry import named
from experiments.common.grade import grades
from experiments.core import registry
from experiments.core.record import is_typed
from experiments.core.runner import run_study
from experiments.core.study import CaseContext
from experiments.studies.craftmd.prompts import PROMPTS
from tests.scripted import ScriptedLLM
from tests.test_craftmd_assess import CASE, ROLES, CraftmdStudy, backend, settings


def run_two_cases(tmp_path):
    respond, _ = backend(lambda text: "Terms: None" if "medical terminology" in text else "Verdict: Yes")
    cases = [{"id": f"case_{i}/t0", "case": {**CASE, "case_id": f"case_{i}"}, "trial": 0} for i in range(2)]
    s = settings(tmp_path)
    asyncio.run(run_study(named(CraftmdStudy)(), s, cases, client=ScriptedLLM(respond, roles=ROLES), log=lambda m: None))
    return s, tmp_path / "run"


def raw_records(run):
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines() if line.strip()]


def assert_answers_graded(rec: dict) -> None:
    """Every answer the record holds has its grade, of that very answer; the answers hold nothing else."""
    g = grades(rec)
    for fmt, modes in rec["answer"].items():
        for mode, said in modes.items():
            assert isinstance(said, str) or said is None
            assert g[f"{mode}/{fmt}"].answer == said


def test_a_run_writes_typed_records_with_every_grade_in_scores(tmp_path):
    s, run = run_two_cases(tmp_path)
    records = raw_records(run)
    assert len(records) == 2 and json.loads((run / "identity.json").read_text())["records_schema"] == 3
    for rec in records:
        assert is_typed(rec) and not {"answers", "assessment", "patient_checks", "correct_answer"} & set(rec)
        assert_answers_graded(rec)
        g = grades(rec)
        assert g["frq/multiturn"].judge == {"model": s.roles["grader"], "prompt_hash": PROMPTS.hash("grader_extract", "grader_match"),
                                           "rule": s.verdict_rule}
        assert g["mcq/vignette"].judge["rule"].startswith("map_choice: ") and g["mcq/vignette"].value == 1
        assert g["assess-Q3"].value == 0 and g["assess-Q1"].value == 1 and g["assess-Q1"].judge["model"] == s.roles["assessor"]
        assert g["patient-check/leaks_diagnosis"].value == 1 and g["patient-check/leaks_diagnosis"].answer[0]["named"] == "Plaque psoriasis"
    m = json.loads((run / "metrics.json").read_text())
    assert next(f for f in m["scores"] if f["score"] == "mcq/vignette")["value"] == 1.0  # the figures are the scores'


def test_a_folder_written_before_typed_scores_is_upgraded_by_the_reader(tmp_path, fixtures_dir):
    # a folder of an older main (the review fixture: no scores, no schema): its FRQ verdicts become frq/<format>
    fixture = tmp_path / "fixture"
    shutil.copytree(fixtures_dir / "review" / "craftmd_run", fixture)
    raw = {r["id"]: r for r in raw_records(fixture)}
    records = registry.open_run(fixture).records
    assert records and all(is_typed(r) and grades(r) for r in records)
    for r in records:
        assert_answers_graded(r)
        for fmt, modes in raw[r["id"]]["answers"].items():
            assert grades(r)[f"frq/{fmt}"].value == modes["frq"]["correct"] and grades(r)[f"frq/{fmt}"].judge["model"] == "embedded"
        assert r["target"] == raw[r["id"]]["correct_answer"] and r["inputs"]["specialty"] == "dermatology"


def test_an_imported_release_carries_its_published_grades_typed(tmp_path, fixtures_dir):
    from experiments.studies.craftmd.importer import import_folder

    import_folder(fixtures_dir / "craftmd" / "published_demo", "demo-published", tmp_path / "imp")
    records = raw_records(tmp_path / "imp")
    assert records and all(is_typed(r) for r in records)
    for r in records:
        assert_answers_graded(r)
        assert all(g.judge == {"model": "published"} for name, g in grades(r).items() if name.startswith("frq/"))
    assert {r["id"]: r["scores"] for r in registry.open_run(tmp_path / "imp").records} == {r["id"]: r["scores"] for r in records}


def test_the_craftmd_scorers_are_declared_for_the_tools():
    study = registry.study_for("craftmd")
    names = [s.name for s in study.scorers]
    assert names[:3] == ["mcq", "frq", "frq-count"] and names[-1] == "patient-check" and study.judge_roles == ("grader", "assessor")
    assert next(s for s in study.scorers if s.name == "assess-Q1").role == "assessor" and all(s.unit == "case_id" for s in study.scorers)
    assert "craftmd-published-gpt3_1106" in study.published
    assert [s.name for s in registry.study_for("calibrate-craftmd-grader").scorers] == ["grader", "published"]
    assert [s.name for s in registry.study_for("calibrate-craftmd-conversations").scorers][1:] == [n for n in names if n.startswith("assess-")]


@pytest.mark.parametrize("step", ["frq", "assess-Q1"])
def test_a_judge_is_asked_again_over_the_stored_answer_and_nothing_else(tmp_path, step):
    s, run = run_two_cases(tmp_path)
    rec = dict(registry.open_run(run).records[0])
    rec["answer"] = {"vignette": {**rec["answer"]["vignette"], "frq": "Psoriasis vulgaris"}}
    s = s.model_copy(update={"roles": {**s.roles, "judge2": "other-model"}})
    sent: list[tuple[str, str]] = []

    def respond(role, content, gen):
        text = content if isinstance(content, str) else "\n".join(m["content"] for m in content)
        sent.append((role, text))
        if "copy out the diagnosis" in text:
            return "Diagnosis: Psoriasis vulgaris"
        return "Verdict: No"

    ctx = CaseContext(ScriptedLLM(respond, roles=("judge2",)), rec["id"])
    judge = next(x for x in registry.study_for("craftmd").scorers if x.name == step)
    got = asyncio.run(judge.run(ctx, rec, s, "judge2"))
    g = got["frq/vignette" if step == "frq" else step]
    assert list(got) == (["frq/vignette"] if step == "frq" else [step])
    assert {role for role, _ in sent} == {"judge2"} and all(c["role"] == "judge2" for c in ctx.calls)
    assert g.value == 0 and g.judge["model"] == "other-model" and g.explanation == "Verdict: No"
    if step == "frq":
        assert [c["step"] for c in ctx.calls] == ["vignette_extract", "vignette_match"] and g.answer == "Psoriasis vulgaris"
        assert "Psoriasis vulgaris" in sent[0][1] and g.source == "grader" and g.judge["prompt_hash"] == PROMPTS.hash("grader_extract", "grader_match")
    else:
        assert [c["step"] for c in ctx.calls] == ["assess_Q1"] and rec["inputs"]["facts"] in sent[0][1]
        assert g.judge["prompt_hash"] == PROMPTS.hash("assess_q1")
