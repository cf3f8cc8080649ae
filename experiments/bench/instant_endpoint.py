"""A stand-in OpenAI-compatible endpoint that answers instantly — for measuring our OWN cost only.

This is not a model and never stands in for one in a study's tests: it exists so that
``medstack bench --runner-scale`` measures the runner, client, cache and results directory with
the model's time taken out. Answers are deterministic, short, and shaped so that a CRAFT-MD
conversation runs a realistic number of turns:

- a chat request of two messages is the patient's opening (its instructions and the doctor's greeting);
  a longer one is a conversation turn, the doctor's when its third message (after instructions and
  greeting) is that opening sent as a user message, else the patient's. The conversation's number of
  doctor turns T is drawn from a hash of that message (the patient's opening, itself
  derived from the case text): T = 5 + hash % 9, i.e. 5..13, mean 9, which with CRAFT-MD's 17
  answer/summary/grader calls gives ~35 calls per case-trial (the LLaMA-2-7b runs the CRAFT-MD
  authors released average 9.4 assistant messages per conversation). Until the turn-T reply, a
  turn ends with a question mark; the turn-T reply names a "Final Diagnosis". Lengths follow the
  same release: ~350 characters per doctor turn, ~110 per patient turn;
- a single-message chat request or a text completion (answers, summary, grader) gets a short
  "Diagnosis: ..." line, or "Verdict: No" when it asks for a verdict (so the grader is not re-asked);
- ``usage`` counts tokens as characters / 4 (prompt: every message's content), like a real
  tokenizer's order of magnitude, so token accounting runs on realistic numbers.

Run: ``python -m experiments.bench.instant_endpoint --port 8130 [--delay-ms 200]`` (binds 127.0.0.1;
``--delay-ms`` holds every answer that long, for tests that need a run to stay in flight). Endpoints:
``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``; anything else 404.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

MODEL = "instant"
OPENING = "Hello doctor."  # how the stand-in's patient opening starts: the doctor's view is told apart by it
DOCTOR_TAIL = ("Could you tell me whether the pain gets worse at night, whether anything makes it better, and whether you "
               "have noticed fever, weight loss, a rash, or changes in appetite since this started? Any recent travel?")
PATIENT_TEXT = ("It started about {d} days ago. It is worse in the evening and resting helps a little. "
                "No fever that I noticed, and I have not travelled.")


def _h(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def turns_for(opening: str) -> int:
    """Doctor turns of the conversation that starts with this patient message: 5..13."""
    return 5 + _h(opening) % 9


def _content(m: dict) -> str:
    c = m.get("content") or ""
    return c if isinstance(c, str) else json.dumps(c)


def _single(text: str) -> str:
    return "Verdict: No" if "Verdict:" in text else f"Diagnosis: condition {_h(text) % 40}"


def answer_chat(messages: list[dict]) -> str:
    if len(messages) < 2:
        return _single(_content(messages[0]) if messages else "")
    if len(messages) == 2:  # the patient's opening (system prompt with the case, the doctor's greeting)
        h = _h(_content(messages[0]))
        return f"{OPENING} For about {3 + h % 20} days I have had trouble number {h % 997}, and it is getting worse."
    opening = _content(messages[2])
    if messages[2].get("role") != "user" or not opening.startswith(OPENING):  # the patient's view: answer the doctor's question
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        return PATIENT_TEXT.format(d=turn + 2)
    turn = sum(1 for m in messages if m.get("role") == "assistant")  # the doctor's view: greeting + earlier turns = this turn's number
    if turn >= turns_for(opening):
        return f"Thank you, that is clear. Final Diagnosis: condition {_h(opening) % 40}."
    return f"Thank you. About turn {turn}: {DOCTOR_TAIL}"


def tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _response(kind: str, body: dict) -> dict:
    n = int(body.get("n") or 1)
    if kind == "chat":
        messages = body.get("messages") or []
        text = answer_chat(messages)
        prompt_tokens = sum(tokens(_content(m)) + 4 for m in messages)
        choices = [{"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop", "logprobs": None} for i in range(n)]
        obj = "chat.completion"
    else:
        prompt = body.get("prompt") or ""
        prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
        text = _single(prompt) + "\n"
        prompt_tokens = tokens(prompt)
        choices = [{"index": i, "text": text, "finish_reason": "stop", "logprobs": None} for i in range(n)]
        obj = "text_completion"
    return {"id": "instant-1", "object": obj, "created": int(time.time()), "model": body.get("model") or MODEL, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens(text) * n, "total_tokens": prompt_tokens + tokens(text) * n}}


DELAY_S = 0.0  # --delay-ms: a fixed wait before each answer (a slow endpoint, for tests that need a run in flight)


async def app(scope, receive, send):  # a bare ASGI app: no framework cost on the endpoint's side
    if scope["type"] != "http":
        return
    if DELAY_S:
        import asyncio

        await asyncio.sleep(DELAY_S)
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    path, status = scope["path"], 200
    if scope["method"] == "GET" and path == "/v1/models":
        out = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "medstack-bench"}]}
    elif scope["method"] == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
        out = _response("chat" if "chat" in path else "completion", json.loads(body or b"{}"))
    else:
        status, out = 404, {"error": {"message": f"no route {path}"}}
    data = json.dumps(out).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def main() -> None:
    ap = argparse.ArgumentParser(description="An OpenAI-compatible stand-in that answers instantly (benchmarks of our own cost).")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="wait this long before every answer (default: none)")
    a = ap.parse_args()
    global DELAY_S
    DELAY_S = a.delay_ms / 1000
    import uvicorn

    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False, http="httptools", loop="uvloop")


if __name__ == "__main__":
    main()
