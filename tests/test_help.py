"""Help that shows what will run: every study's --help gives each option's effective default (the study's default
config over its settings model) and choices, lists the study's roles with one --ROLE-model flag each, prints
bracketed text as written and carries no Python type tags; --print-config prints the resolved settings as YAML;
`sweep STUDY --help` shows the study's own options."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import Field
from typer.testing import CliRunner

from experiments.core import registry
from experiments.core.commands import StudyFlags
from experiments.core.config import RunSettings
from experiments.core.study import Study

WIDE = {"COLUMNS": "250"}  # one option per line: no wrapping inside the assertions' text
TYPE_TAG = re.compile(r"<(bool|int|float|str|path|list\[[^>]*\]|dict[^>]*)>")


@pytest.fixture(scope="module")
def app():
    from scripts import cli as medstack_cli

    if not any(c.name == "sweep" for c in medstack_cli.app.registered_commands):
        medstack_cli._register_studies()
    return medstack_cli.app


def help_of(app, *args: str) -> str:
    r = CliRunner().invoke(app, [*args, "--help"], env=WIDE)
    assert r.exit_code == 0, r.output
    return r.output


def row(text: str, flag: str) -> str:
    """The help row of one option, its continuation lines joined."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"│ {re.escape(flag)}[ ,]", line))
    out = [lines[start]]
    for line in lines[start + 1:]:
        if re.match(r"│ +-", line) or not line.startswith("│ "):
            break
        out.append(line)
    return " ".join(x.strip("│ ").strip() for x in out)


def command_of(name: str) -> list[str]:
    entry = registry.get(name)
    return [name] if entry.top_level else ["run", name]


def test_craftmd_help_shows_defaults_and_choices(app):
    text = help_of(app, "run", "craftmd")
    assert "[default: 5]" in row(text, "--trials") and "[default: 14]" in row(text, "--max-turns")
    assert "[default: 0]" in row(text, "--seed") and "[default: auto]" in row(text, "--concurrency")
    formats = row(text, "--formats")
    assert "Choices: vignette, multiturn, singleturn, summarized" in formats
    assert "[default: vignette,multiturn,singleturn,summarized]" in formats
    loop = row(text, "--loop")
    assert "opensource|gpt" in loop and "Choices: opensource, gpt" in loop and "[default: opensource]" in loop
    assert "[default: --mcq]" in row(text, "--mcq") and "[default: off]" in row(text, "--no-cache")
    assert "configs/paper.yaml" in text  # where the defaults shown come from
    assert "runs/craftmd-<clinical model>" in row(text, "--out")
    assert not TYPE_TAG.search(text), TYPE_TAG.search(text)


def test_defaults_follow_the_command_s_own_config(app):
    """meditod-pol loads configs/pol_icl.yaml with its task fixed: max_tokens 192 there, 256 for NLU."""
    assert "[default: 192]" in row(help_of(app, "run", "meditod-pol"), "--max-tokens")
    assert "[default: 256]" in row(help_of(app, "run", "meditod-nlu"), "--max-tokens")


def test_a_default_config_value_is_the_default_shown(tmp_path):
    """A default config that sets a value other than the settings model's: --help shows the config's."""
    config = tmp_path / "paper.yaml"
    config.write_text("repeats: 3\nword: hi\n", encoding="utf-8")

    class Toy(RunSettings):
        roles: dict[str, str] = {}
        repeats: int = Field(1, ge=1, description="Requests per case.")
        word: str = Field("hello", description="The word.")

    class ToyStudy(Study):
        name, settings_cls, roles, primary_role = "toy", Toy, ("asker", "checker"), "asker"

        def default_config(self, overrides):
            return config

    flags = StudyFlags(ToyStudy())
    shown = {p.flag.decls[0]: flags.help_of(p) for p in flags.params}
    assert shown["--repeats"].endswith("\\[default: 3]") and shown["--word"].endswith("\\[default: hi]")
    assert "--asker-model" in shown and "--checker-model" in shown  # one generated flag per role
    assert "the model under test" in shown["--asker-model"]


def test_bracketed_help_text_prints_as_written(app):
    assert "the fine-tuning rendering + [answer];" in row(help_of(app, "run", "meditod-nlu"), "--mode")
    assert "chat=[{speaker,text}]" in row(help_of(app, "run", "dera-summarize"), "--data")


@pytest.mark.parametrize("name", sorted(set(registry.studies()) - {"toy"}))
def test_every_study_lists_its_roles_with_one_flag_each(app, name):
    study = registry.get(name).make()
    text = help_of(app, *command_of(name))
    names = set(re.split(r"[\s,│]+", text))
    roles_line = " ".join(text.split())
    for role in study.roles:
        flag = "--model" if role == "model" else f"--{role}-model"
        assert flag in names, (name, role, flag)
        assert f"{role} ({flag}" in roles_line, (name, role)
    assert "Exit 130: interrupted (Ctrl-C;" in roles_line and "Exit 0" in roles_line, name  # beside 0, 2 and 3
    assert not TYPE_TAG.search(text), (name, TYPE_TAG.search(text))


def test_dera_decider_flag_sets_the_decider(app):
    r = CliRunner().invoke(app, ["run", "dera-qa", "--decider-model", "llama3-8b-instruct", "--print-config"])
    assert r.exit_code == 0, r.output
    roles = yaml.safe_load(r.output)["roles"]
    assert roles["decider"] == "llama3-8b-instruct" and roles["researcher"] == "embedded"


def test_meditod_grader_flag_is_the_adjudicating_model(app):
    r = CliRunner().invoke(app, ["run", "meditod-nlu", "--data", "meditod-sample", "--grader-model", "mistral-7b-instruct-v0.2", "--print-config"])
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(r.output)["adjudicate_model"] == "mistral-7b-instruct-v0.2"


def test_print_config_prints_the_resolved_settings(app, tmp_path):
    r = CliRunner().invoke(app, ["run", "craftmd", "--data", "craftmd-cases", "--trials", "2", "--formats", "multiturn,vignette", "--grader-model", "llama3-8b-instruct",
                                 "--set", "sampling.doctor.temperature=0.5", "--set", "max_turns=7", "--out", str(tmp_path / "never"),
                                 "--print-config"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("# medstack run craftmd: experiments/studies/craftmd/configs/paper.yaml + the command line")
    config = yaml.safe_load(r.output)
    assert (config["trials"], config["formats"], config["max_turns"]) == (2, ["multiturn", "vignette"], 7)  # flags and --set
    assert config["sampling"]["doctor"]["temperature"] == 0.5 and config["sampling"]["doctor"]["max_tokens"] == 250  # --set over the config
    assert config["roles"]["grader"] == config["roles"]["summarizer"] == "llama3-8b-instruct" and config["roles"]["clinical"] == "embedded"
    assert config["loop"] == "opensource" and config["concurrency"] == "auto"  # from the config file
    assert not (tmp_path / "never").exists()  # nothing written


def test_print_config_names_the_config_the_options_chose(app, tmp_path):
    r = CliRunner().invoke(app, ["run", "dera-qa", "--mcq", "--print-config"])
    assert r.exit_code == 0 and "configs/qa-mcq.yaml" in r.output.splitlines()[0] and yaml.safe_load(r.output)["mcq"] is True
    own = tmp_path / "mine.yaml"
    own.write_text("trials: 3\n", encoding="utf-8")
    r = CliRunner().invoke(app, ["run", "craftmd", "--data", "craftmd-cases", "--config", str(own), "--print-config"])
    assert r.exit_code == 0 and str(own) in r.output.splitlines()[0] and yaml.safe_load(r.output)["trials"] == 3


def test_print_config_refuses_a_bad_value(app):
    from experiments.core.config import ConfigError

    r = CliRunner().invoke(app, ["run", "craftmd", "--formats", "multi-turn", "--print-config"])  # main() prints it, exit 2
    assert isinstance(r.exception, ConfigError) and "unknown format(s) multi-turn" in str(r.exception) and not r.output


def test_sweep_help_shows_the_study_s_options(app):
    text = help_of(app, "sweep", "craftmd")
    assert "--models" in text and "--vary" in text  # the sweep's own
    assert "The options of craftmd" in text and "[default: 5]" in row(text, "--trials") and "--patient-model" in text
    assert "--trials" not in help_of(app, "sweep")  # without a study: the sweep's own only


def test_concurrency_takes_a_number_or_auto(app):
    """`concurrency: N | auto`: the flag reads either (it read only numbers, so help could show a default it refused)."""
    for given, want in (("4", 4), ("auto", "auto")):
        r = CliRunner().invoke(app, ["run", "craftmd", "--data", "craftmd-cases", "--concurrency", given, "--print-config"])
        assert r.exit_code == 0 and yaml.safe_load(r.output)["concurrency"] == want, r.output


def test_sweep_without_models_names_the_option(app):
    from experiments.core.config import ConfigError

    r = CliRunner().invoke(app, ["sweep", "craftmd", "--data", "x.csv"])
    assert isinstance(r.exception, ConfigError) and "--models is required" in str(r.exception)


def every_command(app) -> list[list[str]]:
    """The path of every command and group, the study commands (loaded when first asked for) included."""
    import typer

    root = typer.main.get_command(app)
    paths, todo = [], [([], root)]
    while todo:
        path, cmd = todo.pop()
        paths.append(path)
        if hasattr(cmd, "list_commands"):  # a group (typer's own click or click itself)
            ctx = cmd.context_class(cmd)
            todo += [([*path, name], cmd.get_command(ctx, name)) for name in cmd.list_commands(ctx)]
    return sorted(paths)


def test_every_help_fits_80_columns_and_cuts_no_name(app):
    """At 80 columns the help column wraps; no option name, choice or usage line is cut ("…") or runs past the edge."""
    paths = every_command(app)
    assert ["run", "craftmd"] in paths and ["sweep"] in paths and ["calibrate", "craftmd-grader"] in paths and len(paths) > 40
    paths += [["sweep", name] for name in registry.studies()]  # `sweep STUDY --help`: the sweep's help, then the study's options
    bad = {}
    for path in paths:
        r = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
        assert r.exit_code == 0, (path, r.output)
        wide = [line for line in r.output.splitlines() if len(line) > 80 or "…" in line]
        if wide:
            bad[" ".join(path)] = wide
    assert not bad, bad


REFUSED = (  # what a run refuses before it reads data, and the words it says
    (["--limit", "3", "--sample", "3"], "give one of them"),
    (["--model", "nosuchmodel"], "unknown model alias 'nosuchmodel'"),
    (["--patient-model", "mistral-7b-instruct-v2"], "unknown model alias 'mistral-7b-instruct-v2'"),
    (["--role", "nurse=embedded"], "unknown role(s) nurse"),
)


@pytest.mark.parametrize("args,said", REFUSED)
def test_print_config_and_dry_run_refuse_what_a_run_refuses_without_reading_data(app, tmp_path, monkeypatch, args, said):
    from experiments.studies.craftmd import study as craftmd_study
    from models.errors import MedstackError

    cases = str(Path(__file__).parent / "fixtures" / "craftmd" / "requests_cases.csv")
    for how in (["--print-config"], ["--dry-run", "--out", str(tmp_path / "dry")], []):
        r = CliRunner().invoke(app, ["run", "craftmd", "--data", cases, *args, *how])
        assert isinstance(r.exception, MedstackError) and said in str(r.exception), (how, r.output, r.exception)
        assert getattr(r.exception, "exit_code", 2) == 2
    assert not (tmp_path / "dry").exists()

    def no_reading(*a, **k):
        raise AssertionError("--print-config read the data")

    monkeypatch.setattr(craftmd_study, "load_cases", no_reading)
    monkeypatch.setenv("MEDSTACK_HOME", str(tmp_path / "home"))  # no data set fetched here
    r = CliRunner().invoke(app, ["run", "craftmd", "--data", cases, "--trials", "2", "--print-config"])
    assert r.exit_code == 0 and yaml.safe_load(r.output)["trials"] == 2, r.output
    assert f"# not checked: what needs the data ({cases}" in r.output
    r = CliRunner().invoke(app, ["run", "craftmd", "--data", "craftmd-cases", "--print-config"])
    assert r.exit_code == 0 and "craftmd-cases is registered but not fetched yet" in r.output.splitlines()[1], r.output
    assert yaml.safe_load(r.output)["data"] == "craftmd-cases"


def test_a_sweep_refuses_a_misspelled_model_before_anything_runs(app, tmp_path):
    from models.errors import MedstackError

    cases = str(Path(__file__).parent / "fixtures" / "craftmd" / "requests_cases.csv")
    r = CliRunner().invoke(app, ["sweep", "craftmd", "--models", "embedded,mistral-7b-instruct-v2", "--role", "patient=embedded",
                                 "--role", "grader=embedded", "--data", cases, "--dry-run", "--out", str(tmp_path / "sweep")])
    assert isinstance(r.exception, MedstackError) and "unknown model alias 'mistral-7b-instruct-v2'" in str(r.exception), r.output
    assert not (tmp_path / "sweep").exists()


def test_models_list_at_80_columns_tells_every_alias_apart(app):
    from models.registry import load_registry

    r = CliRunner().invoke(app, ["models", "list"], env={"COLUMNS": "80"}, terminal_width=80)
    assert r.exit_code == 0 and "…" not in r.output and max(map(len, r.output.splitlines())) <= 80, r.output
    assert all(f"│ {alias} " in r.output for alias in load_registry()), r.output  # mistral-7b-instruct-v0.1 and -v0.2

