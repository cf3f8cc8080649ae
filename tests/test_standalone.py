"""The project stands on its own: no tracked file cites the design note it was built from, an issue number, a path
outside the repository (docs/protocols.md is what code, help texts and summaries cite) or narrates how it was made
(tests/ too, but for machine paths in fixtures), nor does any command's help, nor any summary.md a test run writes (this file runs CRAFT-MD, DERA and MediTOD on fixtures through the runner;
tests/conftest.py checks every other summary.md the session wrote)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from experiments.core.registry import named
from experiments.core.config import load_settings
from experiments.core.runner import run_study
from experiments.studies.craftmd.study import CONFIGS, CraftmdStudy
from experiments.studies.craftmd.settings import CraftSettings
from tests.scripted import ScriptedLLM
from tests.standalone import CITATIONS, IN_TESTS, citations

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("## CRAFT-MD", "## DERA", "## MediTOD", "## Auto-evaluation")


SELF = ("tests/standalone.py", "tests/test_standalone.py")  # they spell out what they look for


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    return [ROOT / f for f in out if f and f not in SELF and (ROOT / f).is_file()]


def test_no_tracked_file_cites_what_users_do_not_have_or_narrates():
    files = tracked()
    assert len(files) > 100 and any(f.name == "protocols.md" for f in files) and any(f.parent.name == "tests" for f in files)
    found = {}
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary
        rel = str(f.relative_to(ROOT))
        hits = citations(text, markdown=f.suffix == ".md", kinds=IN_TESTS if rel.startswith("tests/") else tuple(CITATIONS))
        if hits:
            found[rel] = hits
    assert not found, found


def test_no_command_s_help_cites_or_narrates():
    from typer.testing import CliRunner

    from scripts import cli as medstack_cli
    from tests.test_help import every_command

    if not any(c.name == "sweep" for c in medstack_cli.app.registered_commands):
        medstack_cli._register_studies()
    found = {}
    for path in every_command(medstack_cli.app):
        text = CliRunner().invoke(medstack_cli.app, [*path, "--help"], env={"COLUMNS": "250"}).output
        if hits := citations(text):
            found[" ".join(path)] = hits
    assert not found, found


def test_the_check_finds_each_kind():
    for text in ("as quoted in SPEC §3", "(SPEC 3.1, 3.2)", "after issue 13", "The issue-35 A/B", "see ENVIRONMENT.md",
                 "--data /work/shared/data/x.json", "--data ../shared/data/x", "out=/tmp/real2",
                 "shared with other agents' jobs", "on this session's box", "the helper's first fix", "in another working copy",
                 "(session time)", "measured on this branch"):
        assert citations(text), text
    assert citations("fixed in #41", markdown=True) and not citations("color: #555; SPECIALTIES, /tmp/ray, issues to file")
    assert not citations("pure scoring helpers shared by studies; one aiohttp session per endpoint; the test session's server")
    assert citations("(SPEC 7)", kinds=IN_TESTS) and not citations("--out /tmp/x", kinds=IN_TESTS)


def test_protocols_md_covers_every_study_and_is_cited():
    text = (ROOT / "docs" / "protocols.md").read_text(encoding="utf-8")
    for heading in SECTIONS:
        assert f"\n{heading}\n" in text, heading
    for section in text.split("\n## ")[1:5]:
        assert "| setting | the authors |" in section and ("**Stop" in section or "Stop rules" in section), section[:40]
    readme, layout = (ROOT / "README.md").read_text(encoding="utf-8"), (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    assert "(docs/protocols.md)" in readme and "protocols.md" in layout


@pytest.fixture
def craftmd_summary(tmp_path) -> str:
    cases = ROOT / "tests" / "fixtures" / "craftmd" / "requests_cases.csv"
    s = load_settings(CraftSettings, CONFIGS / "embedded-small.yaml", {"data": str(cases), "out": str(tmp_path / "run"), "concurrency": 2})

    def respond(role, content, gen):
        return {"patient": "It hurts.", "clinical": "**Final Diagnosis:** Gout", "summarizer": "A man with a sore toe."}.get(role, "Yes")

    asyncio.run(run_study(named(CraftmdStudy)(), s, client=ScriptedLLM(respond, roles=("clinical", "patient", "grader", "summarizer")), log=lambda m: None))
    return (tmp_path / "run" / "summary.md").read_text(encoding="utf-8")


def test_a_craftmd_summary_cites_the_project_not_the_note(craftmd_summary):
    assert "Johri et al. 2025 (Nat Med), Fig. 2" in craftmd_summary and "docs/protocols.md" in craftmd_summary
    assert "turn cap 4 doctor turns (authors: 14)" in craftmd_summary
    assert citations(craftmd_summary, markdown=True) == []
