"""`medstack rescore` end to end with the real embedded vLLM server: a one-case CRAFT-MD run and a one-question DERA-QA
run, each graded again by the embedded model as a second judge, and the CRAFT-MD run by a panel of three (the same server
under three labels, --no-cache so that each member's requests reach the server; greedy decoding, so the members should agree).
Counted from RUN2's call logs: every request is one the source run's own judge made (its step names), none of the
doctor's, patient's or answerer's; both grades are in every judged record; metrics.json has the agreement."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from experiments.common.grade import grades, split_name
from test_dera_e2e import small_config

pytestmark = pytest.mark.e2e


def _records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "records.jsonl").read_text().splitlines()]


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def check_rescore(cli, src: Path, step: str, ref: str, tmp_path: Path, experiment: str, panel_too: bool = True) -> None:
    """Rescore ``src`` with one model and (``panel_too``) with a panel of three; check what was sent and what was kept."""
    before = _files(src)
    one, panel = tmp_path / f"{step}-one", tmp_path / f"{step}-panel"
    cli("rescore", str(src), "--judge", step, "--judge-model", f"again={ref}", "--out", str(one), check=True)
    if panel_too:
        cli("rescore", str(src), "--judge", step, "--panel", f"a={ref},b={ref},c={ref}", "--out", str(panel), "--no-cache", check=True)
    assert _files(src) == before  # the source folder is only read
    m = json.loads((one / "metrics.json").read_text())["rescore"]
    role = m["role"]  # the source study's role of this judge
    source = _records(src)
    own_steps = {c["step"] for r in source for c in r["calls"] if c["role"] == role}
    own_names = {r["id"]: sorted(n for n in grades(r) if split_name(n)[0] == step and split_name(n)[2] is None) for r in source}
    assert any(own_names.values()), f"the source run has no {step} score"
    for out, labels in ((one, ["again"]), (panel, ["a", "b", "c", "panel"]))[: 2 if panel_too else 1]:
        recs = {r["id"]: r for r in _records(out)}
        assert set(recs) == set(own_names) and all(r["status"] == "ok" for r in recs.values())
        calls = [c for r in recs.values() for c in r["calls"]]
        # only the judge's requests: each a step the source's judge made, from a judge role of this rescore
        assert calls and {c["step"] for c in calls} <= own_steps, ({c["step"] for c in calls} - own_steps)
        assert {c["role"] for c in calls} == ({"judge"} if out == one else {"judge1", "judge2", "judge3"})
        if out == panel:  # every member asked the same requests, each sent to the server
            per = Counter(c["role"] for c in calls)
            assert len(set(per.values())) == 1 and not any(c["cached"] for c in calls)
        for rid, names in own_names.items():
            g = grades(recs[rid])
            for name in names:
                assert name in g and g[name].to_json() == grades(next(r for r in source if r["id"] == rid))[name].to_json()
                assert all(f"{name}@{label}" in g for label in labels), (name, sorted(g))
                if out == panel:  # the panel's grade is its members' majority (or mean)
                    members = [g[f"{name}@{x}"].value for x in ("a", "b", "c")]
                    assert g[f"{name}@panel"].metadata["members"] == [{"model": ref, "value": v} for v in members]
        config = yaml.safe_load((out / "config.yaml").read_text())
        assert config["experiment"] == experiment and config["rescore"]["judge"] == step and config["rescore"]["source"] == str(src)
        metrics = json.loads((out / "metrics.json").read_text())["rescore"]
        for label in labels:
            a = metrics["agreement"][label]
            assert a["n"] >= 0 and (a["n"] == 0 or 0 <= a["percent_agreement"] <= 100)
        if out == panel:
            assert metrics["panel_agreement"]["members"] == ["a", "b", "c"] and "fleiss_kappa" in metrics["panel_agreement"]
    html = Path(cli("report", str(panel if panel_too else one), "--out", str(tmp_path / f"{step}.html"), check=True).stdout.strip()).read_text()
    assert "<h4>Judges</h4>" in html


def test_rescore_a_craftmd_run(cli, embedded_server, fixtures_dir, tmp_path):
    ref = f"embedded@{embedded_server['base_url']}"
    src = tmp_path / "craftmd"
    cli("run", "craftmd", "--data", str(fixtures_dir / "craftmd" / "cases.csv"), "--limit", "1", "--trials", "1", "--max-turns", "2",
        "--clinical-model", ref, "--patient-model", ref, "--grader-model", ref, "--set", "assess_conversations=false",
        "--config", "experiments/studies/craftmd/configs/embedded-small.yaml", "--out", str(src), check=True)
    check_rescore(cli, src, "frq", ref, tmp_path, "craftmd")


def test_rescore_a_dera_qa_run(cli, embedded_server, fixtures_dir, tmp_path):
    ref = f"embedded@{embedded_server['base_url']}"
    cfg = small_config(tmp_path, "qa", answer={"max_tokens": 12}, explain={"max_tokens": 24}, dialogue={"max_tokens": 24},
                       max_turns=1, final={"max_tokens": 12}, judge_exact={"max_tokens": 8}, judge_similarity={"max_tokens": 6})
    src = tmp_path / "dera-qa"
    cli("run", "dera-qa", "--data", str(fixtures_dir / "dera" / "medqa_open.jsonl"), "--model", ref, "--limit", "1",
        "--out", str(src), "--config", str(cfg), check=True)
    check_rescore(cli, src, "llm-exact", ref, tmp_path, "dera-qa", panel_too=False)  # the panel: over the CRAFT-MD run


def test_rescore_the_toy_study_on_the_real_server(embedded_server, monkeypatch, tmp_path):
    """The toy judged study of tests/test_rescore.py, run and rescored in this process against the real server: the
    judge roles of a panel all reach it (no cache), only the judge's requests are sent, whatever the base model
    replies is a grade (an unreadable one unscored, never a failure)."""
    import asyncio

    from typer.testing import CliRunner

    from experiments.core import runner
    from test_rescore import PARTS, JudgedToy, ToySettings, app_with_rescore, register_toy

    ref = f"embedded@{embedded_server['base_url']}"
    register_toy(monkeypatch)
    src = tmp_path / "run"
    settings, cases = runner.prepare_run(JudgedToy(), ToySettings(out=str(src), roles={"answerer": ref, "judge": ref}, concurrency=3))
    assert asyncio.run(runner.run_study(JudgedToy(), settings, cases, log=lambda *_: None)).exit_code == 0
    out = tmp_path / "panel"
    r = CliRunner().invoke(app_with_rescore(), ["rescore", str(src), "--judge", "match", "--panel", f"a={ref},b={ref},c={ref}",
                                                "--out", str(out), "--no-cache"])
    assert r.exit_code == 0, (r.output, r.exception)
    recs = _records(out)
    calls = [c for rec in recs for c in rec["calls"]]
    assert len(calls) == 3 * 3 * len(PARTS) and {c["step"] for c in calls} == {"match"} and not any(c["cached"] for c in calls)
    assert Counter(c["role"] for c in calls) == {"judge1": 6, "judge2": 6, "judge3": 6}
    assert all(c["completion_tokens"] > 0 and c["texts"] for c in calls)  # real replies from the server
    for rec in recs:
        g = grades(rec)
        for p in PARTS:
            assert {f"match/{p}", f"match/{p}@a", f"match/{p}@b", f"match/{p}@c", f"match/{p}@panel"} <= set(g)
            assert g[f"match/{p}@a"].explanation is not None and g[f"match/{p}@a"].judge["model"] == ref
    m = json.loads((out / "metrics.json").read_text())
    assert m["case_status"]["finished"] == 3 and set(m["rescore"]["agreement"]) == {"a", "b", "c", "panel"}
    assert json.loads((out / "identity.json").read_text())["models"]["judge1"]["base_url"].rstrip("/") == embedded_server["base_url"].rstrip("/")
