"""MediTOD supervised fine-tuning samples, built as the dataset authors' released code builds them (docs/protocols.md, MediTOD).

Samples come from the MediTOD study's own builders (``experiments.studies.meditod.tasks.sft_samples``, the
authors' per-task windows) and messages (``experiments.studies.meditod.prompts.sft_messages``): system,
user (``[dialog state]``/``[action]``, ``[dialog history]``, ``[last turn]``, ``[output]`` blocks) and
assistant ``[answer] <target> [done]``. ``render_sft`` (models/prompt_format.py) renders them with the base's chat template
(``chat``) or joins them by newlines (``completion``, for a base without a chat template); the
evaluation run (``medstack run meditod-<task> --mode supervised``) sends the same rendering up to
``[answer]``. The loss covers only what follows the response marker ``[answer]``: every token up
to and including it gets the label -100.
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.studies.meditod.data import load_dialogs, load_split_ids
from experiments.studies.meditod.prompts import sft_messages
from experiments.studies.meditod.tasks import sft_samples
from models.errors import DataError
from models.prompt_format import ANSWER, render_sft

IGNORE_INDEX = -100


def split_file(splits_dir: Path, split: str) -> Path:
    return Path(splits_dir) / f"{split}_ids.json"


def load_pairs(dialogs_path: str, splits_dir: str | None, split: str, task: str, *, history_size: int | None = None) -> list[dict]:
    """[{id, split, messages}] for one split (``history_size``: the authors' parameter; None = 4, their configs')."""
    splits = Path(splits_dir) if splits_dir else Path(dialogs_path).parent
    if not split_file(splits, split).exists():
        raise DataError(f"split {split!r}: {split_file(splits, split)} not found (expected a JSON list of dialog ids)")
    dialogs = load_dialogs(dialogs_path)
    ids = load_split_ids(splits, split, dialogs=dialogs)
    samples = sft_samples(dialogs, ids, task, **({} if history_size is None else {"history_size": history_size}))
    if not samples:
        raise DataError(f"split {split!r} ({split_file(splits, split)}): no {task} samples in its dialogues")
    return [{"id": s["id"], "split": split, "messages": sft_messages(task, s)} for s in samples]


def render_pair(tokenizer, messages: list[dict], prompt_format: str) -> tuple[str, str]:
    """(text up to and including the response marker, the rest): the loss is taken on the rest only."""
    text = render_sft(messages, prompt_format, tokenizer)
    cut = text.rindex(ANSWER) + len(ANSWER)
    return text[:cut], text[cut:]


def tokenize_pair(tokenizer, prompt: str, completion: str, max_length: int, prompt_format: str = "completion") -> dict:
    """input_ids = prompt ++ completion (++ eos for the completion format); labels mask the prompt (-100).

    A chat rendering carries its own special tokens (BOS, end of turn); a completion rendering gets
    the tokenizer's BOS and an EOS after the answer. Too long: the completion is kept (cut to half the
    budget at most) and the prompt loses its oldest tokens, keeping the leading BOS.
    """
    prompt_ids = tokenizer(prompt, add_special_tokens=prompt_format != "chat")["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    if prompt_format != "chat":
        completion_ids = completion_ids + [tokenizer.eos_token_id]
    truncated = False
    if len(prompt_ids) + len(completion_ids) > max_length:
        truncated = True
        completion_ids = completion_ids[: max(max_length // 2, max_length - len(prompt_ids))]
        keep = max_length - len(completion_ids)
        head = prompt_ids[:1] if prompt_ids and prompt_ids[0] == tokenizer.bos_token_id else []
        prompt_ids = head + prompt_ids[len(prompt_ids) - (keep - len(head)):]
    input_ids = list(prompt_ids) + list(completion_ids)
    labels = [IGNORE_INDEX] * len(prompt_ids) + list(completion_ids)
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels, "truncated": truncated}


def build_dataset(pairs: list[dict], tokenizer, max_length: int, prompt_format: str = "completion"):
    """A `datasets.Dataset` of tokenized samples (columns input_ids, attention_mask, labels)."""
    from datasets import Dataset

    rows = [tokenize_pair(tokenizer, *render_pair(tokenizer, p["messages"], prompt_format), max_length, prompt_format)
            for p in pairs]
    ds = Dataset.from_list([{k: r[k] for k in ("input_ids", "attention_mask", "labels")} for r in rows])
    ds.info.description = f"truncated={sum(r['truncated'] for r in rows)}"
    return ds


def write_samples(recipe, out: Path, tokenizer=None) -> dict:
    """``finetune --dry-run``: ``out/samples.jsonl``, one line per training (``data.limit`` applied, as in
    training) and validation sample: split, id, messages, and the rendered ``text`` when a tokenizer is given
    (always for the completion format). Returns counts per split."""
    d = recipe.data
    pairs = load_pairs(d.dialogs, d.splits_dir, d.train_split, d.task, history_size=d.history_size)[: d.limit]
    if d.valid_split:
        pairs += load_pairs(d.dialogs, d.splits_dir, d.valid_split, d.task, history_size=d.history_size)
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    with open(out / "samples.jsonl", "w", encoding="utf-8") as f:
        for p in pairs:
            row = dict(p)
            if tokenizer is not None or d.prompt_format == "completion":
                row["text"] = "".join(render_pair(tokenizer, p["messages"], d.prompt_format))
            counts[p["split"]] = counts.get(p["split"], 0) + 1
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return counts


def dataset_stats(ds) -> dict:
    lengths = [len(x) for x in ds["input_ids"]]
    completion = [sum(1 for t in x if t != IGNORE_INDEX) for x in ds["labels"]]
    return {
        "samples": len(lengths), "tokens": sum(lengths), "completion_tokens": sum(completion),
        "max_length": max(lengths, default=0), "truncated": int((ds.info.description or "truncated=0").split("=")[1]),
    }


def completion_positions(labels):
    """Positions whose NEXT token is a completion token, over the whole batch (the only logits the loss needs)."""
    return (labels[:, 1:] != IGNORE_INDEX).any(dim=0).nonzero().squeeze(-1)


def collator(tokenizer):
    """Pads input_ids/attention_mask with the pad token and labels with -100 (right padding for training).

    Also passes ``logits_to_keep`` = :func:`completion_positions`, so the LM head (with a 262k
    vocabulary it is most of a small model's compute) runs only where the loss is taken.
    """
    from transformers import DataCollatorForSeq2Seq

    tokenizer.padding_side = "right"
    pad = DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=IGNORE_INDEX, return_tensors="pt")

    def collate(features):
        batch = pad(features)
        batch["logits_to_keep"] = completion_positions(batch["labels"])
        return batch

    return collate


def completion_loss(outputs, labels, num_items_in_batch=None):
    """Token-level cross-entropy on the completion tokens (the Trainer's ``compute_loss_func``).

    ``outputs.logits`` covers only :func:`completion_positions`; the sum is divided by the number of
    completion tokens of the whole accumulated batch (``num_items_in_batch``) as transformers does.
    """
    import torch.nn.functional as F

    keep = completion_positions(labels)
    logits = outputs.logits.float()
    targets = labels[:, 1:][:, keep].to(logits.device)
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")
    n = num_items_in_batch if num_items_in_batch is not None else (targets != IGNORE_INDEX).sum()
    return loss / n
