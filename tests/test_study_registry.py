"""The study registry and the flags generated from settings models: a toy study registered from here (a
settings model + a Study, nothing else) runs end to end against the scripted client through its generated
`medstack run toy` command line, dry-runs and renders its paper table; and every shipped default config
agrees with its settings model's code defaults on every key it sets."""

from __future__ import annotations

import json
import re
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import typer
import yaml
from pydantic import Field
from typer.testing import CliRunner

from experiments.core import registry, runner
from experiments.core.config import RunSettings, Sampling, role_flag
from experiments.core.study import CaseContext, Study
from experiments.tables.adapter import PaperAdapter
from experiments.tables.render import run_paper_tables
from scripted import ScriptedLLM


class ToySettings(RunSettings):
    cli_flags = (role_flag("echo", "Echo model (alias of --role echo=REF)."),)

    experiment: str = "toy"
    roles: dict[str, str] = {"echo": "embedded"}
    word: str = Field("hello", description="The word the model is asked to repeat.")
    repeats: int = Field(1, ge=1, description="Requests per case.")
    shout: bool = Field(False, description="Ask for the word in capitals.")
    sampling: Sampling = Field(Sampling(max_tokens=8), description="Sampling of the one step.", json_schema_extra={"cli": False})  # no flag


class ToyStudy(Study):
    name = "toy"
    settings_cls = ToySettings
    roles = ("echo",)
    primary_role = "echo"

    def load_cases(self, s: ToySettings) -> list[dict]:
        lines = Path(s.data).read_text(encoding="utf-8").splitlines()
        return [json.loads(x) for x in lines if x.strip()][: s.limit]

    async def solve(self, ctx: CaseContext, case: dict, s: ToySettings) -> dict:
        word = s.word.upper() if s.shout else s.word
        answers = [(await ctx.chat([{"role": "user", "content": f"{case['id']}: say {word}"}], role="echo",
                                   gen=s.sampling.gen(), step=f"ask{i}")).text for i in range(s.repeats)]
        return {"answers": answers, "correct": int(all(a.strip() == word for a in answers))}

    def metrics(self, records: list[dict], s: ToySettings) -> dict:
        return {"accuracy": sum(r["correct"] for r in records) / len(records) if records else None}

    def summary(self, metrics: dict, s: ToySettings) -> str:
        return f"# toy\n\naccuracy: {metrics['accuracy']}\n\n" + run_paper_tables(s.out, metrics)


class ToyTables(PaperAdapter):
    def case_values(self, run: dict, records: list[dict]) -> dict[str, dict[str, float]]:
        return {"correct": {r["id"]: float(r["correct"]) for r in records}}


TABLES = """study: toy
title: Toy
paper: Nobody, 2026
source: this test
experiments: [toy]
published:
  - {model: Paper, any_model: true, values: {correct: 0.5}}
tables:
  - id: acc
    title: Toy accuracy
    rows:
      - {key: correct, label: repeated the word}
"""


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy study registered as a study folder's study.py would, and a `medstack` app built from the registry."""
    registry.studies()
    monkeypatch.setitem(registry.STUDIES, "toy", registry.StudyEntry("toy", ToyStudy, "Toy: ask each case to repeat a word."))
    tables = tmp_path / "paper_tables.yaml"
    tables.write_text(TABLES, encoding="utf-8")
    monkeypatch.setitem(registry.TABLES, str(tables), registry.PaperTables(tables, ToyTables()))
    sent = []

    def respond(role, content, gen):
        sent.append((role, content))
        text = content[-1]["content"]
        return text.rsplit(" ", 1)[-1] if "c1" in text else "no"  # case c1 answers right, c2 wrong

    @asynccontextmanager
    async def scripted(roles, **kw):
        yield ScriptedLLM(respond, roles=tuple(roles)), {}

    monkeypatch.setattr(runner, "open_client", scripted)
    apps = {name: typer.Typer() for name in ("run_app", "score_app", "import_app", "data_app", "finetune_app")}
    app = typer.Typer()
    for name, sub in apps.items():
        app.add_typer(sub, name=name.removesuffix("_app"))
    registry.register_all(app=app, **apps)
    data = tmp_path / "cases.jsonl"
    data.write_text('{"id": "c1"}\n{"id": "c2"}\n{"id": "c3"}\n', encoding="utf-8")
    return app, data, sent


def test_toy_study_runs_through_its_generated_command_line(toy, tmp_path):
    app, data, sent = toy
    help_text = CliRunner().invoke(app, ["run", "toy", "--help"], env={"COLUMNS": "200"}).output
    for flag, text in [("--word", "The word the model is asked to repeat."), ("--repeats", "(>= 1)"), ("--shout", "--no-shout"),
                       ("--echo-model", "alias of --role echo=REF"), ("--limit", "Only the first N cases"), ("--dry-run", "")]:
        assert flag in help_text and text in help_text, (flag, help_text)
    assert "--sampling" not in help_text  # a field marked cli(False) is not a flag, its description notwithstanding

    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "toy", "--data", str(data), "--limit", "2", "--word", "hi", "--repeats", "2",
                                 "--echo-model", "embedded@http://127.0.0.1:9/v1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert (config["word"], config["repeats"], config["shout"], config["limit"]) == ("hi", 2, False, 2)
    assert config["roles"] == {"echo": "embedded@http://127.0.0.1:9/v1"}
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert {x["id"]: x["correct"] for x in records} == {"c1": 1, "c2": 0}
    assert len(sent) == 4 and all(c[-1]["content"].endswith("say hi") for _, c in sent)
    assert json.loads((out / "metrics.json").read_text())["accuracy"] == 0.5
    summary = (out / "summary.md").read_text()
    assert "Toy accuracy" in summary and "repeated the word" in summary and "0.500" in summary  # its paper table, with the paper's value


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
