"""CRAFT-MD requests built as the authors' code builds them, one test per item, on fixture cases.

The reference is rajpurkarlab/craft-md: ``craftmd_opensource`` / ``craftmd_gpt`` (src/craftmd.py),
``diagnosis_evaluation`` (src/utils.py), the sampling of src/models.py. Each test runs the real
``solve`` through a :class:`CaseContext` against a stand-in client and reads the requests from the
context's call log (role, step, messages, sampling), as a run records them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from experiments.core.registry import named
from experiments.core.config import load_settings
from experiments.core.dryrun import dry_run
from experiments.core.runner import prepare_run, with_answers_line
from experiments.core.scorers import score_record
from experiments.core.study import CaseContext
from experiments.studies.craftmd.data import load_cases
from experiments.studies.craftmd.metrics import grades, run_metrics, summary_markdown
from experiments.studies.craftmd.prompts import render
from experiments.studies.craftmd.protocol import SUMMARY_STOPS, TURN_STOPS, solve
from experiments.studies.craftmd.study import CONFIGS, CraftmdStudy
from experiments.core.deviations import settings_deviations as deviations
from experiments.studies.craftmd.settings import CraftSettings, requests_line
from serving.client import ChatResult

FX = Path(__file__).parent / "fixtures" / "craftmd"
CASES = {c["case_id"]: c for c in load_cases(FX / "requests_cases.csv")}
OTHER, DERM = CASES["case_q"], CASES["case_s"]  # category Other (with a question); Dermatology (no question)
FORMATS = ("vignette", "multiturn", "singleturn", "summarized")
GREETING = render("greeting")


class Stand:
    """Doctor: a question, then a final diagnosis; patient: numbered replies; answers and grader scripted."""

    def __init__(self, doctor=("Where is the pain?", "**Final Diagnosis:** Gout"), verdicts=("Verdict: Yes",)):
        self.doctor, self.verdicts, self.n_patient = list(doctor), list(verdicts), 0

    async def chat(self, messages, role="default", gen=None):
        last = messages[-1]["content"]
        if role == "patient":
            self.n_patient += 1
            text = f"patient reply {self.n_patient}"
        elif role == "clinical" and len(messages) > 1 and "No more questions now." not in last:  # a doctor turn
            text = self.doctor.pop(0) if self.doctor else "Anything else?"
        elif role == "clinical":
            text = "Gout"
        elif role == "summarizer":
            text = "A man reports a painful toe."
        elif "copy out the diagnosis" in last:
            text = "Diagnosis: Podagra"
        else:
            text = self.verdicts.pop(0) if len(self.verdicts) > 1 else self.verdicts[0]
        return ChatResult(texts=[text], prompt_tokens=10, completion_tokens=3)

    async def complete(self, prompt, role="default", gen=None):
        return ChatResult(texts=["Gout"], prompt_tokens=10, completion_tokens=1)


def paper(**kw) -> CraftSettings:
    return load_settings(CraftSettings, CONFIGS / "paper.yaml", {"trials": 1, **kw})


def calls_of(case: dict, s: CraftSettings, client=None) -> tuple[dict, dict]:
    """(record, step -> list of logged calls) of one (case, trial)."""
    ctx = CaseContext(client or Stand(), f"{case['case_id']}/t0")

    async def both():  # solve, then the scorers, as the runner runs them
        rec = await solve(ctx, {"id": f"{case['case_id']}/t0", "case": case, "trial": 0}, s)
        return await score_record(named(CraftmdStudy)().scorers_for(s), ctx, rec, s)

    rec = asyncio.run(both())
    by_step: dict = {}
    for c in ctx.calls:
        by_step.setdefault(c["step"], []).append(c)
    return rec, by_step


def roles(call: dict) -> list[str]:
    return [m["role"] for m in call["messages"]]


# 1. multi-turn and single-turn answers continue the doctor's own chat (open-model loop; GPT loop as an option)
def test_multiturn_and_singleturn_answers_continue_the_doctors_chat():
    rec, steps = calls_of(OTHER, paper())
    doctor_last = steps["doctor_turn_2"][0]["messages"]  # the doctor's chat before its closing turn
    for mode in ("mcq", "frq"):
        multi = steps[f"multiturn_{mode}"][0]
        assert multi["role"] == "clinical" and roles(multi) == ["user", "assistant", "user", "assistant", "user"]
        assert multi["messages"][:-1] == doctor_last[:-1]  # instructions, greeting, turns: the chat as the doctor saw it
        patient_last, asked = multi["messages"][-1]["content"].split("\n\n", 1)  # the question appended after a blank line
        assert patient_last == "patient reply 2" and OTHER["question"] in asked
        assert ("Gout, Septic arthritis, Cellulitis, Pseudogout" in asked) is (mode == "mcq")
        assert "**Final Diagnosis:** Gout" not in json.dumps(multi["messages"])  # the closing turn is left out
        single = steps[f"singleturn_{mode}"][0]
        assert roles(single) == ["user", "assistant", "user"] and single["messages"][:2] == doctor_last[:2]
        assert single["messages"][2]["content"].startswith("patient reply 1\n\n") and OTHER["question"] in single["messages"][2]["content"]

    _, gpt = calls_of(OTHER, paper(loop="gpt"))
    multi = gpt["multiturn_mcq"][0]
    assert roles(multi) == ["system", "assistant", "user", "assistant", "user", "system"]  # craftmd_gpt: a system message after the chat
    assert multi["messages"][-2]["content"] == "patient reply 2" and OTHER["question"] in multi["messages"][-1]["content"]
    assert roles(gpt["vignette_mcq"][0]) == ["system"] and roles(gpt["summarized_mcq"][0]) == ["user"]
    assert roles(gpt["singleturn_frq"][0]) == ["system", "assistant", "user", "system"]


# 2. the doctor's history starts with its own greeting, the one the patient answers
def test_doctors_history_holds_its_greeting():
    _, steps = calls_of(DERM, paper())
    first = steps["doctor_turn_1"][0]["messages"]
    assert roles(steps["doctor_turn_1"][0]) == ["user", "assistant", "user"]
    assert first[1] == {"role": "assistant", "content": GREETING} and first[2]["content"] == "patient reply 1"
    # the grader's and summarizer's one-message prompts: a system message, as the authors' GPT-4/GPT-3.5 calls
    assert roles(steps["summary"][0]) == ["system"]
    _, named = calls_of(DERM, paper(lone_system_as_user=True))
    assert roles(named["summary"][0]) == ["user"] and "lone_system_as_user" in requests_line(paper(lone_system_as_user=True))
    opening = steps["patient_opening"][0]["messages"]
    assert [m["role"] for m in opening] == ["system", "user"] and opening[1]["content"] == GREETING
    assert DERM["vignette"] in opening[0]["content"]


# 3. the specialty in all eight answer requests, where the authors put it
def test_specialty_in_all_eight_answer_requests():
    _, steps = calls_of(DERM, paper())
    identity = render("identity_specialist", specialty="Dermatology")
    for fmt in FORMATS:
        for mode in ("mcq", "frq"):
            msgs = steps[f"{fmt}_{mode}"][0]["messages"]
            assert msgs[0]["content"].startswith(identity), (fmt, mode)  # the first message: the one-message prompt or the instructions
            assert json.dumps(msgs).count("Dermatology") == 1
            if fmt in ("vignette", "summarized"):  # one message: identity, case text, question (and choices)
                case_text = DERM["vignette"] if fmt == "vignette" else "A man reports a painful toe."
                assert len(msgs) == 1 and f"{case_text} {DERM['question']}" in msgs[0]["content"]
                assert ("Plaque psoriasis, Atopic dermatitis, Tinea corporis, Lichen planus" in msgs[0]["content"]) is (mode == "mcq")


# 4. category Other: a doctor without a specialty
def test_category_other_names_no_specialty():
    _, steps = calls_of(OTHER, paper())
    general = render("identity_general")
    asked = [steps[f"{f}_{m}"][0]["messages"] for f in FORMATS for m in ("mcq", "frq")] + [steps["doctor_turn_1"][0]["messages"]]
    assert len(asked) == 9
    for msgs in asked:
        assert msgs[0]["content"].startswith(general) and "Other" not in json.dumps(msgs) and "specialty" not in msgs[0]["content"]


# 5. no stop sequences in the paper config; the embedded config's stops are named deviations
def test_paper_config_sends_no_stops_and_the_embedded_ones_are_named():
    _, steps = calls_of(OTHER, paper())
    assert all(c["gen"]["stop"] is None for cs in steps.values() for c in cs)
    assert deviations(paper()) == [] and requests_line(paper()).endswith("deviations from the authors' requests: none")

    emb = load_settings(CraftSettings, CONFIGS / "embedded-small.yaml", {})
    _, steps = calls_of(OTHER, emb)
    assert steps["doctor_turn_1"][0]["gen"]["stop"] == list(TURN_STOPS) == steps["patient_opening"][0]["gen"]["stop"]
    assert steps["summary"][0]["gen"]["stop"] == list(SUMMARY_STOPS)
    named = deviations(emb)
    assert any(d.startswith("turn_stops") for d in named) and any(d.startswith("summary_stops") for d in named)
    assert "grader temperature 0 (authors: 1)" in named and "grader re-asked at most 0 time(s) (authors: 11)" in named


# 6. the grader: max_tokens 150, temperature 1.0, both steps re-asked while the verdict is neither yes nor no
def test_grader_sampling_and_bounded_reask_loop():
    rec, steps = calls_of(OTHER, paper(formats=["vignette"], mcq=False), Stand(verdicts=("Unclear", "Possibly", "Verdict: Yes")))
    frq = grades(rec)[("vignette", "frq")]
    assert [c["gen"]["temperature"] for c in steps["vignette_extract"] + steps["vignette_match"]] == [1.0] * 6
    assert all(roles(c) == ["system"] for c in steps["vignette_extract"] + steps["vignette_match"])
    assert {c["gen"]["max_tokens"] for c in steps["vignette_extract"] + steps["vignette_match"]} == {150}
    assert len({c["gen"]["seed"] for c in steps["vignette_match"]}) == 3  # each re-ask a fresh sample
    assert len(steps["vignette_extract"]) == 3 and len(steps["vignette_match"]) == 3  # as diagnosis_evaluation: both again
    assert frq.metadata["grader_reasks"] == 2 and frq.value == 1 and frq.source == "grader"
    assert run_metrics([rec])["grader_reasks"] == {"total": 2, "answers_reasked": 1, "max": 2}

    rec, steps = calls_of(OTHER, paper(formats=["vignette"], mcq=False), Stand(verdicts=("unclear",)))
    frq = grades(rec)[("vignette", "frq")]
    assert len(steps["vignette_match"]) == 12 and frq.metadata["grader_reasks"] == 11  # the authors' bound: depth 0..10 re-asks
    assert frq.value is None and frq.source == "unscored_verdict"  # still no verdict: unscored, counted


# 6b. the authors' verdict rule (paper.yaml): "yes" anywhere, else "no" anywhere, else asked again; first_word is named
def test_verdict_rule_decides_the_grade_and_the_reasks():
    hedged = ("I am not sure", "Verdict: Yes")  # "not" holds "no": the authors read a verdict of no, and ask nothing again
    rec, steps = calls_of(OTHER, paper(formats=["vignette"], mcq=False), Stand(verdicts=hedged))
    frq = grades(rec)[("vignette", "frq")]
    assert len(steps["vignette_match"]) == 1 and frq.metadata["grader_reasks"] == 0 and (frq.value, frq.source) == (0, "grader")
    rec, steps = calls_of(OTHER, paper(formats=["vignette"], mcq=False, verdict_rule="first_word"), Stand(verdicts=hedged))
    frq = grades(rec)[("vignette", "frq")]
    assert len(steps["vignette_match"]) == 2 and frq.metadata["grader_reasks"] == 1 and (frq.value, frq.source) == (1, "grader")
    assert "grader verdict read from the reply's first word" in deviations(paper(verdict_rule="first_word"))[0]
    rec, _ = calls_of(OTHER, paper(formats=["vignette"], mcq=False), Stand(verdicts=("The diagnoses differ, yes they are the same",)))
    assert grades(rec)[("vignette", "frq")].value == 1  # "yes" anywhere wins over "no" (in "diagnoses")


# 6c. an empty turn is sent empty, as the authors send it; another text is a named deviation
def test_empty_turn_sent_as_the_authors_send_it():
    class Mute(Stand):
        async def chat(self, messages, role="default", gen=None):
            r = await super().chat(messages, role, gen)
            return ChatResult(texts=[""], prompt_tokens=10, completion_tokens=0) if role == "patient" and self.n_patient == 1 else r

    _, steps = calls_of(OTHER, paper(), Mute())
    assert steps["doctor_turn_1"][0]["messages"][-1] == {"role": "user", "content": ""}
    assert steps["multiturn_frq"][0]["messages"][2]["content"] == ""  # the empty patient turn kept empty in the answer request too
    _, steps = calls_of(OTHER, paper(empty_turn="..."), Mute())
    assert steps["doctor_turn_1"][0]["messages"][-1] == {"role": "user", "content": "..."}
    assert deviations(paper(empty_turn="...")) == ["an empty turn sent as ... (authors: sent empty)"]


# 7. the question split off the vignette as get_case_without_question does, asked where the authors ask it
def test_question_split_and_where_it_is_asked():
    assert OTHER["question"] == "Which is the most likely diagnosis?" and OTHER["question_source"] == "vignette"
    assert OTHER["vignette"].endswith("for blood pressure.") and "?" not in OTHER["vignette"]
    assert DERM["question"] == "What is the final diagnosis?" and DERM["question_source"] == "default"
    _, steps = calls_of(OTHER, paper())
    assert all(OTHER["question"] not in json.dumps(c["messages"]) for s, cs in steps.items() if s.startswith("patient") for c in cs)
    for fmt in FORMATS:
        for mode in ("mcq", "frq"):
            msgs = steps[f"{fmt}_{mode}"][0]["messages"]
            assert json.dumps(msgs).count(OTHER["question"]) == 1 and OTHER["question"] in msgs[-1]["content"]


def test_dry_run_of_the_paper_and_embedded_configs_says_what_is_sent(tmp_path):
    study = named(CraftmdStudy)()
    lines: list[str] = []
    for name in ("paper.yaml", "embedded-small.yaml"):
        s = load_settings(CraftSettings, CONFIGS / name, {"data": str(FX / "requests_cases.csv"), "limit": 1, "trials": 1,
                                                           "out": str(tmp_path / name)})
        s, units = prepare_run(study, s)
        path = asyncio.run(dry_run(study, s, units, log=lines.append))
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        # the study's stand-in replies: the patient answers the greeting, the doctor asks a question, the patient answers,
        # the doctor's diagnosis ends the talk, the summary, 8 answers, the grader's 8 requests, then (assess_conversations, on in the embedded
        # config only) the assessor's five questions of the conversation
        assess = [f"assess_{q}" for q in ("Q1", "Q2", "Q3", "grounded", "complete")] if name == "embedded-small.yaml" else []
        talk = ["patient_opening", "doctor_turn_1", "patient_turn_1", "doctor_turn_2", "summary"]
        assert [r["step"] for r in rows[:5]] == talk
        answers = sorted(f"{f}_{m}" for f in FORMATS for m in ("mcq", "frq"))  # then the grader's two steps per FRQ answer
        assert sorted(r["step"] for r in rows[5:13]) == answers and all(r["role"] == "clinical" for r in rows[5:13])
        assert sorted(r["step"] for r in rows[13:len(rows) - len(assess)]) == sorted(f"{f}_{g}" for f in FORMATS for g in ("extract", "match"))
        assert sorted(r["step"] for r in rows[len(rows) - len(assess):]) == sorted(assess)
        assert all(r["role"] == "assessor" and r["kind"] == "completion" and "Patient-AI: " in r["prompt"] for r in rows[len(rows) - len(assess):])
        doctor = rows[1]
        if name == "paper.yaml":
            assert [m["role"] for m in doctor["messages"]] == ["user", "assistant", "user"] and all(r["gen"]["stop"] is None for r in rows)
            assert {r["gen"]["max_tokens"] for r in rows if r["role"] == "clinical"} == {250}
        else:  # the base model's answers as text completions, the chat flattened, the question in it
            assert rows[5]["kind"] == "completion" and rows[1]["gen"]["stop"] == list(TURN_STOPS)
    assert lines[0].startswith("cases: the first 1 of 2 in the input's order (--limit 1: not a sample)")
    assert lines[1] == requests_line(paper()) and "none" in lines[1]
    assert lines[2].startswith("additions to the protocol: patient_checks") and "assess_conversations" not in lines[2]
    emb = [x for x in lines if x.startswith("requests:")][1]
    assert "turn_stops" in emb and "sent as text completions" in emb
    assert any(x.startswith("additions to the protocol: assess_conversations") for x in lines)


def test_summary_md_names_the_loop_and_every_deviation(tmp_path):
    emb = load_settings(CraftSettings, CONFIGS / "embedded-small.yaml", {})
    rec, _ = calls_of(OTHER, emb)
    metrics = named(CraftmdStudy)().metrics([rec], emb)
    metrics.update(cases=1, deviations=deviations(emb))  # the runner's: every setting against the authors' table
    md = with_answers_line(summary_markdown("embedded", metrics), metrics)
    assert "open-model loop (craftmd_opensource)" in md and f"**Settings unlike the authors' (docs/protocols.md): {len(deviations(emb))} — " in md
    assert len(deviations(emb)) >= 10
    for d in deviations(emb):
        assert md.count(d) == 1


def test_paper_table_footnotes_name_the_deviations_and_the_loop():
    from experiments.core import registry
    from experiments.tables.render import paper_tables_markdown

    def run(path, cfg):
        records = [{"id": "c0/t0", "case_id": "c0", "trial": 0, "status": "ok", "answers": {"vignette": {"mcq": {"correct": 1}}}}]
        return {"path": path, "config": {"experiment": "craftmd", "name": path[3:], **cfg}, "metrics": {}, "identity": {"experiment": "craftmd"},
                "records": records}

    emb = load_settings(CraftSettings, CONFIGS / "embedded-small.yaml", {}).model_dump()
    old = {k: v for k, v in emb.items() if k not in ("loop", "turn_stops", "summary_stops", "grader_reasks")}  # a run from before the loop setting
    md = paper_tables_markdown([run("/x/paper", paper().model_dump()), run("/x/emb", emb), run("/x/gpt", paper(loop="gpt").model_dump()),
                                run("/x/old", old)], registry.study_for("craftmd").tables)
    mcq = md.split("### ")[1]  # the MCQ table: its rows, then its footnotes
    notes = {int(ln.split()[0][1:]): ln for ln in mcq.splitlines() if ln.startswith("^")}
    marks = {ln.split("**")[1]: set(ln.split("**")[2].split("|")[0].split("^")[1:]) for ln in mcq.splitlines() if ln.startswith("| **")}
    of = lambda label: " ".join(notes[int(n)] for n in marks[f"embedded ({label})"])
    assert "Sent unlike the authors' requests" not in of("paper") and "GPT loop" not in of("paper")
    assert "Sent unlike the authors' requests (named settings): turn cap 4 doctor turns (authors: 14); turn_stops" in of("emb")
    assert "grader re-asked at most 0" in of("emb") and "an empty turn sent as ..." in of("emb")
    assert "GPT loop (craftmd_gpt" in of("gpt") and "doctor max_tokens 250 (authors: 150)" in of("gpt")  # their GPT calls: 150
    assert "Sent unlike" not in of("old")  # its config does not say how its requests were built: no claim either way
