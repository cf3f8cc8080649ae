"""README.md as a user reads it: at most 10,000 characters, its links resolve, and every command line of
"Quick start", "Your first real study" and "The other studies" is one that exists: `medstack ...` lines are parsed by the real
CLI with --help appended (click rejects an unknown option before it shows help, so a renamed command or
option fails here), `make` targets exist, files read are ones a line of the block writes."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SECTIONS = ("Quick start", "Your first real study", "The other studies")
SWEEP_OWN = {"--models", "--out", "--published", "--vary"}  # sweep options; the rest are the study's
ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def command_lines(text: str) -> list[str]:
    """The lines of every ```bash block, continuation lines joined."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.strip().startswith("#"):
                out.append(line.strip())
    return out


@pytest.fixture(scope="module")
def app():
    from scripts import cli as medstack_cli

    if not any(c.name == "sweep" for c in medstack_cli.app.registered_commands):
        medstack_cli._register_studies()
    return medstack_cli.app


def parses(app, args: list[str]) -> tuple[bool, str]:
    r = CliRunner().invoke(app, [*args, "--help"])
    return r.exit_code == 0, r.output


def check_line(app, line: str, outs: set[str]) -> None:
    words = shlex.split(line, comments=True)
    while words and ENV.match(words[0]):
        assert words[0].split("=")[0].startswith("MEDSTACK_"), f"{line}: unknown variable {words[0]}"
        words = words[1:]
    cmd, args = words[0], words[1:]
    if cmd == "make":
        targets = re.findall(r"^([a-z-]+):", (REPO / "Makefile").read_text(), re.M)
        assert all(a in targets for a in args), f"{line}: no such make target (targets: {targets})"
    elif cmd == "export":
        assert all(ENV.match(a) for a in args), line
    elif cmd == "cat":
        assert all(any(a.startswith(o + "/") for o in outs) for a in args), f"{line}: reads a file no line of the block writes"
    elif cmd in ("medstack", ".venv/bin/medstack"):
        ok, output = parses(app, args)
        assert ok, f"`{line}` is not accepted by the CLI:\n{output}"
        if args[:1] == ["sweep"]:  # the study's own options ride along unparsed: parse them as `run STUDY` does
            rest, skip = [], False
            for a in args[2:]:
                if skip:
                    skip = False
                elif a.split("=")[0] in SWEEP_OWN:
                    skip = "=" not in a
                else:
                    rest.append(a)
            ok, output = parses(app, ["run", args[1], *rest])
            assert ok, f"`{line}`: the study options are not accepted by `medstack run {args[1]}`:\n{output}"
    else:
        raise AssertionError(f"{line}: a command this test does not know; add it here or use a medstack command")


def test_readme_length_and_links():
    assert len(README.read_text(encoding="utf-8")) <= 10_000, "README.md is over 10,000 characters; move detail to docs/"
    for page in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


@pytest.mark.parametrize("title", SECTIONS)
def test_every_command_line_exists(app, title):
    lines = command_lines(section(title))
    assert lines, f"no command lines under ## {title}"
    outs = set()  # the folders the block's runs write (--out DIR)
    for ln in lines:
        words = shlex.split(ln, comments=True)
        outs |= {b for a, b in zip(words, words[1:]) if a == "--out"}
    for line in lines:
        check_line(app, line, outs)


def test_a_renamed_option_fails_the_check(app):
    """The check can fail: an option the command does not have, a study option a sweep passes on, a target."""
    for bad in ("medstack run craftmd --data craftmd-cases --grader craftmd",
                "medstack models fetch llama3-8b-instruct --allow-download",
                "medstack sweep craftmd --models embedded --patient embedded",
                "make demonstration"):
        with pytest.raises(AssertionError):
            check_line(app, bad, set())
