"""Protocol deviations as data: every request that carries less than the protocol asks, counted and said.

A step that has to send less than its paper's protocol (in-context exemplars left out to fit the
model's context, the oldest dialogue messages cut to fit, a rated dialogue cut at a character cap) names
the quantity at its call, as (sent, asked)::

    await ctx.chat(messages, role="model", gen=gen, step="predict", protocol={"exemplars": (kept, s.k)})

Name it on every request that has the quantity, not only the short ones, so the mean and the
minimum are over all of them. The call log entry keeps it (``protocol: {exemplars: {sent, asked}}``;
also each ``--dry-run`` line), the runner sums each record's requests into ``record["protocol"]``
(:func:`call_protocol`) and every run's into ``metrics.json["protocol"]`` (:func:`protocol_stats`).
:func:`protocol_lines` turns that into the sentences shown at the end of the run, under summary.md's
title, in ``--dry-run`` output and as a footnote of every paper table of the run. One mechanism for
all studies: a study only names the quantity (its label is declared once, in :data:`QUANTITIES`).
"""

from __future__ import annotations

from models.errors import MedstackError

# quantity -> how a sentence names it ("N of M requests carried fewer <label> than the protocol asks")
QUANTITIES = {
    "exemplars": "in-context exemplars (left out, least similar first, to fit the model's context)",
    "history": "dialogue messages (the oldest left out to fit the model's context)",
    "concepts": "concepts to verify (GPT-F1 lists cut at max_concepts)",
    "dialogue_turns": "whole dialogue turns (later turns cut at max_dialogue_chars to fit the judge's context)",
}


def check_protocol(protocol: dict | None, step: str) -> dict:
    """A call's ``protocol`` argument -> its log form {quantity: {sent, asked}}; an unknown quantity is a bug."""
    out = {}
    for name, (sent, asked) in (protocol or {}).items():
        if name not in QUANTITIES:
            raise MedstackError(f"step {step}: unknown protocol quantity {name!r}; declared: {', '.join(QUANTITIES)}")
        out[name] = {"sent": int(sent), "asked": int(asked)}
    return out


def _blank() -> dict:
    return {"requests": 0, "below": 0, "sent": 0, "asked": 0, "sent_min": None, "asked_max": 0}


def _add(acc: dict, part: dict) -> None:
    for k in ("requests", "below", "sent", "asked"):
        acc[k] += part[k]
    if part["sent_min"] is not None:
        acc["sent_min"] = part["sent_min"] if acc["sent_min"] is None else min(acc["sent_min"], part["sent_min"])
    acc["asked_max"] = max(acc["asked_max"], part["asked_max"])


def call_protocol(calls: list[dict]) -> dict:
    """One case's call log -> per quantity: requests, requests below what was asked, sums, min sent.
    Requests that got no answer are left out (the one re-sent after them counts)."""
    out: dict = {}
    for c in calls:
        if c.get("error") or not c.get("protocol"):
            continue
        for name, q in c["protocol"].items():
            one = {"requests": 1, "below": int(q["sent"] < q["asked"]), "sent": q["sent"], "asked": q["asked"],
                   "sent_min": q["sent"], "asked_max": q["asked"]}
            _add(out.setdefault(name, _blank()), one)
    return out


def protocol_stats(records: list[dict]) -> dict:
    """metrics.json's ``protocol``: per quantity over the finished records' requests:
    requests, requests_below (fewer sent than asked), sent_mean, sent_min, asked_mean, asked_max."""
    acc: dict = {}
    for r in records:
        for name, part in (r.get("protocol") or {}).items():
            _add(acc.setdefault(name, _blank()), part)
    return {name: {"requests": a["requests"], "requests_below": a["below"],
                   "sent_mean": round(a["sent"] / a["requests"], 3) if a["requests"] else None, "sent_min": a["sent_min"],
                   "asked_mean": round(a["asked"] / a["requests"], 3) if a["requests"] else None, "asked_max": a["asked_max"]}
            for name, a in sorted(acc.items())}


def protocol_lines(stats: dict | None) -> list[str]:
    """One sentence per quantity where some request carried less than asked (none when the protocol was kept)."""
    lines = []
    for name, s in (stats or {}).items():
        if not s.get("requests_below"):
            continue
        asked = f"{s['asked_max']}" if s["asked_mean"] == s["asked_max"] else f"{s['asked_mean']:g} on average"
        lines.append(f"protocol deviation: {s['requests_below']} of {s['requests']} requests carried fewer "
                     f"{QUANTITIES.get(name, name)} than the protocol asks ({asked}); per request: mean {s['sent_mean']:g}, min {s['sent_min']}")
    return lines
