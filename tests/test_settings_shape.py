"""One settings shape: every study's sampling is ``sampling.STEP``; older spellings are read into it (config files, run
folders, the old flags); every settings field is described, and only fields not marked ``cli(False)`` are flags; run
folders resume by their settings class's rules."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from experiments.core import registry
from experiments.core.commands import StudyFlags, _inherited
from experiments.core.config import RunSettings, is_flag, load_settings
from experiments.core.results import ResultsError, RunDir
from experiments.studies.dera.settings import DialogueSettings, QASettings
from experiments.studies.meditod.settings import MeditodSettings

FIXTURES = Path(__file__).parent / "fixtures" / "resume"  # config.yaml files as the flat-keyed settings wrote them
SETTINGS = {"dera-qa": QASettings, "dera-summarize": DialogueSettings, "meditod-pol": MeditodSettings}


def study_settings() -> dict[str, type[RunSettings]]:
    return {name: entry.make().settings_cls for name, entry in registry.studies().items()}


def test_every_field_of_every_study_is_described_and_only_unmarked_fields_are_flags():
    classes = study_settings()
    assert {"craftmd", "dera-qa", "meditod-nlu", "autoeval", "meld"} <= set(classes)
    undescribed = [f"{cls.__name__}.{n}" for cls in classes.values() for n in cls.model_fields if not _inherited(cls, n, "description")]
    assert not undescribed, f"settings fields without a description: {undescribed}"
    for name, entry in registry.studies().items():
        cls = classes[name]
        flags = StudyFlags(entry.make(), entry.fixed)
        targets = {t for p in flags.params for t in p.flag.targets}
        for field in cls.model_fields:
            marked = not is_flag(_inherited(cls, field, "json_schema_extra"))
            assert (field in targets) != marked or field == "roles", (name, field)  # roles: set by the --ROLE-model flags
    assert not is_flag(_inherited(QASettings, "sampling", "json_schema_extra"))


@pytest.mark.parametrize("name", ["craftmd", "meld", "dera-summarize", "dera-qa", "meditod-nlu", "autoeval"])
def test_every_study_holds_sampling_by_step(name):
    entry = registry.get(name)
    cls, config = entry.make().settings_cls, entry.make().default_config(dict(entry.fixed))
    s = load_settings(cls, config, dict(entry.fixed))  # the study's default config: the shape it ships
    steps = s.sampling if isinstance(s.sampling, dict) else dict(s.sampling)
    assert steps and all(hasattr(v, "gen") for v in steps.values())
    step = next(iter(steps))
    changed = load_settings(cls, config, {**entry.fixed, "sampling": {step: {"max_tokens": 7}}})
    assert (changed.sampling[step] if isinstance(changed.sampling, dict) else getattr(changed.sampling, step)).max_tokens == 7


def test_old_spellings_are_read_into_sampling():
    qa = QASettings.model_validate({"answer": {"temperature": 0.5, "max_tokens": 9, "n": 3}, "judge_exact": {"max_tokens": 5}})
    assert (qa.sampling.answer.temperature, qa.sampling.answer.max_tokens, qa.sampling.answer.n) == (0.5, 9, 3)
    assert qa.sampling.judge_exact.max_tokens == 5 and qa.sampling.final.n == 5  # the other steps keep their defaults
    summ = DialogueSettings.model_validate({"sampling": {"temperature": 0.2, "max_tokens": 48},
                                            "gptf1": {"extraction": {"max_tokens": 32}, "max_concepts": 3}})
    assert (summ.sampling.dialogue.temperature, summ.sampling.dialogue.max_tokens) == (0.2, 48)
    assert summ.sampling.extraction.max_tokens == 32 and summ.gptf1.max_concepts == 3
    pol = MeditodSettings.model_validate({"task": "pol", "temperature": 0.0, "adjudicate_max_tokens": 6})
    assert pol.sampling.turn.max_tokens == 192 and pol.sampling.adjudicate.max_tokens == 6  # pol's own default kept
    assert MeditodSettings.model_validate({"task": "pol", "max_tokens": 10}).sampling.turn.max_tokens == 10
    # an old spelling on the command line wins over the config file's new key
    over = load_settings(QASettings, Path("experiments/studies/dera/configs/qa.yaml"), {"answer": {"max_tokens": 11}})
    assert over.sampling.answer.max_tokens == 11 and over.sampling.answer.n == 5
    with pytest.raises(Exception, match="sampling.answer.bogus"):
        load_settings(QASettings, None, {"sampling": {"answer": {"bogus": 1}}})


def test_old_flags_are_aliases_of_the_new_keys():
    entry = registry.get("meditod-pol")
    flags = StudyFlags(entry.make(), entry.fixed)
    p = next(p for p in flags.params if "--max-tokens" in p.flag.decls)
    assert p.flag.targets == ("sampling.turn.max_tokens",) and flags.default_of(p) == "192"
    assert flags.overrides({p.key: 64})["sampling"] == {"turn": {"max_tokens": 64}}
    entry = registry.get("autoeval")
    flags = StudyFlags(entry.make(), entry.fixed)
    p = next(p for p in flags.params if "--max-tokens" in p.flag.decls)
    assert set(p.flag.targets) == {"sampling.explain.max_tokens", "sampling.rate.max_tokens"}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_run_folder_written_with_the_flat_keys_resumes_under_the_new_shape(tmp_path, name):
    """config.yaml as the flat-keyed settings wrote it (DERA's answer/explain/..., MediTOD's temperature/max_tokens):
    the same command today resumes the run; another sampling value is refused, naming the key."""
    cls, old = SETTINGS[name], yaml.safe_load((FIXTURES / f"{name}.config.yaml").read_text())
    assert "sampling" not in old or "temperature" in old["sampling"]  # the fixture has the old shape
    out = tmp_path / "run"
    config = dict(configs={"dera-qa": "experiments/studies/dera/configs/qa.yaml", "dera-summarize": "experiments/studies/dera/configs/summarize.yaml",
                           "meditod-pol": "experiments/studies/meditod/configs/pol_icl.yaml"})["configs"][name]
    fixed = {"task": "pol"} if name == "meditod-pol" else {}
    roles = {"model": "embedded"} if name == "meditod-pol" else {"default": "embedded"}

    def opened(**over):
        out.mkdir(exist_ok=True)
        (out / "config.yaml").write_text((FIXTURES / f"{name}.config.yaml").read_text().replace("OUT", str(out)))
        (out / "records.jsonl").write_text('{"id": "c1"}\n')
        s = load_settings(cls, config, {**fixed, "out": str(out), "roles": roles, **over})
        return RunDir(out, {**s.model_dump(mode="json"), "experiment": name}, settings_cls=cls)  # the runner names the kind

    assert opened().latest()  # resumes: its one record is kept
    step = {"dera-qa": "answer", "dera-summarize": "dialogue", "meditod-pol": "turn"}[name]
    with pytest.raises(ResultsError, match=r"different settings \(sampling\)"):
        opened(sampling={step: {"max_tokens": 3}})
    assert opened(concurrency=2, limit=1).latest()  # resume_changeable


def test_resume_rules_are_the_settings_classes():
    from experiments.studies.craftmd.settings import CraftSettings

    added, changeable = CraftSettings.resume_rules()
    assert added["answers"] == "free" and added["verdict_rule"] == "first_word"  # RunSettings' and CRAFT-MD's own
    assert "verdict_rule" not in QASettings.resume_rules()[0] and "concurrency" in changeable


# ------------------------------------------------------------------ studies load lazily at start-up

def _study_modules_loaded(*argv: str) -> list[str]:
    import subprocess
    import sys

    code = ("import sys\nfrom scripts import cli\nsys.argv = ['medstack', *sys.argv[1:]]\ntry:\n    cli.main()\nexcept SystemExit:\n    pass\n"
            "print('LOADED', sorted(m for m in sys.modules if m.startswith('experiments.') and m.endswith('.study') and m != 'experiments.core.study'))")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1])
    line = next(x for x in r.stdout.splitlines() if x.startswith("LOADED"))
    return eval(line.removeprefix("LOADED "))


def test_help_lists_every_study_without_importing_one():
    assert _study_modules_loaded("--help") == []
    assert _study_modules_loaded("run", "--help") == []
    assert _study_modules_loaded("run", "dera-qa", "--help") == ["experiments.studies.dera.study"]  # its own folder's only
