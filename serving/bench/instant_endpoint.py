"""A stand-in OpenAI-compatible endpoint that answers instantly, for measuring our OWN cost only.

Not a model, and never one in a study's tests: ``medstack bench --runner-scale`` measures the runner, client,
cache and results directory against it with the model's time taken out. What it answers is data
(``instant_answers.yaml`` beside it): deterministic, short, and shaped so that a two-party
conversation runs a realistic number of turns.

- A chat of two messages is the answering party's opening (its instructions and the asker's greeting). In a
  longer chat, the asker's view is the one whose third message (after instructions and greeting) is that opening
  sent as a user message; any other is the answering party's. The asker's number of turns is drawn from a hash of
  the opening, so it is the same for every call of one conversation; until then it asks, then it concludes.
- A single-message chat or a text completion gets the ``single`` reply (or a ``single_if`` one).
- ``usage`` counts tokens as characters / 4, a real tokenizer's order of magnitude.

Run: ``python -m serving.bench.instant_endpoint --port 8130 [--delay-ms 200]`` (binds 127.0.0.1;
``--delay-ms`` holds every answer that long, for tests that need a run to stay in flight).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import yaml

MODEL = "instant"
ANSWERS = yaml.safe_load((Path(__file__).with_name("instant_answers.yaml")).read_text())


def _h(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def turns_for(opening: str) -> int:
    """The asker's turns in the conversation that starts with this opening."""
    lo, hi = ANSWERS["turns"]
    return lo + _h(opening) % (hi - lo + 1)


def _content(m: dict) -> str:
    c = m.get("content") or ""
    return c if isinstance(c, str) else json.dumps(c)


def _single(text: str) -> str:
    return next((r for k, r in (ANSWERS.get("single_if") or {}).items() if k in text), None) or ANSWERS["single"].format(n=_h(text) % 40)


def answer_chat(messages: list[dict]) -> str:
    if len(messages) < 2:
        return _single(_content(messages[0]) if messages else "")
    if len(messages) == 2:
        h = _h(_content(messages[0]))
        return ANSWERS["opening_reply"].format(days=3 + h % 20, case=h % 997)
    turn = sum(1 for m in messages if m.get("role") == "assistant")  # the asker's view: greeting + earlier turns = this turn
    opening = _content(messages[2])
    if messages[2].get("role") != "user" or not opening.startswith(ANSWERS["opening"]):
        return ANSWERS["answer"].format(days=turn + 2)
    if turn >= turns_for(opening):
        return ANSWERS["conclude"].format(n=_h(opening) % 40)
    return ANSWERS["ask"].format(turn=turn)


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
