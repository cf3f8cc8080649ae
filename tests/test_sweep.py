"""`medstack sweep`: labels, the finished-run check, skip/resume/failure policy (scripted where no model is
needed), and one real sweep through the embedded server (e2e)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from experiments.datasets import registry as D
from experiments.tools.sweep.run import is_finished, labels_for, parse_models
from tests.conftest import MEDSTACK, REPO, run_cli

CASES = "tests/fixtures/craftmd/cases.csv"
SMALL = ["--data", CASES, "--trials", "1", "--formats", "vignette", "--no-frq", "--config", "experiments/studies/craftmd/configs/embedded-small.yaml"]


def _finished_run(d, case_ids: list[str]) -> None:
    """A results directory whose every case finished (as the runner leaves it)."""
    d.mkdir(parents=True)
    recs = [{"id": f"{c}/t0", "case_id": c, "trial": 0, "status": "ok", "answers": {"vignette": {"mcq": {"correct": i % 2}}}}
            for i, c in enumerate(case_ids)]
    (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "metrics.json").write_text(json.dumps({"case_status": {"total": len(recs), "finished": len(recs)}}))
    (d / "config.yaml").write_text("experiment: craftmd\n")


def test_labels_and_models():
    assert labels_for(["embedded", "embedded", "llama3-8b-instruct@http://127.0.0.1:9/v1"]) == ["embedded", "embedded-2", "llama3-8b-instruct"]
    # two endpoints of one model and a model whose own alias is m-2: three entries, three folders, each its own model
    assert labels_for(["m@http://127.0.0.1:8001/v1", "m@http://127.0.0.1:8002/v1", "m-2@http://127.0.0.1:8003/v1"]) == ["m", "m-3", "m-2"]
    assert parse_models(" embedded , llama2-7b-chat ") == ["embedded", "llama2-7b-chat"]
    from experiments.core.config import ConfigError

    with pytest.raises(ConfigError):
        parse_models(" , ")


def test_is_finished(tmp_path):
    _finished_run(tmp_path / "a", ["case_a", "case_b"])
    assert is_finished(tmp_path / "a", ["case_a/t0", "case_b/t0"])
    assert not is_finished(tmp_path / "a", ["case_a/t0", "case_b/t0", "case_c/t0"])  # a larger --limit: resume
    with open(tmp_path / "a" / "records.jsonl", "a") as f:
        f.write(json.dumps({"id": "case_b/t0", "status": "failed", "error": "HTTP 500"}) + "\n")  # the last line wins
    assert not is_finished(tmp_path / "a", ["case_a/t0", "case_b/t0"])
    _finished_run(tmp_path / "b", ["case_a"])
    (tmp_path / "b" / "metrics.json").unlink()  # killed before the metrics were written
    assert not is_finished(tmp_path / "b", ["case_a/t0"])


def test_finished_runs_skipped_missing_weights_reported(cli, tmp_path):
    """Both embedded runs finished earlier: skipped without a server; a model without weights is reported,
    the sweep goes on (compare and report over what there is) and exits 3."""
    sweep = tmp_path / "sweep"
    for label in ("embedded", "embedded-2"):
        _finished_run(sweep / label, ["case_a", "case_b"])
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"MEDSTACK_WEIGHTS": str(empty), "HF_HOME": str(empty), "HF_HUB_CACHE": str(empty)}
    p = cli("sweep", "craftmd", "--models", "embedded,llama3-8b-instruct,embedded", "--limit", "2", *SMALL, "--out", str(sweep), env=env)
    assert p.returncode == 3, p.stderr
    err = " ".join(p.stderr.split())
    assert "embedded: all 2 cases finished earlier" in err and "embedded-2: all 2 cases finished earlier" in err
    assert "llama3-8b-instruct: craftmd with model llama3-8b-instruct stopped: weights for 'llama3-8b-instruct' not found" in err
    assert "going on to the next model" in err
    assert "| llama3-8b-instruct |" in p.stdout and "| error: weights for" in p.stdout and p.stdout.count("| skipped: finished earlier |") == 2
    assert (sweep / "compare" / "summary.md").exists() and (sweep / "report.html").exists()
    assert "serving" not in err and "starting vLLM" not in err  # no server was started for a finished run
    assert not (sweep / "llama3-8b-instruct" / "records.jsonl").exists()


def test_bad_input_before_anything_runs(cli, tmp_path):
    p = cli("sweep", "craftmd", "--models", "embedded", "--data", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "s"))
    assert p.returncode == 2 and "nope.csv" in p.stderr and not (tmp_path / "s").exists()
    p = cli("sweep", "dera-qa", "--models", "embedded", "--published", "craftmd-published-gpt3_1106", "--out", str(tmp_path / "s"))
    assert p.returncode == 2 and "--published imports a study's released runs (craftmd); dera-qa has none" in p.stderr
    p = cli("sweep", "nosuch", "--models", "embedded")
    assert p.returncode == 2 and "unknown study 'nosuch'" in " ".join(p.stderr.split())
    p = cli("sweep", "craftmd", "--models", "embedded", "--model", "embedded", "--data", CASES)
    assert p.returncode == 2 and "--models" in p.stderr


@pytest.mark.e2e
def test_sweep_two_models_resume_and_report(cli, embedded_server, tmp_path):
    """The same (served) model twice: runs in turn, a larger --limit resumes both, the same command again skips both."""
    ref = f"embedded@{embedded_server['base_url']}"
    sweep = tmp_path / "sweep"
    args = ["sweep", "craftmd", "--models", f"{ref},{ref}", *SMALL, "--out", str(sweep)]
    p = cli(*args, "--limit", "1", check=True)
    for label in ("embedded", "embedded-2"):
        recs = [json.loads(x) for x in (sweep / label / "records.jsonl").read_text().splitlines()]
        assert [r["id"] for r in recs] == ["case_a/t0"] and recs[0]["status"] == "ok"
    p = cli(*args, "--limit", "2", check=True)  # resumes each: one case from earlier, one new
    for label in ("embedded", "embedded-2"):
        m = json.loads((sweep / label / "metrics.json").read_text())
        assert m["run"]["cases_resumed"] == 1 and m["run"]["cases_run"] == 1 and m["case_status"]["finished"] == 2
    p = cli(*args, "--limit", "2", check=True)  # nothing left: both skipped
    assert p.stdout.count("| skipped: finished earlier |") == 2
    summary = (sweep / "compare" / "summary.md").read_text()
    assert "## CRAFT-MD: as in the paper" in summary and "**embedded-2**" in summary
    html = (sweep / "report.html").read_text()
    assert 'id="section-craftmd"' in html and "4-choice MCQ accuracy by format" in html


# ---------------------------------------------------------------- which roles vary

def _planned_roles(monkeypatch, tmp_path, study: str, models: list[str], args: list[str], vary: str | None = None):
    """The role -> model map of each run a sweep would start (the study command's body replaced by a recorder)."""
    from experiments.core import commands
    from experiments.tools.sweep import cli as sweep_cli, run as sweep_run

    seen = {}

    def record(study_obj, common, given):
        settings = commands.build_settings(study_obj, common, given)
        seen[settings.out] = dict(sweep_run.prepare_run(study_obj, settings)[0].roles)

    monkeypatch.setattr(sweep_run, "run_command", record)
    entry, cmd, flags = sweep_cli.study_parser(study)
    values = dict(cmd.make_context(study, list(args)).params)
    outcome = sweep_run.run_sweep(entry.make, flags.overrides, values, models, tmp_path / "sweep", report=False, vary=vary,
                                  log=lambda m: None)
    return {k.rsplit("/", 1)[-1]: v for k, v in seen.items()}, outcome


def test_sweep_varies_only_the_role_under_test(monkeypatch, tmp_path):
    """CRAFT-MD: the doctor-AI takes each model; patient and grader stay on the one named model, the summarizer
    follows the grader; the sweep's summary says so."""
    args = ["--data", CASES, "--trials", "1", "--role", "patient=embedded", "--role", "grader=mistral-7b-instruct-v0.2"]
    roles, outcome = _planned_roles(monkeypatch, tmp_path, "craftmd", ["embedded", "llama3-8b-instruct"], args)
    assert roles["embedded"] == {"clinical": "embedded", "patient": "embedded", "grader": "mistral-7b-instruct-v0.2",
                                 "summarizer": "mistral-7b-instruct-v0.2"}
    assert roles["llama3-8b-instruct"] == {**roles["embedded"], "clinical": "llama3-8b-instruct"}
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "Roles: clinical: the model of each run; patient: embedded, grader: mistral-7b-instruct-v0.2, summarizer: mistral-7b-instruct-v0.2 for every run." in summary


def test_sweep_dera_varies_both_agents_judge_fixed(monkeypatch, tmp_path):
    roles, _ = _planned_roles(monkeypatch, tmp_path, "dera-summarize", ["embedded", "llama2-7b-chat"], ["--role", "judge=openbiollm-8b"])
    assert roles["llama2-7b-chat"] == {"decider": "llama2-7b-chat", "researcher": "llama2-7b-chat", "judge": "openbiollm-8b"}
    roles, _ = _planned_roles(monkeypatch, tmp_path / "v", "dera-summarize", ["llama2-7b-chat"], ["--role", "judge=embedded", "--role", "researcher=embedded"],
                              vary="decider")  # --vary: only the Decider varies, the Researcher is named
    assert roles["llama2-7b-chat"] == {"decider": "llama2-7b-chat", "researcher": "embedded", "judge": "embedded"}


def test_sweep_meditod_varies_the_model(monkeypatch, tmp_path):
    roles, _ = _planned_roles(monkeypatch, tmp_path, "meditod-nlu", ["embedded", "llama2-7b-chat"], ["--data", "tests/fixtures/meditod/dialogs.json"])
    assert roles["llama2-7b-chat"]["model"] == "llama2-7b-chat" and roles["embedded"]["model"] == "embedded"


def test_sweep_refuses_unnamed_fixed_roles(cli, tmp_path):
    """A study that needs fixed roles: one line naming the option, exit 2, nothing written."""
    p = cli("sweep", "craftmd", "--models", "embedded,llama3-8b-instruct", "--data", CASES, "--out", str(tmp_path / "s"))
    assert p.returncode == 2 and "Traceback" not in p.stderr and not (tmp_path / "s").exists()
    err = " ".join(p.stderr.split())
    assert "the patient, grader role(s) stay one model for every run" in err  # only the roles the user must give:
    assert "--role patient=ALIAS --role grader=ALIAS (the summarizer follows the grader)" in err  # the summarizer follows the grader
    assert "--role summarizer" not in err
    p = cli("sweep", "dera-qa", "--models", "embedded", "--out", str(tmp_path / "s"))
    assert p.returncode == 2 and "--role judge=ALIAS" in " ".join(p.stderr.split())
    p = cli("sweep", "craftmd", "--models", "embedded", "--data", CASES, "--role", "clinical=embedded", "--role", "patient=embedded",
            "--role", "grader=embedded", "--out", str(tmp_path / "s"))
    assert p.returncode == 2 and "clinical is the role under test" in " ".join(p.stderr.split())
    p = cli("sweep", "craftmd", "--models", "embedded", "--data", CASES, "--vary", "doctor", "--out", str(tmp_path / "s"))
    assert p.returncode == 2 and "--vary 'doctor': roles of craftmd: clinical, patient, grader, summarizer" in " ".join(p.stderr.split())


def test_sweep_dry_run_marks_nothing_finished(cli, tmp_path):
    """`sweep --dry-run`: each model's requests are written, no server starts, and the summary says dry run, never finished."""
    out = tmp_path / "s"
    p = cli("sweep", "craftmd", "--models", "embedded,llama3-8b-instruct", *SMALL, "--role", "patient=embedded", "--dry-run", "--out", str(out))
    assert p.returncode == 0, p.stderr
    summary = (out / "summary.md").read_text()
    assert "finished" not in summary and summary.count("| dry run: requests written to") == 2
    assert (out / "embedded" / "dry-run.jsonl").exists() and (out / "llama3-8b-instruct" / "dry-run.jsonl").exists()
    assert not (out / "report.html").exists() and not (out / "compare").exists()


@pytest.mark.e2e
def test_sweep_starts_stops_servers_joins_published_interrupted_and_resumed(tmp_path):
    """Two model entries, each run starting and stopping its own embedded server (a home of its own,
    so no running server is reused), a fetched published release joined; killed mid-way, the same command
    resumes to one sweep summary and one report; the fixed patient role's model is in every record."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to((Path(os.environ["MEDSTACK_HOME"]) / "models").resolve(), target_is_directory=True)
    release = tmp_path / "release" / "gpt3_1106"
    shutil.copytree(REPO / "tests" / "fixtures" / "craftmd" / "published_demo", release)
    raw = yaml.safe_load(D.REGISTRY_FILE.read_text())
    raw["sets"]["craftmd-published-gpt3_1106"]["files"][0].update(tree_sha256=D.tree_digest(release), tree_size=None)
    (tmp_path / "datasets.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {"MEDSTACK_HOME": str(home), "MEDSTACK_DATA_REGISTRY": str(tmp_path / "datasets.yaml")}
    run_cli("data", "fetch", "craftmd-published-gpt3_1106", "--from", str(release), env=env, check=True)

    sweep = tmp_path / "sweep"
    # both cases of a run at once (--concurrency 2): one server answers both conversations in one batch, about the time of one
    args = ["sweep", "craftmd", "--models", "embedded,embedded", "--data", CASES, "--limit", "2", "--trials", "1",
            "--formats", "vignette,multiturn", "--no-frq", "--max-turns", "2", "--concurrency", "2", "--role", "patient=embedded",
            "--config", "experiments/studies/craftmd/configs/embedded-small.yaml", "--published", "craftmd-published-gpt3_1106", "--out", str(sweep)]
    proc = subprocess.Popen([*MEDSTACK, *args], cwd=REPO, env={**os.environ, "COLUMNS": "200", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = sweep / "embedded" / "records.jsonl"
        deadline = time.monotonic() + 1500
        while proc.poll() is None and not (first.exists() and first.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None, f"the sweep ended before a record was written:\n{proc.stderr.read()}"
        proc.send_signal(signal.SIGTERM)  # unwinds like Ctrl-C (a SIGINT is ignored by a job a script started in the background)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 130, err
        assert "run the same command again to resume" in " ".join(err.split())
        assert not (sweep / "report.html").exists()
        assert json.loads(run_cli("serve", "status", "--json", env=env, check=True).stdout) == []

        p = run_cli(*args, env=env, timeout=3000, check=True)  # the same command: resumes
        err = " ".join(p.stderr.split())
        assert "starting vLLM (CPU) for embedded" in err  # a run left to do starts its server again
        # embedded-small.yaml turns the conversation assessors on: the assessor follows the grader
        roles = {"clinical": "embedded", "patient": "embedded", "grader": "embedded", "summarizer": "embedded", "assessor": "embedded"}
        for label in ("embedded", "embedded-2"):
            m = json.loads((sweep / label / "metrics.json").read_text())
            assert m["case_status"] == {"total": 2, "finished": 2, "failed": 0, "not_started": 0}
            recs = [json.loads(x) for x in (sweep / label / "records.jsonl").read_text().splitlines()]
            assert recs and all(r["roles"] == roles for r in recs)
            assert "Roles: clinical: embedded, patient: embedded" in (sweep / label / "summary.md").read_text()
        assert json.loads((sweep / "embedded" / "metrics.json").read_text())["run"]["cases_resumed"] >= 1 or "embedded: all 2 cases finished earlier" in err
        summary = (sweep / "summary.md").read_text()
        assert ("Roles: clinical: the model of each run; patient: embedded, assessor: embedded for every run "
                "(grader, summarizer: not called with these settings).") in summary
        assert "| (published) |" in summary and (sweep / "published-gpt3_1106" / "metrics.json").exists()
        compare = (sweep / "compare" / "summary.md").read_text()
        assert "gpt3_1106-published" in compare and "**embedded-2**" in compare
        html = (sweep / "report.html").read_text()
        assert "Roles: clinical: embedded, patient: embedded, grader: embedded, summarizer: embedded, assessor: embedded for every run." in html
        assert json.loads(run_cli("serve", "status", "--json", env=env, check=True).stdout) == []  # every server it started is stopped
    finally:  # a failure half-way leaves nothing running: the sweep and every server of this test's own home stopped
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
        run_cli("serve", "stop", env=env, timeout=120)


def test_sweep_roles_not_called_stay_on_the_swept_model(monkeypatch, tmp_path):
    """Vignette MCQ only: CRAFT-MD calls no patient, grader or summarizer; they go with each run's model (no
    server is started for them) and the summary says they were not called."""
    roles, _ = _planned_roles(monkeypatch, tmp_path, "craftmd", ["embedded", "llama2-7b-chat"], SMALL)
    # (the embedded config asks the conversation assessor: with no conversation in these formats it is not called either)
    assert roles["llama2-7b-chat"] == dict.fromkeys(("clinical", "patient", "grader", "summarizer", "assessor"), "llama2-7b-chat")
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "Roles: clinical: the model of each run (patient, grader, summarizer, assessor: not called with these settings)." in summary


def test_report_says_which_roles_were_fixed():
    from experiments.tools.report.build import roles_note

    runs = [{"roles": {"clinical": "a", "patient": "p", "grader": "g"}}, {"roles": {"clinical": "b", "patient": "p", "grader": "g"}},
            {"roles": {}}]  # an imported release has no role map
    assert roles_note(runs) == "Roles: patient: p, grader: g for every run; clinical: the model of each run."
    assert roles_note(runs[:1]) == ""


def test_sweep_refuses_models_that_do_not_fit_one_gpu_before_anything_runs(monkeypatch, tmp_path):
    """On a (stubbed) 20 GB GPU the second run would hold two 8B servers: refused with the numbers before the first runs."""
    from serving import launcher
    from serving.gpu_memory import GpuMemoryError

    monkeypatch.setattr(launcher, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(launcher, "gpu_memory_gib", lambda device=None: (20.0, 19.6))
    args = ["--data", CASES, "--trials", "1", "--role", "patient=openbiollm-8b", "--role", "grader=openbiollm-8b"]
    with pytest.raises(GpuMemoryError, match=r"2 vLLM server\(s\) on one GPU need 35.9 GiB but 0.90 of the GPU's 20.0 GiB = 18.0 GiB"):
        _planned_roles(monkeypatch, tmp_path, "craftmd", ["openbiollm-8b", "llama3-8b-instruct"], args)
    assert not (tmp_path / "sweep").exists()
    roles, _ = _planned_roles(monkeypatch, tmp_path, "craftmd", ["openbiollm-8b"], args)  # one model for every role: one server, fits
    assert roles["openbiollm-8b"]["clinical"] == "openbiollm-8b"
