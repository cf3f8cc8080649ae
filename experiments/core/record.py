"""The typed record: one shape for every study's results, the only fields the tools read (docs/layout.md, "Records").

``id`` the unit of work (a case, or ``<case>/t<trial>`` where trials repeat a case); ``case_id`` the case, the
unit a figure is resampled by; ``trial``; ``inputs`` what the case gave the agents (``question``, ``facts``: what a
simulated patient was told, ``choices`` and ``answer_index`` where the doctor chooses from a list, and whatever else
the study's agents read); ``target`` the gold; ``transcript`` the conversation, ``[{"role", "text"}]``, in the order
it was spoken; ``answer`` what the model under test answered (a text, or ``{part: text}``); ``scores`` the scorers'
typed grades; ``metadata`` everything else the study keeps (stop reason, prompt hashes, strata). The runner adds
its own fields (status, the call log, usage, roles, timing).
"""

from __future__ import annotations

from typing import Any, TypedDict

SCHEMA = 3  # typed records; 2: typed scores, study fields; 1 (none written): neither. Older ones go through their study's upgrade
FIELDS = ("id", "case_id", "trial", "inputs", "target", "transcript", "answer", "scores", "metadata")
RUNNER_FIELDS = ("status", "error", "traceback", "calls", "usage", "roles", "served_dtype", "seconds", "answer_formats", "protocol")


class Turn(TypedDict):
    role: str  # who spoke: doctor, patient, measurement, researcher, decider, ...
    text: str


def record(id: str, case_id: str | None = None, *, trial: int = 0, inputs: dict | None = None, target: Any = None,
           transcript: list[Turn] | None = None, answer: Any = None, metadata: dict | None = None, scores: dict | None = None) -> dict:
    """A typed record (the module docstring); ``case_id`` defaults to ``id``."""
    return {"id": str(id), "case_id": str(case_id if case_id is not None else id), "trial": int(trial), "inputs": dict(inputs or {}),
            "target": target, "transcript": list(transcript or []), "answer": answer, "scores": dict(scores or {}),
            "metadata": dict(metadata or {})}


def is_typed(r: dict) -> bool:
    """A record written in this shape (older ones lack ``inputs`` and ``metadata``)."""
    return isinstance(r.get("inputs"), dict) and isinstance(r.get("metadata"), dict)


def turns(r: dict) -> list[tuple[str, str]]:
    """The transcript as ``(role, text)`` pairs (a record of a kind no study upgrades may still say ``agent`` / ``content``)."""
    return [(str(t.get("role") or t.get("agent")), t.get("text", t.get("content")) or "") for t in r.get("transcript") or [] if isinstance(t, dict)]
