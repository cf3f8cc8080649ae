"""`medstack rescore` over a toy study declared here (its scorers: a binary judge, `match`, deciding per part, and
an ordinal one, `rate`, deciding once per record), against the scripted client: only the judge's requests are sent,
both grades are kept, a panel's majority of all members / mean, its Fleiss' kappa, agreement with the run's own
judge, resume after a kill, and the bad command lines (exit 2, one line)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from experiments.common.grade import Grade, grades
from experiments.common.stats import fleiss_kappa
from experiments.core import registry, runner
from experiments.core.config import ConfigError, RunSettings, Sampling
from experiments.common.grade import BINARY, RATING
from experiments.core.record import record
from experiments.core.scorers import Scorer, review_items
from experiments.core.study import CaseContext, Study
from experiments.tools.rescore.cli import register
from models.errors import MedstackError
from scripted import ScriptedLLM
from tests.conftest import run_cli

REF = "embedded@http://127.0.0.1:9/v1"
PARTS = ("p1", "p2")


class ToySettings(RunSettings):
    roles: dict[str, str] = {"answerer": REF, "judge": REF}
    sampling: Sampling = Sampling(max_tokens=8)


async def ask_match(ctx: CaseContext, r: dict, s: ToySettings, role: str) -> dict:
    """The toy's one judge question per part: does the stored answer match? (yes / no; anything else unscored)."""
    out = {}
    for part in PARTS:
        answer = r["answer"][part]
        reply = await ctx.chat([{"role": "user", "content": f"judge {r['id']} {part}: does {answer} match?"}], role=role,
                               gen=s.sampling.gen(), step="match")
        word = reply.text.strip().lower()
        value = 1 if word.startswith("yes") else 0 if word.startswith("no") else None
        out[part] = Grade(value=value, answer=answer, explanation=reply.text, judge={"model": s.roles[role], "prompt_hash": "toy"})
    return out


async def ask_rate(ctx: CaseContext, r: dict, s: ToySettings, role: str) -> dict:
    reply = await ctx.chat([{"role": "user", "content": f"rate {r['id']}: {r['answer']['p1']} from 1 to 5"}], role=role,
                           gen=s.sampling.gen(), step="rate")
    m = re.search(r"[1-5]", reply.text)
    return {None: Grade(value=int(m.group()) if m else None, answer=r["answer"]["p1"], explanation=reply.text, judge={"model": s.roles[role]})}


MATCH = Scorer("match", BINARY, "Does the answer match?", decide=ask_match, role="judge")
RATE = Scorer("rate", RATING, "How good is the answer?", decide=ask_rate, role="judge")


class JudgedToy(Study):
    name = "toy-judged"
    settings_cls = ToySettings
    roles = ("answerer", "judge")
    primary_role = "answerer"
    scorers = (MATCH, RATE)

    def load_cases(self, s: ToySettings) -> list[dict]:
        return [{"id": f"c{i}"} for i in (1, 2, 3)]

    async def solve(self, ctx: CaseContext, case: dict, s: ToySettings) -> dict:
        answers = {p: (await ctx.chat([{"role": "user", "content": f"answer {case['id']} {p}"}], role="answerer",
                                      gen=s.sampling.gen(), step="answer")).text for p in PARTS}
        return record(case["id"], answer=answers)

    def metrics(self, records: list[dict], s: ToySettings) -> dict:
        return {"records": len(records)}

    def summary(self, metrics: dict, s: ToySettings, run) -> str:
        return f"# toy-judged\n\n{metrics['records']} records\n"


def register_toy(monkeypatch) -> None:
    """JudgedToy as the study of results folders of kind toy-judged (the registry finds declared studies only)."""
    found = registry._kind
    monkeypatch.setattr(registry, "_kind", lambda experiment: JudgedToy if experiment == "toy-judged" else found(experiment))


def own_judge(role: str, text: str) -> str:
    """The source run's judge: c1 and c3 match, c2 does not; every rating 4."""
    if text.startswith("rate"):
        return "4"
    return "no" if " c2 " in text else "yes"


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A source run of the toy study (its records carry typed scores) and `medstack rescore` on a Typer app;
    ``script["judge"]`` answers the rescore's judge requests; ``sent`` is every request the scripted client got."""
    register_toy(monkeypatch)
    sent: list[tuple[str, str]] = []
    script = {"judge": own_judge}

    def respond(role, content, gen):
        text = content[-1]["content"]
        sent.append((role, text))
        return "ans" if role == "answerer" else script["judge"](role, text)

    @asynccontextmanager
    async def scripted(roles, **kw):
        yield ScriptedLLM(respond, roles=tuple(roles)), {}

    monkeypatch.setattr(runner, "open_client", scripted)
    src = tmp_path / "run"
    settings, cases = runner.prepare_run(JudgedToy(), ToySettings(out=str(src)))
    assert asyncio.run(runner.run_study(JudgedToy(), settings, cases, log=lambda *_: None)).exit_code == 0
    sent.clear()
    return app_with_rescore(), src, sent, script


def app_with_rescore() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    return app


def rescore(app, *args):
    return CliRunner().invoke(app, ["rescore", *map(str, args)])


def files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def records(folder: Path) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, (folder / "records.jsonl").read_text().splitlines())}


def test_rescore_sends_only_the_judge_requests_and_keeps_both_grades(toy, tmp_path):
    app, src, sent, script = toy
    before = files(src)
    # the new judge: c2/p2 unreadable (unscored, not fatal), c3/p2 a different verdict
    script["judge"] = lambda role, text: "hmm" if "c2 p2" in text else "no" if "c3 p2" in text else "yes"
    out = tmp_path / "run2"
    r = rescore(app, src, "--judge", "match", "--model", f"other={REF}", "--out", out)
    assert r.exit_code == 0, r.output
    assert files(src) == before  # the source folder is never written
    # 3 records x 2 parts, each one judge request, nothing else
    assert len(sent) == 6 and all(role == "judge" and text.startswith("judge ") for role, text in sent)
    recs = records(out)
    calls = [c for rec in recs.values() for c in rec["calls"]]
    assert len(calls) == 6 and {(c["step"], c["role"]) for c in calls} == {("match", "judge")}
    c2, c3 = grades(recs["c2"]), grades(recs["c3"])
    assert c2["match/p1"].value == 0 and c2["match/p1@other"].value == 1  # both grades side by side
    assert c2["match/p2"].value == 0 and c2["match/p2@other"].value is None and c2["match/p2@other"].explanation == "hmm"
    assert c3["match/p2@other"].value == 0 and c3["match/p2@other"].judge["model"] == REF
    assert c2["rate"].value == 4 and not any(n.startswith("rate@") for n in c2)  # another step: untouched
    assert recs["c1"]["answer"] == {"p1": "ans", "p2": "ans"} and recs["c1"]["roles"] == {"judge": REF}
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["experiment"] == "toy-judged" and config["roles"] == {"judge": REF}
    assert config["rescore"]["source"] == str(src) and config["rescore"]["judge"] == "match" and config["rescore"]["models"] == {"other": REF}
    assert json.loads((out / "identity.json").read_text())["experiment"] == "toy-judged"
    m = json.loads((out / "metrics.json").read_text())["rescore"]
    assert m["judges"]["run"] == {"p1": {"mean": 0.6667, "n": 3, "unscored": 0}, "p2": {"mean": 0.6667, "n": 3, "unscored": 0}}
    assert m["judges"]["other"]["p2"] == {"mean": 0.5, "n": 2, "unscored": 1}
    # own [1,1,0,1,1] vs new [1,1,1,1,0] over the 5 items both scored: 60 %, Cohen's kappa (0.6 - 0.68) / 0.32
    assert m["agreement"]["other"] == {"n": 5, "by_rule": 0, "mean_abs_diff": 0.4, "percent_agreement": 60.0, "kappa": -0.25, "kappa_kind": "cohen"}
    summary = (out / "summary.md").read_text()
    assert "| part | the run's own | other |" in summary and "| p2 | 0.667 (3, 0) | 0.500 (2, 1) |" in summary
    assert "| other | 5 | 60.0% | -0.250 (cohen) | 0.400 |" in summary
    # review reads RUN2 as a toy run, the new judge by its label
    _, items = review_items(MATCH, list(recs.values()), config, by="other")
    assert sorted((it["id"], it["verdict"]) for it in items) == [("c1|p1", 1), ("c1|p2", 1), ("c2|p1", 1), ("c3|p1", 1), ("c3|p2", 0)]


def test_a_binary_panel_takes_the_majority_and_reports_fleiss_kappa(toy, tmp_path):
    app, src, sent, script = toy
    script["judge"] = lambda role, text: {"judge1": "yes", "judge2": "no"}.get(role) or ("yes" if " c1 " in text else "no")
    out = tmp_path / "panel"
    r = rescore(app, src, "--judge", "match", "--panel", f"a={REF},b={REF},c={REF}", "--out", out)
    assert r.exit_code == 0, r.output
    assert len(sent) == 18 and {role for role, _ in sent} == {"judge1", "judge2", "judge3"}
    recs = records(out)
    assert all(c["step"] == "match" for rec in recs.values() for c in rec["calls"])
    panel = {(i, p): grades(rec)[f"match/{p}@panel"] for i, rec in recs.items() for p in PARTS}
    assert {k: g.value for k, g in panel.items()} == {("c1", "p1"): 1, ("c1", "p2"): 1, ("c2", "p1"): 0, ("c2", "p2"): 0,
                                                     ("c3", "p1"): 0, ("c3", "p2"): 0}
    assert panel[("c1", "p1")].metadata["members"] == [{"model": REF, "value": 1}, {"model": REF, "value": 0}, {"model": REF, "value": 1}]
    assert grades(recs["c1"])["match/p1@b"].value == 0  # each member's own grade is kept too
    m = json.loads((out / "metrics.json").read_text())["rescore"]
    expected = fleiss_kappa([[1, 0, 1]] * 2 + [[1, 0, 0]] * 4, [0, 1])
    assert m["panel_agreement"] == {"members": ["a", "b", "c"], "n": 6, "by_rule": 0, "fleiss_kappa": round(expected, 4)}
    # panel [1,1,0,0,0,0] vs the run's own [1,1,0,0,1,1]: 4 of 6
    assert m["agreement"]["panel"]["n"] == 6 and m["agreement"]["panel"]["percent_agreement"] == pytest.approx(66.6667)
    assert "Fleiss' kappa" in (out / "summary.md").read_text()
    _, items = review_items(MATCH, list(recs.values()), {}, by="panel")
    assert sorted((it["id"], it["verdict"]) for it in items) == sorted((f"{i}|{p}", g.value) for (i, p), g in panel.items())


def test_a_tied_panel_is_unscored_and_an_ordinal_panel_takes_the_mean(toy, tmp_path):
    app, src, sent, script = toy
    script["judge"] = lambda role, text: {"judge1": "yes", "judge2": "no"}[role]
    r = rescore(app, src, "--judge", "match", "--panel", f"a={REF},b={REF}", "--out", tmp_path / "tie")
    assert r.exit_code == 0, r.output
    recs = records(tmp_path / "tie")
    assert all(grades(rec)[f"match/{p}@panel"].value is None for rec in recs.values() for p in PARTS)
    m = json.loads((tmp_path / "tie" / "metrics.json").read_text())["rescore"]
    assert m["judges"]["panel"]["p1"] == {"mean": None, "n": 0, "unscored": 3} and m["agreement"]["panel"]["n"] == 0

    script["judge"] = lambda role, text: {"judge1": "2", "judge2": "3", "judge3": "5"}[role]
    sent.clear()
    out = tmp_path / "rate"
    r = rescore(app, src, "--judge", "rate", "--panel", f"a={REF},b={REF},c={REF}", "--out", out)
    assert r.exit_code == 0, r.output
    assert len(sent) == 9 and all(text.startswith("rate ") for _, text in sent)
    g = grades(records(out)["c1"])
    assert g["rate"].value == 4 and g["rate@panel"].value == pytest.approx(10 / 3) and g["rate@panel"].source == "mean"
    m = json.loads((out / "metrics.json").read_text())["rescore"]
    assert m["judges"]["panel"] == {"-": {"mean": 3.3333, "n": 3, "unscored": 0}}
    # the mean 3.33 rounds to 3 for agreement and kappa; the difference is the mean's
    a = m["agreement"]["panel"]
    assert (a["n"], a["percent_agreement"], a["mean_abs_diff"], a["kappa_kind"]) == (3, 0.0, 0.6667, "linear-weighted")
    assert m["panel_agreement"]["fleiss_kappa"] == round(fleiss_kappa([[2, 3, 5]] * 3, [1, 2, 3, 4, 5]), 4)


def test_resume_after_a_kill_asks_only_the_records_not_finished(toy, tmp_path):
    app, src, sent, script = toy
    script["judge"] = lambda role, text: "yes"
    out = tmp_path / "run2"
    assert rescore(app, src, "--judge", "match", "--judge-model", REF, "--out", out).exit_code == 0
    lines = (out / "records.jsonl").read_text().splitlines()
    (out / "records.jsonl").write_text(lines[0] + "\n")  # killed after the first record was written
    done = json.loads(lines[0])["id"]
    sent.clear()
    r = rescore(app, src, "--judge", "match", "--judge-model", REF, "--out", out)
    assert r.exit_code == 0, r.output
    assert len(sent) == 4 and not any(f" {done} " in text for _, text in sent)  # the finished record is not asked again
    recs = records(out)
    assert len(recs) == 3 and all(grades(rec)[f"match/{p}@embedded"].value == 1 for rec in recs.values() for p in PARTS)
    assert json.loads((out / "metrics.json").read_text())["run"]["cases_resumed"] == 1


def test_dry_run_builds_only_the_judge_requests(toy, tmp_path):
    app, src, sent, script = toy
    out = tmp_path / "dry"
    r = rescore(app, src, "--judge", "match", "--panel", f"a={REF},b={REF}", "--out", out, "--dry-run")
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (out / "dry-run.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and {(x["step"], x["role"]) for x in rows} == {("match", "judge1"), ("match", "judge2")}
    assert not sent and not (out / "records.jsonl").exists()


def test_bad_command_lines_are_refused_before_anything_runs(toy, tmp_path):
    app, src, sent, script = toy
    before = files(src)
    r = rescore(app, src, "--judge", "grade", "--judge-model", REF, "--out", tmp_path / "x")
    assert isinstance(r.exception, ConfigError) and getattr(r.exception, "exit_code", 2) == 2
    assert "\n" not in str(r.exception) and "no judge step 'grade'" in str(r.exception) and "its judge steps: match, rate" in str(r.exception)
    r = rescore(app, src, "--judge", "match", "--judge-model", REF, "--panel", f"a={REF},b={REF}", "--out", tmp_path / "x")
    assert isinstance(r.exception, ConfigError) and "--judge-model and --panel" in str(r.exception)
    for panel, why in [(f"{REF},{REF}", "two judges labelled 'embedded'"), (REF, "at least two"), (f"a/b={REF},c={REF}", "label 'a/b'"),
                       (f"panel={REF},c={REF}", "label 'panel'")]:
        r = rescore(app, src, "--judge", "match", "--panel", panel, "--out", tmp_path / "x")
        assert isinstance(r.exception, ConfigError) and why in str(r.exception), (panel, r.exception)
    for out in (src, src / "inside"):
        r = rescore(app, src, "--judge", "match", "--judge-model", REF, "--out", out)
        assert isinstance(r.exception, MedstackError) and "the source is never written" in str(r.exception)
    assert not sent and not (tmp_path / "x").exists() and files(src) == before


def test_bad_command_lines_exit_2_with_one_line(tmp_path):
    """Through the real `medstack` (a subprocess): exit 2 and one line, no traceback."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text('{"id": "c1", "status": "ok", "scores": {"match/p1": {"value": 1}}}\n')
    (run / "config.yaml").write_text("experiment: nobody-declares-this\n")
    for args, says in [(["--judge-model", REF, "--panel", f"a={REF},b={REF}"], "--judge-model and --panel together"),
                       (["--judge-model", REF], "has no judge step 'match'; its study declares no judge that can be asked again")]:
        proc = run_cli("rescore", str(run), "--judge", "match", *args, "--out", str(tmp_path / "out"))
        assert proc.returncode == 2 and says in proc.stdout + proc.stderr, (proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr and len((proc.stdout + proc.stderr).strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_fleiss_kappa_on_a_hand_worked_example():
    # 4 items, 3 raters: P_i = 1, 1/3, 1, 1/3 -> P-bar 2/3; p = (0.5, 0.5) -> P_e 1/2; kappa = (2/3 - 1/2) / (1 - 1/2) = 1/3
    assert fleiss_kappa([[1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 0, 0]]) == pytest.approx(1 / 3)
    assert fleiss_kappa([[1, 1, 1], [0, 0, 0]]) == pytest.approx(1.0)
    # categories named but unused change nothing; one category throughout, no item or one rater: undefined
    assert fleiss_kappa([["a", "a", "b"], ["b", "b", "b"]], ["a", "b", "c"]) == pytest.approx(fleiss_kappa([["a", "a", "b"], ["b", "b", "b"]]))
    assert all(v != v for v in (fleiss_kappa([[1, 1], [1, 1]]), fleiss_kappa([]), fleiss_kappa([[1], [0]])))
    with pytest.raises(ValueError):
        fleiss_kappa([[1, 1], [1, 0, 0]])


def test_the_report_shows_the_judges_side_by_side(toy, tmp_path):
    from experiments.tools.report.build import build_report

    app, src, sent, script = toy
    script["judge"] = lambda role, text: {"judge1": "yes", "judge2": "no", "judge3": "no"}[role]
    out = tmp_path / "panel"
    assert rescore(app, src, "--judge", "match", "--panel", f"a={REF},b={REF},c={REF}", "--out", out).exit_code == 0
    html = build_report([str(out)], tmp_path / "report").read_text(encoding="utf-8")
    assert "<h4>Judges</h4>" in html and "agreement with the run&#39;s own judge" in html
    assert "<td>p1</td><td>0.667 (3, 0)</td><td>1.000 (3, 0)</td><td>0.000 (3, 0)</td><td>0.000 (3, 0)</td><td>0.000 (3, 0)</td>" in html
    assert "<td>panel</td><td>6</td><td>33.3%</td>" in html and "Fleiss&#39; kappa" in html
    assert "match/p1@panel" in html  # the case view lists every grade, the panel's beside the run's own


def test_a_rescored_run_can_be_rescored_again(toy, tmp_path):
    app, src, sent, script = toy
    script["judge"] = lambda role, text: "no"
    assert rescore(app, src, "--judge", "match", "--judge-model", f"first={REF}", "--out", tmp_path / "r2").exit_code == 0
    r = rescore(app, tmp_path / "r2", "--judge", "match", "--judge-model", f"second={REF}", "--out", tmp_path / "r3")
    assert r.exit_code == 0, (r.output, r.exception)
    g = grades(records(tmp_path / "r3")["c1"])
    assert g["match/p1"].value == 1 and g["match/p1@first"].value == 0 and g["match/p1@second"].value == 0
    # a different judge for the same RUN2 is refused: it holds a rescore with other settings
    r = rescore(app, src, "--judge", "match", "--judge-model", f"other={REF}", "--out", tmp_path / "r2")
    assert isinstance(r.exception, MedstackError) and "different settings" in str(r.exception) and "rescore" in str(r.exception)
