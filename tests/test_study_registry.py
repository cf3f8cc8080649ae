"""The study registry and the flags generated from settings models: a toy study declared in one file of its own folder
(tests/studies/toy/__init__.py: settings, Study with its scorers, paper-table adapter, the declaration), found through the
registry's search path ($MEDSTACK_STUDIES), runs end to end against the scripted client through its generated
`medstack run toy` command line (its data set named from the folder's datasets.yaml), dry-runs, takes a stratified
`--sample`, is swept, and renders its paper table; and the tools that know no study serve it: `review` builds its
judge's items and page, `calibrate reviews` holds its judge to a clinician's labels, `rescore` asks its judge again,
`compare` runs its own comparison and the typed scores', the report shows its scores; and every shipped default config
agrees with its settings model's code defaults on every key it sets.

Fixtures others reuse: ``toy`` (the study on the search path, a `medstack` app from the registry, the scripted client's
requests) and ``toy_run`` (a finished toy run of cases c1 (right) and c2 (wrong), with its scores ``echo-judge`` (a rule)
and ``echo-asked`` (its optional model scorer))."""

from __future__ import annotations

import json
import re
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from experiments.core import commands, registry, runner
from experiments.core.results import read_run
from experiments.tables.build import declarations
from scripted import ScriptedLLM

TOY = Path(__file__).parent / "studies" / "toy"
ECHO = "embedded@http://127.0.0.1:9/v1"


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy study's folder on the registry's search path, and a `medstack` app built from the registry."""
    monkeypatch.setenv("MEDSTACK_STUDIES", str(TOY))
    monkeypatch.setenv("MEDSTACK_HOME", str(tmp_path / "home"))  # where `data fetch` puts the toy's data set
    sent = []

    def respond(role, content, gen):
        sent.append((role, content))
        text = content[-1]["content"]
        if text.endswith("yes or no"):  # the judge asked again (rescore): it finds every answer right
            return "yes"
        return text.rsplit(" ", 1)[-1] if "c1" in text else "no"  # case c1 answers right, the others wrong

    @asynccontextmanager
    async def scripted(roles, **kw):
        yield ScriptedLLM(respond, roles=tuple(roles)), {}

    monkeypatch.setattr(runner, "open_client", scripted)
    apps = {name: typer.Typer() for name in ("run_app", "score_app", "import_app", "data_app", "finetune_app")}
    app = typer.Typer()
    for name, sub in apps.items():
        app.add_typer(sub, name=name.removesuffix("_app"))
    commands.register_all(app=app, **apps)
    data = tmp_path / "cases.jsonl"
    data.write_text('{"id": "c1", "group": "a"}\n{"id": "c2", "group": "b"}\n{"id": "c3", "group": "a"}\n', encoding="utf-8")
    return app, data, sent


def test_the_toy_is_found_through_the_search_path_only(toy, monkeypatch):
    assert "toy" in registry.commands() and [s.name for s in registry.study_for("toy").scorers] == ["echo-judge", "echo-asked"]
    assert registry.study_for("toy").name == "toy"  # the name the declaration gives its command, and nowhere else
    assert any(d.path == str(TOY / "paper_tables.yaml") and d.experiments == ["toy"] for d in declarations(registry.table_sources()))
    monkeypatch.delenv("MEDSTACK_STUDIES")
    assert "toy" not in registry.commands() and registry.study_for("toy") is None


def test_toy_study_runs_through_its_generated_command_line(toy, tmp_path):
    app, data, sent = toy
    help_text = CliRunner().invoke(app, ["run", "toy", "--help"], env={"COLUMNS": "200"}).output
    for flag, text in [("--word", "The word the model is asked to repeat."), ("--repeats", "(>= 1)"), ("--shout", "--no-shout"),
                       ("--echo-model", "alias of --role echo=REF"), ("--limit", "Only the first N cases"), ("--dry-run", "")]:
        assert flag in help_text and text in help_text, (flag, help_text)
    assert "--sampling" not in help_text  # a field marked cli(False) is not a flag, its description notwithstanding
    assert "Toy: ask each case to repeat a word." in help_text and "One record per case." in help_text  # the declaration's help, once
    assert "Toy: ask each case to repeat a word." in CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output

    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "toy", "--data", str(data), "--limit", "2", "--word", "hi", "--repeats", "2",
                                 "--echo-model", ECHO, "--out", str(out)])
    assert r.exit_code == 0, r.output
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert (config["word"], config["repeats"], config["shout"], config["limit"]) == ("hi", 2, False, 2)
    assert config["roles"] == {"echo": ECHO}
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert {x["id"]: x["scores"]["echo-judge"]["value"] for x in records} == {"c1": 1, "c2": 0}
    assert len(sent) == 4 and all(c[-1]["content"].endswith("say hi") for _, c in sent)  # the optional scorer was not asked
    assert [(f["score"], f["value"], f["n"]) for f in json.loads((out / "metrics.json").read_text())["scores"]] == [("echo-judge", 0.5, 2)]
    summary = (out / "summary.md").read_text()
    assert "Toy accuracy" in summary and "repeated the word" in summary and "0.500" in summary  # its paper table, with the paper's value


def test_toy_data_set_comes_from_its_folder(toy, tmp_path):
    app, _, _ = toy
    r = CliRunner().invoke(app, ["data", "list"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "toy-cases" in r.output, r.output
    r = CliRunner().invoke(app, ["data", "fetch", "toy-cases", "--from", str(TOY / "cases.jsonl")])
    assert r.exit_code == 0, r.output
    out = tmp_path / "named"
    r = CliRunner().invoke(app, ["run", "toy", "--data", "toy-cases", "--word", "hi", "--echo-model", ECHO, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert [x["id"] for x in read_run(out).records] == ["c1", "c2", "c3", "c4"]


def test_toy_sample_keeps_its_strata(toy, tmp_path):
    app, data, _ = toy
    out = tmp_path / "sample"
    r = CliRunner().invoke(app, ["run", "toy", "--data", str(TOY / "cases.jsonl"), "--sample", "2", "--echo-model", ECHO, "--out", str(out)])
    assert r.exit_code == 0, r.output
    groups = {"c1": "a", "c2": "b", "c3": "a", "c4": "b"}
    assert sorted(groups[x["id"]] for x in read_run(out).records) == ["a", "b"]  # one case of each group, as the whole set's mix
    scope = json.loads((out / "metrics.json").read_text())["scope"]
    assert (scope["how"], scope["n"], scope["of"], scope["strata"]) == ("sample", 2, 4, ["group"])


def test_toy_study_dry_runs_and_rejects_bad_flags(toy, tmp_path):
    app, data, sent = toy
    out = tmp_path / "dry"
    r = CliRunner().invoke(app, ["run", "toy", "--data", str(data), "--shout", "--dry-run", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (out / "dry-run.jsonl").read_text().splitlines()]
    assert [(x["case_id"], x["messages"][-1]["content"]) for x in rows] == [("c1", "c1: say HELLO"), ("c2", "c2: say HELLO"), ("c3", "c3: say HELLO")]
    assert not sent and not (out / "records.jsonl").exists()
    r = CliRunner().invoke(app, ["run", "toy", "--data", str(data), "--repeats", "0", "--out", str(tmp_path / "bad")])
    assert r.exit_code != 0 and "repeats" in str(r.exception) and not (tmp_path / "bad").exists()


def test_toy_sweeps(toy, tmp_path):
    app, data, sent = toy
    dry = tmp_path / "sweep-dry"
    r = CliRunner().invoke(app, ["sweep", "toy", "--models", f"{ECHO},{ECHO}", "--data", str(data), "--dry-run", "--out", str(dry)])
    assert r.exit_code == 0, r.output
    assert [len((dry / lbl / "dry-run.jsonl").read_text().splitlines()) for lbl in ("embedded", "embedded-2")] == [3, 3] and not sent
    out = tmp_path / "sweep"
    r = CliRunner().invoke(app, ["sweep", "toy", "--models", f"{ECHO},{ECHO}", "--data", str(data), "--word", "hi", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert [json.loads((out / lbl / "metrics.json").read_text())["scores"][0]["value"] for lbl in ("embedded", "embedded-2")] == [1 / 3, 1 / 3]
    assert "# Toy comparison" in (out / "compare" / "summary.md").read_text() and (out / "report.html").exists()


@pytest.fixture
def toy_run(toy, tmp_path):
    """A finished toy run (c1 answered right, c2 wrong; word "hi"), its records carrying the scores echo-judge (the rule)
    and echo-asked (the model, which says yes to both)."""
    app, data, sent = toy
    out = tmp_path / "toy-run"
    r = CliRunner().invoke(app, ["run", "toy", "--data", str(data), "--limit", "2", "--word", "hi", "--echo-model", ECHO, "--out", str(out),
                                 "--scorers", "echo-asked"])
    assert r.exit_code == 0, r.output
    return out


def test_toy_rescore_asks_its_judge_again(toy, toy_run, tmp_path):
    app, _, sent = toy
    out = tmp_path / "rescored"
    asked = sum(c[-1]["content"].endswith("yes or no") for _, c in sent)
    r = CliRunner().invoke(app, ["rescore", str(toy_run), "--judge", "echo-judge", "--judge-model", ECHO, "--out", str(out)])
    assert r.exit_code != 0 and "echo-judge cannot be asked again over a stored answer; its judge steps: echo-asked" in str(r.exception)
    r = CliRunner().invoke(app, ["rescore", str(toy_run), "--judge", "echo-asked", "--judge-model", ECHO, "--out", str(out)])
    assert r.exit_code == 0, r.output
    scores = {x["id"]: x["scores"] for x in read_run(out).records}
    assert {i: (s["echo-judge"]["value"], s[f"echo-asked@{ECHO.split('@')[0]}"]["value"]) for i, s in scores.items()} == {"c1": (1, 1), "c2": (0, 1)}
    assert sum(c[-1]["content"].endswith("yes or no") for _, c in sent) - asked == 2


def test_toy_records_carry_typed_scores(toy_run):
    records = {r["id"]: r for r in read_run(toy_run).records}
    assert records["c1"]["scores"]["echo-judge"] == {"value": 1, "answer": "hi", "source": "exact", "judge": {"rule": "every answer equals the word hi"}}
    assert (records["c1"]["target"], records["c1"]["answer"], records["c1"]["metadata"]) == ("hi", ["hi"], {"group": "a"})  # the typed record
    assert records["c2"]["scores"]["echo-judge"]["value"] == 0


def test_toy_review_builds_its_judges_items(toy, toy_run, tmp_path):
    from experiments.tools.review.judges import load_judge
    from models.errors import DataError

    app, _, _ = toy
    j = load_judge(toy_run, "echo-judge")
    assert (j["experiment"], j["scale"]["kind"], j["scale"]["question"]) == ("toy", "binary", registry.study_for("toy").scorers[0].question)
    assert [(i["id"], i["verdict"], i["stratum"]) for i in j["items"]] == [("c1", 1, "1||"), ("c2", 0, "0||")]
    assert j["items"][0]["show"] == {"the word asked for": "hi", "the answers": ["hi"]}
    with pytest.raises(DataError, match="a toy run's judge steps are echo-judge, echo-asked"):
        load_judge(toy_run, "frq")
    with pytest.raises(DataError, match="no record carries a echo-judge@m2 decision.*rescore"):
        load_judge(toy_run, "echo-judge@m2")
    # the grades a rescore adds beside the run's own (STEP@JUDGE) are reviewed as a judge of their own
    lines = [json.loads(x) for x in (toy_run / "records.jsonl").read_text().splitlines()]
    for x in lines:
        x["scores"]["echo-judge@m2"] = {"value": 1 - x["scores"]["echo-judge"]["value"], "answer": "hi", "judge": {"model": "m2"}}
    (toy_run / "records.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert [(i["id"], i["verdict"]) for i in load_judge(toy_run, "echo-judge@m2")["items"]] == [("c1", 0), ("c2", 1)]
    page = tmp_path / "page.html"
    r = CliRunner().invoke(app, ["review", str(toy_run), "--judge", "echo-judge", "--sample", "2", "--reviewer", "alice", "--export", str(page)])
    assert r.exit_code == 0, r.output
    assert "the word asked for" in page.read_text() and (toy_run / "reviews" / "sample-echo-judge.json").exists()


def test_toy_calibrate_holds_its_judge_to_a_clinicians_labels(toy, toy_run):
    from experiments.tools.review.judges import load_judge
    from experiments.tools.review.labels import write_sample

    app, _, _ = toy
    write_sample(toy_run, load_judge(toy_run, "echo-judge"), 2, 0)
    labels = toy_run / "reviews" / "alice.jsonl"
    labels.write_text("".join(json.dumps({"judge": "echo-judge", "item": i, "reviewer": "alice", "label": v}) + "\n" for i, v in (("c1", 1), ("c2", 1))))
    r = CliRunner().invoke(app, ["calibrate", "reviews", str(toy_run), "--labels", str(toy_run / "reviews"), "--n-boot", "200"])
    assert r.exit_code == 0, r.output
    cal = json.loads((toy_run / "reviews" / "calibration-echo-judge.json").read_text())
    vs = cal["reviewers"]["alice"]["vs_judge"]
    assert cal["experiment"] == "toy" and vs["n"] == 2 and vs["exact_agreement"] == 0.5  # alice says c2 repeated the word; the rule says no
    assert "judge vs alice" in r.output
    # a judge that graded the same answers after the run (a rescore's echo-judge@m2: it says c2 repeated the word too)
    # is held to the same clinician, on a sample of its own
    lines = [json.loads(x) for x in (toy_run / "records.jsonl").read_text().splitlines()]
    for x in lines:
        x["scores"]["echo-judge@m2"] = {"value": 1, "answer": x["scores"]["echo-judge"]["answer"], "judge": {"model": "m2"}}
    (toy_run / "records.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    write_sample(toy_run, load_judge(toy_run, "echo-judge@m2"), 2, 0)
    with labels.open("a") as f:
        f.write("".join(json.dumps({"judge": "echo-judge@m2", "item": i, "reviewer": "alice", "label": 1}) + "\n" for i in ("c1", "c2")))
    r = CliRunner().invoke(app, ["calibrate", str(toy_run), "--labels", str(toy_run / "reviews"), "--judge", "echo-judge@m2", "--n-boot", "200"])
    assert r.exit_code == 0, r.output
    assert json.loads((toy_run / "reviews" / "calibration-echo-judge@m2.json").read_text())["reviewers"]["alice"]["vs_judge"]["exact_agreement"] == 1.0


def test_toy_compare_runs_its_own_and_the_typed_scores(toy, toy_run, tmp_path):
    app, data, _ = toy
    other = tmp_path / "toy-hello"
    assert CliRunner().invoke(app, ["run", "toy", "--data", str(data), "--echo-model", ECHO, "--out", str(other)]).exit_code == 0
    r = CliRunner().invoke(app, ["compare", str(toy_run), str(other), "--out", str(tmp_path / "cmp")])
    assert r.exit_code == 0, r.output
    summary = (tmp_path / "cmp" / "summary.md").read_text()
    assert "# Toy comparison" in summary and "- toy-run: accuracy 0.500" in summary and "- toy-hello: accuracy 0.333" in summary
    scores = {x["run"]: x["scores"] for x in json.loads((tmp_path / "cmp" / "scores.json").read_text())}
    [(run, rows)] = [(k, v) for k, v in scores.items() if k.endswith("toy-run")]
    row = next(x for x in rows if x["score"] == "echo-judge")
    assert (row["metric"], row["value"], row["n"], row["unscored"]) == ("mean", 0.5, 2, 0) and row["low"] <= 0.5 <= row["high"]
    assert re.search(r"\| echo-judge \| 0\.500 \[[0-9., ]+\] \(n=2\) \| 0\.333 \[[0-9., ]+\] \(n=3\) \|", summary), summary


def test_toy_report_shows_its_scores(toy_run, tmp_path):
    from experiments.tools.report.build import build_report

    html = build_report([str(toy_run)], tmp_path / "r.html").read_text()
    assert ("<td>echo-judge (Did the model repeat the word it was asked for, in every answer?)</td><td>1</td>"
            "<td>rule every answer equals the word hi</td><td>hi</td>") in html
    assert "<td>echo-judge (Did the model repeat the word it was asked for, in every answer?)</td><td>0</td>" in html
    assert "<tr><td>echo-judge</td><td>mean</td><td>0.500 [" in html and "(n=2)</td></tr>" in html  # the score's figure, as summary.md gives it


def _defaults(model) -> dict:
    return model.model_dump(mode="json")


def _disagreements(code: dict, config: dict, where: str = "") -> list[str]:
    out = []
    for key, value in config.items():
        if isinstance(value, dict) and isinstance(code.get(key), dict):
            out += _disagreements(code[key], value, f"{where}{key}.")
        elif key in code and code[key] != value:
            out.append(f"{where}{key}: code {code[key]!r}, config {value!r}")
    return out


@pytest.mark.parametrize("name", sorted(set(registry.studies()) - {"toy"}))
def test_shipped_default_config_agrees_with_the_code_defaults(name):
    """Each default in one place: a study's default (paper) config may only repeat the settings model's defaults."""
    entry = registry.get(name)
    study = entry.make()
    path = study.default_config(dict(entry.fixed))
    config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    code = _defaults(study.settings_cls(**entry.fixed))
    config = study.settings_cls.model_validate({**config, **entry.fixed}).model_dump(mode="json", include=set(config))
    assert not _disagreements(code, config), f"{path}: " + "; ".join(_disagreements(code, config))


COMMON_FLAGS = ["--data", "--model", "-m", "--role", "--config", "--set", "--out", "--limit", "--concurrency", "--seed", "--no-cache",
                "--allow-remote", "--api-key", "--lora", "--dry-run", "--print-config"]
STUDY_FLAGS = {  # every flag the hand-written option lists had, generated now from the settings models
    ("run", "craftmd"): ["--clinical-model", "--patient-model", "--grader-model", "--summarizer-model", "--formats", "--mcq", "--no-mcq",
                         "--frq", "--no-frq", "--trials", "--specialty", "--max-turns", "--name", "--assessor-model", "--loop"],
    ("meld",): ["--threshold"],
    ("run", "dera-corrupt"): ["--level", "--researcher-model", "--judge-model"],
    ("run", "dera-qa"): ["--split", "--mcq", "--bertscore-model", "--decider-model", "--researcher-model", "--judge-model"],
    ("run", "meditod-pol"): ["--split", "--splits-dir", "--mode", "--k", "--encoder", "--max-tokens", "--adjudicate-model", "--grader-model", "--compare",
                             "--no-bertscore", "--bertscore-encoder", "--bertscore-layer"],
    ("autoeval",): ["RESULTS", "--criteria", "--judge-model", "-j", "--reference", "--examples", "--api", "--max-tokens"],
}


@pytest.mark.parametrize("command", list(STUDY_FLAGS), ids=" ".join)
def test_every_flag_name_and_alias_is_kept(command):
    from scripts import cli as medstack_cli

    if not any(c.name == "sweep" for c in medstack_cli.app.registered_commands):
        medstack_cli._register_studies()
    out = CliRunner().invoke(medstack_cli.app, [*command, "--help"], env={"COLUMNS": "250"}).output
    names = set(re.split(r"[\s,│]+", out))  # one option's names are listed with commas (--adjudicate-model,--grader-model)
    for flag in COMMON_FLAGS + STUDY_FLAGS[command]:
        assert flag in names, (command, flag, out)
