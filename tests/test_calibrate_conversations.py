"""`calibrate conversations`: the CRAFT-MD assessors against the released expert labels (fixture in the release's
layout), with a scripted assessor: agreement, kappa and confusion worked by hand, unscored replies, resume;
and one end-to-end run against the real embedded server."""

from __future__ import annotations

import asyncio
import json

import pytest

from experiments.studies.craftmd.calibrate_conversations import (ConversationCalibration, ConversationCalibrationSettings, agreement,
                                                 calibration_metrics, interleaved)
from experiments.core.registry import named
from experiments.core.runner import prepare_run, run_study
from experiments.studies.craftmd.assess import conversation_text
from experiments.core.record import turns
from experiments.studies.craftmd.experts import load_expert_labels
from serving.cache import ResponseCache
from tests.scripted import ScriptedLLM


def test_agreement_and_kappa_by_hand():
    # experts (No, No, No, Yes, Yes, Yes, Yes) vs assessor (No, No, Yes, No, Yes, Yes, Yes): 5 of 7 agree;
    # marginals 3/7 and 4/7 on both sides: p_e = 25/49, kappa = (35/49 - 25/49) / (24/49) = 10/24
    a = agreement([False, False, False, True, True, True, True], [False, False, True, False, True, True, True], n_boot=500)
    assert a["n"] == 7 and a["exact_agreement"] == pytest.approx(5 / 7) and a["kappa"] == pytest.approx(10 / 24)
    assert a["confusion"] == [[2, 1], [1, 3]]
    lo, hi = a["ci95"]["kappa"]
    assert lo <= 10 / 24 <= hi and a["ci95"]["exact_agreement"][0] <= 5 / 7 <= a["ci95"]["exact_agreement"][1]
    assert agreement([], [])["kappa"] is None
    assert agreement([True, True], [True, True])["kappa"] is None  # one category on both sides: kappa undefined, not 1


@pytest.fixture
def convs(fixtures_dir):
    return load_expert_labels(fixtures_dir / "craftmd" / "experts")


def scripted(convs, plan: dict[str, dict[str, str]]):
    """Replies by case (its conversation found by its text in the prompt; the fixture's two models share each
    case's conversation, so their identical requests are answered once, then from the cache) and question."""
    texts = {c.case_id: conversation_text(turns({"transcript": c.transcript})) for c in convs}
    wording = {"Q1": "one most likely diagnosis", "Q2": "key information", "Q3": "medical terminology", "grounded": "grounded in the case notes",
               "complete": "complete for what"}
    sent = []

    def respond(role, content, gen):
        text = content if isinstance(content, str) else "\n".join(m["content"] for m in content)
        cid = next(i for i, t in texts.items() if t in text)
        q = next(q for q, w in wording.items() if w in text)
        sent.append((cid, q))
        return plan.get(cid, {}).get(q, "Verdict: Yes")

    return respond, sent


# the assessor's Q2 per case: Yes, No, Yes and one unreadable; the experts' Q2 in the fixture:
# gpt-4 case_1..4 Yes, Yes, No, Yes; gpt-3.5 case_1..4 No, Yes, No, No
Q2 = {"case_1": "Verdict: Yes", "case_2": "Verdict: No", "case_3": "Verdict: Yes", "case_4": "I am not sure"}


def settings(tmp_path, fixtures_dir, **kw):
    return ConversationCalibrationSettings(**{"data": str(fixtures_dir / "craftmd" / "experts"), "out": str(tmp_path / "cal"),
                                              "roles": {"assessor": "scripted"}, "n_boot": 500, "concurrency": 4, **kw})


def test_calibration_through_the_runner_by_hand_and_resume(convs, fixtures_dir, tmp_path):
    plan = {cid: {"Q2": v} for cid, v in Q2.items()}
    respond, sent = scripted(convs, plan)
    cache = ResponseCache(tmp_path / "cache.sqlite")
    study = named(ConversationCalibration)()
    s, cases = prepare_run(study, settings(tmp_path, fixtures_dir, limit=4))
    assert [c["id"] for c in cases] == ["gpt-4/case_1", "gpt-3.5/case_1", "gpt-4/case_2", "gpt-3.5/case_2"]  # models in turn
    o = asyncio.run(run_study(study, s, cases, client=ScriptedLLM(respond, roles=("assessor",), cache=cache), log=lambda m: None))
    assert o.finished == 4 and len(sent) == 10  # five questions per conversation; the second model's copy from the cache
    # the whole set: the four done are resumed, only the other four are asked
    s, cases = prepare_run(study, settings(tmp_path, fixtures_dir))
    client = ScriptedLLM(respond, roles=("assessor",), cache=cache)
    o = asyncio.run(run_study(study, s, cases, client=client, log=lambda m: None))
    assert o.finished == 8 and len(sent) == 20 and len(set(sent)) == 20 and o.metrics["run"]["cases_resumed"] == 4
    m = json.loads((tmp_path / "cal" / "metrics.json").read_text())
    # Q2 pairs (experts, assessor), case_4 unscored for both models: gpt-4 (Y,Y) (Y,N) (N,Y); gpt-3.5 (N,Y) (Y,N) (N,Y):
    # 1 of 6 agree; marginals experts 3/6 Yes, assessor 4/6 Yes: p_e = 1/2, kappa = (1/6 - 1/2) / (1/2) = -2/3
    q2 = m["questions"]["Q2"]
    assert (q2["n"], q2["assessor_unscored"], q2["confusion"]) == (6, 2, [[0, 3], [2, 1]])
    assert q2["exact_agreement"] == pytest.approx(1 / 6) and q2["kappa"] == pytest.approx(-2 / 3)
    # Q1: the assessor says Yes to all 8; the experts 4 Yes -> agreement 1/2, kappa 0
    q1 = m["questions"]["Q1"]
    assert q1["confusion"] == [[0, 4], [0, 4]] and q1["exact_agreement"] == 0.5 and q1["kappa"] == pytest.approx(0.0)
    per = m["per_model"]
    assert per["gpt-4"]["Q2"]["assessor"]["pct"] == pytest.approx(200 / 3) and per["gpt-4"]["Q2"]["experts"]["pct"] == pytest.approx(75.0)
    assert per["gpt-3.5"]["Q2"]["assessor"]["yes"] == 2 and per["gpt-3.5"]["Q2"]["assessor"]["n"] == 3
    assert per["gpt-3.5"]["Q2"]["experts"]["pct"] == pytest.approx(25.0)
    assert per["gpt-4"]["grounded"]["experts"] is None and m["questions"]["grounded"]["experts_unlabelled"] is None
    md = (tmp_path / "cal" / "summary.md").read_text()
    assert "| assessor `scripted` | Q2 | experts combined | 6 | 0.167 [" in md and "| [[0, 3], [2, 1]] |" in md
    assert "| GPT-4 | Q1 | 100.0 (4/4) | – | 75.0 (3/4) | 53.33 |" in md and "not released" in md
    # Q3 answered "Verdict: Yes", not with terms: unscored, and counted as quoting what no patient line holds
    assert m["questions"]["Q3"]["assessor_unscored"] == 8 and m["questions"]["Q3"]["terms_not_in_patient_lines"] == 8
    # per rater: Q2 against d1 alone (gpt-4 case_1..3 Y, N, N; gpt-3.5 N, Y, N) vs the assessor (Y, N, Y; Y, N, Y):
    # (Y,Y) (N,N) (N,Y) (N,Y) (Y,N) (N,Y) -> [[1, 3], [1, 1]], sensitivity 1/2, specificity 1/4
    d1 = m["per_rater"]["Q2"]["d1"]
    assert d1["n"] == 6 and d1["confusion"] == [[1, 3], [1, 1]] and (d1["sensitivity"], d1["specificity"]) == (0.5, 0.25)
    # the records carry the experts' labels beside the assessor's verdicts, for the report's case browser
    rec = json.loads((tmp_path / "cal" / "records.jsonl").read_text().splitlines()[0])
    assert rec["scores"]["assess-Q1@experts"]["judge"]["model"] == "dermatologists" and rec["scores"]["assess-Q1"]["value"] == 1 and rec["transcript"]
    # the report: beside the grader calibration (judge-calibration table), and each conversation's verdicts beside the experts'
    from experiments.tools.report.build import build_report

    html = build_report([str(tmp_path / "cal")], tmp_path / "report.html").read_text()
    assert "CRAFT-MD conversation assessors vs the paper&#39;s dermatologists" in html
    assert "confusion [[0, 3], [2, 1]]" in html
    assert html.count("<td>assess-Q2@experts (") == 8 and html.count("<td>assess-Q2 (") == 8  # per conversation: the assessor's grade beside the experts'


def test_interleaved_and_bad_labels(convs, tmp_path):
    order = [c.model for c in interleaved(convs)]
    assert order[:4] == ["gpt-4", "gpt-3.5", "gpt-4", "gpt-3.5"]
    from models.errors import DataError

    with pytest.raises(DataError):
        prepare_run(named(ConversationCalibration)(), ConversationCalibrationSettings(data=str(tmp_path), out=str(tmp_path / "o")))


def test_cli_help_and_metrics_without_labels(tmp_path):
    import typer
    from typer.testing import CliRunner

    from experiments.tools.calibrate import cli as calibrate_cli
    from experiments.core import commands

    app = typer.Typer()
    apps = dict(app=app, run_app=typer.Typer(), score_app=typer.Typer(), import_app=typer.Typer(), data_app=typer.Typer(), finetune_app=typer.Typer(),
                calibrate_app=calibrate_cli.calibrate_app)
    commands.register_all(**apps)  # the tools' commands and the studies' calibrations, from their declarations
    r = CliRunner().invoke(app, ["calibrate", "conversations", "--help"])
    assert r.exit_code == 0 and "--labels" in r.output and "--limit" in r.output
    assert calibration_metrics([])["raters"]["Q1"]["n"] == 0 and calibration_metrics([])["questions"] == {}


@pytest.mark.e2e
def test_calibrate_conversations_with_the_real_embedded_server(cli, embedded_server, fixtures_dir, tmp_path):
    out = tmp_path / "cal"
    args = ["calibrate", "conversations", "--assessor-model", f"embedded@{embedded_server['base_url']}", "--labels", str(fixtures_dir / "craftmd" / "experts"),
            "--limit", "2", "--out", str(out), "--config", "experiments/studies/craftmd/configs/embedded-small.yaml"]
    proc = cli(*args, check=True)
    assert "CRAFT-MD conversation checks against the paper's dermatologists" in proc.stdout
    assert "temperature 0.0, top_p 1.0, max_tokens 24, text completion" in proc.stdout  # as embedded-small.yaml's run asks
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and all(r["status"] == "ok" for r in recs)
    calls = [c for r in recs for c in r["calls"]]
    assert len(calls) == 10 and {c["role"] for c in calls} == {"assessor"} and all(c["kind"] == "completion" for c in calls)
    m = json.loads((out / "metrics.json").read_text())
    for q in ("Q1", "Q2", "Q3"):
        x = m["questions"][q]
        assert x["n"] + x["assessor_unscored"] == 2  # every verdict is a pair or counted unscored
    proc = cli(*args, check=True)  # the same command resumes: nothing asked again
    assert json.loads((out / "metrics.json").read_text())["run"]["cases_run"] == 0


def test_clinicians_review_the_assessor_on_the_same_blind_page_and_calibrate_reads_their_labels(convs, fixtures_dir, tmp_path):
    """`review --judge assess-Q1` over the calibration's conversations, then `calibrate RUN --labels RUN/reviews`."""
    from experiments.tools.calibrate.reviews import calibrate_reviews
    from experiments.tools.review.judges import load_judge
    from experiments.tools.review.labels import append_label, write_sample

    respond, _ = scripted(convs, {"case_1": {"Q1": "Verdict: No"}, "case_4": {"Q1": "unsure"}})
    study = named(ConversationCalibration)()
    s, cases = prepare_run(study, settings(tmp_path, fixtures_dir))
    asyncio.run(run_study(study, s, cases, client=ScriptedLLM(respond, roles=("assessor",)), log=lambda m: None))
    run = tmp_path / "cal"
    j = load_judge(run, "assess-Q1")
    assert j["scale"]["names"] == {"1": "yes", "0": "no"} and "one most likely diagnosis" in j["scale"]["question"]
    assert len(j["items"]) == 6  # case_4's unreadable reply (both models) is no decision to review
    it = next(i for i in j["items"] if i["id"] == "gpt-4/case_1")
    assert it["verdict"] == 0 and set(it["show"]) == {"case notes", "conversation"}  # what the assessor was given, never the verdict
    assert it["show"]["conversation"][0] == "Doctor-AI: Hi! What symptoms are you facing today?" and "itchy silver" in it["show"]["case notes"]
    sample = write_sample(run, j, 6, 0)
    assert "verdict" not in json.dumps(sample["items"])
    # the clinician agrees except on one item
    for x in sample["items"]:
        v = next(i["verdict"] for i in j["items"] if i["id"] == x["id"])
        append_label(run, "derm", {"judge": "assess-Q1", "item": x["id"], "label": 1 - v if x["id"] == "gpt-3.5/case_2" else v, "skipped": False, "comment": ""})
    r = calibrate_reviews(run, run / "reviews", n_boot=200)["reviewers"]["derm"]["vs_judge"]
    assert r["n"] == 6 and r["exact_agreement"] == pytest.approx(5 / 6)


def test_without_a_model_the_terminology_check_alone_by_hand(fixtures_dir, tmp_path):
    """No --model: no server, no request; the fixture's conversations (both models share each case's) hold a listed term
    in case_3 only ("a pearly papule with telangiectasia"). Q3 labels: combined gpt-4 N, N, Y, N; gpt-3.5 N, N, N
    (d1 N, d2 Y, d3 N), N. Against the combined label: confusion [[6, 1], [0, 1]], agreement 7/8, sensitivity 1,
    specificity 6/7, kappa: p_o 56/64, p_e (1/8)(2/8) + (7/8)(6/8) = 44/64 -> (12/64) / (20/64) = 0.6. Against d1 (6
    conversations: Y only gpt-4 case_3): [[4, 1], [0, 1]], kappa (30/36 - 22/36) / (14/36) = 4/7. Against d2: every one
    agrees, kappa 1. The raters on the 4 they share: (N,N) (Y,Y) (N,N) (N,Y): 3/4, kappa (12/16 - 8/16) / (8/16) = 0.5."""
    import typer
    from typer.testing import CliRunner

    from experiments.tools.calibrate import cli as calibrate_cli
    from experiments.core import commands

    app = typer.Typer()
    apps = dict(app=app, run_app=typer.Typer(), score_app=typer.Typer(), import_app=typer.Typer(), data_app=typer.Typer(), finetune_app=typer.Typer(),
                calibrate_app=calibrate_cli.calibrate_app)
    commands.register_all(**apps)  # the tools' commands and the studies' calibrations, from their declarations
    r = CliRunner().invoke(app, ["calibrate", "conversations", "--labels", str(fixtures_dir / "craftmd" / "experts"), "--out", str(tmp_path / "cal"),
                                 "--n-boot", "200"])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "cal" / "metrics.json").read_text())
    c, d1, d2 = (m["detector"]["Q3"][k] for k in ("combined", "d1", "d2"))
    assert c["confusion"] == [[6, 1], [0, 1]] and c["exact_agreement"] == 7 / 8 and c["sensitivity"] == 1 and c["specificity"] == pytest.approx(6 / 7)
    assert c["kappa"] == pytest.approx(0.6) and d1["confusion"] == [[4, 1], [0, 1]] and d1["kappa"] == pytest.approx(4 / 7)
    assert d2["n"] == 6 and d2["kappa"] == pytest.approx(1.0) and m["detector"]["Q3"]["yes"] == 2
    assert m["raters"]["Q3"]["n"] == 4 and m["raters"]["Q3"]["kappa"] == pytest.approx(0.5) and m["questions"] == {}
    assert "| terminology check | Q3 | rater d1 | 6 | 0.833 [" in r.output and "| rater d2 (the ceiling) | Q3 | rater d1 | 4 | 0.750 [" in r.output
    rec = json.loads((tmp_path / "cal" / "records.jsonl").read_text().splitlines()[2])
    g = rec["scores"]["terminology"]
    assert rec["id"] == "gpt-4/case_3" and (g["value"], g["answer"]) == (1, ["papule", "telangiectasia"])
    from experiments.tools.report.build import build_report

    html = build_report([str(tmp_path / "cal")], tmp_path / "report.html").read_text()
    assert "terminology check (no model)" in html and "confusion [[6, 1], [0, 1]]" in html


def test_without_a_model_the_assessors_options_are_refused_and_with_one_the_summary_says_the_answers_used(fixtures_dir, tmp_path):
    """An option that sets how the assessor is asked does nothing without --assessor-model: refused in one line (exit 2),
    nothing written; with it, the settings line printed is the one the requests were built from (--answers)."""
    from experiments.core.config import ConfigError
    from experiments.studies.craftmd.calibrate_grader import settings_line, study_settings
    import typer
    from typer.testing import CliRunner

    from experiments.tools.calibrate import cli as calibrate_cli
    from experiments.core import commands

    app = typer.Typer()
    commands.register_all(app=app, run_app=typer.Typer(), score_app=typer.Typer(), import_app=typer.Typer(), data_app=typer.Typer(),
                          finetune_app=typer.Typer(), calibrate_app=calibrate_cli.calibrate_app)
    for extra in (["--limit", "2"], ["--answers", "constrained"], ["--chat"], ["--config", "experiments/studies/craftmd/configs/embedded-small.yaml"]):
        r = CliRunner().invoke(app, ["calibrate", "conversations", "--labels", str(fixtures_dir / "craftmd" / "experts"),
                                     "--out", str(tmp_path / "cal"), *extra])
        assert isinstance(r.exception, ConfigError) and extra[0].split("/")[0] in str(r.exception) and "--assessor-model" in str(r.exception)
        assert not (tmp_path / "cal").exists()
    run = study_settings(None, {"assessor": "embedded"}, step="assessor").model_copy(update={"answers": "constrained"})
    assert settings_line(run, "assessor", None).endswith("answers constrained")
