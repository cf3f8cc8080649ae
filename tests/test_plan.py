"""Planning before a run (experiments/core/plan.py): a configuration that cannot fit its model is said before the
first request and in a case that fails for it; a dry run says its replies stood in and plans the full run for a GPU
(cases at once, hours) from the protocol's worst case, the study's figures or an earlier run's call log. No server:
the CLI's own typer app in this process, and the runner with a scripted client."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from experiments.core import plan
from serving.client import StatusError
from tests.scripted import ScriptedLLM
from tests.test_dry_runs import invoke  # noqa: F401 - the fixture: `medstack ARGS` in this process

FX = Path(__file__).parent / "fixtures"
AGENTCLINIC = ["run", "agentclinic", "--data", str(FX / "agentclinic" / "cases.jsonl"), "--limit", "2", "--model", "embedded"]
CRAFTMD = ["run", "craftmd", "--data", str(FX / "craftmd" / "cases.csv"), "--limit", "1", "--model", "llama3-8b-instruct"]


def _said(r) -> str:
    return " ".join(r.output.split())


def test_paper_agentclinic_on_the_embedded_model_is_said_not_to_fit(invoke, tmp_path):  # noqa: F811
    r = invoke(*AGENTCLINIC, "--dry-run", "--out", str(tmp_path / "paper"))
    said = _said(r)
    assert "this configuration may not fit its model: embedded's context is 2,048 tokens" in said
    assert re.search(r"doctor \d,\d{3}", said) and "--config experiments/studies/agentclinic/configs/embedded-demo.yaml" in said
    assert "The run goes on." in said
    assert "those replies were stand-ins, not a model's: they end each conversation early" in said
    assert "at most 40 request(s) per case (20 doctor inference(s)" in said and "at most 80 requests" in said
    demo = _said(invoke(*AGENTCLINIC, "--config", "experiments/studies/agentclinic/configs/embedded-demo.yaml", "--dry-run",
                        "--out", str(tmp_path / "demo")))
    assert "may not fit" not in demo and "at most 12 request(s) per case (6 doctor inference(s)" in demo


def test_a_case_that_outgrows_the_context_fails_saying_which_config_fits(tmp_path):
    from experiments.core.registry import studies
    from experiments.core.runner import prepare_run, run_study
    from experiments.studies.agentclinic.settings import AgentClinicSettings
    from experiments.core.config import load_settings

    study = studies()["agentclinic"].make()
    s = load_settings(AgentClinicSettings, study.default_config({}), {"data": str(FX / "agentclinic" / "cases.jsonl"), "limit": 1,
                                                                     "roles": {"default": "embedded"}, "out": str(tmp_path / "run")})
    s, cases = prepare_run(study, s)

    def respond(role, messages, gen):
        raise StatusError(400, "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens")

    logged: list[str] = []
    roles = ("doctor", "patient", "measurement", "moderator")
    out = asyncio.run(run_study(study, s, cases, client=ScriptedLLM(respond, roles=roles), log=logged.append))
    assert out.failed == 1
    first = next(i for i, m in enumerate(logged) if "may not fit its model" in m)
    assert "embedded-demo.yaml" in logged[first]
    import json
    rec = json.loads((tmp_path / "run" / "records.jsonl").read_text().splitlines()[0])
    assert rec["status"] == "failed" and "maximum context length" in rec["error"]
    assert rec["error"].startswith(f"doctor (doctor): {plan.CONTEXT_HINT} (the config made for this model: --config "
                                   "experiments/studies/agentclinic/configs/embedded-demo.yaml): HTTP 400"), rec["error"]
    assert "embedded-demo.yaml" in out.summary  # the summary's line of each failed case keeps it


def test_dry_run_plans_a_24_gb_gpu(invoke, tmp_path):  # noqa: F811
    said = _said(invoke(*CRAFTMD, "--gpu-memory", "24", "--dry-run", "--out", str(tmp_path / "d")))
    assert "request(s) of 5 case-trials written to" in said and "plan: 5 case-trials; at most" in said and "typical case-trial: 33.8 requests, 16,811 prompt and 1,472 output tokens" in said
    assert "llama3-8b-instruct alone on one 24 GB GPU (A10-class, 22.5 GiB): 13 case-trials at once" in said
    assert "48 GB" not in said and "computed, not measured on a GPU" in said
    p = plan.gpu_plan("llama3-8b-instruct", "auto", 24, 500, 16_811, 1_472, 4_648)  # the docs' 100 cases x 5 trials
    assert p.at_once == 13 and 1.4 < p.hours < 1.8 and 0.9 < p.hours_cached < 1.2, (p.hours, p.hours_cached)


def test_plan_from_an_earlier_run(invoke, tmp_path):  # noqa: F811
    import json

    run = tmp_path / "earlier"  # two finished case-trials with their call logs, and a failed one (left out)
    run.mkdir()
    call = lambda p, c: {"kind": "chat", "messages": [{"role": "user", "content": "x" * p}], "prompt_tokens": p, "completion_tokens": c}  # noqa: E731
    recs = [{"id": "a/t0", "status": "ok", "calls": [call(1000, 100)] * 30}, {"id": "b/t0", "status": "ok", "calls": [call(1000, 100)] * 40},
            {"id": "c/t0", "status": "failed", "calls": [call(5000, 1)]}]
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    w = plan.measured(str(run))
    assert w.calls == 35 and w.prompt_tokens == 35_000 and w.output_tokens == 3_500
    said = _said(invoke(*CRAFTMD, "--plan-from", str(run), "--gpu-memory", "80", "--dry-run", "--out", str(tmp_path / "d")))
    assert f"typical case-trial: {w.calls:.1f} requests" in said and f"measured in {run}" in said
    assert "H100 SXM-class" in said
    with pytest.raises(Exception, match="no records.jsonl"):
        plan.measured(str(tmp_path))


def test_a_running_server_with_a_longer_context_is_taken_at_its_word(tmp_path, monkeypatch):
    """A server the run finds running (not started by it) reports its own max_model_len: where that fits, the run
    says so after the registry's warning, and a case is not told the config it should have used."""
    from contextlib import nullcontext

    from experiments.core import runner
    from experiments.core.config import load_settings
    from experiments.core.registry import studies
    from experiments.studies.agentclinic.settings import AgentClinicSettings

    study = studies()["agentclinic"].make()
    s = load_settings(AgentClinicSettings, study.default_config({}), {"data": str(FX / "agentclinic" / "cases.jsonl"), "limit": 1,
                                                                     "roles": {"default": "embedded"}, "out": str(tmp_path / "run")})
    s, cases = runner.prepare_run(study, s)
    roles = ("doctor", "patient", "measurement", "moderator")
    client = ScriptedLLM(lambda role, m, gen: "DIAGNOSIS READY: flu" if role == "doctor" else "Yes", roles=roles)

    async def long_context(role="default"):
        return 32768

    monkeypatch.setattr(client, "served_context_length", long_context)
    found = {r: {"alias": "embedded", "started_by_run": False} for r in roles}
    monkeypatch.setattr(runner, "_open", lambda *a, **k: nullcontext((client, found)))
    monkeypatch.setattr(runner.RunDir, "write_identity", lambda self, *a, **k: {})
    logged: list[str] = []
    out = asyncio.run(runner.run_study(study, s, cases, log=logged.append))
    assert out.finished == 1
    warned = next(i for i, m in enumerate(logged) if "may not fit its model" in m)
    assert any("the servers' own context lengths fit this configuration" in m for m in logged[warned:])
