"""Every key of --set and of a config file, and every sampling step, is one the study's settings declare: an unknown one
is refused before anything starts (exit 2, one line naming --set or the file and line, the closest valid names)."""

from __future__ import annotations

from tests.conftest import FIXTURES, run_cli

CASES_CSV = str(FIXTURES / "craftmd" / "cases.csv")


def refused(*args: str, tmp) -> str:
    proc = run_cli("run", "craftmd", "--data", CASES_CSV, "--limit", "2", "--model", "embedded", "--out", str(tmp / "o"), *args, timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-2000:]
    assert "Traceback" not in text and "starting vLLM" not in text and not (tmp / "o").exists()
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr


def test_unknown_sampling_step_is_refused_with_the_closest_step(tmp_path):
    err = refused("--set", "sampling.doctr.temperature=0", tmp=tmp_path)
    assert "--set sampling.doctr.temperature=0" in err and "did you mean sampling.doctor?" in err
    assert "paper.yaml" not in err


def test_misspelled_sampling_field_names_set_not_the_config(tmp_path):
    err = refused("--set", "sampling.doctor.temprature=0", tmp=tmp_path)
    assert "--set sampling.doctor.temprature=0" in err and "sampling.doctor.temperature" in err
    assert "paper.yaml" not in err and "Extra inputs" not in err


def test_unknown_key_in_a_config_file_names_its_line(tmp_path):
    cfg = tmp_path / "mine.yaml"
    cfg.write_text("trials: 1\nsampling:\n  doctor:\n    temperature: 0\n  pateint:\n    max_tokens: 9\n")
    err = refused("--config", str(cfg), tmp=tmp_path)
    assert f"{cfg}:5: sampling.pateint" in err and "did you mean sampling.patient?" in err


def test_every_declared_step_is_accepted():
    proc = run_cli("run", "craftmd", "--data", CASES_CSV, "--set", "sampling.assessor.temperature=0", "--set", "sampling.doctor.temperature=0",
                   "--print-config", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "doctr" not in proc.stdout


def test_a_misspelled_role_offers_the_closest_role(tmp_path):
    err = refused("--role", "graderr=embedded", tmp=tmp_path)
    assert "graderr" in err and "did you mean grader?" in err
