"""MediTOD prompt/completion datasets for supervised fine-tuning.

The samples and the prompt are the MediTOD study's own (``experiments.meditod``): a
training pair is ``(supervised_prompt(task, sample), target_text + eos)``, exactly what
``medstack run meditod-<task> --mode supervised`` later sends to the server, so training
and evaluation see the same text. The loss covers the completion tokens only: prompt
positions get the label -100.
"""

from __future__ import annotations

from pathlib import Path

from models.errors import DataError

IGNORE_INDEX = -100


def _field(sample, name: str):
    return sample[name] if isinstance(sample, dict) else getattr(sample, name)


def split_file(splits_dir: Path, split: str) -> Path:
    return Path(splits_dir) / f"{split}_ids.json"


def load_pairs(dialogs_path: str, splits_dir: str | None, split: str, task: str, *, history_turns: int | None = None) -> list[dict]:
    """[{id, prompt, completion}] for one split, built with the MediTOD study's builders
    (``history_turns`` utterances of history; None: the study's default, 4 as in the authors' configs)."""
    from experiments.meditod.data import load_dialogs, load_split_ids
    from experiments.meditod.prompts import supervised_prompt
    from experiments.meditod.tasks import build_samples

    splits = Path(splits_dir) if splits_dir else Path(dialogs_path).parent
    if not split_file(splits, split).exists():
        raise DataError(f"split {split!r}: {split_file(splits, split)} not found (expected a JSON list of dialog ids)")
    dialogs = load_dialogs(dialogs_path)
    ids = load_split_ids(splits, split)
    samples = build_samples(dialogs, ids, task, **({} if history_turns is None else {"history_turns": history_turns}))
    if not samples:
        raise DataError(f"split {split!r} ({split_file(splits, split)}): no {task} samples in its dialogues")
    return [{"id": str(_field(s, "id")), "prompt": supervised_prompt(task, s), "completion": _field(s, "target_text")} for s in samples]


def tokenize_pair(tokenizer, prompt: str, completion: str, max_length: int, prompt_format: str = "completion") -> dict:
    """input_ids = prompt ++ completion ++ eos; labels mask the prompt (-100).

    Too long: the completion is kept (cut to half the budget at most) and the prompt loses
    its oldest tokens (the start of the dialogue history), keeping the leading BOS.
    """
    if prompt_format == "chat":
        prompt_ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
        if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "keys"):
            prompt_ids = prompt_ids["input_ids"]
    else:
        prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
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
    """A `datasets.Dataset` of tokenized pairs (columns input_ids, attention_mask, labels)."""
    from datasets import Dataset

    rows = [tokenize_pair(tokenizer, p["prompt"], p["completion"], max_length, prompt_format) for p in pairs]
    ds = Dataset.from_list([{k: r[k] for k in ("input_ids", "attention_mask", "labels")} for r in rows])
    ds.info.description = f"truncated={sum(r['truncated'] for r in rows)}"
    return ds


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
