"""MediTOD requests, built as the dataset authors' released code builds them (docs/protocols.md, MediTOD;
experiments/studies/meditod/README.md, Inputs); wording ours, in the template files of ``prompts/``.

In-context (chat messages, ``icl_messages``): a system message (task + ontology), then per exemplar
(most similar first) its input as a user message and its gold answer as JSON as an assistant message, then
the test input. ``fit_icl_messages`` drops the least similar exemplars while the request does not fit the
model's context (the test input always stays). Inputs:

    NLU  [dialog history]\n<lines>\n\n[last turn]\n<lines>\n\n[output]
    POL  [dialog state]\n```\n<state, indented JSON>\n```\n\n[last turn]\n<lines>\n\n[output]
    NLG  [actions]\n```\n<actions, indented JSON>\n```\n\n[last turn]\n<lines>\n\n[output]

Supervised (``sft_messages``): system (one line), user, and for training an assistant message
``[answer] <target> [done]``, rendered by ``render_sft`` (models/prompt_format.py, shared with fine-tuning):

    NLU  [dialog history]\n<lines>\n\n (only when there is history) [last turn]\n<lines>\n\n[output]
    POL  [dialog state]\n<state, one-line JSON>\n\n + the NLU blocks
    NLG  [action]\n<actions, one-line JSON>\n\n[last turn]\n<lines>\n\n[output]

``parse_sft`` lower-cases the reply, cuts it at ``[done]`` and parses JSON (a failure is a format error).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from experiments.studies.meditod.ontology import from_status_shape, render_ontology
from experiments.common.parsing import extract_json
from experiments.core.prompts import PromptSet
from models.prompt_format import ANSWER, DONE

PROMPT_DIR = Path(__file__).with_name("prompts")
PROMPTS = PromptSet(PROMPT_DIR)


def template(name: str) -> str:
    return PROMPTS.text(name)


def prompt_hash(*names: str) -> str:
    return PROMPTS.hash(*names)


def templates_used(task: str, mode: str) -> list[str]:
    return [f"{'icl' if mode == 'icl' else 'sft'}_{task}_system.txt"]


def _lines(lines: list[str]) -> str:
    return "\n".join(lines)


# ------------------------------------------------------------------ in-context

def icl_system(task: str) -> str:
    values = {} if task == "nlg" else {"ontology": render_ontology(task)}
    return PROMPTS.render(f"icl_{task}_system.txt", **values)


def icl_user(task: str, sample: dict) -> str:
    last = "[last turn]\n" + _lines(sample["last_turn"]) + "\n\n[output]"
    if task == "nlu":
        return "[dialog history]\n" + _lines(sample["history"]) + "\n\n" + last
    if task == "pol":
        return "[dialog state]\n```\n" + json.dumps(sample["state"], indent=2) + "\n```\n\n" + last
    return "[actions]\n```\n" + json.dumps(sample["actions"], indent=2) + "\n```\n\n" + last


def icl_assistant(task: str, sample: dict) -> str:
    return sample["answer"] if task == "nlg" else json.dumps(sample["answer"])


def icl_messages(task: str, sample: dict, exemplars: list[dict]) -> list[dict]:
    """System, then (user, assistant) per exemplar in the order given (most similar first), then the test input."""
    msgs = [{"role": "system", "content": icl_system(task)}]
    for e in exemplars:
        msgs += [{"role": "user", "content": icl_user(task, e)}, {"role": "assistant", "content": icl_assistant(task, e)}]
    return msgs + [{"role": "user", "content": icl_user(task, sample)}]


def fit_icl_messages(task: str, sample: dict, exemplars: list[dict], *, budget_tokens: int | None = None,
                     count_tokens: Callable[[list[dict]], int] | None = None) -> tuple[list[dict], int]:
    """(messages, exemplars kept): the least similar exemplars go first while over ``budget_tokens``."""
    count = count_tokens or estimate_message_tokens
    for n in range(len(exemplars), -1, -1):
        msgs = icl_messages(task, sample, exemplars[:n])
        if budget_tokens is None or count(msgs) <= budget_tokens:
            return msgs, n
    return msgs, 0


def parse_icl(task: str, text: str):
    """The reply lower-cased (as the authors' post-processing does); NLU/POL: the first JSON list (an object is
    wrapped) or None (format error), NLU converted back to the data's prefixed slots; NLG: the stripped text."""
    text = (text or "").lower()
    if task == "nlg":
        return text.strip()
    value = extract_json(text)
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        return None
    return from_status_shape(value) if task == "nlu" else value


# ------------------------------------------------------------------ supervised

def sft_user(task: str, sample: dict) -> str:
    history = "[dialog history]\n" + _lines(sample["history"]) + "\n\n" if sample["history"] else ""
    last = "[last turn]\n" + _lines(sample["last_turn"]) + "\n\n[output]"
    if task == "nlu":
        return history + last
    if task == "pol":
        return "[dialog state]\n" + json.dumps(sample["state"]) + "\n\n" + history + last
    return "[action]\n" + json.dumps(sample["actions"]) + "\n\n" + last


def sft_answer(task: str, sample: dict) -> str:
    body = sample["target"] if task == "nlg" else json.dumps(sample["target"])
    return f"{ANSWER} {body} {DONE}"


def sft_messages(task: str, sample: dict, *, with_answer: bool = True) -> list[dict]:
    msgs = [{"role": "system", "content": PROMPTS.render(f"sft_{task}_system.txt")},
            {"role": "user", "content": sft_user(task, sample)}]
    return msgs + ([{"role": "assistant", "content": sft_answer(task, sample)}] if with_answer else [])


def parse_sft(task: str, text: str):
    """Lower-case, cut at ``[done]`` (and at a stray ``[1]``, as the authors do), then NLU/POL: ``json.loads``;
    a failure or a non-list is a format error (None). NLG: the text."""
    text = (text or "").lower().split(DONE, 1)[0].strip().split("[1]", 1)[0].strip()
    if task == "nlg":
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, list) else None


# ------------------------------------------------------------------ token counting

def estimate_message_tokens(messages: list[dict]) -> int:
    """Conservative estimate when no tokenizer is at hand (JSON and names run ~3 chars/token)."""
    return sum(len(m["content"]) // 3 + 4 for m in messages) + 1


def load_tokenizer(alias: str):
    """The model's own tokenizer from its local weights, or None (nothing is downloaded)."""
    try:
        from transformers import AutoTokenizer

        from models.paths import set_offline
        from models.registry import get_spec, resolve_weights

        set_offline()
        _, path = resolve_weights(alias)
        tok = AutoTokenizer.from_pretrained(str(path))
        if tok.chat_template is None and get_spec(alias).chat_template_path():  # the template vLLM serves it with
            tok.chat_template = get_spec(alias).chat_template_path().read_text()
        return tok
    except Exception:  # noqa: BLE001 - no local weights/tokenizer
        return None


def make_message_counter(alias: str) -> Callable[[list[dict]], int]:
    """Tokens of a chat request as the server renders it (the model's chat template), or the estimate."""
    tok = load_tokenizer(alias)
    if tok is None or tok.chat_template is None:
        return estimate_message_tokens

    def count(messages: list[dict]) -> int:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)

    return count


def make_token_counter(alias: str) -> Callable[[str], int]:
    """Tokens of a text with the model's tokenizer, or ~3 characters per token."""
    tok = load_tokenizer(alias)
    if tok is None:
        return lambda text: len(text) // 3 + 1
    return lambda text: len(tok(text, add_special_tokens=True)["input_ids"])
