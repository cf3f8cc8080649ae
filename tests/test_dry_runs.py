"""`--dry-run` is a run: every study, in both answer modes, goes through the one runner with the
recording client, writes as many requests constrained as free (each constrained one with its reply format as
vLLM's structured_outputs field), and a dry run that builds no request for its cases exits 2 naming the cause.
No server: the commands run in this process through the CLI's own app (typer), like `medstack run ... --dry-run`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from experiments.core.dryrun import dry_run
from experiments.core.study import Study
from models.errors import DataError

FX = Path(__file__).parent / "fixtures"

# study -> (argv before the common options, requests per dry run, a step of the first case that has a declared format)
STUDIES = {
    "craftmd": (["run", "craftmd", "--data", str(FX / "craftmd" / "cases.csv"), "--limit", "1"], 105, "vignette_mcq"),
    "dera-summarize": (["run", "dera-summarize", "--data", str(FX / "dera" / "encounters.jsonl"), "--limit", "1"], None, "researcher:1"),
    "dera-careplan": (["run", "dera-careplan", "--data", str(FX / "dera" / "encounters.jsonl"), "--limit", "1"], None, "researcher:1"),
    "dera-qa": (["run", "dera-qa", "--data", str(FX / "dera" / "medqa_open.jsonl"), "--limit", "2"], 20, "oneshot"),
    "meditod-nlu-icl": (["run", "meditod-nlu", "--data", str(FX / "meditod" / "dialogs.json"), "--mode", "icl", "--k", "2", "--limit", "3"], 3, "predict"),
    "meditod-pol-icl": (["run", "meditod-pol", "--data", str(FX / "meditod" / "dialogs.json"), "--mode", "icl", "--k", "2", "--limit", "3"], 3, "predict"),
    "meditod-nlg-icl": (["run", "meditod-nlg", "--data", str(FX / "meditod" / "dialogs.json"), "--mode", "icl", "--k", "2", "--limit", "3"], 3, None),
    "meditod-nlu-supervised": (["run", "meditod-nlu", "--data", str(FX / "meditod" / "dialogs.json"), "--mode", "supervised", "--limit", "3"], 3, None),
    "meditod-pol-supervised": (["run", "meditod-pol", "--data", str(FX / "meditod" / "dialogs.json"), "--mode", "supervised", "--limit", "3"], 3, None),
    "meditod-nlg-supervised": (["run", "meditod-nlg", "--data", str(FX / "meditod" / "dialogs.json"), "--mode", "supervised", "--limit", "3"], 3, None),
    "autoeval": (["autoeval", str(FX / "autoeval" / "results"), "--criteria", "empathy", "--limit", "2"], 7, "rate"),
}


@pytest.fixture(scope="module")
def invoke():
    """`medstack ARGS` in this process: the CLI's typer app with every study registered (as scripts.cli.main does)."""
    import typer

    from experiments.core import commands

    apps = {name: typer.Typer() for name in ("run_app", "score_app", "import_app", "data_app", "finetune_app")}
    app = typer.Typer()
    for name, sub in apps.items():
        app.add_typer(sub, name=name.removesuffix("_app"))
    commands.register_all(app=app, **apps)
    runner = CliRunner()

    def go(*args: str):
        r = runner.invoke(app, list(args), catch_exceptions=True)
        if r.exception and not isinstance(r.exception, SystemExit):
            raise r.exception
        assert r.exit_code == 0, r.output
        return r

    return go


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "dry-run.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_dry_run_free_and_constrained_write_the_same_requests(invoke, tmp_path, study):
    argv, expected, step = STUDIES[study]
    free, cons = tmp_path / "free", tmp_path / "constrained"
    invoke(*argv, "--dry-run", "--out", str(free))
    invoke(*argv, "--dry-run", "--set", "answers=constrained", "--out", str(cons))
    a, b = _rows(free), _rows(cons)
    assert sorted(p.name for p in cons.iterdir()) == ["dry-run.jsonl"]           # no records, metrics, identity or cache
    assert a and len(a) == len(b)                                                # the constrained run builds every request
    if expected is not None:
        assert len(a) == expected
    assert [(r["case_id"], r["step"]) for r in a] == [(r["case_id"], r["step"]) for r in b]
    first = b[0]
    assert first["role"] and first["kind"] in ("chat", "completion") and ("messages" in first) == (first["kind"] == "chat")
    assert "structured" not in a[0]["gen"]
    if step is None:  # a free-text step (NLG) or a supervised completion: nothing to constrain
        assert not any((r.get("constraint") or {}).get("applied") for r in b)
        return
    one = next(r for r in b if r["step"] == step)
    assert one["constraint"]["applied"] is True and one["gen"]["structured"] == {one["constraint"]["kind"]: one["constraint"]["spec"]}
    free_one = next(r for r in a if r["step"] == step)
    assert free_one["constraint"]["applied"] is False and "structured" not in free_one["gen"]
    if one["constraint"]["kind"] == "regex":  # free text ends inside the step's budget: $words filled from max_tokens
        assert "$words" not in one["gen"]["structured"]["regex"]


# study -> (argv, the kinds of request (role: step, a step's running number left out) its dry run must show)
KINDS = {
    "agentclinic": (["run", "agentclinic", "--data", str(FX / "agentclinic" / "cases.jsonl"), "--sample", "3", "--seed", "0"],
                    {"doctor: doctor", "patient: patient", "measurement: measurement", "moderator: moderator"}),
    "craftmd": (["run", "craftmd", "--data", str(FX / "craftmd" / "cases.csv"), "--limit", "1", "--trials", "1", "--set", "assess_conversations=true"],
                {"patient: patient_opening", "clinical: doctor_turn", "patient: patient_turn", "summarizer: summary", "clinical: vignette_mcq",
                 "clinical: multiturn_frq", "grader: vignette_extract", "grader: vignette_match", "assessor: assess_Q1", "assessor: assess_complete"}),
    "dera-summarize": (["run", "dera-summarize", "--data", str(FX / "dera" / "encounters.jsonl"), "--limit", "1"],
                       {"decider: decider:initial", "researcher: researcher", "decider: decider", "decider: decider:final",
                        "judge: gptf1:dera_vs_initial:Pertinent Positives:extract_gt", "judge: gptf1:dera_vs_initial:Pertinent Positives:precision"}),
    "dera-qa": (["run", "dera-qa", "--data", str(FX / "dera" / "medqa_open.jsonl"), "--limit", "1"],
                {"decider: oneshot", "decider: decider:explain", "researcher: researcher", "decider: decider", "decider: decider:final",
                 "judge: judge:exact:dera", "judge: judge:similarity:dera"}),
    "meditod-nlu": (["run", "meditod-nlu", "--data", str(FX / "meditod" / "dialogs.json"), "--k", "0", "--limit", "2"], {"model: predict"}),
}


@pytest.mark.parametrize("study", sorted(KINDS))
def test_a_dry_run_shows_every_kind_of_request_and_says_which_replies_stood_in(invoke, tmp_path, capsys, study):
    """The study's stand-in replies (Study.standins) walk each branch its loop takes on a reply: AgentClinic's doctor
    asks, requests a test and diagnoses, so the measurement agent and the moderator are asked; CRAFT-MD's doctor asks,
    then diagnoses, and its grader, summarizer and assessor follow; DERA's Researcher makes a point, then stops. The
    dry run lists each kind with its count and the replies that stood in."""
    from experiments.core.dryrun import request_kind

    argv, kinds = KINDS[study]
    r = invoke(*argv, "--dry-run", "--out", str(tmp_path / "dry"))
    got = {request_kind(row) for row in _rows(tmp_path / "dry")}
    assert kinds <= got, kinds - got
    said = " ".join((r.output + capsys.readouterr().err).split())
    assert "dry run: requests by kind (role: step): " in said and "dry run: replies stood in for the models'" in said
    if study == "agentclinic":
        assert "'REQUEST TEST: Complete_Blood_Count'" in said and "moderator: 'Yes'" in said


def test_constrained_regex_bound_follows_the_steps_max_tokens(invoke, tmp_path):
    argv = STUDIES["dera-qa"][0]
    for tokens, out in ((50, tmp_path / "a"), (200, tmp_path / "b")):
        invoke(*argv, "--dry-run", "--set", "answers=constrained", "--set", f"answer.max_tokens={tokens}", "--out", str(out))
    (a,), (b,) = ([r for r in _rows(p) if r["step"] == "oneshot"][:1] for p in (tmp_path / "a", tmp_path / "b"))
    assert a["gen"]["structured"]["regex"] == "[^\\s]+( [^\\s]+){0,14}\\n?"    # (50 - 8) // 3
    assert b["gen"]["structured"]["regex"] == "[^\\s]+( [^\\s]+){0,64}\\n?"    # (200 - 8) // 3


def test_dry_run_reports_exemplars_left_out_to_fit(invoke, tmp_path, capsys):
    """An in-context run whose exemplars do not fit the model's context: each request says so (protocol)."""
    out = tmp_path / "icl"
    r = invoke("run", "meditod-nlu", "--data", str(FX / "meditod" / "dialogs.json"), "--mode", "icl", "--k", "3", "--limit", "3",
               "--set", "context_margin=1700", "--dry-run", "--out", str(out))
    rows = _rows(out)
    assert all(row["protocol"]["exemplars"]["asked"] == 3 for row in rows)
    below = sum(row["protocol"]["exemplars"]["sent"] < 3 for row in rows)
    assert below >= 1
    assert f"protocol deviation: {below} of {len(rows)} requests carried fewer in-context exemplars" in " ".join((r.output + capsys.readouterr().err).split())


def test_finetune_dry_run_writes_its_samples(invoke, tmp_path):
    out = tmp_path / "ft"
    invoke("finetune", "meditod-nlu", "--data", str(FX / "meditod" / "dialogs.json"), "--base", "llama3-8b-instruct", "--dry-run", "--out", str(out))
    rows = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and [m["role"] for m in rows[0]["messages"]] == ["system", "user", "assistant"]


class _Broken(Study):
    name = "broken"

    def load_cases(self, settings):
        return [{"id": "a"}]

    async def solve(self, ctx, case, settings):
        raise KeyError("no_such_field")  # a bug before the first request

    def metrics(self, records, settings):
        return {}

    def summary(self, metrics, settings, run):
        return "# broken\n"


def test_a_dry_run_that_builds_no_request_is_an_error_naming_the_cause(tmp_path):
    from experiments.core.config import RunSettings

    s = RunSettings(out=str(tmp_path / "o"))
    with pytest.raises(DataError, match=r"no request was built for 1 case\(s\) \(case a: KeyError: 'no_such_field'\)"):
        asyncio.run(dry_run(_Broken(), s, [{"id": "a"}], log=lambda *_: None))
    assert not (tmp_path / "o" / "dry-run.jsonl").exists()


def test_craftmd_dry_run_shows_the_stratified_sample_and_its_composition(invoke, tmp_path, capsys):
    """`run craftmd --dry-run --sample 7 --seed 0`: the line naming the sample and its composition, and requests for
    exactly the drawn cases (experiments/core/scope.py; the fixture's strata in tests/test_scope.py)."""
    out = tmp_path / "dry"
    r = invoke("run", "craftmd", "--data", str(FX / "craftmd" / "strata_cases.csv"), "--sample", "7", "--seed", "0", "--trials", "1",
               "--formats", "vignette", "--dry-run", "--out", str(out))
    said = " ".join((r.output + capsys.readouterr().err).split())
    assert ("cases: 7 of 20, a random sample stratified by dataset and specialty (5 strata, each in proportion to the whole set; "
            "--sample 7 --seed 0): 5 MedQA_USMLE, 1 dermatology_public, 1 dermatology_private") in said
    cases = {row["case_id"].split("/")[0] for row in _rows(out)}
    assert len(cases) == 7 and sum(c.startswith("usmle_") for c in cases) == 5
