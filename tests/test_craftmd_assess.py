"""CRAFT-MD conversation checks: the deterministic patient checks (hand-worked examples), the assessors' requests,
parsing and unscored counting, their metrics and summary lines, and resume of the assessor step (scripted model)."""

from __future__ import annotations

import asyncio
import json

import pytest

from experiments.common.grade import aggregate, grades
from experiments.studies.craftmd.assess import QUESTIONS, conversation_text, parse_reply, request_prompt
from experiments.studies.craftmd.metrics import conversation_markdown
from experiments.core.scorers import figures, score_record, scores_markdown
from experiments.studies.craftmd.settings import CraftSettings, additions
from experiments.core.registry import named
from experiments.studies.craftmd.study import CraftmdStudy as Unnamed, paper_model

CraftmdStudy = named(Unnamed)  # as the registry names it: `craftmd`
from experiments.core.runner import run_study
from experiments.core.study import CaseContext
from serving.cache import ResponseCache
from tests.scripted import ScriptedLLM, down

VIGNETTE = "A 30-year-old woman has silvery scaly plaques on her elbows and knees that began two months ago and itch at night."
CHOICES = ["Plaque psoriasis", "Eczema", "Tinea corporis", "Lichen planus"]
TURNS = [("patient", "I have itchy patches on my elbows."),
         ("doctor", "How long have you had them?"),
         ("patient", "My aunt said it's plaque psoriasis, or maybe eczema."),    # patient turn 2: names the answer and a choice
         ("doctor", "Do they itch?"),
         ("patient", "   "),                                                        # patient turn 3: empty
         ("doctor", "Where else?"),
         ("patient", "Well, silvery scaly plaques on her elbows and knees that began two months ago!"),  # turn 4: 13 copied words
         ("doctor", "**Final Diagnosis:** Plaque psoriasis"),
         ("patient", "Plaque psoriasis, thank you.")]                               # after the doctor's final turn: not checked


# ------------------------------------------------------------------ assessor requests and replies

def test_request_holds_the_vignette_and_every_turn_and_replies_parse_with_the_one_verdict_parser():
    p = request_prompt("Q2", TURNS, VIGNETTE)
    assert VIGNETTE in p and p.rstrip().endswith("Verdict:")
    assert "Doctor-AI: **Final Diagnosis:** Plaque psoriasis" in p and "Patient-AI: (no answer)" in p  # the closing turn, an empty turn
    assert conversation_text([("doctor", "a\n b"), ("patient", "c")]) == "Doctor-AI: a b\nPatient-AI: c"
    assert parse_reply("Q1", " Yes")["verdict"] is True
    assert parse_reply("Q1", "Verdict: no")["verdict"] is False
    assert parse_reply("Q1", "Decide whether the conversation")["verdict"] is None  # rambling: unscored, not No
    assert parse_reply("Q1", "")["verdict"] is None
    g = parse_reply("grounded", "No. Invented: a fever of 39 C")
    assert g["verdict"] is False and g["invented"] == "a fever of 39 C"
    assert "invented" not in parse_reply("grounded", "Yes")


def assessed(case: str, **verdicts) -> dict:
    return {"id": case, "case_id": case, "scores": {f"assess-{q}": {"value": v} for q, v in verdicts.items()}}


def test_rates_leave_unscored_out_and_count_them():
    recs = [assessed(c, Q1=v) for c, v in (("a", 1), ("b", 0), ("c", None), ("d", 1))] + [{"id": "e", "case_id": "e"}]  # e: not assessed
    f = aggregate(recs, "assess-Q1")
    assert (f.values, f.unscored, f.n) == (3, 1, 3) and f.value == pytest.approx(2 / 3) and 0 <= f.low <= f.value <= f.high <= 1
    # trials of one case average first (like accuracy): case a 1/2, case b 1 -> 0.75
    f = aggregate([assessed("a", Q3=1), assessed("a", Q3=0), assessed("b", Q3=1)], "assess-Q3")
    assert f.value == pytest.approx(0.75) and f.n == 2


def test_summary_table_puts_the_papers_value_beside_the_run_where_it_has_one():
    metrics = {"scores": [f.json() for f in figures([assessed("a", **{q: 1 for q in QUESTIONS})], CraftmdStudy.scorers)]}
    published = {"Q1": {"gpt-4": 53.33}, "Q2": {"gpt-4": 71.11}, "Q3_overall": 7.22}
    md = conversation_markdown(metrics, published, "gpt-4")
    assert "## Conversation quality" in md and "| Q1: one most likely diagnosis can be reached | 100.0 [100.0, 100.0] (n=1) | 0 | 53.33 (GPT-4) |" in md
    assert "7.22 (all four models)" in md
    assert "| patient-AI answers complete for what was asked | 100.0 [100.0, 100.0] (n=1) | 0 | – |" in md
    md = conversation_markdown(metrics, None, None)  # the published values absent: the column stays, empty
    assert "| 0 | – |" in md and "none of the paper's four" in md
    assert conversation_markdown({}, None, None) == ""
    assert paper_model("llama-2-7b-chat") == "llama-2-7b" and paper_model("Mistral-7B-Instruct-v0.2") == "mistral-v2-7b"
    assert paper_model("gpt-4-0613") == "gpt-4" and paper_model("embedded") is None and paper_model("gpt-4o") is None


def test_settings_assessor_follows_the_grader_and_is_named_as_an_addition():
    s = CraftSettings(assess_conversations=True, roles={"clinical": "a", "patient": "b", "grader": "g", "summarizer": "g"})
    assert s.roles["assessor"] == "g" and s.sampling["assessor"] == s.sampling["grader"]
    assert "assessor" not in CraftSettings().roles and "assessor" not in CraftSettings().sampling  # off: nothing added
    assert additions(s)[0].startswith("assess_conversations") and additions(CraftSettings(patient_checks=False)) == []
    prepared = named(CraftmdStudy)().prepare(CraftSettings(data="x.csv", roles={"clinical": "a", "assessor": "embedded"}))
    assert "assessor" not in prepared.roles  # off: not a role of the run


# ------------------------------------------------------------------ through solve and the runner

CASE = {"case_id": "case_x", "vignette": VIGNETTE, "question": "What is the diagnosis?", "choices": CHOICES, "answer": "Plaque psoriasis",
        "answer_index": 0, "specialty": "Dermatology", "dataset": "fixture"}


def backend(assessor_reply="Verdict: Yes", fail_assessor=False):
    """Role-aware answers: two doctor questions then a diagnosis; the assessor's reply as given."""
    state = {"doctor": 0, "assessor": 0}

    def respond(role, content, gen):
        text = content if isinstance(content, str) else "\n".join(m["content"] for m in content)
        if role == "assessor":
            state["assessor"] += 1
            if fail_assessor:
                raise down()
            return assessor_reply(text) if callable(assessor_reply) else assessor_reply
        if role == "clinical":
            if "No more questions now." in text or len(content) == 1:
                return "Plaque psoriasis"
            state["doctor"] += 1
            return "Where is the rash?" if state["doctor"] % 3 else "**Final Diagnosis:** Plaque psoriasis"
        if role == "patient":
            return "On my elbows, it's plaque psoriasis."
        if role == "summarizer":
            return "A woman with elbow plaques."
        return "Diagnosis: Plaque psoriasis" if "copy out the diagnosis" in text else "Verdict: Yes"

    return respond, state


ROLES = ("clinical", "patient", "grader", "summarizer", "assessor")


def settings(tmp_path, **kw):
    return CraftSettings(**{"data": "x", "out": str(tmp_path / "run"), "trials": 1, "max_turns": 3, "concurrency": 2,
                            "assess_conversations": True, "formats": ["vignette", "multiturn"], **kw})


def scored(client, s, answers="free"):
    """solve() and the study's scorers, as the runner runs them, through one CaseContext."""
    ctx = CaseContext(client, "case_x/t0", answers=answers)
    study = named(CraftmdStudy)()

    async def both():
        rec = await study.solve(ctx, {"id": "case_x/t0", "case": CASE, "trial": 0}, s)
        assert rec["scores"] == {}  # solve judges nothing: the scorers do, after it
        return await score_record(study.scorers_for(s), ctx, rec, s)

    return asyncio.run(both()), ctx


def test_the_scorers_add_five_assessor_requests_and_the_patient_checks(tmp_path):
    respond, state = backend(lambda text: "Verdict: No. Invented: a fever" if "grounded in the case notes" in text else
                             ("I cannot tell" if "medical terminology" in text else "Verdict: Yes"))
    s = settings(tmp_path)
    rec, ctx = scored(ScriptedLLM(respond, roles=ROLES), s)
    steps = [c["step"] for c in ctx.calls if c["role"] == "assessor"]
    assert sorted(steps) == sorted(f"assess_{q}" for q in QUESTIONS) and state["assessor"] == 5
    g = grades(rec)
    assert g["assess-Q1"].value == 1 and g["assess-Q3"].value is None and g["assess-grounded"].value == 0
    assert g["assess-grounded"].metadata == {"invented": "a fever"} and g["assess-grounded"].explanation == "Verdict: No. Invented: a fever"
    assert g["patient-check/leaks_diagnosis"].value == 1 and g["patient-check/leaks_diagnosis"].answer[0]["named"] == "Plaque psoriasis"
    figs = {(f.score, f.metric): f for f in figures([rec], CraftmdStudy.scorers)}
    assert figs[("assess-Q3", "mean")].unscored == 1 and figs[("assess-Q3", "mean")].value is None
    assert figs[("patient-check/leaks_diagnosis", "per conversation")].value == 1 and named(CraftmdStudy)().metrics([rec], s)["additions"]
    md = scores_markdown([f.json() for f in figs.values()], CraftmdStudy.scorers)
    assert "### patient-check" in md and md.count("(authors' release): per conversation") == 4  # beside the authors' four released patients
    off, _ = scored(ScriptedLLM(backend()[0], roles=ROLES), s.model_copy(update={"patient_checks": False}))
    assert not any(k.startswith("patient-check/") for k in off["scores"])  # --no-patient-checks: the scorer does not run


def test_constrained_assessor_requests_carry_their_format_and_a_broken_reply_is_unscored(tmp_path):
    respond, _ = backend("maybe")
    rec, ctx = scored(ScriptedLLM(respond, roles=ROLES), settings(tmp_path, answers="constrained"), answers="constrained")
    calls = [c for c in ctx.calls if c["role"] == "assessor"]
    assert all(c["constraint"]["applied"] and c["gen"]["structured"] for c in calls)
    assert all(g.value is None for n, g in grades(rec).items() if n.startswith("assess-"))  # out of format: handed over empty, unscored


def test_no_assessor_request_when_off_and_checks_can_be_turned_off(tmp_path):
    respond, state = backend()
    rec, _ = scored(ScriptedLLM(respond, roles=ROLES), settings(tmp_path, assess_conversations=False, patient_checks=False))
    assert state["assessor"] == 0 and not any(k.startswith(("assess-", "patient-check")) for k in rec["scores"])


def test_assessor_step_resumes_from_the_cache(tmp_path):
    """The assessor's endpoint is down: the cases fail (never scored); the next run replays every conversation and
    answer from the cache and sends only the assessor's requests."""
    cases = [{"id": f"case_{i}/t0", "case": {**CASE, "case_id": f"case_{i}"}, "trial": 0} for i in range(2)]
    cache = ResponseCache(tmp_path / "cache.sqlite")
    s = settings(tmp_path)
    respond, _ = backend(fail_assessor=True)
    o = asyncio.run(run_study(named(CraftmdStudy)(), s, cases, client=ScriptedLLM(respond, roles=ROLES, cache=cache), log=lambda m: None))
    assert o.failed == 2 and o.finished == 0
    respond, state = backend()
    client = ScriptedLLM(respond, roles=ROLES, cache=cache)
    o = asyncio.run(run_study(named(CraftmdStudy)(), s, cases, client=client, log=lambda m: None))
    assert o.finished == 2 and o.failed == 0
    fresh = [role for role, _ in client.sent]
    assert set(fresh) == {"assessor"} and len(fresh) == 10  # 5 per conversation; everything else came from the cache
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    q1 = next(f for f in m["scores"] if f["score"] == "assess-Q1")
    assert (q1["value"], q1["values"], q1["unscored"]) == (1.0, 2, 0)
    assert "## Conversation quality" in (tmp_path / "run" / "summary.md").read_text()
    # a third run resumes: nothing is sent
    client = ScriptedLLM(respond, roles=ROLES, cache=cache)
    asyncio.run(run_study(named(CraftmdStudy)(), s, cases, client=client, log=lambda m: None))
    assert client.sent == []


def test_review_of_a_live_runs_assessor(tmp_path):
    from experiments.tools.review.judges import load_judge

    respond, _ = backend(lambda text: "Terms: None" if "medical terminology" in text else "Verdict: Yes")
    cases = [{"id": f"case_{i}/t0", "case": {**CASE, "case_id": f"case_{i}"}, "trial": 0} for i in range(2)]
    asyncio.run(run_study(named(CraftmdStudy)(), settings(tmp_path), cases, client=ScriptedLLM(respond, roles=ROLES), log=lambda m: None))
    j = load_judge(tmp_path / "run", "assess-Q3")
    assert [i["verdict"] for i in j["items"]] == [0, 0] and j["items"][0]["show"]["case notes"] == VIGNETTE
    conv = j["items"][0]["show"]["conversation"]
    assert conv[0].startswith("Doctor-AI: ") and conv[1] == "Patient-AI: On my elbows, it's plaque psoriasis."


def test_report_shows_the_rates_the_checks_and_each_cases_checks(tmp_path):
    from experiments.tools.report.build import build_report

    respond, _ = backend(lambda text: "Verdict: No. Invented: a fever" if "grounded in the case notes" in text else "Verdict: Yes")
    cases = [{"id": f"case_{i}/t0", "case": {**CASE, "case_id": f"case_{i}"}, "trial": 0} for i in range(2)]
    asyncio.run(run_study(named(CraftmdStudy)(), settings(tmp_path), cases, client=ScriptedLLM(respond, roles=ROLES), log=lambda m: None))
    html = build_report([str(tmp_path / "run")], tmp_path / "report.html").read_text()
    assert "<tr><td>assess-Q1</td><td>mean</td><td>1.000 [1.000, 1.000] (n=2)</td></tr>" in html  # the run's figures
    assert "<tr><td>patient-check/leaks_diagnosis</td><td>per patient turn</td>" in html
    # each case's grades with what the scorer asks: the assessor's no and the patient check's hit, with the evidence
    assert "<td>assess-grounded (Is every answer of the patient-AI grounded in the case notes" in html
    assert "patient-check/leaks_diagnosis (the patient names the correct diagnosis before the doctor&#39;s final turn)</td><td>1</td>" in html


def test_q3_is_answered_with_the_terms_and_each_must_be_in_a_patient_line():
    turns = [("doctor", "Any papules or erythema?"), ("patient", "Yes, small  Papules on my arms."), ("patient", "It itches.")]
    assert request_prompt("Q3", turns, VIGNETTE).rstrip().endswith("Terms:")
    assert parse_reply("Q3", "Terms: papules", turns)["verdict"] is True
    assert parse_reply("Q3", ' "small papules".', turns) == {"verdict": True, "terms": ["small papules"], "reply": ' "small papules".'}
    assert parse_reply("Q3", "Terms: None", turns)["verdict"] is False and parse_reply("Q3", "None.", turns)["verdict"] is False
    # erythema is only in the doctor's line: the quoted evidence is not the patient's, so the item is unscored and counted
    bad = parse_reply("Q3", "Terms: papules, erythema", turns)
    assert bad["verdict"] is None and bad["terms_not_found"] == ["erythema"]
    assert parse_reply("Q3", "", turns)["verdict"] is None and "terms_not_found" not in parse_reply("Q3", "", turns)


def test_terminology_check_reads_the_patients_lines_only():
    from experiments.studies.craftmd.terminology import medical_terms, terminology_check, terms

    assert terms()["macule"] == "flat spot" and "eczema" not in terms()  # a diagnosis name is no term of the list
    # whole words, any case, -s / -es added; "plaques" -> plaque; "lesioned" and "Erythematousness" are no listed word
    assert medical_terms("Papules, ERYTHEMA and two plaques; lesioned skin; Erythematousness") == ["papule", "erythema", "plaque"]
    got = terminology_check([("doctor", "Is there pruritus?"), ("patient", "It itches, and there are bumps."), ("patient", "A vesicle burst.")])
    assert got == {"verdict": True, "terms": ["vesicle"]}
    assert terminology_check([("doctor", "Any macules?"), ("patient", "Just flat spots.")]) == {"verdict": False, "terms": []}


def test_every_listed_term_says_why_and_lesion_is_a_patients_word():
    # every term line carries its reason (the list's header: each term is justified); "lesion", the umbrella word of
    # patient leaflets, is not terminology, while a morphology word beside it still is
    from experiments.studies.craftmd.terminology import TERMS_FILE, medical_terms
    rows = [line.split("\t") for line in TERMS_FILE.read_text(encoding="utf-8").splitlines() if line.strip() and not line.startswith("#")]
    assert rows and all(len(r) == 3 and r[2].strip() for r in rows)
    assert medical_terms("I have a skin lesion on my arm") == []
    assert medical_terms("The lesion is a papule") == ["papule"]
