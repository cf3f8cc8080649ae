"""MediTOD task samples, windowed as the dataset authors' released code windows them: the windows, per task
and baseline, and each sample's fields are in experiments/studies/meditod/README.md, Inputs and Python interface.

``icl_samples`` builds the in-context baselines' samples (and their exemplars); POL/NLG samples at u = 0 are built
(and sent) but not scored (``scored: False``), as the authors' post-processing skips them. ``sft_samples`` builds the
supervised LoRA samples, one per patient utterance the doctor answers; the id names the labelled utterance (p for
NLU, d for POL/NLG). ``gold_turns``: every labelled turn, what ``medstack score`` aligns predictions with.
"""

from __future__ import annotations

from experiments.studies.meditod.ontology import to_status_shape
from models.errors import MedstackError

TASKS = ("nlu", "pol", "nlg")
HISTORY_SIZE = 4  # the authors' history_size in every config


def line(u: dict) -> str:
    return f"{u['speaker']}: {u['text']}"


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise MedstackError(f"unknown MediTOD task {task!r}; valid tasks: {', '.join(TASKS)}")


def _sample(task: str, did: str, u: dict, *, history: list[str], last_turn: list[str], target, answer=None,
            state=None, actions=None, scored: bool = True) -> dict:
    s = {"id": f"{did}/{u['uttr_id']}", "dialog_id": did, "uttr_id": u["uttr_id"], "task": task,
         "history": history, "last_turn": last_turn, "target": target, "answer": target if answer is None else answer,
         "retrieval_text": "\n".join(last_turn), "scored": scored}
    if state is not None:
        s["state"] = state
    if actions is not None:
        s["actions"] = actions
    return s


def icl_samples(dialogs: dict, dialog_ids: list[str], task: str, *, history_size: int = HISTORY_SIZE) -> list[dict]:
    """In-context samples (README, Inputs), in dialogue order."""
    _check_task(task)
    out = []
    for did in map(str, dialog_ids):
        utts = dialogs[did]["utterances"]
        lines = [line(u) for u in utts]
        for u, utt in enumerate(utts):
            if task == "nlu":
                if utt["speaker"] != "patient" or u + 1 == len(utts):
                    continue
                window = lines[max(0, u - history_size):u + 1]
                gold = utt.get("nlu", [])
                out.append(_sample(task, did, utt, history=window[:-2], last_turn=window[-2:], target=gold,
                                   answer=to_status_shape(gold)))
                continue
            if utt["speaker"] != "doctor":
                continue
            last = lines[max(0, u - history_size - 1):u][-2:]
            if task == "pol":
                state = utts[u - 1].get("dialog_state", {}) if u > 0 else {}
                out.append(_sample(task, did, utt, history=[], last_turn=last, target=utt.get("actions", []),
                                   state=state, scored=u > 0))
            else:
                actions = utt.get("actions", []) if u > 0 else {}
                out.append(_sample(task, did, utt, history=[], last_turn=last, target=utt["text"],
                                   actions=actions, scored=u > 0))
    return out


def sft_samples(dialogs: dict, dialog_ids: list[str], task: str, *, history_size: int = HISTORY_SIZE) -> list[dict]:
    """Supervised samples (README, Inputs), in dialogue order."""
    _check_task(task)
    out = []
    for did in map(str, dialog_ids):
        utts = dialogs[did]["utterances"]
        lines = [line(u) for u in utts]
        for p, utt in enumerate(utts):
            if utt["speaker"] != "patient" or p + 1 >= len(utts) or utts[p + 1]["speaker"] != "doctor":
                continue
            reply = utts[p + 1]
            window = lines[max(0, p + 1 - history_size):p + 1]
            history, last = window[:-2], window[-2:]
            if task == "nlu":
                out.append(_sample(task, did, utt, history=history, last_turn=last, target=utt.get("nlu", [])))
            elif task == "pol":
                out.append(_sample(task, did, reply, history=history, last_turn=last, target=reply.get("actions", []),
                                   state=utt.get("dialog_state", {})))
            else:
                out.append(_sample(task, did, reply, history=[], last_turn=last, target=reply["text"],
                                   actions=reply.get("actions", [])))
    return out


def build_samples(dialogs: dict, dialog_ids: list[str], task: str, *, mode: str = "icl",
                  history_size: int = HISTORY_SIZE) -> list[dict]:
    """The samples of ``mode`` (icl | supervised)."""
    build = icl_samples if mode == "icl" else sft_samples
    return build(dialogs, dialog_ids, task, history_size=history_size)


def gold_turns(dialogs: dict, dialog_ids: list[str], task: str) -> list[dict]:
    """Every labelled turn as ``{id, dialog_id, uttr_id, target}``, in dialogue order."""
    _check_task(task)
    out = []
    for did in map(str, dialog_ids):
        for u, utt in enumerate(dialogs[did]["utterances"]):
            if task == "nlu" and utt["speaker"] == "patient":
                target = utt.get("nlu", [])
            elif task != "nlu" and utt["speaker"] == "doctor" and u > 0:
                target = utt.get("actions", []) if task == "pol" else utt["text"]
            else:
                continue
            out.append({"id": f"{did}/{utt['uttr_id']}", "dialog_id": did, "uttr_id": utt["uttr_id"], "target": target})
    return out

