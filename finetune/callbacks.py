"""Trainer callbacks: throughput (training tokens/s) and a progress bar that shows loss and tok/s."""

from __future__ import annotations

import time

from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback


class ThroughputCallback(TrainerCallback):
    """Training tokens/s: input tokens (padding excluded) over time spent training, evaluation and checkpoint saving excluded.

    Adds ``tokens_per_s`` (since the previous log) and ``tokens_seen`` to every train log and to
    ``state.log_history``. Needs ``include_num_input_tokens_seen="non_padding"`` in the TrainingArguments.
    Runs before the progress callback, so the numbers show up in the bar.
    """

    def __init__(self) -> None:
        self.t_last = None
        self.tokens_last = 0
        self.train_seconds = 0.0  # pure training time
        self.train_tokens = 0

    def on_train_begin(self, args, state, control, **kw):
        self.t_last = time.perf_counter()
        self.tokens_last = state.num_input_tokens_seen or 0

    def on_log(self, args, state, control, logs=None, **kw):
        if logs is None or "loss" not in logs or self.t_last is None:
            return
        now = time.perf_counter()
        tokens = state.num_input_tokens_seen or 0
        dt = max(now - self.t_last, 1e-9)
        self.train_seconds += dt
        self.train_tokens += tokens - self.tokens_last
        extra = {"tokens_per_s": round((tokens - self.tokens_last) / dt, 2), "tokens_seen": int(tokens)}
        logs.update(extra)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(extra)
        self.t_last, self.tokens_last = now, tokens

    def _pause_ends(self):  # evaluation / saving happened since the last log: restart the clock
        if self.t_last is not None:
            self.t_last = time.perf_counter()

    def on_evaluate(self, args, state, control, **kw):
        self._pause_ends()

    def on_save(self, args, state, control, **kw):
        self._pause_ends()

    @property
    def tokens_per_s(self) -> float | None:
        return round(self.train_tokens / self.train_seconds, 2) if self.train_seconds > 0 else None


class LossProgressCallback(ProgressCallback):
    """transformers' tqdm bar, with the latest loss, valid loss and tokens/s as its postfix instead of printed dicts."""

    def __init__(self) -> None:
        super().__init__()
        self.postfix: dict = {}

    def on_log(self, args, state, control, logs=None, **kw):
        if not state.is_world_process_zero or self.training_bar is None or not logs:
            return
        if "loss" in logs:
            self.postfix["loss"] = f"{logs['loss']:.4f}"
        if "tokens_per_s" in logs:
            self.postfix["tok/s"] = f"{logs['tokens_per_s']:.0f}"
        if "eval_loss" in logs:
            self.postfix["valid"] = f"{logs['eval_loss']:.4f}"
        self.training_bar.set_postfix(self.postfix, refresh=True)
