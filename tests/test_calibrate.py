"""Judge calibration on hand-worked fixtures in the published formats, with a scripted judge.

Fixture validation_graderai_small.csv (dermatologist counts 2, 5, 3, 5; case_4 blank -> skipped):
  case_0 gold Plaque psoriasis: plaque psoriasis (exact, 1), psoriasis (judge Yes, 1), guttate psoriasis (No),
         multiple (0), eczema (No)                                  -> judge 2
  case_1 gold Cushing syndrome: cushing disease x2 (asked, No), cushing syndrome x3 (exact) -> judge 3
  case_2 gold Tinea pedis: "tinea manuum, tinea pedis" (zero: 0; any: exact part, 1), tinea pedis (1),
         athlete's foot (Yes, 1), none (0), tinea corporis (No)     -> zero 2, any 3
  case_3 gold Halo nevus: 5 x exact                                  -> judge 5
Rule zero, (dermatologist, judge) = (2,2), (5,3), (3,2), (5,5):
  exact agreement 2/4 = 0.5; mean |diff| (0+2+1+0)/4 = 0.75; bound ((5-0)+(5-2)+(5-1)+(5-0))/5/4 = 0.85;
  linear kappa: observed weighted disagreement (0 + 2/5 + 1/5 + 0)/4 = 0.15, expected from the marginals
  (derm 2:1/4, 3:1/4, 5:1/2; judge 2:1/2, 3:1/4, 5:1/4) = 1.5/5 = 0.3 -> 1 - 0.15/0.3 = 0.5;
  Spearman: ranks derm (1, 3.5, 2, 3.5), judge (1.5, 3, 1.5, 4) -> 4 / sqrt(4.5 * 4.5) = 0.8889.
Rule any: judge (2, 3, 3, 5): exact 0.75, mean |diff| 0.5, bound (1 + 0.6 + 1 + 1)/4 = 0.9.
Published release folder: case_10 = case_0 in order (authors' count 3), case_11 = case_1 as a multiset
(5), case_12 = case_2 in order with a -1 counted wrong (3), case_13 matches nothing -> 3 matched;
(derm, published) = (2,3), (5,5), (3,3): exact 2/3, mean |diff| 1/3, bound (0.8 + 1 + 1)/3.
Trivial cases (any grader scores them alike): only case_3 (5 x gold); it matches nothing in the release,
so 0 of the 3 matched cases are trivial.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import typer
from typer.testing import CliRunner

from experiments.tools.calibrate import cli as calibrate_cli
from experiments.core import commands, registry
from experiments.studies.autoeval.calibrate import calibrate_autoeval
from experiments.studies.craftmd.calibrate_grader import CalibrationFailed, calibrate_grader, published_counts, read_labels, trivial_kind
from experiments.common.stats import count_agreement, kendall, spearman, weighted_kappa
from models.errors import DataError
from serving.client import ChatResult

YES = {("plaque psoriasis", "psoriasis"), ("tinea pedis", "athlete's foot")}


class ScriptedJudge:
    """Answers grader_match prompts: Yes for the pairs in YES, No otherwise; records every pair asked."""

    def __init__(self, fail_on: str | None = None):
        self.asked: list[tuple[str, str]] = []
        self.fail_on = fail_on

    def _reply(self, prompt: str) -> ChatResult:
        m = re.findall(r"Correct: (.*?)\. Given: (.*?)\.\n", prompt + "\n")[-1]
        pair = (m[0].lower(), m[1].lower())
        self.asked.append(pair)
        if self.fail_on and pair[1] == self.fail_on:
            return ChatResult(texts=[], error="HTTP 500")
        return ChatResult(texts=["Verdict: Yes" if pair in YES else "Verdict: No"])

    async def chat(self, messages, role="default", gen=None):
        return self._reply(messages[-1]["content"])

    async def complete(self, prompt, role="default", gen=None):
        return self._reply(prompt)


@pytest.fixture
def labels(fixtures_dir):
    return fixtures_dir / "craftmd" / "validation_graderai_small.csv"


def test_read_labels_skips_blank_counts(labels):
    d = read_labels(labels)
    assert [c["id"] for c in d["cases"]] == ["case_0", "case_1", "case_2", "case_3"] and d["skipped_blank"] == ["case_4"]
    assert d["cases"][2]["trials"][0] == "tinea manuum, tinea pedis" and d["cases"][1]["dermatologist"] == 5


def test_labels_folder_is_the_registered_expert_annotations(tmp_path, labels):
    """craftmd-expert-labels is the authors' whole expert_annotations folder: the grader check is found in it."""
    (tmp_path / "validation_graderai.csv").write_bytes(labels.read_bytes())
    assert read_labels(tmp_path) == read_labels(labels)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="empty/validation_graderai.csv: no such file"):
        read_labels(empty)


def test_bad_labels_name_file_and_line(tmp_path, labels):
    bad = tmp_path / "bad.csv"
    bad.write_text(labels.read_text().replace("dermatologist_accuracy,2,", "dermatologist_accuracy,7,"))
    with pytest.raises(DataError, match=r"bad.csv:9: case_0: dermatologist_accuracy '7'"):
        read_labels(bad)
    bad.write_text("\n".join(l for l in labels.read_text().splitlines() if not l.startswith("trial_3")))
    with pytest.raises(DataError, match=r"bad.csv:2: missing row\(s\) trial_3"):
        read_labels(bad)


def test_calibrate_grader_rule_zero_hand_worked(labels, tmp_path):
    judge = ScriptedJudge()
    m = asyncio.run(calibrate_grader("scripted", str(labels), tmp_path / "cal", rule="zero", client=judge, log=lambda *_: None))
    j = m["judge_vs_dermatologist"]
    assert j["n"] == 4 and j["exact_agreement"] == 0.5 and j["mean_abs_diff"] == 0.75 and abs(j["trial_agreement_bound"] - 0.85) < 1e-12
    assert abs(j["weighted_kappa_linear"] - 0.5) < 1e-12 and abs(j["spearman"]["rho"] - 4 / 4.5) < 1e-12
    assert j["confusion"][5][3] == 1 and j["confusion"][3][2] == 1 and j["confusion"][2][2] == 1 and j["confusion"][5][5] == 1
    assert m["cases_blank_skipped"] == 1 and m["cases_failed"] == 0
    # no shortcut decided "cushing disease" vs "Cushing syndrome": the judge was asked (and said No)
    assert ("cushing syndrome", "cushing disease") in judge.asked
    # exact normalized equality is the only thing that skips the judge; a concurrent list under zero is 0 unasked
    assert ("plaque psoriasis", "plaque psoriasis") not in judge.asked and not any("tinea manuum" in g for _, g in judge.asked)
    recs = {r["id"]: r for r in map(json.loads, (tmp_path / "cal" / "records.jsonl").read_text().splitlines())}
    assert [r["scores"]["grader"]["value"] for r in recs.values()] == [2, 3, 2, 5]
    for f in ("config.yaml", "metrics.json", "summary.md", "confusion_judge.png"):
        assert (tmp_path / "cal" / f).exists()
    assert (tmp_path / "cal" / "confusion_judge.png").read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "cal" / "summary.md").read_text()
    assert "concurrent-diagnosis rule: `zero`" in md and "linear" in md and "| 4 | 0.500 | 0.750 | 0.850 | 0.500 | 0.889 |" in md


def test_calibrate_grader_rule_any_and_published(labels, fixtures_dir, tmp_path):
    m = asyncio.run(calibrate_grader("scripted", str(labels), tmp_path / "cal", rule="any", client=ScriptedJudge(),
                                     published=str(fixtures_dir / "craftmd" / "published_release"), log=lambda *_: None))
    j = m["judge_vs_dermatologist"]
    assert (j["exact_agreement"], j["mean_abs_diff"], round(j["trial_agreement_bound"], 12)) == (0.75, 0.5, 0.9)
    p = m["published"]
    assert p["cases_matched"] == 3 and p["matched_by_format"] == {"vignette": 3}
    pv = p["vs_dermatologist"]
    assert pv["n"] == 3 and abs(pv["exact_agreement"] - 2 / 3) < 1e-12 and abs(pv["mean_abs_diff"] - 1 / 3) < 1e-12
    assert abs(pv["trial_agreement_bound"] - (0.8 + 1 + 1) / 3) < 1e-12
    assert pv["weighted_kappa_linear"] == weighted_kappa([2, 5, 3], [3, 5, 3], categories=range(6))
    recs = {r["id"]: r for r in map(json.loads, (tmp_path / "cal" / "records.jsonl").read_text().splitlines())}
    pub = {i: r["scores"]["published"] for i, r in recs.items() if "published" in r["scores"]}
    assert pub["case_1"]["metadata"]["order"] == "multiset" and pub["case_2"]["value"] == 3  # -1 is wrong
    assert (tmp_path / "cal" / "confusion_published.png").exists()
    md = (tmp_path / "cal" / "summary.md").read_text()
    assert "3 of 4 cases matched" in md
    # cases 0-2 mix right, wrong and None/Multiple extractions: none of the matched cases is trivial
    assert p["matched_trivial"] == {"all_gold": 0, "all_none_or_multiple": 0} and pub["case_0"]["metadata"]["trivial"] is None
    assert "0 of the matched cases are trivial" in md


def test_trivial_cases_are_counted(labels, fixtures_dir, tmp_path):
    cases = read_labels(labels)["cases"]
    assert [trivial_kind(c["trials"], c["gold"]) for c in cases] == [None, None, None, "all_gold"]  # case_3: 5 x "halo nevus"
    assert trivial_kind(["None", "multiple", "", "Multiple", "none"], "Gout") == "all_none_or_multiple"
    # the fixture release plus a file matching case_3 (all gold) and one matching a case with all None/Multiple
    release = tmp_path / "release"
    release.mkdir()
    for f in (fixtures_dir / "craftmd" / "published_release").glob("*.json"):
        (release / f.name).write_text(f.read_text())
    extra = {"case_14": ("Halo nevus", ["halo nevus"] * 5), "case_15": ("Gout", ["none", "multiple", "none", "none", "multiple"])}
    for name, (gold, ex) in extra.items():
        trials = {f"trial_{t}": {"extracted_ans_vignette_frq": e, "evaluation_vignette_frq": int(e == "halo nevus")} for t, e in enumerate(ex)}
        (release / f"{name}.json").write_text(json.dumps({"case_id": name, "correct_ans": gold, **trials}))
    cases.append({"id": "case_9", "gold": "Gout", "trials": ["none", "multiple", "none", "none", "multiple"], "dermatologist": 0})
    pub = published_counts(release, cases)
    assert sorted(pub) == ["case_0", "case_1", "case_2", "case_3", "case_9"]
    assert pub["case_3"]["trivial"] == "all_gold" and pub["case_9"]["trivial"] == "all_none_or_multiple" and pub["case_1"]["trivial"] is None


def test_failed_request_is_never_scored(labels, tmp_path):
    with pytest.raises(CalibrationFailed, match="1 trial"):
        asyncio.run(calibrate_grader("scripted", str(labels), tmp_path / "cal", client=ScriptedJudge(fail_on="eczema"), log=lambda *_: None))
    m = json.loads((tmp_path / "cal" / "metrics.json").read_text())
    assert m["trials_failed"] == 1 and m["failed_cases"] == ["case_0"] and m["judge_vs_dermatologist"]["n"] == 3
    recs = {r["id"]: r for r in map(json.loads, (tmp_path / "cal" / "records.jsonl").read_text().splitlines())}
    assert recs["case_0"]["status"] == "failed" and "grader" not in recs["case_0"]["scores"]


def test_stats_helpers_by_hand():
    assert weighted_kappa([0, 1, 2], [0, 1, 2]) == 1.0
    # 2 categories: linear weights = unweighted kappa; po = 0.5, pe = 0.5 -> 0
    assert weighted_kappa([0, 0, 1, 1], [0, 1, 0, 1]) == 0.0
    assert spearman([1, 2, 3], [3, 2, 1])["rho"] == -1.0 and kendall([1, 2, 3, 4], [1, 3, 2, 4])["tau_b"] == pytest.approx(4 / 6)
    c = count_agreement([5, 0], [4, 0], 5)
    assert c["exact_agreement"] == 0.5 and c["mean_abs_diff"] == 0.5 and c["trial_agreement_bound"] == 0.9


def test_calibrate_autoeval_rank_agreement(tmp_path):
    ref = tmp_path / "ref.csv"
    ref.write_text("id,criterion,rating\nd1,empathy,1\nd2,empathy,2\nd3,empathy,4\nd4,empathy,5\n")
    judge = tmp_path / "judge.csv"
    judge.write_text("id,criterion,rating\nd1,empathy,2\nd2,empathy,1\nd3,empathy,4\nd4,empathy,5\nd9,empathy,3\n")
    m = calibrate_autoeval(str(judge), str(ref), tmp_path / "cal")
    o = m["overall"]
    # ranks ref 1,2,3,4 vs judge 2,1,3,4: d^2 sum 2 -> rho = 1 - 6*2/(4*15) = 0.8; tau = (5-1)/6
    assert o["n"] == 4 and o["spearman"]["rho"] == pytest.approx(0.8) and o["kendall"]["tau_b"] == pytest.approx(4 / 6)
    assert o["exact_agreement"] == 0.5 and o["mean_abs_diff"] == 0.5 and m["items_matched"] == 4
    assert (tmp_path / "cal" / "confusion_autoeval.png").exists()
    # an autoeval results folder gives its typed scores rubric/<criterion> (an older record's derived on reading): the same figures
    run = tmp_path / "autoeval-run"
    run.mkdir()
    (run / "config.yaml").write_text("experiment: autoeval\n")
    rows = [{"id": "d1::empathy", "source_id": "d1", "criterion": "empathy", "rating": 2},  # written before typed scores
            *({"id": f"{d}::empathy", "source_id": d, "criterion": "empathy", "scores": {"rubric/empathy": {"value": v}}}
              for d, v in (("d2", 1), ("d3", 4), ("d4", 5), ("d9", 3))),
            {"id": "d5::empathy", "source_id": "d5", "criterion": "empathy", "scores": {"rubric/empathy": {"value": None}}}]
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert calibrate_autoeval(str(run), str(ref), tmp_path / "cal2")["overall"] == o
    # its records are typed: one per item, the judge's rating its grade, the reference rating its target; an older
    # calibration's records (item, criterion, reference, judge) read the same through the one reader
    cal = registry.open_run(tmp_path / "cal")
    typed = {r["id"]: (r["case_id"], r["inputs"]["criterion"], r["target"], r["scores"]["rubric/empathy"]["value"]) for r in cal.finished}
    assert typed == {"d1|empathy": ("d1", "empathy", 1, 2), "d2|empathy": ("d2", "empathy", 2, 1), "d3|empathy": ("d3", "empathy", 4, 4),
                     "d4|empathy": ("d4", "empathy", 5, 5)}
    (tmp_path / "cal" / "records.jsonl").write_text("".join(json.dumps({"id": i, "item": c, "criterion": k, "reference": t, "judge": v}) + "\n"
                                                            for i, (c, k, t, v) in typed.items()))
    assert {r["id"]: r for r in registry.open_run(tmp_path / "cal").finished} == {r["id"]: r for r in cal.finished}
    # the report draws the run's table through the study's hook, not by itself
    from experiments.tools.report.build import build_report

    html = build_report([str(tmp_path / "cal")], tmp_path / "r.html").read_text()
    assert "Rubric judge vs reference ratings" in html and "<td>rubric judge</td><td>4</td><td>0.500</td><td>0.500</td>" in html


def test_cli_registers_both_commands(labels, tmp_path):
    app = typer.Typer()
    apps = dict(app=app, run_app=typer.Typer(), score_app=typer.Typer(), import_app=typer.Typer(), data_app=typer.Typer(), finetune_app=typer.Typer(),
                calibrate_app=calibrate_cli.calibrate_app)
    commands.register_all(**apps)  # the tools' commands and the studies' calibrations, from their declarations
    runner = CliRunner()
    for cmd in (["calibrate", "craftmd-grader", "--help"], ["calibrate", "autoeval", "--help"]):
        assert runner.invoke(app, cmd).exit_code == 0
    r = runner.invoke(app, ["calibrate", "craftmd-grader", "--judge-model", "x", "--rule", "some", "--out", str(tmp_path / "o"), "--labels", str(labels)])
    assert r.exit_code != 0


def test_report_has_a_calibration_section(labels, tmp_path):
    from experiments.tools.report.build import build_report

    asyncio.run(calibrate_grader("scripted", str(labels), tmp_path / "runs" / "cal", client=ScriptedJudge(), log=lambda *_: None))
    html = build_report([str(tmp_path / "runs")], tmp_path / "r.html").read_text()
    assert "Judge calibration" in html and "CRAFT-MD grader vs dermatologist" in html and "0.850" in html


def test_calibrate_grader_dry_run_sends_the_grader_requests_of_a_paper_run(tmp_path):
    """`calibrate craftmd-grader --config paper.yaml --dry-run` against a paper run's own grader requests (tests/
    test_craftmd_requests.py's stand-in run of the same case): the same verdict request (role, message roles and text,
    temperature 1.0, max_tokens 150), re-asked as often (grader_reasks 11) while the reply holds no verdict."""
    from experiments.core.config import load_settings
    from experiments.studies.craftmd.settings import CraftSettings
    from experiments.studies.craftmd.study import CONFIGS
    from tests.test_craftmd_requests import OTHER, Stand, calls_of

    paper = load_settings(CraftSettings, CONFIGS / "paper.yaml", {"trials": 1})
    _, run = calls_of(OTHER, paper, Stand(verdicts=("Unclear.",)))  # the grader extracts "Podagra"; no verdict word
    assert len(run["vignette_match"]) == paper.grader_reasks + 1 == 12
    labels = tmp_path / "labels.csv"
    labels.write_text(",case_0\n" + "".join(f"trial_{t},Podagra\n" for t in range(5)) + f"correct_ans,{OTHER['answer']}\ndermatologist_accuracy,0\n")
    r = CliRunner().invoke(_app(), ["calibrate", "craftmd-grader", "--judge-model", "embedded", "--labels", str(labels), "--out", str(tmp_path / "cal"),
                                    "--config", str(CONFIGS / "paper.yaml"), "--dry-run"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (tmp_path / "cal" / "dry-run.jsonl").read_text().splitlines()]
    assert not (tmp_path / "cal" / "records.jsonl").exists()  # nothing ran
    assert {x["step"] for x in rows} == {"vignette_match"} and len(rows) == 5 * 12  # 5 trials, each re-asked as the run re-asks
    for want, got in zip(run["vignette_match"], [x for x in rows if x["case_id"] == "case_0|0"]):
        assert (got["role"], got["kind"], got["messages"]) == (want["role"], want["kind"], want["messages"])
        assert {k: v for k, v in got["gen"].items() if k != "seed"} == {k: v for k, v in want["gen"].items() if k != "seed"}
        assert got["gen"]["temperature"] == 1.0 and got["gen"]["max_tokens"] == 150 and got["messages"][0]["role"] == "system"
    assert "re-asks up to 11; verdict rule `anywhere`" in r.output


def _app():
    app = typer.Typer()
    apps = dict(app=app, run_app=typer.Typer(), score_app=typer.Typer(), import_app=typer.Typer(), data_app=typer.Typer(), finetune_app=typer.Typer(),
                calibrate_app=calibrate_cli.calibrate_app)
    commands.register_all(**apps)  # the tools' commands and the studies' calibrations, from their declarations
    return app
