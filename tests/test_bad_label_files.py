"""Label and CSV files that are not UTF-8: every reader says one line naming the file, the line and the byte, and the
command exits 2 (models/errors.py read_utf8, the one reader of their text)."""

from __future__ import annotations

import pytest

from experiments.studies.autoeval.metrics import load_reference
from experiments.studies.autoeval.calibrate import read_ratings
from experiments.studies.craftmd.calibrate_grader import read_labels
from experiments.studies.craftmd.data import load_csv
from experiments.tools.review.labels import read_labels as read_review_labels
from models.errors import DataError, read_utf8
from tests.conftest import run_cli

# line 3 holds a Latin-1 "é" (0xe9) in its 2nd column
LATIN1 = "id,criterion,rating\na,empathy,4\nb\xe9,empathy,3\n".encode("latin-1")
WHERE = r":3: not UTF-8 text \(byte 0xe9 at column 2\); save the file as UTF-8$"


@pytest.fixture
def latin(tmp_path):
    p = tmp_path / "labels.csv"
    p.write_bytes(LATIN1)
    return p


def test_the_one_reader_names_file_line_and_byte(latin, tmp_path):
    with pytest.raises(DataError, match=WHERE):
        read_utf8(latin)
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbfid\n")
    assert read_utf8(bom) == "id\n"
    with pytest.raises(DataError, match="no such file"):
        read_utf8(tmp_path / "none.csv")


@pytest.mark.parametrize("reader", [
    lambda p: read_labels(p),                  # calibrate craftmd-grader --labels
    lambda p: load_reference(p, []),           # autoeval --reference
    lambda p: read_ratings(p),                 # calibrate autoeval ratings / reference
    lambda p: load_csv(p),                     # run craftmd --data (the case CSV)
    lambda p: read_review_labels(p),           # review label files (a download from the offline page)
], ids=["craftmd-grader-labels", "autoeval-reference", "calibrate-autoeval-ratings", "craftmd-cases", "review-labels"])
def test_every_reader_refuses_a_non_utf8_file_in_one_line(reader, latin):
    with pytest.raises(DataError) as e:
        reader(latin)
    assert str(e.value).startswith(str(latin)) and ":3: not UTF-8 text (byte 0xe9" in str(e.value) and "\n" not in str(e.value)


def test_calibrate_craftmd_grader_on_a_non_utf8_file_exits_2_in_one_line(latin, tmp_path):
    p = run_cli("calibrate", "craftmd-grader", "--judge-model", "embedded", "--labels", str(latin), "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [f"error: {latin}:3: not UTF-8 text (byte 0xe9 at column 2); save the file as UTF-8"]
