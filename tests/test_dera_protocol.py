"""DERA protocol logic with a deterministic scripted chat backend (no server)."""

from __future__ import annotations

import asyncio

import pytest

from experiments.dera import dialogue, gptf1, qa
from experiments.dera.calls import CaseLog
from experiments.dera.settings import DialogueSettings, QASettings, Sampling
from serving.client import ChatResult, GenConfig


class ScriptedClient:
    """Answers each call with ``reply(role, prompt, gen)``; keeps every request."""

    def __init__(self, reply):
        self.reply = reply
        self.requests: list[tuple[str, str, GenConfig]] = []

    async def chat(self, messages, role="default", gen=GenConfig()):
        prompt = messages[-1]["content"]
        self.requests.append((role, prompt, gen))
        out = self.reply(role, prompt, gen)
        if isinstance(out, ChatResult):
            return out
        texts = out if isinstance(out, list) else [out] * gen.n
        return ChatResult(texts=texts, prompt_tokens=10, completion_tokens=5, finish_reasons=["stop"] * len(texts))

    async def complete(self, prompt, role="default", gen=GenConfig()):
        return await self.chat([{"role": "user", "content": prompt}], role, gen)


SUMMARY = "\n".join(f"{s}: text about {s.lower()}." for s in DialogueSettings().sections)
ENC = {"id": "e1", "age": 40, "sex": "female", "chief_complaint": "cough",
       "chat": [{"speaker": "doctor", "text": "What brings you in?"}, {"speaker": "patient", "text": "A cough for a week."}]}


def run(coro):
    return asyncio.run(coro)


def test_researcher_stop_tag_ends_dialogue():
    calls = {"researcher": 0}

    def reply(role, prompt, gen):
        if role == "researcher":
            calls["researcher"] += 1
            return '[RESPONSE: "Positives omit the fever."]' if calls["researcher"] == 1 else "[STOP]"
        return '[RESPONSE: "Agreed."] [SCRATCHPAD: "Pertinent Positives: add fever"]'

    log = CaseLog(ScriptedClient(reply), seed=1)
    out = run(dialogue.run_dialogue(log, ENC, {s: "x" for s in DialogueSettings().sections}, DialogueSettings()))
    assert out["stop_reason"] == "researcher_stop"
    assert [m["agent"] for m in out["transcript"]] == ["researcher", "decider", "researcher"]
    assert [m["turn"] for m in out["transcript"]] == [1, 2, 3]
    assert out["scratchpad"] == ["Pertinent Positives: add fever"]


def test_turn_cap_counts_all_messages():
    def reply(role, prompt, gen):
        if role == "researcher":
            return '[RESPONSE: "Check negatives."]'
        return '[RESPONSE: "Fine."] [SCRATCHPAD: "none"]'

    client = ScriptedClient(reply)
    log = CaseLog(client, seed=1)
    out = run(dialogue.run_dialogue(log, ENC, {}, DialogueSettings()))
    assert out["stop_reason"] == "turn_cap"
    assert out["turns"] == 15 and len(client.requests) == 15
    assert out["transcript"][-1]["agent"] == "researcher"  # 8 researcher + 7 decider messages
    assert out["scratchpad"] == []  # "none" is not a correction
    out4 = run(dialogue.run_dialogue(CaseLog(ScriptedClient(reply), 1), ENC, {}, DialogueSettings(max_turns=4)))
    assert out4["turns"] == 4 and out4["transcript"][-1]["agent"] == "decider"


def test_scratchpad_accumulates_and_reaches_final_rewrite():
    n = {"d": 0}

    def reply(role, prompt, gen):
        if role == "researcher":
            return '[RESPONSE: "Another point."]'
        if "Discussion so far" not in prompt:  # the initial summary and the final rewrite
            return SUMMARY
        n["d"] += 1
        return f'[RESPONSE: "ok {n["d"]}"] [SCRATCHPAD: "fix {n["d"]}a"] [SCRATCHPAD: "fix {n["d"]}b"]'

    client = ScriptedClient(reply)
    settings = DialogueSettings(max_turns=6)
    rec = run(dialogue.make_solver(client, settings, "m")(ENC))
    assert rec["scratchpad"] == ["fix 1a", "fix 1b", "fix 2a", "fix 2b", "fix 3a", "fix 3b"]
    final_prompt = [p for r, p, g in client.requests if "Agreed corrections:" in p][0]
    for line in rec["scratchpad"]:
        assert f"- {line}" in final_prompt
    assert rec["final"]["Pertinent Positives"] == "text about pertinent positives."
    assert [m["agent"] for m in rec["transcript"]][:2] == ["researcher", "decider"]
    assert rec["prompt_hashes"]["summarize_decider_final"] and rec["model"] == "m"
    # sampling: the paper's summarization settings with the per-case seed on every request
    gens = {g for _, _, g in client.requests if g.max_tokens == 512}
    assert all(g.temperature == 1.0 and g.top_p == 1.0 and g.seed == rec["seed"] for g in gens)


def test_malformed_tags_are_kept_and_counted():
    def reply(role, prompt, gen):
        if role == "researcher":
            return "I think the positives are wrong."  # no tag, no stop
        if "Agreed corrections:" in prompt:
            return "nothing useful"
        return "Sure, fixed it."  # no tags

    rec = run(dialogue.make_solver(ScriptedClient(reply), DialogueSettings(max_turns=2), "m")(ENC))
    assert rec["transcript"][0]["content"] == "I think the positives are wrong."
    assert rec["transcript"][1]["content"] == "Sure, fixed it."
    steps = [e["step"] for e in rec["parse_errors"]]
    assert "researcher:1" in steps and "decider:2" in steps and "decider:final" in steps and "decider:initial" in steps
    # sections the final rewrite lacks keep the initial text
    assert set(rec["final_sections_kept_from_initial"]) == set(DialogueSettings().sections)


def test_failed_request_ends_dialogue_as_error():
    def reply(role, prompt, gen):
        if role == "researcher":
            return ChatResult(error="HTTP 500: boom")
        return "x"

    out = run(dialogue.run_dialogue(CaseLog(ScriptedClient(reply), 1), ENC, {}, DialogueSettings()))
    assert out["stop_reason"] == "error" and out["turns"] == 0


def test_context_overflow_drops_oldest_history():
    def reply(role, prompt, gen):
        if prompt.count("Researcher: ") > 1:
            return ChatResult(error="HTTP 400: This model's maximum context length is 2048 tokens.")
        return '[RESPONSE: "go on"] [SCRATCHPAD: "none"]'

    log = CaseLog(ScriptedClient(reply), 1)
    out = run(dialogue.run_dialogue(log, ENC, {}, DialogueSettings(max_turns=5)))
    assert out["turns"] == 5 and out["stop_reason"] == "turn_cap"
    assert any(c.get("dropped_history") for c in log.calls)


# -- QA -------------------------------------------------------------------------------------------

def test_majority_vote_and_tie_rule():
    assert qa.majority_vote(["b", "a", "a", "b", "c"]) == "b"  # tie a/b: b came first
    assert qa.majority_vote(["x", "y", "y", "z", "y"]) == "y"
    assert qa.majority_vote([None, "", "q"]) == "q"
    assert qa.majority_vote([None, None]) is None
    assert qa.majority_vote(["Graves disease", "graves disease"]) == "Graves disease"  # exact strings


def test_vote_distribution_text():
    assert qa.vote_distribution_text(["A", "B", "A", "A", "B"]) == "'A' 60%, 'B' 40%"
    assert qa.vote_distribution_text(["B", "A", None, "A", "B"]) == "'B' 50%, 'A' 50%"
    assert qa.vote_distribution_text([None]) == "no usable answers"


def test_answer_from_completion():
    assert qa.answer_from_completion(" Scrotal ultrasound.\nQuestion: next", mcq=False) == "Scrotal ultrasound"
    assert qa.answer_from_completion("Answer: Bradykinin", mcq=False) == "Bradykinin"
    assert qa.answer_from_completion("   ", mcq=False) is None
    assert qa.answer_from_completion("Answer: (C) Graves", mcq=True) == "C"


Q = {"id": "q1", "question_open": "What vitamin deficiency causes scurvy?", "answer": "Vitamin C",
     "options": {"A": "Vitamin A", "B": "Vitamin C"}, "answer_idx": "B"}


def qa_reply(role, prompt, gen):
    if role == "judge":
        return "True\nSame vitamin." if "Answer 1" in prompt else "0.9"
    if role == "researcher":
        return "Consider 'bleeding gums' in the question. STOP" if "Student: Answer: Vitamin C" in prompt else "What does 'scurvy' suggest?"
    if "Here is a discussion" in prompt:
        return "Vitamin C"
    if "Reply in this form" in prompt:
        return "Answer: Vitamin C\nResponse: It is ascorbic acid."
    if "explain what in the question" in prompt:
        return "The answers split between two vitamins."
    return ["Vitamin D", "Vitamin C", "Vitamin D", "Vitamin C", "Vitamin B1"]


async def no_scores(log, q, answers):
    return {"oneshot": {}, "dera": {"exact": 1}}


def test_qa_protocol_settings_and_flow():
    client = ScriptedClient(qa_reply)
    settings = QASettings()
    rec = run(qa.make_solver(client, settings, "m", no_scores)(Q))
    assert rec["oneshot"]["vote"] == "Vitamin D"  # tie D/C, D first
    assert rec["oneshot"]["distribution_text"] == "'Vitamin D' 40%, 'Vitamin C' 40%, 'Vitamin B1' 20%"
    assert rec["answers"] == {"oneshot": "Vitamin D", "dera": "Vitamin C"} and rec["answer_changed"]
    assert rec["stop_reason"] == "researcher_stop" and rec["turns"] == 2
    assert [m["agent"] for m in rec["transcript"]] == ["decider", "researcher", "decider", "researcher"]
    gens = [g for _, _, g in client.requests]
    assert (gens[0].temperature, gens[0].max_tokens, gens[0].n) == (0.7, 50, 5) and gens[0].seed == rec["seed"]
    assert (gens[1].temperature, gens[1].max_tokens) == (0.0, 400)
    assert all((g.temperature, g.max_tokens, g.frequency_penalty) == (0.3, 250, 0.5) for g in gens[2:5])
    final = gens[5]  # greedy x5: asked once, copied (vLLM refuses n>1 without sampling)
    assert (final.temperature, final.max_tokens, final.n) == (0.0, 100, 1)
    assert rec["final"]["answers"] == ["Vitamin C"] * 5
    final_prompt = client.requests[5][1]
    assert "Teacher: What does 'scurvy' suggest?" in final_prompt and "Question: What vitamin deficiency" in final_prompt
    assert rec["correct"] == 1


def test_qa_turn_cap_three():
    def reply(role, prompt, gen):
        return "Keep thinking about 'scurvy'." if role == "researcher" else qa_reply(role, prompt, gen)

    client = ScriptedClient(reply)
    rec = run(qa.make_solver(client, QASettings(), "m", no_scores)(Q))
    assert rec["stop_reason"] == "turn_cap" and rec["turns"] == 3
    assert sum(1 for r, _, _ in client.requests if r == "researcher") == 3
    assert rec["stated_answers"] == ["Vitamin C"] * 3


def test_seed_is_deterministic_per_case():
    from experiments.dera.calls import case_seed

    assert case_seed(0, "q1") == case_seed(0, "q1")
    assert case_seed(0, "q1") != case_seed(0, "q2") and case_seed(1, "q1") != case_seed(0, "q1")


# -- GPT-F1 ---------------------------------------------------------------------------------------

def test_prf_arithmetic():
    r = gptf1.prf(n_gt=4, tp_gt=3, n_pred=5, tp_pred=2)
    assert r["recall"] == pytest.approx(0.75) and r["precision"] == pytest.approx(0.4)
    assert r["f1"] == pytest.approx(2 * 0.4 * 0.75 / 1.15)
    assert gptf1.prf(0, 0, 0, 0) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert gptf1.prf(3, 0, 0, 0)["f1"] == 0.0
    assert gptf1.prf(2, 2, 2, 2)["f1"] == 1.0


def test_gptf1_section_with_scripted_judge():
    gt, pred = "Fever, cough and COVID.", "Cough and COVID-19 and rash."

    def reply(role, prompt, gen):
        assert role == "judge" and gen.temperature == 0 and gen.max_tokens == 200
        if "List the medical concepts" in prompt:
            return '["fever", "cough", "COVID"]' if gt in prompt else '["cough", "COVID-19", "rash"]'
        if gt in prompt.split("Concepts already")[0]:  # precision: pred concepts looked up in the ground truth
            return "[1, 2]"
        return "[2, 3]"  # recall: cough, COVID found in the prediction

    log = CaseLog(ScriptedClient(reply), 1)
    res = run(gptf1.score_summary(log, {"S": gt}, {"S": pred}, ["S"], DialogueSettings().gptf1, label="t"))
    s = res["sections"]["S"]
    assert s["gt_concepts"] == ["fever", "cough", "COVID"] and s["pred_concepts"] == ["cough", "COVID-19", "rash"]
    assert s["recall"] == pytest.approx(2 / 3) and s["precision"] == pytest.approx(2 / 3) and s["f1"] == pytest.approx(2 / 3)
    assert res["average"]["f1"] == pytest.approx(2 / 3)


def test_gptf1_unparseable_judge_is_unscored():
    log = CaseLog(ScriptedClient(lambda r, p, g: "" if "List" in p else "[1]"), 1)
    res = run(gptf1.score_summary(log, {"S": "fever"}, {"S": "cough"}, ["S"], DialogueSettings().gptf1, label="t"))
    assert res["sections"]["S"]["scored"] is False and res["sections"]["S"]["f1"] is None
    assert res["unscored_sections"] == 1 and res["average"]["f1"] is None and log.parse_errors


def test_corruption_touches_only_chosen_sections():
    settings = DialogueSettings(task="corrupt", corruption_level=5)

    def reply(role, prompt, gen):
        if "less faithful" in prompt:
            assert "strength of 5 out of 10" in prompt
            return "Pertinent Positives: no cough.\nDemographics and Social Determinants of Health: changed!"
        return SUMMARY

    log = CaseLog(ScriptedClient(reply), 1)
    ref = {s: f"ref {s}" for s in settings.sections}
    out, _ = run(dialogue.corrupt(log, ref, settings))
    assert out["Pertinent Positives"] == "no cough."
    assert out["Demographics and Social Determinants of Health"] == ref["Demographics and Social Determinants of Health"]
    assert out["Medical History"] == ref["Medical History"]  # missing from the reply: unchanged, counted
    assert log.parse_errors


def test_sampling_config_gen():
    g = Sampling(temperature=0.3, max_tokens=250, frequency_penalty=0.5).gen(7)
    assert (g.temperature, g.max_tokens, g.frequency_penalty, g.seed, g.n) == (0.3, 250, 0.5, 7, 1)


def test_mcq_variant_votes_letters_and_scores_accuracy():
    from experiments.dera.qa_metrics import make_scorer

    def reply(role, prompt, gen):
        if role == "researcher":
            assert "Options: A) Vitamin A  B) Vitamin C" in prompt
            return "STOP"
        if "Here is a discussion" in prompt:
            return "B"
        if "explain what in the question" in prompt:
            return "Split between A and B."
        assert "Options: A) Vitamin A  B) Vitamin C" in prompt
        return ["A", "B) Vitamin C", "Answer: A", "B", "(A)"]

    settings = QASettings(mcq=True)
    rec = run(qa.make_solver(ScriptedClient(reply), settings, "m", make_scorer(settings))(Q))
    assert rec["oneshot"]["answers"] == ["A", "B", "A", "B", "A"] and rec["answers"] == {"oneshot": "A", "dera": "B"}
    assert rec["scores"]["oneshot"]["accuracy"] == 0 and rec["scores"]["dera"]["accuracy"] == 1 and rec["correct"] == 1
    assert rec["gold"] == "B"


def test_careplan_prompts_render_with_sections():
    from experiments.dera.prompts import prompt_hash, render

    text = render("careplan_decider_initial", age=50, sex="male", chief_complaint="cough", chat="Doctor: hi")
    for s in ("Medications", "Referrals", "Tests", "Lifestyle", "Supportive Care"):
        assert s in text
    assert "$" not in render("careplan_researcher", age=1, sex="f", chief_complaint="x", chat="c", summary="s", review_sections="Tests", dialogue="d")
    assert len(prompt_hash("careplan_decider_final")) == 12


def test_gptf1_empty_reference_is_unscored_and_empty_prediction_scores_zero():
    def reply(role, prompt, gen):
        return '["fever"]' if "List the medical concepts" in prompt else "[1]"

    log = CaseLog(ScriptedClient(reply), 1)
    res = run(gptf1.score_summary(log, {"A": "", "B": "fever for two days"}, {"A": "", "B": ""}, ["A", "B"],
                                  DialogueSettings().gptf1, label="t"))
    a, b = res["sections"]["A"], res["sections"]["B"]
    # no reference text: nothing to score against (not a perfect 1.0 for two unparsed summaries)
    assert a["scored"] is False and a["f1"] is None and a["reason"] == "empty reference section"
    # a reference concept the (empty) prediction misses: recall 0, precision 0 (no predicted concepts)
    assert b["scored"] is True and b["recall"] == 0.0 and b["precision"] == 0.0 and b["f1"] == 0.0
    assert res["unscored_sections"] == 1 and res["average"]["f1"] == 0.0
