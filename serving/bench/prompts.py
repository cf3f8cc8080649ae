"""Benchmark prompts: token-id lists of exactly ``input_len`` tokens, identical for both engines.

Default source: fictional clinical dialogue snippets written for medstack
(``serving/bench/data/dialogues.jsonl``). ``--prompts FILE`` reads the user's own
texts (JSONL with a ``prompt``/``text`` field, or ``turns`` like our data; or plain text,
one prompt per non-empty line). ``--random-prompts`` draws random token ids instead.

Every prompt starts with ``<bos>`` (Gemma needs it; our tokenizer does not add it) and a
unique header line, then dialogue text from a different starting snippet, cut to the exact
length. The unique start keeps vLLM's prefix cache from serving one prompt from another,
which a plain ``generate`` loop could not do either.
"""

from __future__ import annotations

import random
from pathlib import Path

from models.jsontext import iter_jsonl
from models.errors import DataError

DEFAULT_DATA = Path(__file__).with_name("data") / "dialogues.jsonl"


def _turns_text(turns: list, where: str) -> str:
    lines = []
    for t in turns:
        if not isinstance(t, dict) or "text" not in t:
            raise DataError(f"{where}: each turn needs a 'text' field (and optionally 'role')")
        role = str(t.get("role", "speaker")).capitalize()
        lines.append(f"{role}: {t['text']}")
    return "\n".join(lines)


def load_texts(path: str | Path | None = None) -> list[str]:
    """Source texts from a JSONL/plain-text file (default: our dialogue snippets)."""
    p = Path(path) if path else DEFAULT_DATA
    if not p.exists():
        raise DataError(f"{p}: prompts file does not exist")
    texts: list[str] = []
    if p.suffix == ".jsonl":
        for lineno, row in iter_jsonl(p):
            where = f"{p}:{lineno}"
            if "turns" in row:
                texts.append(_turns_text(row["turns"], where))
            elif isinstance(row.get("prompt") or row.get("text"), str):
                texts.append(row.get("prompt") or row.get("text"))
            else:
                raise DataError(f"{where}: expected a 'prompt', 'text' or 'turns' field")
    else:
        texts = [line.strip() for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        raise DataError(f"{p}: no prompts in file")
    return texts


def build_prompts(tokenizer, texts: list[str], n: int, input_len: int, seed: int = 0) -> list[list[int]]:
    """``n`` distinct prompts of exactly ``input_len`` token ids, built from ``texts``."""
    if input_len < 8:
        raise DataError(f"--input-len {input_len}: need at least 8 tokens")
    encoded = [tokenizer.encode(t + "\n\n", add_special_tokens=False) for t in texts]
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    prompts = []
    for i in range(n):
        ids = bos + tokenizer.encode(f"Clinic visit {i + 1}.\n", add_special_tokens=False)
        k = i
        while len(ids) < input_len:
            ids += encoded[order[k % len(order)]]
            k += 1
        prompts.append(ids[:input_len])
    return prompts


def random_prompts(tokenizer, n: int, input_len: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of random ordinary (non-special) token ids, after ``<bos>``."""
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(min(len(tokenizer), 200_000)) if i not in special]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return [(bos + [rng.choice(vocab) for _ in range(input_len)])[:input_len] for _ in range(n)]
