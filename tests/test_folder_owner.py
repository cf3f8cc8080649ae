"""Every command that writes a results folder owns it: pointed at a folder holding another kind's results, each
refuses (exit 2, one line naming what is there) before it reads a case or sends a request, and the folder is left
byte for byte as it was. A calibration computed whole keeps its old result until the new one is complete."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from experiments.core.results import kind_of
from tests.conftest import FIXTURES, run_cli

DEAD = "embedded@http://127.0.0.1:9/v1"  # never reached: every writer refuses first
EXPERTS = str(FIXTURES / "craftmd" / "experts")


def snapshot(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` (names and bytes, hashed) and every folder."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir" for p in sorted(folder.rglob("*"))}


# the writers: (kind it writes, argv with OUT in place of --out's value)
WRITERS = {
    "run dera-qa": ("dera-qa", ["run", "dera-qa", "--data", "experiments/studies/dera/data/sample_medqa_open.jsonl", "--limit", "1",
                                "--model", DEAD, "--out", "OUT"]),
    "run craftmd": ("craftmd", ["run", "craftmd", "--data", str(FIXTURES / "craftmd" / "cases.csv"), "--limit", "1", "--trials", "1",
                                "--model", DEAD, "--out", "OUT"]),
    "import craftmd": ("craftmd", ["import", "craftmd", str(FIXTURES / "craftmd" / "published_release"), "--name", "x",
                                   "--cases", str(FIXTURES / "craftmd" / "cases.csv"), "--out", "OUT"]),
    "import craftmd-experts": ("craftmd-experts", ["import", "craftmd-experts", EXPERTS, "--out", "OUT"]),
    "calibrate conversations": ("calibrate-conversations", ["calibrate", "conversations", "--labels", EXPERTS, "--out", "OUT"]),
    "calibrate conversations (assessor)": ("calibrate-conversations", ["calibrate", "conversations", "--labels", EXPERTS,
                                                                        "--assessor-model", DEAD, "--out", "OUT"]),
    "calibrate craftmd-grader": ("calibrate-craftmd-grader", ["calibrate", "craftmd-grader", "--judge-model", DEAD, "--labels",
                                                              str(FIXTURES / "craftmd" / "validation_graderai_small.csv"), "--out", "OUT"]),
    "calibrate autoeval": ("calibrate-autoeval", ["calibrate", "autoeval", "--ratings", str(FIXTURES / "autoeval" / "reference.csv"),
                                                  "--reference", str(FIXTURES / "autoeval" / "reference.csv"), "--out", "OUT"]),
    "compare": ("compare", ["compare", str(FIXTURES / "old_runs" / "dera-qa"), "--out", "OUT"]),
    "autoeval": ("autoeval", ["autoeval", str(FIXTURES / "autoeval" / "results"), "--limit", "1", "--model", DEAD, "--out", "OUT"]),
    "sweep": ("sweep", ["sweep", "dera-qa", "--models", DEAD, "--data", "experiments/studies/dera/data/sample_medqa_open.jsonl",
                        "--limit", "1", "--out", "OUT"]),
    "rescore": ("rescore", ["rescore", str(FIXTURES / "old_runs" / "dera-qa"), "--judge", "llm-exact", "--judge-model", DEAD, "--out", "OUT"]),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """One folder of each of three kinds: a CRAFT-MD run and a DERA-QA run (as older code wrote them) and a
    calibration (as `calibrate conversations` writes it today)."""
    base = tmp_path_factory.mktemp("kinds")
    out = {k: base / k for k in ("craftmd", "dera-qa")}
    for k, p in out.items():
        shutil.copytree(FIXTURES / "old_runs" / k, p)
    out["calibrate-conversations"] = base / "calibrate-conversations"
    run_cli("calibrate", "conversations", "--labels", EXPERTS, "--n-boot", "100", "--out", str(out["calibrate-conversations"]), check=True)
    return out


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_writer_refuses_another_kinds_folder_and_leaves_it_byte_for_byte(folders, writer):
    kind, argv = WRITERS[writer]
    for there, folder in folders.items():
        if there == kind:
            continue
        before = snapshot(folder)
        p = run_cli(*[str(folder) if a == "OUT" else a for a in argv], timeout=300)
        assert p.returncode == 2, (writer, there, p.stderr[-1500:])
        lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
        assert len(lines) == 1 and f"holds results of `{kind_of(folder)}`" in lines[0] and "Traceback" not in p.stderr, (writer, there, p.stderr[-1500:])
        assert snapshot(folder) == before, (writer, there)


def test_a_whole_result_replaces_the_old_one_only_when_complete(tmp_path):
    """calibrate conversations, computed whole: again into its own folder, it replaces it; killed before commit()
    (simulated: the .new files written, not put in place), the old files are what the folder holds."""
    from experiments.core.results import RunDir

    out = tmp_path / "cal"
    run_cli("calibrate", "conversations", "--labels", EXPERTS, "--n-boot", "100", "--out", str(out), check=True)
    first = snapshot(out)
    run_cli("calibrate", "conversations", "--labels", EXPERTS, "--n-boot", "200", "--out", str(out), check=True)
    assert "n_boot: 200" in (out / "config.yaml").read_text() and not list(out.glob("*.new"))
    second = snapshot(out)
    rd = RunDir(out, {"experiment": "calibrate-conversations", "n_boot": 300}, whole=True)
    rd.append_many([{"id": "x"}])
    rd.write_summary("partial\n")  # ... and the process dies here
    assert {k: v for k, v in snapshot(out).items() if not k.endswith(".new")} == second != first
    RunDir(out, {"experiment": "calibrate-conversations", "n_boot": 300}, whole=True)  # the next opening clears the debris
    assert sorted(p.name for p in out.glob("*.new")) == ["config.yaml.new"]  # its own, just begun
