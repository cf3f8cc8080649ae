"""CRAFT-MD on the results contract: a record's typed scores restate its own fields (a live run's, a folder written
before typed scores read through the registry's reader, an imported release's), and the ``frq`` and ``assess-Q1``
judges asked again over a stored answer send only the judge's requests (scripted model)."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from experiments.common.grade import grades
from experiments.core import registry
from experiments.core.runner import run_study
from experiments.core.study import CaseContext
from experiments.studies.craftmd.metrics import run_metrics
from experiments.common.patient_checks import CHECKS
from experiments.studies.craftmd.prompts import PROMPTS
from experiments.studies.craftmd.study import CraftmdStudy
from tests.scripted import ScriptedLLM
from tests.test_craftmd_assess import CASE, ROLES, backend, settings


def run_two_cases(tmp_path):
    respond, _ = backend(lambda text: "Terms: None" if "medical terminology" in text else "Verdict: Yes")
    cases = [{"id": f"case_{i}/t0", "case": {**CASE, "case_id": f"case_{i}"}, "trial": 0} for i in range(2)]
    s = settings(tmp_path)
    asyncio.run(run_study(CraftmdStudy(), s, cases, client=ScriptedLLM(respond, roles=ROLES), log=lambda m: None))
    return s, tmp_path / "run"


def raw_records(run):
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines() if line.strip()]


def assert_scores_restate_the_fields(rec: dict, grader: str | None) -> None:
    """A record's scores: of an old record, its grading fields typed; of today's, the only place its grades are."""
    g = grades(rec)
    for fmt, modes in rec["answers"].items():
        for mode, a in modes.items():
            assert g[f"{mode}/{fmt}"].answer == a.get("answer")
            if "correct" in a or "parsed_by" in a:  # written before typed scores
                assert g[f"{mode}/{fmt}"].value == a["correct"]
            else:
                assert not set(a) & {"correct", "grade_source", "parsed_by", "extraction_status", "grader_reasks"}
    if grader is not None:
        assert g["frq/vignette"].judge["model"] == grader
    for q, a in (rec.get("assessment") or {}).items():
        assert g[f"assess-{q}"].value == (None if a["verdict"] is None else int(a["verdict"])) and g[f"assess-{q}"].explanation == a["reply"]
    for c, found in (rec.get("patient_checks") or {}).items():
        if c in CHECKS:
            assert g[f"patient-check/{c}"].value == (None if found is None else int(bool(found)))


def test_a_run_writes_typed_scores_equal_to_the_fields_the_metrics_read(tmp_path):
    s, run = run_two_cases(tmp_path)
    records = raw_records(run)
    assert len(records) == 2 and json.loads((run / "identity.json").read_text())["records_schema"] == 2
    for rec in records:
        assert_scores_restate_the_fields(rec, s.roles["grader"])
        g = grades(rec)
        assert g["frq/multiturn"].judge == {"model": s.roles["grader"], "prompt_hash": PROMPTS.hash("grader_extract", "grader_match"),
                                           "rule": s.verdict_rule}
        assert g["mcq/vignette"].judge["rule"].startswith("map_choice: ") and g["mcq/vignette"].value == 1
        assert g["assess-Q3"].value == 0 and g["assess-Q1"].value == 1 and g["assess-Q1"].judge["model"] == s.roles["assessor"]
        assert g["patient-check/leaks_diagnosis"].value == 1 and g["patient-check/leaks_diagnosis"].answer[0]["named"] == "Plaque psoriasis"
    assert run_metrics(records)["accuracy"]["vignette.mcq"]["accuracy"] == 1.0  # the metrics read the scores


def test_a_folder_written_before_typed_scores_is_upgraded_by_the_reader(tmp_path, fixtures_dir):
    # a folder of today's main (the review fixture: no scores, no schema): its FRQ verdicts become frq/<format>
    fixture = tmp_path / "fixture"
    shutil.copytree(fixtures_dir / "review" / "craftmd_run", fixture)
    records = registry.open_run(fixture).records
    assert records and all(grades(r) for r in records)
    for r in records:
        assert_scores_restate_the_fields(r, "embedded")


def test_an_imported_release_carries_its_published_grades_typed(tmp_path, fixtures_dir):
    from experiments.studies.craftmd.importer import import_folder

    import_folder(fixtures_dir / "craftmd" / "published_demo", "demo-published", tmp_path / "imp")
    records = raw_records(tmp_path / "imp")
    assert records and all("scores" in r for r in records)
    for r in records:
        assert_scores_restate_the_fields(r, None)
        assert all(g.judge == {"model": "published"} for name, g in grades(r).items() if name.startswith("frq/"))
    assert {r["id"]: r["scores"] for r in registry.open_run(tmp_path / "imp").records} == {r["id"]: r["scores"] for r in records}


def test_the_craftmd_results_are_declared_for_the_tools():
    r = registry.results_for("craftmd")
    assert [j.step for j in r.judges][:2] == ["frq", "frq-count"] and r.judge("assess-Q1").role == "assessor"
    assert r.compare is not None and r.import_published is not None and "craftmd-published-gpt3_1106" in r.published
    assert registry.results_for("calibrate-craftmd-grader").judge("published").items is not None
    assert [j.step for j in registry.results_for("calibrate-craftmd-conversations").judges] == [j.step for j in r.judges[2:]]


@pytest.mark.parametrize("step", ["frq", "assess-Q1"])
def test_a_judge_is_asked_again_over_the_stored_answer_and_nothing_else(tmp_path, step):
    s, run = run_two_cases(tmp_path)
    rec = dict(registry.open_run(run).records[0])
    rec["answers"] = {**rec["answers"], "vignette": {**rec["answers"]["vignette"], "frq": {**rec["answers"]["vignette"]["frq"], "answer": "Psoriasis vulgaris"}}}
    s = s.model_copy(update={"roles": {**s.roles, "judge2": "other-model"}})
    sent: list[tuple[str, str]] = []

    def respond(role, content, gen):
        text = content if isinstance(content, str) else "\n".join(m["content"] for m in content)
        sent.append((role, text))
        if "copy out the diagnosis" in text:
            return "Diagnosis: Psoriasis vulgaris"
        return "Verdict: No"

    ctx = CaseContext(ScriptedLLM(respond, roles=("judge2",)), rec["id"])
    judge = registry.results_for("craftmd").judge(step)
    g = asyncio.run(judge.ask(ctx, rec, "vignette" if step == "frq" else None, s, "judge2"))
    assert {role for role, _ in sent} == {"judge2"} and all(c["role"] == "judge2" for c in ctx.calls)
    assert g.value == 0 and g.judge["model"] == "other-model" and g.explanation == "Verdict: No"
    if step == "frq":
        assert [c["step"] for c in ctx.calls] == ["vignette_extract", "vignette_match"] and g.answer == "Psoriasis vulgaris"
        assert "Psoriasis vulgaris" in sent[0][1] and g.source == "grader" and g.judge["prompt_hash"] == PROMPTS.hash("grader_extract", "grader_match")
    else:
        assert [c["step"] for c in ctx.calls] == ["assess_Q1"] and rec["vignette"] in sent[0][1]
        assert g.judge["prompt_hash"] == PROMPTS.hash("assess_q1")
