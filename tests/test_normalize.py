"""Every word normaliser's output on tricky strings (apostrophes, accents, ligatures, non-ASCII punctuation and
spaces, underscores, plurals), pinned in tests/fixtures/normalize_pins.json from the functions as they were before
they became options of one module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.common.choice import norm
from experiments.common.text import normalize_for_bleu, rouge
from experiments.craftmd import check_split, grading
from experiments.craftmd.patient_checks import words as patient_words
from experiments.meditod.metrics import normalize_text

PINS = json.loads((Path(__file__).parent / "fixtures" / "normalize_pins.json").read_text(encoding="utf-8"))
CALLERS = {
    "choice.norm": norm,
    "grading.normalize": grading.normalize,
    "grading.words": lambda s: sorted(grading.words(s)),
    "patient_checks.words": patient_words,
    "check_split._norm": check_split._norm,
    "meditod.normalize_text": normalize_text,
}


@pytest.mark.parametrize("caller", list(CALLERS))
def test_each_caller_keeps_its_output(caller):
    assert [CALLERS[caller](s) for s in PINS["strings"]] == PINS[caller]


def test_rouge_is_unchanged():
    pairs = [tuple(p) for p in PINS["pairs"]]
    assert [rouge([normalize_text(h)], [normalize_text(r)]) for h, r in pairs] == PINS["rouge"]
    assert [rouge([h], [r]) for h, r in pairs] == PINS["rouge_raw"]
    assert normalize_for_bleu("a") == ["a"]
