"""MediTOD task samples: NLU, POL and NLG as sequence-to-sequence (output = JSON or text).

Stable interface (the LoRA fine-tuning code builds on it):

``build_samples(dialogs, dialog_ids, task, *, history_turns=HISTORY_TURNS) -> list[dict]`` with
``task`` in {"nlu", "pol", "nlg"}. One sample per turn, in dialogue order:

- ``nlu``: every patient turn. Input = dialogue history + the last (doctor, patient) exchange;
  target = the patient turn's ``nlu`` list.
- ``pol``: every doctor turn except the opening utterance. Input = dialogue history + the
  current dialogue state (the ``dialog_state`` of the latest patient turn); target = the doctor
  turn's ``actions`` list.
- ``nlg``: the same doctor turns. Input = dialogue history + the doctor's ``actions``;
  target = the doctor's utterance text.

(The turn sets follow the dataset authors' scorer: all patient turns for NLU, all doctor turns
but utterance 0 for POL/NLG; POL Precision@K walks these turns in order.)

Each sample dict has:
  ``id`` ("<dialog_id>/<uttr_id>"), ``dialog_id`` (str), ``uttr_id`` (int), ``task``,
  ``input_text`` (the serialized task input, history limited to the last ``history_turns``
  utterances), ``target`` (gold: list for NLU/POL, str for NLG), ``target_text`` (the gold exactly
  as a model should output it: compact JSON for NLU/POL, the utterance for NLG),
  ``retrieval_text`` (what the in-context retriever embeds: the dialogue history incl. the last
  exchange), and the pieces ``context`` (history utterances ``{"speaker", "text"}``), ``last``
  (NLU: the last exchange), ``state`` (POL), ``actions`` (NLG) that ``serialize_input`` uses to
  rebuild a shorter input when a prompt must fit a small context.
"""

from __future__ import annotations

import json

from models.errors import MedstackError

TASKS = ("nlu", "pol", "nlg")
HISTORY_TURNS = 4  # utterances of history before the current turn kept in input_text (the authors' history_size: 4)


def compact_json(value) -> str:
    """The one serialization of structured targets (and of what models are asked to output)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _turn(u: dict) -> dict:
    return {"speaker": u["speaker"], "text": u["text"]}


def _lines(turns: list[dict]) -> str:
    return "\n".join(f"{t['speaker'].capitalize()}: {t['text']}" for t in turns) or "(none)"


def serialize_input(task: str, sample: dict, history_turns: int | None = None) -> str:
    """The task input as text; ``history_turns`` keeps only that many latest history utterances."""
    ctx = sample["context"]
    if history_turns is not None:
        ctx = ctx[len(ctx) - history_turns:] if history_turns > 0 else []
    parts = [f"Dialogue history:\n{_lines(ctx)}"]
    if task == "nlu":
        parts.append(f"Last exchange:\n{_lines(sample['last'])}")
    elif task == "pol":
        parts.append(f"Dialogue state: {compact_json(sample['state'])}")
    elif task == "nlg":
        parts.append(f"Doctor actions: {compact_json(sample['actions'])}")
    return "\n".join(parts)


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise MedstackError(f"unknown MediTOD task {task!r}; valid tasks: {', '.join(TASKS)}")


def build_samples(dialogs: dict, dialog_ids: list[str], task: str, *, history_turns: int = HISTORY_TURNS) -> list[dict]:
    """Task samples of the given dialogues (see module docstring)."""
    _check_task(task)
    samples = []
    for did in dialog_ids:
        did = str(did)
        utts = dialogs[did]["utterances"]
        state: dict = {}
        for j, u in enumerate(utts):
            if u["speaker"] == "patient":
                if task == "nlu":
                    prev_doctor = j > 0 and utts[j - 1]["speaker"] == "doctor"
                    split = j - 1 if prev_doctor else j
                    context = [_turn(x) for x in utts[max(0, split - history_turns):split]]
                    last = [_turn(x) for x in utts[split:j + 1]]
                    target = u.get("nlu", [])
                    samples.append(_sample(task, did, u, context, target, compact_json(target), last=last,
                                           retrieval=context + last))
                state = u.get("dialog_state", state)
                continue
            if task == "nlu" or j == 0:
                continue
            context = [_turn(x) for x in utts[max(0, j - history_turns):j]]
            if task == "pol":
                target = u.get("actions", [])
                samples.append(_sample(task, did, u, context, target, compact_json(target), state=state, retrieval=context))
            else:
                samples.append(_sample(task, did, u, context, u["text"], u["text"], actions=u.get("actions", []),
                                       retrieval=context))
    return samples


def _sample(task, did, u, context, target, target_text, *, retrieval, last=None, state=None, actions=None) -> dict:
    s = {
        "id": f"{did}/{u['uttr_id']}",
        "dialog_id": did,
        "uttr_id": u["uttr_id"],
        "task": task,
        "target": target,
        "target_text": target_text,
        "context": context,
        "retrieval_text": _lines(retrieval),
    }
    if last is not None:
        s["last"] = last
    if state is not None:
        s["state"] = state
    if actions is not None:
        s["actions"] = actions
    s["input_text"] = serialize_input(task, s)
    return s


def gold_by_key(dialogs: dict, dialog_ids: list[str], task: str) -> dict[tuple[str, int], dict]:
    """{(dialog_id, uttr_id): sample} for scoring predictions made elsewhere."""
    return {(s["dialog_id"], s["uttr_id"]): s for s in build_samples(dialogs, dialog_ids, task, history_turns=0)}
