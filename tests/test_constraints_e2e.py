"""Constrained answers against the real vLLM server (embedded model): one test per constraint kind (choice,
regex, JSON schema, grammar), each sent through the runner's CaseContext with answers: constrained exactly as the
studies send it, and the reply obeys the declared format; the probe passes on a real server; a fake
endpoint that rejects the field stops a constrained run before any case (exit 2)."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest

from experiments.studies.craftmd.prompts import PROMPTS as CRAFT
from experiments.studies.craftmd.prompts import render
from experiments.core.constraints import build
from experiments.studies.dera.prompts import PROMPTS as DERA
from experiments.studies.dera.prompts import render as render_dera
from experiments.core.study import CaseContext
from serving.client import Endpoint, GenConfig, LLMClient
from tests.scripted import ChatStub, serve_stub

pytestmark = pytest.mark.e2e
FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def server(request):
    """The shared test server (MEDSTACK_TEST_SERVER, used as is: no adapter is loaded into it) or the session's own."""
    url = os.environ.get("MEDSTACK_TEST_SERVER")
    return {"base_url": url} if url else request.getfixturevalue("embedded_server")


def _client(server) -> LLMClient:
    return LLMClient({"default": Endpoint(server["base_url"], "embedded", "embedded-e2e-constraints")}, timeout=300, retries=1)


def _ask(server, kind, content, constraint, gen):
    async def go():
        client = _client(server)
        try:
            await client.check_structured_outputs()  # the real server supports the field: no error
            ctx = CaseContext(client, "e2e", answers="constrained")
            send = ctx.chat if kind == "chat" else ctx.complete
            r = await send(content, role="default", gen=gen, step="e2e", constraint=constraint)
            return r, ctx.calls[0]
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_choice_constraint_mcq_answer_is_one_of_the_choices(server):
    choices = ["Plaque psoriasis", "Atopic dermatitis", "Tinea corporis", "Lichen planus"]
    prompt = render("ask_mcq", identity=render("identity_specialist", specialty="Dermatology"),
                    case="A 30-year-old woman has silvery scaly plaques on both elbows and pitted nails.",
                    question="What is the most likely diagnosis?", choices=", ".join(choices)) + "\nAnswer:"
    c = CRAFT.constraint("ask_mcq", choices=choices)
    r, entry = _ask(server, "completion", prompt, c, GenConfig(temperature=0.7, max_tokens=24, seed=1))
    assert entry["gen"]["structured"] == {"choice": choices} and entry["format_ok"] == [True]
    assert r.text in choices


def test_regex_constraint_dera_researcher_reply_is_tagged(server):
    c = DERA.constraint("summarize_researcher")
    prompt = ("You review a summary of a doctor-patient chat. Point out one problem as [RESPONSE: \"your message\"], "
              "or write [STOP] if there is none.\nSummary: Pertinent Positives: cough for three days.\n")
    r, entry = _ask(server, "chat", [{"role": "user", "content": prompt}], c, GenConfig(temperature=0.0, max_tokens=120))
    assert entry["gen"]["structured"] == {"regex": c.bounded(120).spec} and "{0,37}" in c.bounded(120).spec  # (120 - 8) // 3 words
    # the bounded words close the tag inside the budget: the whole reply obeys the regex
    assert entry["finish_reasons"] == ["stop"] and c.check(r.text) and entry["format_ok"] == [True]
    assert r.text == "[STOP]" or r.text.startswith('[RESPONSE: "')


def test_bounded_one_line_answers_end_inside_their_budget(server):
    """DERA-QA's one-shot answer (5 samples, max_tokens 50): unbounded, a small model wrote one long line until
    max_tokens and a third of the answers were cut; with $words filled from max_tokens every sample ends itself."""
    c = DERA.constraint("qa_oneshot")
    q = json.loads((FIX / "dera" / "medqa_open.jsonl").read_text().splitlines()[0])
    prompt = render_dera("qa_oneshot", question=q["question_open"])
    r, entry = _ask(server, "chat", [{"role": "user", "content": prompt}], c, GenConfig(temperature=0.7, max_tokens=50, n=5, seed=7))
    assert entry["gen"]["structured"] == {"regex": "[^\\s]+( [^\\s]+){0,14}\\n?"}
    # the server does not get the seed (send_seed is off by default), so the five samples vary from run to run: on 20
    # released questions 4 of 100 such samples still reached max_tokens (measured) — a cut sample is
    # counted as a format error, never taken as in format; most samples end themselves inside the bound
    stopped = [f == "stop" for f in entry["finish_reasons"]]
    assert len(stopped) == 5 and sum(stopped) >= 3, entry["finish_reasons"]
    assert entry["format_ok"] == stopped
    assert all(t.strip() and "\n" not in t.strip() for t, ok in zip(r.texts, stopped) if ok)


GRAMMAR = """root ::= verdict ("\\n" reason)?
verdict ::= "Yes" | "No"
reason ::= word (" " word){0,$words}
word ::= [^ \\t\\n]+
"""


def test_grammar_constraint_verdict_and_a_bounded_reason(server):
    """The fourth kind, an EBNF grammar (vLLM's xgrammar syntax), through the same CaseContext as a study's step."""
    c = build({"grammar": GRAMMAR}, {}, "e2e grammar")
    prompt = ("Is fever a symptom of influenza? Answer Yes or No, then give the reason on the next line.\nAnswer:")
    r, entry = _ask(server, "completion", prompt, c, GenConfig(temperature=0.7, max_tokens=40, seed=3))
    sent = entry["gen"]["structured"]["grammar"]
    assert "{0,10}" in sent and "$words" not in sent                      # (40 - 8) // 3 words
    assert entry["constraint"]["kind"] == "grammar" and entry["constraint"]["applied"] is True
    # the server kept the grammar and its bound, whether the reply ended itself or was cut inside a word
    # (a base model that wants to go on past the bound may glue words together: it is then cut, and counted)
    raw = entry["texts"][0]
    assert re.fullmatch(r"(Yes|No)(\n[^ \t\n]+( [^ \t\n]+){0,10})?", raw), raw
    assert entry["format_ok"] == [entry["finish_reasons"] == ["stop"]] and (r.text == raw) == entry["format_ok"][0]


def test_json_schema_constraint_gptf1_verification_numbers(server):
    c = DERA.constraint("gptf1_verify", n=3)
    prompt = DERA.render("gptf1_verify", snippet="Cough and fever for two days, no chest pain.", list_a="cough, fever, chest pain",
                         list_b="1. cough\n2. fever\n3. rash")
    r, entry = _ask(server, "completion", prompt + "\n", c, GenConfig(temperature=0.0, max_tokens=40))
    assert entry["gen"]["structured"] == {"json": c.spec}
    if entry["finish_reasons"] == ["stop"]:
        value = json.loads(r.text)
        assert isinstance(value, list) and all(isinstance(i, int) and 1 <= i <= 3 for i in value)
    else:
        assert r.text == "" and entry["format_ok"] == [False]


class _Rejecting(ChatStub):
    """An OpenAI-shaped endpoint that refuses `structured_outputs` (as a non-vLLM server would) and records requests."""

    seen: list = []

    def answer(self, body: dict) -> str:
        return "hello"

    def reply(self, body: dict) -> tuple[dict, int]:
        _Rejecting.seen.append(body)
        if "structured_outputs" in body:
            return {"error": {"message": "Unrecognized request argument supplied: structured_outputs", "type": "invalid_request_error"}}, 400
        return super().reply(body)


def test_endpoint_rejecting_structured_outputs_exits_2_before_any_case(cli, tmp_path):
    srv = serve_stub(_Rejecting)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
        proc = cli("run", "dera-qa", "--mcq", "--model", f"embedded@{url}", "--data", str(FIX / "dera" / "medqa_open.jsonl"), "--limit", "1",
                   "--out", str(tmp_path / "run"), "--set", "answers=constrained", timeout=300)
    finally:
        srv.shutdown()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "structured outputs" in proc.stderr and "refused" in proc.stderr and "Traceback" not in proc.stderr
    assert _Rejecting.seen and all("structured_outputs" in b for b in _Rejecting.seen)  # only the probe went out
    assert not (tmp_path / "run" / "records.jsonl").exists()
