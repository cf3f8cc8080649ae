"""Every word normaliser's output on tricky strings (apostrophes, accents, ligatures, non-ASCII punctuation and
spaces, underscores, plurals), pinned in tests/fixtures/normalize_pins.json from the functions as they were before
they became options of one module (patient_checks.words: as it is since it took plurals singular)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.common.normalize import normalize, words
from experiments.common.text import rouge
from experiments.studies.craftmd import grading
from experiments.common.patient_checks import singular, words as patient_words

PINS = json.loads((Path(__file__).parent / "fixtures" / "normalize_pins.json").read_text(encoding="utf-8"))
# each former normaliser (the fixture's key) -> the options of the one module that replace it
CALLERS = {
    "choice.norm": normalize,
    "grading.normalize": lambda s: normalize(s, drop_apostrophes=True),
    "grading.words": lambda s: sorted(set(words(s, stop=grading._STOP, singular=True))),
    # and patient_checks' own plural rule (stems "-ies", spares "-ss", "-us", "-is"), which no option gives
    "patient_checks.words": lambda s: [singular(w) for w in words(s, split="letters", drop_apostrophes=True)],
    "check_split._norm": lambda s: normalize(s, split="space", lower=False),
    "meditod.normalize_text": lambda s: normalize(s, split="punct"),
}


@pytest.mark.parametrize("caller", list(CALLERS))
def test_each_caller_keeps_its_output(caller):
    assert [CALLERS[caller](s) for s in PINS["strings"]] == PINS[caller]


def test_the_callers_use_those_options():
    assert [grading.normalize(s) for s in PINS["strings"]] == PINS["grading.normalize"]
    assert [patient_words(s) for s in PINS["strings"]] == PINS["patient_checks.words"]


def test_rouge_is_unchanged_with_one_normalization():
    """ROUGE was given MediTOD's normalization and then a second one of its own; now the first only (and raw text
    gives the same figures: rouge-score keeps lower-cased ASCII letters and digits whatever we do)."""
    pairs = [tuple(p) for p in PINS["pairs"]]
    assert [rouge([normalize(h, split="punct")], [normalize(r, split="punct")]) for h, r in pairs] == PINS["rouge"]
    assert [rouge([h], [r]) for h, r in pairs] == PINS["rouge_raw"]
