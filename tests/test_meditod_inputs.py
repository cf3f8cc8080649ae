"""MediTOD inputs as the authors' released code builds them: windows, skip rules, messages,
retrieval key and order, the NLU status shape, supervised rendering and its loss mask, dry runs.

The dialogues here are written by hand so that every rule shows: utterance texts are ``t<u>`` (u =
position in the dialogue), so a window is read off its lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.studies.meditod.ontology import from_status_shape, load_ontology, prefixed_slots, render_ontology, to_status_shape
from experiments.studies.meditod.prompts import fit_icl_messages, icl_messages, parse_icl, parse_sft, sft_messages
from experiments.studies.meditod.retrieval import retrieve_exemplars
from models.prompt_format import ANSWER, render_sft
from experiments.studies.meditod.tasks import gold_turns, icl_samples, sft_samples

FX = Path(__file__).parent / "fixtures" / "meditod"


def _utt(u: int, speaker: str, state: dict | None = None) -> dict:
    x = {"speaker": speaker, "uttr_id": u, "text": f"t{u}"}
    if speaker == "patient":
        x["nlu"] = [{"intent": "inform", "slots": {"positive_symptom": [{"value": f"s{u}"}]}}]
        if state is not None:
            x["dialog_state"] = state
    else:
        x["actions"] = [{"action": "inquire", "symptom": [{"value": f"a{u}"}]}]
    return x


def _dialog(speakers: str, *, stateless: tuple = ()) -> dict:
    return {"utterances": [_utt(u, "doctor" if c == "d" else "patient", None if u in stateless else {"k": f"state{u}"})
                           for u, c in enumerate(speakers)]}


@pytest.fixture
def dialogs():
    # df: doctor first, ends with the doctor; pf: patient first, ends with the patient (its final utterance);
    # es: utterance 1 has no recorded dialogue state (empty state)
    return {"df": _dialog("dpdpdpdpd"), "pf": _dialog("pdpdp"), "es": _dialog("dpd", stateless=(1,))}


def L(*us):
    return [f"{'doctor' if sp == 'd' else 'patient'}: t{u}" for sp, u in us]


def by_id(samples):
    return {s["id"]: s for s in samples}


# ------------------------------------------------------------------ in-context windows and skip rules

def test_icl_nlu_window_first_utterance_and_dialogue_end(dialogs):
    s = by_id(icl_samples(dialogs, ["df", "pf"], "nlu"))
    assert sorted(s) == ["df/1", "df/3", "df/5", "df/7", "pf/0", "pf/2"]   # pf/4 is the dialogue's final utterance: skipped
    assert s["pf/0"]["history"] == [] and s["pf/0"]["last_turn"] == L(("p", 0))          # first utterance: the patient's alone
    assert s["df/1"]["history"] == [] and s["df/1"]["last_turn"] == L(("d", 0), ("p", 1))
    assert s["df/7"]["history"] == L(("p", 3), ("d", 4), ("p", 5))                        # at most 3 history lines
    assert s["df/7"]["last_turn"] == L(("d", 6), ("p", 7))
    assert s["df/7"]["retrieval_text"] == "doctor: t6\npatient: t7"                         # the key is the last turn only
    assert s["df/7"]["target"] == dialogs["df"]["utterances"][7]["nlu"]
    assert s["df/7"]["answer"] == [{"intent": "inform", "slots": {"symptom": [{"value": "s7", "status": "positive"}]}}]


def test_icl_pol_window_state_and_opening(dialogs):
    s = by_id(icl_samples(dialogs, ["df", "pf", "es"], "pol"))
    assert sorted(s) == ["df/0", "df/2", "df/4", "df/6", "df/8", "es/0", "es/2", "pf/1", "pf/3"]
    assert s["df/0"]["last_turn"] == [] and s["df/0"]["state"] == {} and not s["df/0"]["scored"]  # u = 0: sent, not scored
    assert s["df/2"]["last_turn"] == L(("d", 0), ("p", 1)) and s["df/2"]["state"] == {"k": "state1"} and s["df/2"]["scored"]
    assert s["df/8"]["last_turn"] == L(("d", 6), ("p", 7)) and s["df/8"]["history"] == []   # no history for POL
    assert s["df/8"]["state"] == {"k": "state7"}                                            # recorded on u - 1
    assert s["pf/1"]["last_turn"] == L(("p", 0)) and s["pf/1"]["state"] == {"k": "state0"}
    assert s["es/2"]["state"] == {}                                                          # nothing recorded: empty state
    user = icl_messages("pol", s["es/2"], [])[-1]["content"]
    assert user == "[dialog state]\n```\n{}\n```\n\n[last turn]\ndoctor: t0\npatient: t1\n\n[output]"
    assert json.loads(icl_messages("pol", s["df/2"], [])[-1]["content"].split("```\n")[1]) == {"k": "state1"}
    assert '{\n  "k": "state1"\n}' in icl_messages("pol", s["df/2"], [])[-1]["content"]      # indented JSON


def test_icl_nlg_actions_and_opening(dialogs):
    s = by_id(icl_samples(dialogs, ["df"], "nlg"))
    assert s["df/0"]["actions"] == {} and s["df/0"]["target"] == "t0" and not s["df/0"]["scored"]
    assert s["df/4"]["actions"] == dialogs["df"]["utterances"][4]["actions"] and s["df/4"]["last_turn"] == L(("d", 2), ("p", 3))
    user = icl_messages("nlg", s["df/0"], [])[-1]["content"]
    assert user == "[actions]\n```\n{}\n```\n\n[last turn]\n\n\n[output]"


def test_icl_nlu_layout_keeps_an_empty_history_block(dialogs):
    s = by_id(icl_samples(dialogs, ["df"], "nlu"))
    assert icl_messages("nlu", s["df/1"], [])[-1]["content"] == (
        "[dialog history]\n\n\n[last turn]\ndoctor: t0\npatient: t1\n\n[output]")
    assert icl_messages("nlu", s["df/5"], [])[-1]["content"] == (
        "[dialog history]\npatient: t1\ndoctor: t2\npatient: t3\n\n[last turn]\ndoctor: t4\npatient: t5\n\n[output]")


def test_sample_counts_follow_the_authors_rules():
    from experiments.studies.meditod.data import load_dialogs

    d = load_dialogs(FX / "dialogs.json")
    for did, dlg in d.items():
        utts = dlg["utterances"]
        sp = [u["speaker"] for u in utts]
        assert len(icl_samples(d, [did], "nlu")) == sum(1 for i, s in enumerate(sp) if s == "patient" and i + 1 < len(sp))
        for task in ("pol", "nlg"):
            assert len(icl_samples(d, [did], task)) == sp.count("doctor")
        paired = sum(1 for i, s in enumerate(sp) if s == "patient" and i + 1 < len(sp) and sp[i + 1] == "doctor")
        for task in ("nlu", "pol", "nlg"):
            assert len(sft_samples(d, [did], task)) == paired


# ------------------------------------------------------------------ messages, exemplar order, fitting

def test_messages_system_exemplars_most_similar_first_then_test(dialogs):
    test = by_id(icl_samples(dialogs, ["df"], "nlu"))["df/7"]
    ex = icl_samples(dialogs, ["pf"], "nlu")           # [pf/0, pf/2] as retrieved: most similar first
    msgs = icl_messages("nlu", test, ex)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "patient: t0" in msgs[1]["content"] and "patient: t2" in msgs[3]["content"]
    assert json.loads(msgs[2]["content"]) == ex[0]["answer"]
    assert msgs[-1]["content"].endswith("[last turn]\ndoctor: t6\npatient: t7\n\n[output]")
    system = msgs[0]["content"]
    for name in load_ontology()["intents"]:
        assert f"- {name}: " in system
    assert "- symptom: " in system and "status, one of: positive, negative, unknown" in system and "- disease:" not in system
    fitted, kept = fit_icl_messages("nlu", test, ex, budget_tokens=len(msgs[0]["content"]) // 3 + 60)
    assert kept == 0 and fitted == [msgs[0], msgs[-1]]          # the least similar go first; the test input stays
    fitted, kept = fit_icl_messages("nlu", test, ex, budget_tokens=None)
    assert kept == 2 and fitted == msgs


def test_pol_system_lists_actions_and_slots_without_statuses():
    text = render_ontology("pol")
    for name in load_ontology()["actions"]:
        assert f"- {name}: " in text
    assert "- disease: " in text and "status, one of" not in text


class _Encoder:
    """Embeds a text as a fixed vector per known key; records what it was asked to embed."""

    def __init__(self, table):
        self.table, self.seen = table, []

    def encode(self, texts, **_):
        self.seen += list(texts)
        return np.array([self.table.get(t, [0.0, 0.0, 1.0]) for t in texts], dtype=np.float32)


def test_retrieval_is_keyed_on_the_last_turn_most_similar_first(dialogs):
    test = [by_id(icl_samples(dialogs, ["df"], "nlu"))["df/7"]]
    train = icl_samples(dialogs, ["pf"], "nlu")
    enc = _Encoder({"doctor: t6\npatient: t7": [1.0, 0.0, 0.0], "patient: t0": [0.6, 0.8, 0.0], "doctor: t1\npatient: t2": [0.9, 0.1, 0.0]})
    got = retrieve_exemplars(test, train, 2, enc)
    assert [e["id"] for e in got[0]] == ["pf/2", "pf/0"]
    assert set(enc.seen) == {"doctor: t6\npatient: t7", "patient: t0", "doctor: t1\npatient: t2"}


# ------------------------------------------------------------------ NLU status shape

def test_status_shape_round_trip_and_invalid_status():
    gold = [{"intent": "inform", "slots": {"positive_symptom": [{"value": "cough"}], "negative_symptom": [{"value": "fever"}],
                                           "avail_medical_test": [{"value": "x-ray"}], "occupation": [{"value": "nurse", "status": "true"}]}},
            {"intent": "chit-chat"}]
    shaped = to_status_shape(gold)
    assert shaped[0]["slots"]["symptom"] == [{"value": "cough", "status": "positive"}, {"value": "fever", "status": "negative"}]
    assert shaped[0]["slots"]["medical_test"] == [{"value": "x-ray", "status": "avail"}]
    assert shaped[0]["slots"]["occupation"] == [{"value": "nurse", "status": "true"}]   # no prefix: kept as it is
    assert from_status_shape(shaped) == gold
    odd = [{"intent": "inform", "slots": {"symptom": [{"value": "a"}, {"value": "b", "status": "maybe"}],
                                          "medical_test": [{"value": "c", "status": "positive"}]}}]
    assert from_status_shape(odd)[0]["slots"] == {"unknown_symptom": [{"value": "a"}, {"value": "b"}],
                                                  "unknown_medical_test": [{"value": "c"}]}
    assert parse_icl("nlu", 'Here: [{"intent": "inform", "slots": {"symptom": [{"value": "Cough", "status": "Positive"}]}}]') == [
        {"intent": "inform", "slots": {"positive_symptom": [{"value": "cough"}]}}]
    assert parse_icl("pol", "no json") is None


def test_every_label_of_the_fixtures_is_in_the_ontology():
    from experiments.studies.meditod.data import load_dialogs
    from experiments.studies.meditod.ontology import split_slot

    ont = load_ontology()
    d = load_dialogs(FX / "dialogs.json")
    seen = {"intent": set(), "action": set(), "slot": set(), "attr": set()}
    for dlg in d.values():
        for u in dlg["utterances"]:
            for e in u.get("nlu", []):
                seen["intent"].add(e["intent"])
                for name, items in (e.get("slots") or {}).items():
                    slot = split_slot(name)[0]
                    seen["slot"].add(slot)
                    seen["attr"] |= {(slot, a) for it in items for a in it}
            for name, items in (u.get("dialog_state") or {}).items():
                slot = split_slot(name)[0]
                seen["slot"].add(slot)
                seen["attr"] |= {(slot, a) for it in items for a in it}
            for a in u.get("actions", []):
                seen["action"].add(a["action"])
                for slot, items in a.items():
                    if slot == "action":
                        continue
                    seen["slot"].add(slot)
                    seen["attr"] |= {(slot, c["type"]) for it in items for c in it.get("checks", [])}
    assert seen["intent"] and seen["action"] and seen["attr"]
    assert seen["intent"] <= set(ont["intents"])
    assert seen["action"] <= set(ont["actions"])
    assert seen["slot"] <= set(ont["slots"])
    assert {(s, a) for s, a in seen["attr"] if a not in ont["slots"][s]["attributes"]} == set()
    assert set(prefixed_slots()) == {"symptom", "medical_history", "family_history", "habit", "exposure", "medication", "medical_test"}


# ------------------------------------------------------------------ supervised samples, rendering, loss mask

def test_sft_windows_pairs_and_ids(dialogs):
    nlu = by_id(sft_samples(dialogs, ["df", "pf"], "nlu"))
    assert sorted(nlu) == ["df/1", "df/3", "df/5", "df/7", "pf/0", "pf/2"]     # pf/4 has no doctor reply
    assert nlu["pf/0"]["history"] == [] and nlu["pf/0"]["last_turn"] == L(("p", 0))
    assert nlu["df/1"]["last_turn"] == L(("d", 0), ("p", 1)) and nlu["df/1"]["history"] == []
    assert nlu["df/7"]["history"] == L(("d", 4), ("p", 5)) and nlu["df/7"]["last_turn"] == L(("d", 6), ("p", 7))
    assert nlu["df/7"]["target"] == dialogs["df"]["utterances"][7]["nlu"]          # the data's prefixed shape
    pol = by_id(sft_samples(dialogs, ["df"], "pol"))
    assert sorted(pol) == ["df/2", "df/4", "df/6", "df/8"]                          # keyed by the doctor's reply
    assert pol["df/8"]["state"] == {"k": "state7"} and pol["df/8"]["target"] == dialogs["df"]["utterances"][8]["actions"]
    assert pol["df/8"]["history"] == L(("d", 4), ("p", 5))
    nlg = by_id(sft_samples(dialogs, ["df"], "nlg"))
    assert nlg["df/8"]["history"] == [] and nlg["df/8"]["target"] == "t8" and nlg["df/8"]["actions"] == dialogs["df"]["utterances"][8]["actions"]


def test_sft_user_blocks(dialogs):
    s = by_id(sft_samples(dialogs, ["df"], "pol"))["df/8"]
    m = sft_messages("pol", s)
    assert [x["role"] for x in m] == ["system", "user", "assistant"]
    assert m[1]["content"] == ('[dialog state]\n{"k": "state7"}\n\n[dialog history]\ndoctor: t4\npatient: t5\n\n'
                               "[last turn]\ndoctor: t6\npatient: t7\n\n[output]")
    assert m[2]["content"] == '[answer] [{"action": "inquire", "symptom": [{"value": "a8"}]}] [done]'
    first = by_id(sft_samples(dialogs, ["df"], "nlu"))["df/1"]
    assert sft_messages("nlu", first)[1]["content"] == "[last turn]\ndoctor: t0\npatient: t1\n\n[output]"  # no empty history block
    g = by_id(sft_samples(dialogs, ["df"], "nlg"))["df/2"]
    assert sft_messages("nlg", g)[1]["content"].startswith('[action]\n[{"action": "inquire"')
    assert render_sft(sft_messages("nlg", g, with_answer=False), "completion").endswith("[output]\n[answer]")


def test_parse_sft_lowercases_cuts_and_counts_format_errors():
    assert parse_sft("nlu", ' [{"intent": "Inform"}] [done] trailing') == [{"intent": "inform"}]
    assert parse_sft("nlu", ' [{"intent": "inform"} [done]') is None
    assert parse_sft("pol", ' {"action": "inquire"} [done]') is None        # not a list: a format error
    assert parse_sft("nlg", " Any Fever? [done] more") == "any fever?"


@pytest.fixture(scope="module")
def tokenizer():
    from experiments.studies.meditod.prompts import load_tokenizer

    tok = load_tokenizer("embedded")
    assert tok is not None and tok.chat_template  # the embedded model is prepared with medstack's chat template
    return tok


@pytest.mark.parametrize("fmt", ["completion", "chat"])
def test_loss_mask_starts_after_the_response_marker(dialogs, tokenizer, fmt):
    from finetune.data import IGNORE_INDEX, render_pair, tokenize_pair

    s = by_id(sft_samples(dialogs, ["df"], "nlu"))["df/7"]
    prompt, rest = render_pair(tokenizer, sft_messages("nlu", s), fmt)
    assert prompt.endswith(ANSWER) and rest.startswith(" [{") and "[done]" in rest
    row = tokenize_pair(tokenizer, prompt, rest, 1024, fmt)
    first = next(i for i, x in enumerate(row["labels"]) if x != IGNORE_INDEX)
    assert tokenizer.decode(row["input_ids"][:first]).endswith(ANSWER)
    assert all(x == IGNORE_INDEX for x in row["labels"][:first])
    learned = tokenizer.decode([x for x in row["labels"] if x != IGNORE_INDEX])
    assert learned.strip().startswith('[{"intent": "inform"') and "[done]" in learned
    assert ANSWER not in learned and "patient: t7" not in learned
    if fmt == "completion":
        assert row["input_ids"][0] == tokenizer.bos_token_id and row["labels"][-1] == tokenizer.eos_token_id
    else:
        assert row["input_ids"].count(tokenizer.bos_token_id) == 1
        # inference renders the same prefix: the chat template's generation prompt + [answer]
        gen = render_sft(sft_messages("nlu", s, with_answer=False), "chat", tokenizer)
        assert gen == prompt


def test_gold_turns_for_scoring_are_all_labelled_turns(dialogs):
    assert [g["id"] for g in gold_turns(dialogs, ["pf"], "nlu")] == ["pf/0", "pf/2", "pf/4"]
    assert [g["id"] for g in gold_turns(dialogs, ["df"], "pol")] == ["df/2", "df/4", "df/6", "df/8"]


# ------------------------------------------------------------------ dry runs (no server, nothing sent)

@pytest.mark.parametrize("task,n", [("nlu", 3), ("pol", 4), ("nlg", 4)])
def test_run_dry_run_writes_every_request_and_no_results(cli, tmp_path, task, n):
    out = tmp_path / "d"
    r = cli("run", f"meditod-{task}", "--data", str(FX / "dialogs.json"), "--mode", "icl", "--k", "2", "--dry-run", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(x) for x in (out / "dry-run.jsonl").read_text().splitlines()]
    assert sorted(p.name for p in out.iterdir()) == ["dry-run.jsonl"]          # no records, metrics, identity, cache
    assert len(rows) == n and [r["case_id"] for r in rows] == [s["id"] for s in icl_samples(
        __import__("experiments.studies.meditod.data", fromlist=["x"]).load_dialogs(FX / "dialogs.json"), ["301"], task)]
    for row in rows:
        assert row["role"] == "model" and row["step"] == "predict" and row["kind"] == "chat" and "prompt" not in row
        roles = [m["role"] for m in row["messages"]]
        assert roles[0] == "system" and roles[-1] == "user" and roles[1:-1] == ["user", "assistant"] * ((len(roles) - 2) // 2)
        assert row["messages"][-1]["content"].endswith("[output]")
    r = cli("run", f"meditod-{task}", "--data", str(FX / "dialogs.json"), "--k", "0", "--limit", "1", "--dry-run", "--out", str(out))
    assert r.returncode == 0 and len((out / "dry-run.jsonl").read_text().splitlines()) == 1


def test_run_dry_run_supervised_sends_the_training_rendering(cli, tmp_path):
    out = tmp_path / "s"
    r = cli("run", "meditod-pol", "--data", str(FX / "dialogs.json"), "--mode", "supervised", "--dry-run", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(x) for x in (out / "dry-run.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(x["kind"] == "completion" for x in rows)      # 301: 4 patient turns, 3 answered
    assert rows[0]["prompt"].endswith("[output]\n[answer]") and rows[0]["gen"]["stop"] == ["[done]"]


def test_finetune_dry_run_without_and_with_a_tokenizer(cli, tmp_path):
    out = tmp_path / "ft"
    r = cli("finetune", "meditod-nlu", "--data", str(FX / "dialogs.json"), "--base", "llama3-8b-instruct", "--dry-run", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert {x["split"] for x in rows} == {"train", "valid"} and all("text" not in x for x in rows)
    assert [m["role"] for m in rows[0]["messages"]] == ["system", "user", "assistant"]
    assert sum(x["split"] == "train" for x in rows) == 4 and sum(x["split"] == "valid" for x in rows) == 1
    r = cli("finetune", "meditod-nlu", "--data", str(FX / "dialogs.json"), "--base", "embedded", "--set", "data.prompt_format=chat",
            "--limit", "2", "--dry-run", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert sum(x["split"] == "train" for x in rows) == 2
    assert all(x["text"].startswith("<bos><start_of_turn>user\n") and x["text"].rstrip().endswith("[done]<end_of_turn>") for x in rows)
