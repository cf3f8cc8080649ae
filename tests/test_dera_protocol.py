"""DERA protocol logic with a deterministic scripted chat backend (no server)."""

from __future__ import annotations

import asyncio
import re

import pytest

from experiments.studies.dera import dialogue, gptf1, qa
from experiments.common.stats import prf
from experiments.common.grade import Grade, to_disk
from experiments.studies.dera.calls import CaseLog
from experiments.studies.dera.settings import DialogueSettings, QASettings, Sampling
from experiments.core.study import CaseContext, RequestFailed
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


def case_log(client, case_id: str = "e1") -> CaseLog:
    """DERA's log over the runner's per-case context (the call log, seeds and failure policy are the runner's)."""
    return CaseLog(CaseContext(client, case_id))


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

    log = case_log(ScriptedClient(reply))
    out = run(dialogue.run_dialogue(log, ENC, {s: "x" for s in DialogueSettings().sections}, DialogueSettings()))
    assert out["stop_reason"] == "researcher_stop"
    assert [m["role"] for m in out["transcript"]] == ["researcher", "decider", "researcher"]
    assert [m["turn"] for m in out["transcript"]] == [1, 2, 3]
    assert out["scratchpad"] == ["Pertinent Positives: add fever"]


def test_turn_cap_counts_all_messages():
    def reply(role, prompt, gen):
        if role == "researcher":
            return '[RESPONSE: "Check negatives."]'
        return '[RESPONSE: "Fine."] [SCRATCHPAD: "none"]'

    client = ScriptedClient(reply)
    log = case_log(client)
    out = run(dialogue.run_dialogue(log, ENC, {}, DialogueSettings()))
    assert out["stop_reason"] == "turn_cap"
    assert out["turns"] == 15 and len(client.requests) == 15
    assert out["transcript"][-1]["role"] == "researcher"  # 8 researcher + 7 decider messages
    assert out["scratchpad"] == []  # "none" is not a correction
    out4 = run(dialogue.run_dialogue(case_log(ScriptedClient(reply)), ENC, {}, DialogueSettings(max_turns=4)))
    assert out4["turns"] == 4 and out4["transcript"][-1]["role"] == "decider"


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
    rec = run(dialogue.make_solver(settings, "m")(case_log(client), ENC))
    assert rec["metadata"]["scratchpad"] == ["fix 1a", "fix 1b", "fix 2a", "fix 2b", "fix 3a", "fix 3b"]
    final_prompt = [p for r, p, g in client.requests if "Agreed corrections:" in p][0]
    for line in rec["metadata"]["scratchpad"]:
        assert f"- {line}" in final_prompt
    assert rec["answer"]["dera"]["Pertinent Positives"] == "text about pertinent positives."
    assert [m["role"] for m in rec["transcript"]][:2] == ["researcher", "decider"]
    assert rec["metadata"]["prompt_hashes"]["summarize_decider_final"] and rec["metadata"]["model"] == "m"
    # sampling: the paper's summarization settings; the runner's context gives every sampled request its seed
    gens = {g for _, _, g in client.requests if g.max_tokens == 512}
    assert all(g.temperature == 1.0 and g.top_p == 1.0 and g.seed is not None for g in gens)


def test_both_agents_see_the_scratchpad_as_it_stands_and_the_rewrite_applies_it():
    """The Researcher's prompt at round 3 holds the lines accepted in rounds 1-2; the Decider's
    prompts hold what it already accepted; the final rewrite prompt carries every line and its output applies them."""
    rounds = {"d": 0}

    def reply(role, prompt, gen):
        if role == "researcher":
            return '[RESPONSE: "Check the next section."]'
        if "Agreed corrections:" in prompt:  # the final rewrite: add the findings the prompt lists as agreed
            added = re.findall(r"^- Pertinent Positives: add (finding \d+)$", prompt, flags=re.M)
            return SUMMARY.replace("text about pertinent positives.", "text about pertinent positives; " + "; ".join(added) + ".")
        if "Discussion so far" not in prompt:  # the initial summary
            return SUMMARY
        rounds["d"] += 1
        return f'[RESPONSE: "Agreed."] [SCRATCHPAD: "Pertinent Positives: add finding {rounds["d"]}"]'

    client = ScriptedClient(reply)
    rec = run(dialogue.make_solver(DialogueSettings(max_turns=6), "m")(case_log(client), ENC))
    assert rec["metadata"]["scratchpad"] == [f"Pertinent Positives: add finding {i}" for i in (1, 2, 3)]
    researcher = [p for r, p, _ in client.requests if r == "researcher"]
    decider = [p for r, p, _ in client.requests if r == "decider" and "Discussion so far" in p]
    assert len(researcher) == 3 and len(decider) == 3
    # every prompt shows the current draft and a scratchpad block
    for p in researcher + decider:
        assert "Scratchpad (" in p and "text about pertinent positives." in p
    # round 1: nothing accepted yet
    assert "(empty: nothing accepted yet)" in researcher[0] and "(empty: nothing accepted yet)" in decider[0]
    # round 3 (message 5): the Researcher sees the lines accepted in rounds 1 and 2, not the later one
    assert "- Pertinent Positives: add finding 1\n- Pertinent Positives: add finding 2" in researcher[2]
    assert "add finding 3" not in researcher[2]
    assert "- Pertinent Positives: add finding 1" in researcher[1] and "add finding 2" not in researcher[1]
    # the Decider answers knowing what it already accepted
    assert "- Pertinent Positives: add finding 1" in decider[1] and "add finding 2" not in decider[1]
    assert "add finding 2" in decider[2]
    # the final rewrite applies them all
    final_prompt = [p for r, p, _ in client.requests if "Agreed corrections:" in p][0]
    for line in rec["metadata"]["scratchpad"]:
        assert f"- {line}" in final_prompt
    assert "applies every agreed correction" in final_prompt
    assert rec["answer"]["dera"]["Pertinent Positives"] == "text about pertinent positives; finding 1; finding 2; finding 3."
    final, initial = rec["answer"]["dera"], rec["answer"]["initial"]
    assert final != initial and initial["Pertinent Positives"] == "text about pertinent positives."
    assert {k: v for k, v in final.items() if k != "Pertinent Positives"} == {k: v for k, v in initial.items() if k != "Pertinent Positives"}


def test_careplan_reply_and_final_prompts_carry_the_care_plan_rules():
    settings = DialogueSettings(task="careplan", sections=["Medications", "Referrals", "Tests", "Lifestyle", "Supportive Care"],
                                review_sections=["Medications"], score_sections=["Medications"], max_turns=2)
    plan = "\n".join(f"{s}: plan for {s.lower()}." for s in settings.sections)

    def reply(role, prompt, gen):
        if role == "researcher":
            return '[RESPONSE: "Medications: the antibiotic has no grounds."]'
        if role == "judge":
            return "[]" if "Concepts" in prompt else "[]"
        if "Discussion so far" in prompt:
            return '[RESPONSE: "Agreed."] [SCRATCHPAD: "Medications: drop the antibiotic"]'
        return plan

    client = ScriptedClient(reply)
    log = case_log(client)
    rec = run(dialogue.make_solver(settings, "m")(log, ENC))
    assert rec["metadata"]["scratchpad"] == ["Medications: drop the antibiotic"]
    by_template = {c["template"]: c["messages"][0]["content"] for c in log.ctx.calls}
    for name in ("careplan_researcher", "careplan_decider_reply", "careplan_decider_final"):
        assert "Rules of the care plan" in by_template[name], name
        assert "None needed." in by_template[name]
    assert "- Medications: drop the antibiotic" in by_template["careplan_decider_final"]
    assert "Scratchpad (" in by_template["careplan_decider_reply"]


def test_malformed_tags_are_kept_and_counted():
    def reply(role, prompt, gen):
        if role == "researcher":
            return "I think the positives are wrong."  # no tag, no stop
        if "Agreed corrections:" in prompt:
            return "nothing useful"
        return "Sure, fixed it."  # no tags

    rec = run(dialogue.make_solver(DialogueSettings(max_turns=2), "m")(case_log(ScriptedClient(reply)), ENC))
    assert rec["transcript"][0]["text"] == "I think the positives are wrong."
    assert rec["transcript"][1]["text"] == "Sure, fixed it."
    steps = [e["step"] for e in rec["metadata"]["parse_errors"]]
    assert "researcher:1" in steps and "decider:2" in steps and "decider:final" in steps and "decider:initial" in steps
    # sections the final rewrite lacks keep the initial text
    assert set(rec["metadata"]["final_sections_kept_from_initial"]) == set(DialogueSettings().sections)


def test_failed_request_fails_the_case():
    """A call with no answer is never a turn: it raises, and the runner records the case as failed."""
    def reply(role, prompt, gen):
        if role == "researcher":
            return ChatResult(error="HTTP 500: boom")
        return "x"

    log = case_log(ScriptedClient(reply))
    with pytest.raises(RequestFailed, match="researcher:1"):
        run(dialogue.run_dialogue(log, ENC, {}, DialogueSettings()))
    assert log.ctx.calls[-1]["error"] == "HTTP 500: boom" and log.ctx.calls[-1]["template"] == "summarize_researcher"


def test_context_overflow_drops_oldest_history():
    def reply(role, prompt, gen):
        if prompt.count("Researcher: ") > 1:
            return ChatResult(error="HTTP 400: This model's maximum context length is 2048 tokens.")
        return '[RESPONSE: "go on"] [SCRATCHPAD: "none"]'

    log = case_log(ScriptedClient(reply))
    out = run(dialogue.run_dialogue(log, ENC, {}, DialogueSettings(max_turns=5)))
    assert out["turns"] == 5 and out["stop_reason"] == "turn_cap"
    assert any(c.get("dropped_history") for c in log.ctx.calls)


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


def test_qa_protocol_settings_and_flow():
    client = ScriptedClient(qa_reply)
    settings = QASettings()
    rec = run(qa.make_solver(settings, "m")(case_log(client, "q1"), Q))
    meta = rec["metadata"]
    assert meta["oneshot"]["vote"] == "Vitamin D"  # tie D/C, D first
    assert meta["oneshot"]["distribution_text"] == "'Vitamin D' 40%, 'Vitamin C' 40%, 'Vitamin B1' 20%"
    assert rec["answer"] == {"oneshot": "Vitamin D", "dera": "Vitamin C"} and meta["answer_changed"]
    assert meta["stop_reason"] == "researcher_stop" and meta["turns"] == 2
    assert [m["role"] for m in rec["transcript"]] == ["decider", "researcher", "decider", "researcher"]
    gens = [g for _, _, g in client.requests]
    assert (gens[0].temperature, gens[0].max_tokens, gens[0].n) == (0.7, 50, 5) and gens[0].seed is not None
    assert (gens[1].temperature, gens[1].max_tokens) == (0.0, 400)
    assert all((g.temperature, g.max_tokens, g.frequency_penalty) == (0.3, 250, 0.5) for g in gens[2:5])
    final = gens[5]  # greedy x5: asked once, copied (vLLM refuses n>1 without sampling)
    assert (final.temperature, final.max_tokens, final.n) == (0.0, 100, 1)
    assert meta["final"]["answers"] == ["Vitamin C"] * 5
    final_prompt = client.requests[5][1]
    assert "Teacher: What does 'scurvy' suggest?" in final_prompt and "Question: What vitamin deficiency" in final_prompt
    assert rec["scores"] == {} and rec["target"] == Q["answer"]  # solve judges nothing: the study's scorers do, after it


def test_qa_turn_cap_three():
    def reply(role, prompt, gen):
        return "Keep thinking about 'scurvy'." if role == "researcher" else qa_reply(role, prompt, gen)

    client = ScriptedClient(reply)
    rec = run(qa.make_solver(QASettings(), "m")(case_log(client, "q1"), Q))
    assert rec["metadata"]["stop_reason"] == "turn_cap" and rec["metadata"]["turns"] == 3
    assert sum(1 for r, _, _ in client.requests if r == "researcher") == 3
    assert rec["metadata"]["stated_answers"] == ["Vitamin C"] * 3


def test_sampled_calls_get_per_call_seeds_greedy_ones_none():
    client = ScriptedClient(qa_reply)
    run(qa.make_solver(QASettings(), "m")(case_log(client, "q1"), Q))
    seeds = [g.seed for _, _, g in client.requests if g.temperature > 0]
    assert seeds and None not in seeds and len(set(seeds)) == len(seeds)  # per (case, step), from the runner
    assert all(g.seed is None for _, _, g in client.requests if g.temperature == 0)


# -- GPT-F1 ---------------------------------------------------------------------------------------

def test_prf_arithmetic():  # GPT-F1's counts: (pred found in gt, n pred, gt found in pred, n gt); both empty -> 1
    p, r, f = prf(2, 5, 3, 4, both_empty=1.0)
    assert r == pytest.approx(0.75) and p == pytest.approx(0.4)
    assert f == pytest.approx(2 * 0.4 * 0.75 / 1.15)
    assert prf(0, 0, 0, 0, both_empty=1.0) == (1.0, 1.0, 1.0)
    assert prf(0, 0, 0, 3, both_empty=1.0)[2] == 0.0
    assert prf(2, 2, 2, 2, both_empty=1.0)[2] == 1.0


def test_gptf1_section_with_scripted_judge():
    gt, pred = "Fever, cough and COVID.", "Cough and COVID-19 and rash."

    def reply(role, prompt, gen):
        assert role == "judge" and gen.temperature == 0 and gen.max_tokens == 200
        if "List the medical concepts" in prompt:
            return '["fever", "cough", "COVID"]' if gt in prompt else '["cough", "COVID-19", "rash"]'
        if gt in prompt.split("Concepts already")[0]:  # precision: pred concepts looked up in the ground truth
            return "[1, 2]"
        return "[2, 3]"  # recall: cough, COVID found in the prediction

    log = case_log(ScriptedClient(reply))
    res = run(gptf1.score_summary(log, {"S": gt}, {"S": pred}, ["S"], gptf1.GptF1.of(DialogueSettings()), label="t"))
    s = res["sections"]["S"]
    assert s["gt_concepts"] == ["fever", "cough", "COVID"] and s["pred_concepts"] == ["cough", "COVID-19", "rash"]
    assert s["recall"] == pytest.approx(2 / 3) and s["precision"] == pytest.approx(2 / 3) and s["f1"] == pytest.approx(2 / 3)
    assert res["average"]["f1"] == pytest.approx(2 / 3)


def test_gptf1_extraction_names_the_section_and_the_cap_is_a_reported_setting():
    def capped(cap):
        return gptf1.GptF1.of(DialogueSettings(gptf1={"max_concepts": cap}))

    many = [f"c{i}" for i in range(7)]

    def reply(role, prompt, gen):
        if "List the medical concepts" in prompt:
            assert "Section: Pertinent Negatives" in prompt and '"Pertinent Negatives" section' in prompt
            return str(many).replace("'", '"')
        return "[1, 2, 3]"

    log = case_log(ScriptedClient(reply))
    res = run(gptf1.score_summary(log, {"Pertinent Negatives": "no fever"}, {"Pertinent Negatives": "denies fever"},
                                  ["Pertinent Negatives"], capped(5), label="t"))
    s = res["sections"]["Pertinent Negatives"]
    assert s["gt_concepts"] == many[:5] and s["concepts_cut"] == {"gt": 2, "pred": 2}
    verify = [c for c in log.ctx.calls if c["step"].endswith(("recall", "precision"))]
    assert [c["protocol"] for c in verify] == [{"concepts": {"sent": 5, "asked": 7}}] * 2  # a protocol deviation of each request
    assert s["recall"] == pytest.approx(3 / 5)
    # no cap: nothing cut, nothing reported
    res = run(gptf1.score_summary(case_log(ScriptedClient(reply)), {"Pertinent Negatives": "no fever"},
                                  {"Pertinent Negatives": "denies fever"}, ["Pertinent Negatives"], capped(None), label="t"))
    assert res["sections"]["Pertinent Negatives"]["gt_concepts"] == many and "concepts_cut" not in res["sections"]["Pertinent Negatives"]
    assert DialogueSettings().gptf1.max_concepts == 40
    # metrics count the cut comparisons
    from experiments.studies.dera import report

    from experiments.studies.dera.scorers import gptf1_grades

    def scored(arm: dict) -> dict:  # the record's result, as the gptf1 scorer gives it
        return {"id": "e", "calls": [], "metadata": {"turns": 1, "stop_reason": "researcher_stop", "scratchpad": [], "parse_attempts": 1,
                                                     "parse_errors": []},
                "scores": to_disk({f"gptf1/{n}": g for n, g in gptf1_grades("dera_vs_initial", arm, {"model": "judge"}).items()})}

    rec = scored({"sections": {"Pertinent Negatives": {**s, "concepts_cut": {"gt": 2, "pred": 0}}}})
    m = report.dialogue_metrics([rec], DialogueSettings(score_sections=["Pertinent Negatives"]))
    assert m["gptf1_concept_lists_cut"] == 1 and m["gptf1_max_concepts"] == 40
    one = DialogueSettings(score_sections=["Pertinent Negatives"])
    text = report.dialogue_summary(m, one, "dera-summarize")
    assert "concept cap (`gptf1.max_concepts`): 40 concepts per list, 1 section comparison(s) cut" in text
    # the cap is stated even when nothing was cut, and "no cap" when there is none
    section = {k: v for k, v in s.items() if k != "concepts_cut"}
    uncut = scored({"sections": {"Pertinent Negatives": section}})
    text = report.dialogue_summary(report.dialogue_metrics([uncut], one), one, "dera-summarize")
    assert "40 concepts per list, 0 section comparison(s) cut." in text
    none = DialogueSettings(score_sections=["Pertinent Negatives"], gptf1={"max_concepts": None})
    text = report.dialogue_summary(report.dialogue_metrics([uncut], none), none, "dera-summarize")
    assert "concept cap (`gptf1.max_concepts`): no cap." in text


def test_gptf1_unparseable_judge_is_unscored():
    log = case_log(ScriptedClient(lambda r, p, g: "" if "List" in p else "[1]"))
    res = run(gptf1.score_summary(log, {"S": "fever"}, {"S": "cough"}, ["S"], gptf1.GptF1.of(DialogueSettings()), label="t"))
    assert res["sections"]["S"]["scored"] is False and res["sections"]["S"]["f1"] is None
    assert res["average"]["f1"] is None and log.parse_errors


def test_corruption_touches_only_chosen_sections():
    settings = DialogueSettings(task="corrupt", corruption_level=5)

    def reply(role, prompt, gen):
        if "less faithful" in prompt:
            assert "strength of 5 out of 10" in prompt
            # the corruption prompt sees the dialogue and the summary instructions
            assert "Patient: A cough for a week." in prompt and "Pertinent Negatives are those the patient denies" in prompt
            return "Pertinent Positives: no cough.\nDemographics and Social Determinants of Health: changed!"
        return SUMMARY

    log = case_log(ScriptedClient(reply))
    ref = {s: f"ref {s}" for s in settings.sections}
    out, _ = run(dialogue.corrupt(log, ENC, ref, settings))
    assert out["Pertinent Positives"] == "no cough."
    assert out["Demographics and Social Determinants of Health"] == ref["Demographics and Social Determinants of Health"]
    assert out["Medical History"] == ref["Medical History"]  # missing from the reply: unchanged, counted
    assert log.parse_errors


def test_sampling_config_gen():
    g = Sampling(temperature=0.3, max_tokens=250, frequency_penalty=0.5).gen()
    assert (g.temperature, g.max_tokens, g.frequency_penalty, g.seed, g.n) == (0.3, 250, 0.5, None, 1)


def test_mcq_variant_votes_letters_and_scores_accuracy():
    from experiments.core.scorers import score_record
    from experiments.studies.dera.scorers import QA

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
    log = case_log(ScriptedClient(reply), "q1")
    rec = run(qa.make_solver(settings, "m")(log, Q))
    rec = run(score_record([s for s in QA if s.applies(settings)], log.ctx, rec, settings))
    assert rec["metadata"]["oneshot"]["answers"] == ["A", "B", "A", "B", "A"] and rec["answer"] == {"oneshot": "A", "dera": "B"}
    assert rec["scores"]["accuracy/oneshot"]["value"] == 0 and rec["scores"]["accuracy/dera"]["value"] == 1 and "correct" not in rec
    assert rec["target"] == "B" and set(rec["scores"]) == {"accuracy/oneshot", "accuracy/dera"}


def test_careplan_prompts_render_with_sections():
    from experiments.studies.dera.prompts import prompt_hash, render

    text = render("careplan_decider_initial", age=50, sex="male", chief_complaint="cough", chat="Doctor: hi")
    for s in ("Medications", "Referrals", "Tests", "Lifestyle", "Supportive Care"):
        assert s in text
    assert "$" not in render("careplan_researcher", age=1, sex="f", chief_complaint="x", chat="c", summary="s", review_sections="Tests",
                             dialogue="d", scratchpad="- Tests: add a chest X-ray")
    assert len(prompt_hash("careplan_decider_final")) == 12


def test_gptf1_empty_reference_is_unscored_and_empty_prediction_scores_zero():
    def reply(role, prompt, gen):
        return '["fever"]' if "List the medical concepts" in prompt else "[1]"

    log = case_log(ScriptedClient(reply))
    res = run(gptf1.score_summary(log, {"A": "", "B": "fever for two days"}, {"A": "", "B": ""}, ["A", "B"],
                                  gptf1.GptF1.of(DialogueSettings()), label="t"))
    a, b = res["sections"]["A"], res["sections"]["B"]
    # no reference text: nothing to score against (not a perfect 1.0 for two unparsed summaries)
    assert a["scored"] is False and a["f1"] is None and a["reason"] == "empty reference section"
    # a reference concept the (empty) prediction misses: recall 0, precision 0 (no predicted concepts)
    assert b["scored"] is True and b["recall"] == 0.0 and b["precision"] == 0.0 and b["f1"] == 0.0
    assert res["average"]["f1"] == 0.0  # the average over the one scored section


@pytest.mark.parametrize("error,is_context", [
    ("HTTP 400: Error code: 400 - This model's maximum context length is 2048 tokens. However, your prompt contains at least 2049 input tokens", True),
    ("HTTP 400: Error code: 400 - max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", True),  # prompt fills the context exactly
    ("gave up after 3 attempts: connection refused", False),
    (None, False),
])
def test_context_errors_are_recognised(error, is_context):
    from experiments.studies.dera.calls import is_context_error

    assert is_context_error(error) is is_context
