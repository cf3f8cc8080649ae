"""The baseline a user would write without a server: a plain ``transformers`` ``generate`` loop.

Same weights (``models.registry.resolve_weights``), same token ids, same output length
(``min_new_tokens = max_new_tokens``, greedy), in the dtype of the vLLM server it is compared with
(float32 unless that server computes in bfloat16: ``serving.bench.run.baseline_dtype``). Batch size 1 is a loop over the
prompts; batched runs ``generate`` on groups of ``batch_size`` prompts one after another
(all prompts have the same length, so no padding). A streamer records when each decoding
step hands out its tokens, giving TTFT / inter-token gaps per request; a request's clock
starts when its batch starts. The figures go through the same ``calculate_metrics``.
"""

from __future__ import annotations

import time

from serving.bench.measure import calculate_metrics
from serving.bench.send import RequestOutput


class _StepTimes:
    """A ``generate`` streamer that only notes when each step's tokens arrive (the first put is the prompt)."""

    def __init__(self):
        self.times: list[float] = []
        self._seen_prompt = False

    def put(self, value) -> None:
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def load_model(weights_dir: str, threads: int | None = None, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM

    if threads:
        torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(str(weights_dir), dtype=getattr(torch, dtype))
    model.eval()
    return model


def generate_batch(model, prompts: list[list[int]], output_len: int) -> list[RequestOutput]:
    """One ``generate`` call over ``prompts`` (equal lengths); one timing record per prompt."""
    import torch

    input_ids = torch.tensor(prompts, dtype=torch.long)
    streamer = _StepTimes()
    start = time.perf_counter()
    try:
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=output_len,
                min_new_tokens=output_len,
                do_sample=False,
                streamer=streamer,
                pad_token_id=model.config.pad_token_id if model.config.pad_token_id is not None else 0,
            )
    except Exception as e:  # noqa: BLE001 - failures are data
        err = f"{type(e).__name__}: {e}"
        return [RequestOutput(error=err, prompt_len=len(p), start=start, latency=time.perf_counter() - start) for p in prompts]
    t = streamer.times
    n_new = int(out.shape[1] - input_ids.shape[1])
    records = []
    for p in prompts:
        records.append(RequestOutput(
            success=bool(t) and n_new > 0,
            error="" if t else "generate returned no tokens",
            prompt_len=len(p),
            output_tokens=n_new,
            ttft=(t[0] - start) if t else 0.0,
            itl=[b - a for a, b in zip(t, t[1:])],
            latency=(t[-1] - start) if t else 0.0,
            start=start,
        ))
    return records


def run_level(model, prompts: list[list[int]], output_len: int, batch_size: int) -> tuple[dict, list[RequestOutput]]:
    """Run all ``prompts`` in batches of ``batch_size``; return (figures, per-request records)."""
    outputs: list[RequestOutput] = []
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        outputs += generate_batch(model, prompts[i:i + batch_size], output_len)
    duration = time.perf_counter() - t0
    return calculate_metrics(outputs, duration), outputs


def warm_up(model, prompt: list[int]) -> None:
    generate_batch(model, [prompt], 2)
