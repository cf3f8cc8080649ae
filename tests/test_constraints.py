"""Constrained answers, without a server: every declared format accepts the gold answers of our
fixtures and what the step's parser reads, rejects a malformed reply; the mechanism (CaseContext) sends a
constraint only with answers: constrained, logs it, keys the cache on it, and turns a reply that broke it
into a counted format error; the runner names the mode everywhere; `compare` warns on mixed modes."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from experiments.studies.autoeval import judge as J
from experiments.core.config import ConfigError, load_settings
from experiments.core.constraints import Constraint, ConstraintError, read_declarations
from experiments.studies.craftmd import grading
from experiments.studies.craftmd.data import load_cases as load_craft_cases
from experiments.studies.craftmd.prompts import PROMPTS as CRAFT
from experiments.studies.dera.calls import CaseLog
from experiments.studies.dera.dialogue import parse_decider, parse_researcher
from experiments.studies.dera.prompts import PROMPTS as DERA
from experiments.studies.dera.qa import answer_from_completion, letter_values
from experiments.common.parsing import extract_after, extract_bool, extract_indices, extract_list, extract_number, extract_verdict
from experiments.core.results import ResultsError
from experiments.core.study import CaseContext
from serving.cache import ResponseCache, request_key
from serving.client import GenConfig
from tests.scripted import ScriptedLLM

FIX = Path(__file__).parent / "fixtures"
MEDQA = [json.loads(x) for x in (FIX / "dera" / "medqa_open.jsonl").read_text().splitlines() if x.strip()]
CRAFT_CASES = load_craft_cases(str(FIX / "craftmd" / "cases.csv"))


def ok(c: Constraint, text: str) -> bool:
    return c.check(text) is True


# ------------------------------------------------------------------ the declaration files

@pytest.mark.parametrize("prompts", [DERA, CRAFT, J.PROMPTS])
def test_every_declaration_names_a_template_and_builds(prompts):
    decls = prompts.declarations()
    assert decls, f"{prompts.folder} declares no constraint"
    templates = {p.stem for p in prompts.folder.glob("*.txt")}
    values = {"n": 3, "letters": ["A", "B"], "letter_class": "AB", "choices": ["x", "y"]}
    for name in decls:
        assert name in templates, f"{name} is declared but no template {name}.txt exists"
        c = prompts.constraint(name, **values)
        assert c.kind in ("choice", "regex", "json") and c.source.endswith(name)


def test_free_text_steps_declare_nothing():
    for name in ("summarize_decider_initial", "summarize_decider_final", "careplan_decider_initial", "corrupt", "qa_researcher", "qa_explain"):
        assert DERA.constraint(name) is None
    for name in ("doctor_system", "patient_system", "summarize", "ask_frq", "meld"):
        assert CRAFT.constraint(name) is None
    assert J.PROMPTS.constraint("explain") is None


def test_malformed_declarations_and_missing_values_are_errors(tmp_path):
    bad = tmp_path / "constraints.yaml"
    bad.write_text("x: {choice: [a], regex: b}\n")
    with pytest.raises(ConstraintError, match="exactly one of"):
        read_declarations(bad)
    with pytest.raises(ConstraintError, match=r"needs a value for \$choices"):
        CRAFT.constraint("ask_mcq")
    with pytest.raises(ConstraintError, match="bounded repetition"):  # xgrammar expands it for minutes: HTTP 500
        Constraint.make("regex", '\\[RESPONSE: "[^"]{1,500}"\\]')
    with pytest.raises(ConstraintError, match="invalid regex"):
        Constraint.make("regex", "(unbalanced")
    with pytest.raises(ConstraintError, match="JSON schema"):
        Constraint.make("json", {"type": "no-such-type"})


# ------------------------------------------------------------------ CRAFT-MD

def test_craftmd_mcq_accepts_each_gold_choice_and_the_answer_maps_exactly():
    for case in CRAFT_CASES:
        c = CRAFT.constraint("ask_mcq", choices=case["choices"])
        gold = case["choices"][case["answer_index"]]
        assert ok(c, gold) and grading.parse_mcq(gold, case["choices"], case["answer_index"]) == {
            "answer": gold, "choice": case["answer_index"], "choice_text": gold, "parsed_by": "exact", "correct": 1}
        for bad in ("B", f"B. {gold}", gold + " because", ""):
            assert not ok(c, bad)


def test_craftmd_grader_formats_accept_gold_and_parse():
    ext = CRAFT.constraint("grader_extract")
    golds = [case["answer"] for case in CRAFT_CASES] + ["iron deficiency anaemia", "impetigo, eczema herpeticum", "Multiple", "None"]
    for g in golds:
        for reply in (g, f" {g}", f" {g}\n"):
            assert ok(ext, reply), reply
            value, status = grading.parse_extraction(reply)
            assert status in ("ok", "concurrent", "multiple", "none") and (value or "").lower() in ("", g.lower())
    for bad in ("", "Diagnosis:\n\nmigraine", "migraine; tension headache", "  two spaces", "a\nb"):
        assert not ok(ext, bad), bad
    match = CRAFT.constraint("grader_match")
    for reply, verdict in ((" Yes", True), ("No", False), (" No\n", False)):
        assert ok(match, reply) and extract_verdict(reply) is verdict
    for bad in ("Maybe", "Verdict: Yes", "Yes, because"):
        assert not ok(match, bad)


# ------------------------------------------------------------------ DERA

def _log() -> CaseLog:
    return CaseLog(CaseContext(ScriptedLLM(lambda *a: ""), "x"))


def test_dera_tagged_replies_accept_the_protocol_and_always_parse():
    for task in ("summarize", "careplan"):
        r = DERA.constraint(f"{task}_researcher")
        for reply in ('[RESPONSE: "Pertinent Positives omit the fever."]', "[STOP]"):
            assert ok(r, reply)
            log = _log()
            parse_researcher(log, "researcher:1", reply)
            assert log.parse_errors == []
        for bad in ("RESPONSE: no brackets", '[RESPONSE: "a"] [STOP]', '[RESPONSE: "cut at max_tok', ""):
            assert not ok(r, bad)
        d = DERA.constraint(f"{task}_decider_reply")
        for reply, accepted in (('[RESPONSE: "Agreed."]\n[SCRATCHPAD: "Pertinent Positives: add fever"]', ["Pertinent Positives: add fever"]),
                                ('[RESPONSE: "I disagree: the chat says no fever."]\n[SCRATCHPAD: "none"]', []),
                                ('[RESPONSE: "Both."]\n[SCRATCHPAD: "a: b"]\n[SCRATCHPAD: "c: d"]', ["a: b", "c: d"])):
            assert ok(d, reply)
            log = _log()
            assert parse_decider(log, "decider:2", reply)[1] == accepted and log.parse_errors == []
        for bad in ('[RESPONSE: "Agreed."]', '[SCRATCHPAD: "x"]', '[RESPONSE: "Agreed."] [SCRATCHPAD: "x"]', '[RESPONSE: "a"]\n[SCRATCHPAD: "b'):
            assert not ok(d, bad)


def test_gptf1_json_formats():
    ext = DERA.constraint("gptf1_extract")
    for reply in ('["chest pain", "hypertension"]', "[]"):
        assert ok(ext, reply) and extract_list(reply) == json.loads(reply)
    for bad in ('["chest pain", 3]', '[""]', "chest pain, hypertension", '["chest pain"'):
        assert not ok(ext, bad)
    ver = DERA.constraint("gptf1_verify", n=3)
    for reply in ("[1, 3]", "[]"):
        assert ok(ver, reply) and extract_indices(reply, 3) == json.loads(reply)
    for bad in ("[4]", "[0]", '["1"]', "1, 3"):
        assert not ok(ver, bad)


def test_dera_qa_formats_accept_the_released_gold_answers():
    one, final_open = DERA.constraint("qa_oneshot"), DERA.constraint("qa_oneshot")
    dec = DERA.constraint("qa_decider")
    for q in MEDQA:
        assert ok(one, q["answer"]) and answer_from_completion(q["answer"], mcq=False) == q["answer"].rstrip(".")
        assert ok(final_open, q["answer"] + "\n")
        reply = f"Answer: {q['answer']}\nResponse: it fits the findings."
        assert ok(dec, reply) and extract_after(reply, "answer") == q["answer"]
        lv = letter_values(q)
        mcq, dec_mcq = DERA.constraint("qa_oneshot_mcq", **lv), DERA.constraint("qa_decider_mcq", **lv)
        assert ok(mcq, q["answer_idx"]) and answer_from_completion(q["answer_idx"], mcq=True) == q["answer_idx"]
        assert ok(dec_mcq, f"Answer: {q['answer_idx']}\nResponse: the findings point there.")
        for bad in ("F", f"{q['answer_idx']}) {q['answer']}", ""):
            assert not ok(mcq, bad)
        assert not ok(dec_mcq, f"Answer: {q['answer']}\nResponse: x")
    for bad in ("", "\nIron deficiency", " leading space"):
        assert not ok(one, bad)
    assert not ok(dec, "Response: first\nAnswer: x")


def test_dera_qa_judges():
    ex, sim = DERA.constraint("judge_exact"), DERA.constraint("judge_similarity")
    for reply, verdict in (("True\nBoth name the same drug.", True), ("False", False)):
        assert ok(ex, reply) and extract_bool(reply.splitlines()[0]) is verdict
    for bad in ("Maybe", "true", "The answers are the same. True"):
        assert not ok(ex, bad)
    for reply in ("0.8", "1", "0", "1.0", "0.25\n"):
        assert ok(sim, reply) and 0 <= extract_number(reply) <= 1
    for bad in ("80", "0.8 because", "1.5", "-0.1"):
        assert not ok(sim, bad)


# ------------------------------------------------------------------ autoeval

def test_autoeval_rating_format_in_chat_and_completion_mode():
    rate = J.PROMPTS.constraint("rate")
    reply = "Good: asks about worries.\nBad: no summary.\nSummary: adequate.\nRating: 4"
    assert ok(rate, reply) and J.parse_notes(reply)["rating"] == 4
    for bad in (reply.replace("Rating: 4", "Rating: 6"), reply.replace("Rating: 4", "Rating: four"), "Rating: 4", reply + " (out of 5)"):
        assert not ok(rate, bad)
    cont = rate.continuing("Good:")
    assert ok(cont, reply[len("Good:"):]) and not ok(cont, reply)
    with pytest.raises(ConstraintError):
        CRAFT.constraint("ask_mcq", choices=["a"]).continuing("Good:")


# ------------------------------------------------------------------ the mechanism

def _ctx(answers: str, respond, cache=None, finish="stop"):
    client = ScriptedLLM(respond, cache=cache)
    if finish != "stop":
        orig = client._send

        async def send(*a, **kw):
            r = await orig(*a, **kw)
            r.finish_reasons = [finish] * len(r.texts)
            return r

        client._send = send
    return client, CaseContext(client, "case1", answers=answers)


def test_constraint_is_sent_logged_and_checked_only_in_constrained_mode():
    seen = []

    def respond(role, content, gen):
        seen.append(gen.structured)
        return " Yes" if gen.structured else "Yes, they match."

    c = CRAFT.constraint("grader_match")
    for mode in ("free", "constrained"):
        client, ctx = _ctx(mode, respond)
        r = asyncio.run(ctx.complete("Verdict:", role="grader", gen=GenConfig(max_tokens=4), step="match", constraint=c))
        entry = ctx.calls[0]
        assert entry["constraint"]["applied"] is (mode == "constrained") and entry["constraint"]["declared_by"].endswith("grader_match")
        if mode == "free":
            assert seen[-1] is None and "structured" not in entry["gen"] and r.text == "Yes, they match." and entry["format_ok"] == [False]
        else:
            assert json.loads(seen[-1]) == {"regex": c.spec} and entry["gen"]["structured"] == {"regex": c.spec}
            assert r.text == " Yes" and entry["format_ok"] == [True]
    # a step without a declared format: nothing sent, nothing checked, in either mode
    client, ctx = _ctx("constrained", respond)
    asyncio.run(ctx.complete("Hello", role="grader", gen=GenConfig(), step="free"))
    assert seen[-1] is None and "constraint" not in ctx.calls[0] and "format_ok" not in ctx.calls[0]


def test_a_constrained_reply_cut_at_max_tokens_is_a_counted_format_error_not_a_crash():
    c = CRAFT.constraint("grader_extract")
    client, ctx = _ctx("constrained", lambda role, content, gen: " iron deficiency", finish="length")
    r = asyncio.run(ctx.complete("Diagnosis:", role="grader", gen=GenConfig(max_tokens=2), step="extract", constraint=c))
    assert r.text == "" and ctx.calls[0]["texts"] == [" iron deficiency"] and ctx.calls[0]["format_ok"] == [False]
    assert grading.parse_extraction(r.text) == (None, "unparsed")  # the step's parser counts it
    client, ctx = _ctx("free", lambda role, content, gen: " iron deficiency", finish="length")
    r = asyncio.run(ctx.complete("Diagnosis:", role="grader", gen=GenConfig(max_tokens=2), step="extract", constraint=c))
    assert r.text == " iron deficiency" and ctx.calls[0]["format_ok"] == [False]  # free mode: measured, never altered


def test_cache_keys_differ_between_modes_and_free_keys_are_unchanged(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    calls = []

    def respond(role, content, gen):
        calls.append(gen.structured)
        return "No"

    c = CRAFT.constraint("grader_match")
    keys = {}
    for mode in ("free", "constrained", "free", "constrained"):
        client, ctx = _ctx(mode, respond, cache=cache)
        r = asyncio.run(ctx.complete("Verdict:", role="grader", gen=GenConfig(max_tokens=4), step="m", constraint=c))
        keys.setdefault(mode, set()).add(r.key)
    assert len(keys["free"]) == 1 and len(keys["constrained"]) == 1 and keys["free"] != keys["constrained"]
    assert len(calls) == 2  # each mode asked once, then answered from its own cache entry
    old_gen = {k: v for k, v in asdict(GenConfig(max_tokens=4)).items() if k != "structured"}  # the key before the setting existed
    assert next(iter(keys["free"])) == request_key({"kind": "completion", "model": "scripted-model", "content": "Verdict:", "gen": old_gen})


def test_settings_default_free_and_validate(tmp_path):
    from experiments.core.config import RunSettings

    assert RunSettings().answers == "free"
    assert load_settings(RunSettings, None, {"answers": "constrained"}).answers == "constrained"
    with pytest.raises(ConfigError, match="answers"):
        load_settings(RunSettings, None, {"answers": "strict"})


# ------------------------------------------------------------------ the runner, end to end on a scripted backend

def _qa_backend(role, content, gen):
    """Honours the structured field like vLLM would (for the shapes DERA-QA asks), free text otherwise."""
    prompt = content[-1]["content"] if isinstance(content, list) else content
    want = json.loads(gen.structured) if gen.structured else None
    if want and want.get("choice"):
        return want["choice"][0]  # the probe, and MCQ letters
    if role == "judge":
        return "True\nThe same drug." if "Answer 1" in prompt else "0.8"
    if role == "researcher":
        return "Consider the findings. STOP"
    return "Answer: B\nResponse: it fits." if "Response:" in prompt else "The answer is B"


def _run_qa(tmp_path, mode, out=None):
    from experiments.core.commands import build_settings
    from experiments.core.registry import get
    from experiments.core.runner import prepare_run, run_study

    study = get("dera-qa").make()
    common = {"model": "embedded@http://127.0.0.1:9/v1", "set_": [f"answers={mode}", "max_turns=1"]}
    given = {"out": str(out or tmp_path / mode), "data": str(FIX / "dera" / "medqa_open.jsonl"), "limit": 2, "mcq": True}
    settings, cases = prepare_run(study, build_settings(study, common, given))  # MCQ: no BERTScore encoder in a unit test
    client = ScriptedLLM(_qa_backend, roles=study.roles)
    return asyncio.run(run_study(study, settings, cases, client=client, log=lambda m: None)), client


def test_runner_names_the_mode_everywhere_and_refuses_to_mix_modes(tmp_path):
    for mode in ("free", "constrained"):
        o, client = _run_qa(tmp_path, mode)
        out = tmp_path / mode
        assert o.exit_code == 0
        assert yaml.safe_load((out / "config.yaml").read_text())["answers"] == mode
        ident = json.loads((out / "identity.json").read_text())["answers"]
        assert ident["mode"] == mode and (("declarations" in ident) is (mode == "constrained"))
        m = json.loads((out / "metrics.json").read_text())
        assert m["answers"] == mode and m["answer_formats"]["replies"] > 0
        assert (m["answer_formats"]["constrained_calls"] > 0) is (mode == "constrained")
        assert f"**answers: {mode}**" in (out / "summary.md").read_text().splitlines()[2]
        probes = [c for _, c in client.sent if c in ("One word:",) or (isinstance(c, list) and c[-1]["content"] == "Reply with one word.")]
        assert bool(probes) is (mode == "constrained")  # the endpoint is probed once before a constrained run only
    with pytest.raises(ResultsError, match="answers"):
        _run_qa(tmp_path, "constrained", out=tmp_path / "free")


def test_an_endpoint_that_ignores_the_field_is_refused_before_any_case(tmp_path):
    from experiments.core.commands import build_settings
    from experiments.core.registry import get
    from experiments.core.runner import prepare_run, run_study
    from serving.client import StructuredOutputsUnsupported

    study = get("dera-qa").make()
    common = {"model": "embedded@http://127.0.0.1:9/v1", "set_": ["answers=constrained"]}
    given = {"out": str(tmp_path / "run"), "data": str(FIX / "dera" / "medqa_open.jsonl"), "limit": 1}
    settings, cases = prepare_run(study, build_settings(study, common, given))
    client = ScriptedLLM(lambda role, content, gen: "hello", roles=study.roles)  # answers, but ignores structured_outputs
    with pytest.raises(StructuredOutputsUnsupported, match="ignored the `structured_outputs` field"):
        asyncio.run(run_study(study, settings, cases, client=client, log=lambda m: None))
    assert len(client.sent) == 1 and not (tmp_path / "run" / "records.jsonl").exists()


def test_old_results_without_the_setting_resume_as_free(tmp_path):
    o, _ = _run_qa(tmp_path, "free")
    cfg_path = tmp_path / "free" / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    del cfg["answers"]  # a results directory written before the setting existed
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    o, _ = _run_qa(tmp_path, "free")
    assert o.exit_code == 0 and o.metrics["run"]["cases_resumed"] == 2


def test_compare_warns_when_modes_differ(tmp_path):
    from experiments.core import registry
    from experiments.studies.craftmd.compare import run_compare
    from tests.test_craftmd_compare import make_run

    a = make_run(tmp_path / "a", "free-run", {("vignette", "mcq"): {"c1": [1], "c2": [0]}})
    b = make_run(tmp_path / "b", "constrained-run", {("vignette", "mcq"): {"c1": [1], "c2": [1]}})
    cfg = yaml.safe_load((b / "config.yaml").read_text())
    (b / "config.yaml").write_text(yaml.safe_dump({**cfg, "answers": "constrained"}))
    study = registry.get("craftmd").make()
    res = run_compare([str(a), str(b)], tmp_path / "cmp", study)
    assert [r["answers"] for r in res["runs"]] == ["free", "constrained"]
    assert any("different modes" in w for w in res["warnings"])
    md = (tmp_path / "cmp" / "summary.md").read_text()
    assert "answers: constrained" in md and "**Warning:**" in md
    c = make_run(tmp_path / "c", "free-run-2", {("vignette", "mcq"): {"c1": [0], "c2": [0]}})
    assert not any("different modes" in w for w in run_compare([str(a), str(c)], tmp_path / "cmp2", study)["warnings"])


# ------------------------------------------------------------------ free text bounded by the step's budget

def test_free_text_is_bounded_from_the_steps_max_tokens():
    from experiments.core.constraints import build, word_bounds

    c = DERA.constraint("qa_decider")
    b = c.bounded(250)
    assert "$words" in c.spec and "{0,40}" in b.spec and "$words" not in b.spec        # (250 - 8) // (3 x 2 bounds)
    line = "Answer: x\nResponse: "
    assert ok(b, line + " ".join(["w"] * 41)) and not ok(b, line + " ".join(["w"] * 42))
    assert ok(c, line + " ".join(["w"] * 200))                                         # unfilled: the format without the bound
    reply = DERA.constraint("summarize_decider_reply")
    assert word_bounds(reply.spec) == 5 and "{0,33}" in reply.bounded(512).spec       # RESPONSE + up to 4 SCRATCHPAD lines
    assert DERA.constraint("qa_oneshot").bounded(1).spec == "[^\\s]+( [^\\s]+){0,1}\\n?"  # never below one word
    sim = DERA.constraint("judge_similarity")
    assert sim.bounded(16) == sim                                                      # nothing free to bound
    with pytest.raises(ConstraintError, match="free text without a length bound"):
        build({"regex": "Answer: [^\\n]*\\n?"}, {}, "x")
    with pytest.raises(ConstraintError, match="free text without a length bound"):
        build({"regex": "(Yes|No)( because)+"}, {}, "x")
    with pytest.raises(ConstraintError, match="repetitions need bounds"):
        build({"grammar": 'root ::= ("a" | "b")+'}, {}, "x")
    g = build({"grammar": 'root ::= w (" " w){0,$words}\nw ::= [^ \\t\\n]+'}, {}, "x")
    assert "{0,4}" in g.bounded(20).spec


@pytest.mark.parametrize("prompts", [DERA, CRAFT, J.PROMPTS])
def test_every_declared_free_text_is_bounded(prompts):
    from experiments.core.constraints import unbounded_free_text

    values = {"n": 3, "letters": ["A", "B"], "letter_class": "AB", "choices": ["x", "y"]}
    for name in prompts.declarations():
        c = prompts.constraint(name, **values)
        if c.kind == "regex":
            assert unbounded_free_text(c.spec) is None, name
            assert "$words" not in c.bounded(100).spec, name
