"""MediTOD prompts, built from the template files in ``prompts/`` beside this module.

Stable interface (the LoRA fine-tuning code builds on it):

- ``supervised_prompt(task, sample) -> str``: a one-line task instruction + ``sample["input_text"]``
  + ``"Output:\\n"``. The SAME text is the LoRA training prompt and the ``--mode supervised``
  evaluation prompt; the training completion is ``sample["target_text"]`` (one line).
- ``icl_prompt(task, sample, exemplars, *, budget_tokens=None, count_tokens=None) -> str``: the
  full task instruction (intents / slots / attributes defined in our own words), then the
  exemplars (``Input``/``Output`` pairs, most similar closest to the test input), then the test
  input. When ``budget_tokens`` is given the prompt is made to fit: the least similar exemplars
  are dropped first, never the test sample; if the test sample alone is still too long, its
  oldest history utterances are dropped. ``fit_icl_prompt`` returns what was kept as well.
- ``make_token_counter(alias)``: counts tokens with the model's own tokenizer (transformers
  ``AutoTokenizer`` from the resolved local weights), or a conservative 1 token / 3 characters.

Generation stops at a blank line (``STOP``); models answer on one line after ``Output:``.
"""

from __future__ import annotations

from pathlib import Path
from string import Template
from typing import Callable

from experiments.meditod.tasks import serialize_input
from experiments.prompts import PromptSet

PROMPT_DIR = Path(__file__).with_name("prompts")
PROMPTS = PromptSet(PROMPT_DIR)  # the one loader; templates are substituted byte-exact (no strip: training prompts end in "Output:\n")
STOP = ("\n\n", "\n###", "\nDialogue history:")


def template(name: str) -> str:
    return PROMPTS.text(name)


def prompt_hash(*names: str) -> str:
    return PROMPTS.hash(*names)


def instruction(task: str, short: bool = False) -> str:
    text = template(f"{task}_instruction.txt").strip()
    return text.splitlines()[0] if short else text


def templates_used(task: str, mode: str) -> list[str]:
    base = [f"{task}_instruction.txt"]
    return base + (["supervised.txt"] if mode == "supervised" else ["icl.txt", "icl_example.txt"])


def supervised_prompt(task: str, sample: dict) -> str:
    return Template(template("supervised.txt")).substitute(instruction=instruction(task, short=True), input=sample["input_text"])


def fit_supervised_prompt(task: str, sample: dict, *, budget_tokens: int | None = None,
                          count_tokens: Callable[[str], int] | None = None) -> tuple[str, int | None]:
    """(supervised prompt, history utterances kept or None): oldest history dropped only if over budget."""
    prompt = supervised_prompt(task, sample)
    count = count_tokens or estimate_tokens
    if budget_tokens is None or count(prompt) <= budget_tokens:
        return prompt, None
    for h in range(len(sample["context"]) - 1, -1, -1):
        prompt = supervised_prompt(task, {**sample, "input_text": serialize_input(task, sample, history_turns=h)})
        if count(prompt) <= budget_tokens:
            return prompt, h
    return prompt, 0


def _render_icl(task: str, test_input: str, exemplars: list[dict]) -> str:
    ex = Template(template("icl_example.txt"))
    # exemplars arrive most similar first; the most similar is placed closest to the test input
    examples = "".join(ex.substitute(input=e["input_text"], output=e["target_text"]) for e in reversed(exemplars))
    return Template(template("icl.txt")).substitute(instruction=instruction(task), examples=examples, input=test_input)


def fit_icl_prompt(task: str, sample: dict, exemplars: list[dict], *, budget_tokens: int | None = None,
                   count_tokens: Callable[[str], int] | None = None) -> tuple[str, int, int | None]:
    """(prompt, exemplars kept, history utterances kept or None if untouched)."""
    count = count_tokens or estimate_tokens
    for n in range(len(exemplars), -1, -1):
        prompt = _render_icl(task, sample["input_text"], exemplars[:n])
        if budget_tokens is None or count(prompt) <= budget_tokens:
            return prompt, n, None
    for h in range(len(sample["context"]) - 1, -1, -1):
        prompt = _render_icl(task, serialize_input(task, sample, history_turns=h), [])
        if count(prompt) <= budget_tokens:
            return prompt, 0, h
    return prompt, 0, 0


def icl_prompt(task: str, sample: dict, exemplars: list[dict], *, budget_tokens: int | None = None,
               count_tokens: Callable[[str], int] | None = None) -> str:
    return fit_icl_prompt(task, sample, exemplars, budget_tokens=budget_tokens, count_tokens=count_tokens)[0]


def estimate_tokens(text: str) -> int:
    """Conservative token estimate when no tokenizer is at hand (JSON and names run ~3 chars/token)."""
    return len(text) // 3 + 1


def make_token_counter(alias: str) -> Callable[[str], int]:
    """Token counter with the served model's tokenizer, or the conservative estimate."""
    try:
        from transformers import AutoTokenizer

        from models.paths import set_offline
        from models.registry import resolve_weights

        set_offline()
        _, path = resolve_weights(alias)
        tok = AutoTokenizer.from_pretrained(str(path))
    except Exception:  # noqa: BLE001 - no local weights/tokenizer: fall back to the estimate
        return estimate_tokens

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=True)["input_ids"])

    return count
