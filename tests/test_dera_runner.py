"""The four DERA commands on the study runner, with a scripted backend behind the real client:
a case whose call gets no answer is failed (never scored, exit 3, named in the summary) and the
next run completes it; bad options exit 2 before anything starts; every command takes the
common options."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from experiments.core.commands import build_settings
from experiments.core.config import ConfigError
from experiments.studies.dera import qa_metrics
from experiments.studies.dera.settings import CAREPLAN_SECTIONS, SUMMARY_SECTIONS
from experiments.core.registry import get
from experiments.studies.dera.study import SAMPLE_ENCOUNTERS
from experiments.core.runner import prepare_run, run_study
from tests.scripted import ScriptedLLM, down

ROLES = ("decider", "researcher", "judge")
DEAD = "embedded@http://127.0.0.1:9/v1"  # never reached: the scripted client answers


def sections_text(names: list[str]) -> str:
    return "\n".join(f"{s}: fever and cough, {s.lower()}." for s in names)


def dialogue_backend(sections: list[str], fail_marker: str | None = None):
    """Researcher: one point, then STOP; Decider: sections or tagged replies; judge: GPT-F1 lists."""

    def respond(role, content, gen):
        prompt = content[-1]["content"]
        if fail_marker and role == "researcher" and fail_marker in prompt:
            raise down()
        if role == "researcher":
            return '[RESPONSE: "Pertinent Positives omit the fever."]' if "(no messages yet)" in prompt else "[STOP]"
        if role == "judge":
            return '["fever", "cough"]' if "List the medical concepts" in prompt else "[1, 2]"
        if "Discussion so far" in prompt:
            return '[RESPONSE: "Agreed."] [SCRATCHPAD: "Pertinent Positives: add fever"]'
        return sections_text(sections)

    return respond


def qa_backend(fail_marker: str | None = None):
    def respond(role, content, gen):
        prompt = content[-1]["content"]
        if fail_marker and role == "researcher" and fail_marker in prompt:
            raise down()
        if role == "judge":
            return "True\nThe same drug." if "Answer 1" in prompt else "0.8"
        if role == "researcher":
            return "Think about what the question says. STOP"
        return "Answer: B\nResponse: it fits the findings."

    return respond


def settings_for(name: str, tmp_path: Path, *, options: dict | None = None, **common):
    study = get(name).make()
    values = {"model": DEAD, "out": str(tmp_path / name), "set_": ["max_turns=3"], **common}
    flags = {k: values.pop(k) for k in ("model", "role", "config", "set_") if k in values}  # the flags that are not settings
    return study, build_settings(study, flags, {**values, **(options or {})})


def run(study, settings, respond, **kw):
    settings, cases = prepare_run(study, settings)
    client = ScriptedLLM(respond, roles=ROLES)
    return asyncio.run(run_study(study, settings, cases, client=client, log=lambda m: None, **kw)), cases


def records(out: Path) -> dict[str, dict]:
    return {r["id"]: r for r in (json.loads(x) for x in (out / "records.jsonl").read_text().splitlines())}


@pytest.fixture
def no_bertscore(monkeypatch):
    async def fake(pred, gold, model_path, num_layers=None):
        return 0.5

    monkeypatch.setattr(qa_metrics, "bertscore", fake)


COMMANDS = [
    # (command, study options, backend(fail_marker), failing case, marker, a scorer every finished record carries)
    ("dera-summarize", {}, lambda m=None: dialogue_backend(SUMMARY_SECTIONS, m), "sample-002", "ankle swelling", "gptf1/dera_vs_initial"),
    ("dera-careplan", {}, lambda m=None: dialogue_backend(CAREPLAN_SECTIONS, m), "sample-002", "ankle swelling", "gptf1/dera_vs_initial"),
    ("dera-corrupt", {"corruption_level": 3}, lambda m=None: dialogue_backend(SUMMARY_SECTIONS, m), "sample-002", "ankle swelling", "gptf1/initial"),
    ("dera-qa", {}, lambda m=None: qa_backend(m), "sample_medqa_open-00002", "lisinopril", "llm-exact/dera"),
    ("dera-qa", {"mcq": True}, lambda m=None: qa_backend(m), "sample_medqa_open-00002", "lisinopril", "accuracy/dera"),
]


@pytest.mark.parametrize("name,options,backend,failing,marker,scored", COMMANDS,
                         ids=["summarize", "careplan", "corrupt", "qa-open", "qa-mcq"])
def test_failed_case_is_failed_not_scored_and_the_rerun_completes_it(tmp_path, no_bertscore, name, options, backend, failing, marker, scored):
    study, s = settings_for(name, tmp_path, options=options, limit=3)
    resume = f"medstack run {name} --out {s.out}"
    o, cases = run(study, s, backend(marker), resume_command=resume)
    assert len(cases) == 3 and (o.finished, o.failed, o.not_started, o.exit_code) == (2, 1, 0, 3)
    out = Path(s.out)
    recs = records(out)
    bad = recs[failing]
    assert bad["status"] == "failed" and "gave up after" in bad["error"] and "researcher" in bad["error"]
    assert not bad.get("scores") and not bad.get("answer")
    assert bad["calls"][-1]["error"] and bad["calls"][-1]["role"] == "researcher"  # answered calls and the failed one are logged
    for cid, r in recs.items():
        if cid != failing:
            assert r["status"] == "ok" and scored in r["scores"] and r["metadata"]["parse_attempts"] > 0 and r["metadata"]["prompt_hashes"]
            assert all(c.get("template") and c["step"] for c in r["calls"])
            steps = [c["step"] for c in r["calls"]]
            assert len(steps) == len(set(steps)), "step names are unique per call within a case"
    m = json.loads((out / "metrics.json").read_text())
    assert m["n_cases"] == 2 and m["case_status"] == {"total": 3, "finished": 2, "failed": 1, "not_started": 0}
    summary = (out / "summary.md").read_text()
    assert "1 failed cases" in summary and f"{failing}:" in summary and resume in summary
    # the endpoint answers again: only the failed case runs, the last line per id wins
    o, _ = run(study, s, backend())
    assert (o.finished, o.failed, o.exit_code) == (3, 0, 0)
    m = json.loads((out / "metrics.json").read_text())
    assert m["n_cases"] == 3 and m["run"]["cases_run"] == 1 and m["run"]["cases_resumed"] == 2
    assert records(out)[failing]["status"] == "ok" and "failed cases" not in (out / "summary.md").read_text()


def test_defaults_roles_and_options(tmp_path):
    # default config and data, per-role aliases of --role, corrupt/qa default out
    study, s = settings_for("dera-summarize", tmp_path, out=None, set_=[], options={"roles": {"judge": "judge-model@http://127.0.0.1:9/v1"}})
    s, cases = prepare_run(study, s)
    assert s.task == "summarize" and s.max_turns == 15 and s.data == str(SAMPLE_ENCOUNTERS) and len(cases) == 4
    assert s.roles == {"decider": DEAD, "researcher": DEAD, "judge": "judge-model@http://127.0.0.1:9/v1"}
    assert s.out == str(Path("runs") / "dera-summarize-embedded")
    study, s = settings_for("dera-corrupt", tmp_path, out=None, options={"corruption_level": 7})
    assert prepare_run(study, s)[0].out == str(Path("runs") / "dera-corrupt-embedded-level7")
    study, s = settings_for("dera-qa", tmp_path, out=None, set_=[], options={"mcq": True})
    s, cases = prepare_run(study, s)
    assert s.mcq and s.out.endswith("dera-qa-embedded-mcq") and len(cases) == 5
    # --split picks <split>.jsonl in a folder
    folder = tmp_path / "medqa"
    folder.mkdir()
    (folder / "dev.jsonl").write_text(json.dumps({"question_open": "q?", "answer": "a"}) + "\n")
    study, s = settings_for("dera-qa", tmp_path, data=str(folder), options={"split": "dev"})
    s, cases = prepare_run(study, s)
    assert s.data == str(folder / "dev.jsonl") and cases[0]["id"] == "dev-00001"
    # a config for another task is refused
    study, s = settings_for("dera-careplan", tmp_path, config=Path(__file__).resolve().parent.parent / "experiments" / "studies" / "dera" / "configs" / "summarize.yaml")
    with pytest.raises(ConfigError, match="task: careplan"):
        prepare_run(study, s)


def test_cli_level_missing_and_unknown_role_exit_2_before_anything_starts(cli, tmp_path):
    out = tmp_path / "o"
    proc = cli("run", "dera-corrupt", "--model", DEAD, "--out", str(out))
    assert proc.returncode == 2 and "--level" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("run", "dera-corrupt", "--level", "11", "--model", DEAD, "--out", str(out))
    assert proc.returncode == 2 and "corruption_level" in proc.stderr
    proc = cli("run", "dera-qa", "--role", "grader=embedded", "--model", DEAD, "--out", str(out))
    assert proc.returncode == 2 and "grader" in proc.stderr and "valid roles: decider, researcher, judge" in proc.stderr
    assert not out.exists()


COMMON_FLAGS = ["--data", "--model", "--role", "--config", "--set", "--out", "--limit", "--concurrency", "--seed",
                "--no-cache", "--allow-remote", "--api-key", "--lora"]


def test_every_dera_command_lists_the_common_options():
    from experiments.core.commands import study_command
    from experiments.core.registry import get

    app, run_app = typer.Typer(), typer.Typer()
    app.add_typer(run_app, name="run")
    for name in ("dera-summarize", "dera-careplan", "dera-corrupt", "dera-qa"):
        run_app.command(name)(study_command(get(name)))
    extra = {"dera-corrupt": ["--level"], "dera-qa": ["--split", "--mcq", "--bertscore-model"]}
    for name in ("dera-summarize", "dera-careplan", "dera-corrupt", "dera-qa"):
        res = CliRunner().invoke(app, ["run", name, "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0, res.output
        for flag in [*COMMON_FLAGS, "--researcher-model", "--judge-model", *extra.get(name, [])]:
            assert flag in res.output, (name, flag)
