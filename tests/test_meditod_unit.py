"""MediTOD data loading, samples, prompts, retrieval, prediction scoring CLI and the run loop (scripted client)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from experiments.meditod import run as run_mod
from experiments.meditod.data import load_dialogs, load_split_ids
from experiments.meditod.prompts import STOP, estimate_tokens, fit_icl_prompt, icl_prompt, supervised_prompt
from experiments.meditod.retrieval import top_k
from experiments.meditod.tasks import build_samples, compact_json
from models.errors import DataError
from serving.client import ChatResult

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
    r = cli("score", "meditod-nlg", "--data", str(DATA), "--pred", str(pred), "--no-bertscore")
    assert "| BLEU-2 | 100.00 |" in r.stdout


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


# ------------------------------------------------------------------ the run loop with a scripted client

class ScriptedClient:
    """Stands in for LLMClient: answers each prompt with the gold of the test turn (or junk for one turn)."""

    def __init__(self, answers: dict[str, str]):
        self.answers = answers
        self.prompts: list[str] = []
        self.gens = []

    async def complete(self, prompt, role="default", gen=None):
        self.prompts.append(prompt)
        self.gens.append(gen)
        for needle, answer in self.answers.items():
            if needle in prompt.rsplit("### Now your turn", 1)[-1]:
                return ChatResult(texts=[answer], prompt_tokens=len(prompt) // 4, completion_tokens=7)
        return ChatResult(texts=["I am not sure."], prompt_tokens=len(prompt) // 4, completion_tokens=4)

    def usage_summary(self):
        n = len(self.prompts)
        return {"total": {"requests": n, "failed": 0, "cache_hits": 0, "prompt_tokens": 0, "completion_tokens": 7 * n}}


def _fake_open_client(client):
    @contextlib.asynccontextmanager
    async def fake(roles, **kw):
        yield client, {r: {"alias": a} for r, a in roles.items()}
    return fake


def test_run_loop_scores_resumes_and_compares(tmp_path, monkeypatch, dialogs):
    import serving.session

    answers = {  # POL test turns of 301: answer 301/2 and 301/4 with gold, 301/6 with junk
        "Patient: I have been short of breath for two weeks.\nDialogue state": compact_json(dialogs["301"]["utterances"][2]["actions"]),
        "Patient: Yes, it is getting worse every day.\nDialogue state": "Output: " + compact_json(dialogs["301"]["utterances"][4]["actions"]) + " trailing",
    }
    client = ScriptedClient(answers)
    monkeypatch.setattr(serving.session, "open_client", _fake_open_client(client))
    data = tmp_path / "d"
    shutil.copytree(FX, data)
    s = run_mod.MeditodSettings(task="pol", data=str(data / "dialogs.json"), out=str(tmp_path / "runs" / "pol-icl"), k=2,
                                roles={"default": "embedded"})
    m = asyncio.run(run_mod.run(s, log=lambda *_: None))
    assert len(client.prompts) == 3 and all(g.temperature == 0.0 and g.stop == STOP for g in client.gens)
    assert all(p.count("### Example") == 2 for p in client.prompts)
    # turn 2 and 4 exact; turn 6 is a lone inquire (skipped) answered with prose -> format error
    assert m["f1"] == 1.0 and m["scored_turns"] == 2 and m["format_errors"] == 0
    assert m["p@1"] == pytest.approx(2 / 3) and m["joint_accuracy"] == pytest.approx(2 / 3)
    recs = [json.loads(line) for line in (Path(s.out) / "records.jsonl").read_text().splitlines()]
    assert [r["id"] for r in recs] and {r["id"] for r in recs} == {"301/2", "301/4", "301/6"}
    r0 = next(r for r in recs if r["id"] == "301/2")
    assert r0["correct"] == 1 and r0["exemplars_kept"] == 2 and len(r0["exemplar_ids"]) == 2 and r0["prompt_hash"]
    assert r0["transcript"][0] == {"agent": "doctor", "content": "Hello, what brings you here today?", "turn": 0}
    assert next(r for r in recs if r["id"] == "301/6")["parse_error"] is True
    summary = (Path(s.out) / "summary.md").read_text()
    assert "| P@1 | 0.6667 |" in summary and "tokens/s" in summary
    # resume: nothing is asked again
    asyncio.run(run_mod.run(s, log=lambda *_: None))
    assert len(client.prompts) == 3
    # the supervised run in the sibling folder shows both columns side by side
    s2 = s.model_copy(update={"mode": "supervised", "k": 0, "out": str(tmp_path / "runs" / "pol-supervised")})
    asyncio.run(run_mod.run(s2, log=lambda *_: None))
    assert client.prompts[-1].startswith("Task:") and "### Example" not in client.prompts[-1]
    summary2 = (Path(s2.out) / "summary.md").read_text()
    assert "| metric | supervised (embedded) | icl (embedded) |" in summary2


def test_supervised_prompt_fits_by_dropping_history(dialogs):
    from experiments.meditod.prompts import fit_supervised_prompt

    x = build_samples(dialogs, ["301"], "pol")[2]          # 5 history utterances
    full, h = fit_supervised_prompt("pol", x)
    assert h is None and full == supervised_prompt("pol", x)
    p, h = fit_supervised_prompt("pol", x, budget_tokens=estimate_tokens(full) - 20)
    assert h is not None and h < len(x["context"]) and p.endswith("Output:\n") and "Dialogue state:" in p


class FailingClient(ScriptedClient):
    async def complete(self, prompt, role="default", gen=None):
        self.prompts.append(prompt)
        return ChatResult(error="gave up after 6 attempts: APIConnectionError")


def test_failed_requests_are_asked_again_on_resume(tmp_path, monkeypatch, dialogs):
    import serving.session

    s = run_mod.MeditodSettings(task="nlu", data=str(DATA), out=str(tmp_path / "nlu-icl"), k=0, limit=2, roles={"default": "embedded"})
    bad = FailingClient({})
    monkeypatch.setattr(serving.session, "open_client", _fake_open_client(bad))
    m = asyncio.run(run_mod.run(s, log=lambda *_: None))
    assert m["request_errors"] == 2 and m["format_errors"] == 2      # a failed request is never fatal
    good = ScriptedClient({"short of breath for two weeks.\nOutput": compact_json(dialogs["301"]["utterances"][1]["nlu"]),
                           "worse every day.\nOutput": compact_json(dialogs["301"]["utterances"][3]["nlu"])})
    monkeypatch.setattr(serving.session, "open_client", _fake_open_client(good))
    m = asyncio.run(run_mod.run(s, log=lambda *_: None))
    assert len(good.prompts) == 2 and m["request_errors"] == 0 and m["f1"] == 1.0 and m["turns"] == 2


def test_adjudication_loop_rescoring(tmp_path, monkeypatch):
    import serving.session

    pred = [{"intent": "inform", "slots": {"positive_symptom": [{"value": "dyspnea", "onset": "2 weeks back"}]}}]
    client = ScriptedClient({"short of breath for two weeks.\nOutput": compact_json(pred),
                             "Phrase 1: two weeks ago\nPhrase 2: 2 weeks back": "positive"})
    monkeypatch.setattr(serving.session, "open_client", _fake_open_client(client))
    s = run_mod.MeditodSettings(task="nlu", data=str(DATA), out=str(tmp_path / "adj"), k=0, limit=1,
                                roles={"default": "embedded"}, adjudicate_model="judge")
    m = asyncio.run(run_mod.run(s, log=lambda *_: None))
    # gold: head dyspnea (canonical) + onset "two weeks ago" (non-canonical); exact: non-canonical TP 0 FP 1 FN 1
    assert m["medical_f1"] == 1.0 and m["non_medical_f1"] == 0.0 and m["f1"] == 0.5
    adj = m["adjudicated"]
    assert adj["pairs_judged"] == 1 and adj["unparsed_verdicts"] == 0 and adj["non_medical_f1"] == 1.0 and adj["f1"] == 1.0
    line = json.loads((tmp_path / "adj" / "adjudications.jsonl").read_text())
    assert line["gold"] == "two weeks ago" and line["same"] is True
    assert "icl + adjudication" in (tmp_path / "adj" / "summary.md").read_text()
