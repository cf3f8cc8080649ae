"""Sending one benchmark request: a streaming completion, timed token by token.

One function, one signature, one result record. Failures are data (``success=False``
with ``error``), never exceptions, so one bad request does not end a benchmark.
The prompt is sent as token ids, so the server sees exactly the tokens the
transformers baseline sees; ``ignore_eos`` makes every request produce exactly
``output_len`` tokens.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field


@dataclass
class RequestOutput:
    """Timing of one request. Times in seconds; ``itl`` holds the gaps between streamed tokens."""

    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


async def send_completion(sdk, model: str, prompt_ids: list[int], output_len: int, *, temperature: float = 0.0) -> RequestOutput:
    """Stream one ``/v1/completions`` request through the openai SDK client ``sdk``."""
    out = RequestOutput(prompt_len=len(prompt_ids))
    start = time.perf_counter()
    out.start = start
    last = start
    chunks = 0
    usage_tokens = None
    try:
        stream = await sdk.completions.create(
            model=model,
            prompt=prompt_ids,
            max_tokens=output_len,
            temperature=temperature,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].text:
                if chunks == 0:
                    out.ttft = now - start
                else:
                    out.itl.append(now - last)
                last = now
                chunks += 1
            if getattr(chunk, "usage", None):
                usage_tokens = chunk.usage.completion_tokens
                out.prompt_len = chunk.usage.prompt_tokens or out.prompt_len
        out.latency = last - start
        out.output_tokens = usage_tokens if usage_tokens is not None else chunks
        if chunks == 0:
            out.error = "the stream ended without any token"
        else:
            out.success = True
    except Exception as e:  # noqa: BLE001 - every failure becomes a record
        out.error = f"{type(e).__name__}: {e}"
        out.latency = time.perf_counter() - start
    return out
