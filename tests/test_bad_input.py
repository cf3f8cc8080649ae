"""Malformed input, one test per kind: exit 2, a message naming the file/line/id or option, no
traceback, no hang, and nothing started (every check happens before a server would start)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, run_cli

CASES_CSV = str(FIXTURES / "craftmd" / "cases.csv")
MEDITOD = str(FIXTURES / "meditod" / "dialogs.json")


def craftmd(*extra: str) -> list[str]:
    return ["run", "craftmd", "--data", CASES_CSV, "--model", "embedded", *extra]


def files(tmp: Path) -> dict[str, str]:
    """Bad input files, written fresh for each test."""
    (tmp / "binary.csv").write_bytes(bytes(range(256)) * 8)
    (tmp / "empty.jsonl").write_text("")
    (tmp / "bad.jsonl").write_text('{"question_open": "q", "answer": "a", "id": "1"}\n{not json\n')
    (tmp / "nocol.csv").write_text("case_vignette,answer\nx,y\n")
    (tmp / "notjson.json").write_text("{ this is not json")
    (tmp / "bad.yaml").write_text("trials: [unclosed\n")
    (tmp / "list.yaml").write_text("- a\n- b\n")
    (tmp / "afile").write_text("x")
    (tmp / "noadapter").mkdir(exist_ok=True)
    (tmp / "emptyrun").mkdir(exist_ok=True)
    (tmp / "emptyrun" / "records.jsonl").write_text("")
    return {k: str(tmp / k) for k in ("binary.csv", "empty.jsonl", "bad.jsonl", "nocol.csv", "notjson.json", "bad.yaml", "list.yaml",
                                      "afile", "noadapter", "emptyrun")}


# (name, argv builder, text the message must contain)
KINDS = [
    ("concurrency 0", lambda f: craftmd("--concurrency", "0"), "concurrency"),
    ("negative limit", lambda f: craftmd("--limit", "-3"), "limit"),
    ("zero limit", lambda f: craftmd("--limit", "0"), "limit"),
    ("zero trials", lambda f: craftmd("--trials", "0"), "trials"),
    ("zero max turns", lambda f: craftmd("--max-turns", "0"), "max_turns"),
    ("negative k", lambda f: ["run", "meditod-nlu", "--data", MEDITOD, "--model", "embedded", "--k", "-2"], "k"),
    ("binary data file", lambda f: ["run", "craftmd", "--data", f["binary.csv"], "--model", "embedded"], "binary.csv"),
    ("empty jsonl", lambda f: ["run", "dera-qa", "--data", f["empty.jsonl"], "--model", "embedded"], "empty.jsonl"),
    ("invalid json line", lambda f: ["run", "dera-qa", "--data", f["bad.jsonl"], "--model", "embedded"], "bad.jsonl:2"),
    ("missing csv column", lambda f: ["run", "craftmd", "--data", f["nocol.csv"], "--model", "embedded"], "nocol.csv:1"),
    ("data file does not exist", lambda f: ["run", "craftmd", "--data", "/nonexistent/cases.csv", "--model", "embedded"], "/nonexistent/cases.csv"),
    ("dialogs not json", lambda f: ["run", "meditod-pol", "--data", f["notjson.json"], "--model", "embedded"], "notjson.json"),
    ("unknown role", lambda f: craftmd("--role", "graderr=embedded"), "graderr"),
    ("role without =", lambda f: craftmd("--role", "clinical"), "--role"),
    ("model ref without http", lambda f: craftmd("--role", "clinical=embedded@localhost:8000"), "embedded@localhost:8000"),
    ("set without =", lambda f: craftmd("--set", "trials"), "--set"),
    ("set unknown key", lambda f: craftmd("--set", "bogus_key=1"), "bogus_key"),
    ("set wrong type", lambda f: craftmd("--set", "sampling.doctor.temperature=hot"), "temperature"),
    ("config missing", lambda f: craftmd("--config", "/nonexistent/x.yaml"), "/nonexistent/x.yaml"),
    ("config invalid yaml", lambda f: craftmd("--config", f["bad.yaml"]), "bad.yaml"),
    ("config not a mapping", lambda f: craftmd("--config", f["list.yaml"]), "list.yaml"),
    ("unknown format", lambda f: craftmd("--formats", "vignette,telepathy"), "telepathy"),
    ("nothing to ask", lambda f: craftmd("--no-mcq", "--no-frq"), "nothing to ask"),
    ("no case matches", lambda f: craftmd("--specialty", "Astrology"), "Astrology"),
    ("lora item without =", lambda f: craftmd("--lora", "adapter"), "NAME=PATH"),
    ("lora dir without adapter", lambda f: craftmd("--lora", f"a={f['noadapter']}"), "adapter_config.json"),
    ("out is a file", lambda f: craftmd("--out", f["afile"]), "afile"),
    ("remote endpoint refused", lambda f: craftmd("--model", "embedded@http://10.1.2.3:8000/v1", "--limit", "1"), "--allow-remote"),
    ("corrupt without level", lambda f: ["run", "dera-corrupt", "--model", "embedded"], "--level"),
    ("autoeval without dialogues", lambda f: ["autoeval", "--data", f["emptyrun"], "--judge-model", "embedded"], "emptyrun"),
    ("seed not a number", lambda f: craftmd("--seed", "abc"), "seed"),
]


@pytest.mark.parametrize("name,argv,needle", KINDS, ids=[k[0] for k in KINDS])
def test_bad_input_exits_2_with_a_message_and_starts_nothing(name, argv, needle, tmp_path):
    args = argv(files(tmp_path))
    if "--out" not in args:
        args += ["--out", str(tmp_path / "o")]
    proc = run_cli(*args, timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, f"{name}: exit {proc.returncode}\n{text[-2000:]}"
    assert needle.lower() in text.lower(), f"{name}: message lacks {needle!r}\n{text[-2000:]}"
    assert "Traceback" not in text and "starting vLLM" not in text


def test_resume_with_other_settings_is_refused_naming_the_key(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("trials: 9\n")
    (out / "records.jsonl").write_text(json.dumps({"id": "case_a/t0", "status": "ok"}) + "\n")
    proc = run_cli(*craftmd("--trials", "1", "--out", str(out)), timeout=120)
    assert proc.returncode == 2 and "different settings" in proc.stderr and "trials" in proc.stderr


def test_there_are_at_least_25_kinds():
    assert len(KINDS) + 1 >= 25
