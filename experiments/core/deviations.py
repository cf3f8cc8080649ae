"""Protocol deviations as data: every request that carries less than the protocol asks, counted and said
(docs/protocol-deviations.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, get_args, get_origin

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


# -- settings against the authors' ---------------------------------------------------------------------------
#
# Every settings field of every study is in its settings class's ``authors_table`` (merged along the class's bases,
# so RunSettings' rows hold for all): either ``Authors`` (the authors fixed it: their value, and how a run that
# differs reads) or ``Unpaired`` (no authors' counterpart, and why). :func:`settings_deviations` compares a run's
# settings with every ``Authors`` row; the runner puts the result in metrics.json (``deviations``) and under
# summary.md's title. A key is a field, a dotted path into a nested settings model, and ``*`` stands for every key
# of a mapping (``sampling.*.max_tokens``). tests/test_deviations_table.py fails on a field no row covers.

NOT_FIXED = type("NotFixed", (), {"__repr__": lambda self: "NOT_FIXED"})()  # the authors fixed no value here


@dataclass(frozen=True)
class Authors:
    """A setting the authors fixed.

    ``value``: their value, or a function ``(settings, *keys) -> value`` (``keys``: what each ``*`` matched) for one
    that depends on other settings; it returns :data:`NOT_FIXED` where they fixed none (an open model's own
    sampling). ``says``: the phrase of a run that differs, with ``{path}``, ``{key}``, ``{ours}``, ``{authors}``.
    ``same``: when ours counts as theirs (default: equal); ``show``: ours as the phrase says it (default: as set)."""

    value: Any
    says: str = "{path} {ours} (authors: {authors})"
    same: Callable[[Any, Any], bool] | None = None
    show: Callable[[Any], Any] | None = None


def unset_as(text: str) -> Callable[[Any], Any]:
    """``Authors(show=...)`` of a setting whose unset value stands for a default: how that default reads."""
    return lambda ours: text if ours is None else ours


@dataclass(frozen=True)
class Unpaired:
    """A setting with no authors' counterpart (the run's scope, how it reaches its servers, a choice the papers
    leave open), and why."""

    why: str


def table_of(cls) -> dict:
    """A settings class's whole table: the ``authors_table`` of it and its bases, the most derived row winning."""
    rows: dict = {}
    for klass in reversed(cls.__mro__):
        rows.update(klass.__dict__.get("authors_table") or {})
    return rows


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) if value else "none"
    if isinstance(value, str):
        return repr(value) if not value.strip() or value != value.strip() else value
    return str(value)


def _expand(node: Any, parts: list[str], path: list[str], keys: list[str]):
    """(concrete path, wildcard keys, value) of every setting a table key names."""
    if not parts:
        yield ".".join(path), keys, node
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        for k, v in (node or {}).items():
            yield from _expand(v, rest, path + [str(k)], keys + [str(k)])
    elif isinstance(node, dict):
        if head in node:
            yield from _expand(node[head], rest, path + [head], keys)
    else:
        yield from _expand(getattr(node, head), rest, path + [head], keys)


def settings_deviations(settings) -> list[str]:
    """Every way these settings differ from the authors' (their table's ``Authors`` rows), one phrase each, in table order."""
    out = []
    for key, row in table_of(type(settings)).items():
        if not isinstance(row, Authors):
            continue
        for path, keys, ours in _expand(settings, key.split("."), [], []):
            theirs = row.value(settings, *keys) if callable(row.value) else row.value
            if theirs is NOT_FIXED:
                continue
            same = row.same(ours, theirs) if row.same else ours == theirs
            if not same:
                shown = _show(row.show(ours) if row.show else ours)
                out.append(row.says.format(path=path, key=".".join(keys), ours=shown, authors=_show(theirs)))
    return out


def deviations_line(devs: list[str] | None) -> str:
    """summary.md's sentence on the settings compared with the authors' (the run's title carries it)."""
    if not devs:
        return "settings against the authors' (docs/protocols.md): none differs."
    return f"settings unlike the authors' (docs/protocols.md): {len(devs)} — " + "; ".join(devs) + "."


def _submodels(annotation) -> tuple[str, type] | None:
    """('', Model) for a field of a settings model type, ('*', Model) for a mapping of them, else None."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "", annotation
    if get_origin(annotation) is dict:
        args = get_args(annotation)
        if len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
            return "*", args[1]
    return None


def uncovered(cls, table: dict | None = None, prefix: str = "") -> list[str]:
    """The settings of ``cls`` (nested models field by field) that no row of its table names."""
    table = table_of(cls) if table is None else table
    missing = []
    for name, field in cls.model_fields.items():
        path = prefix + name
        if path in table:
            continue
        sub = _submodels(field.annotation)
        if sub is None:
            missing.append(path)
        else:
            star, model = sub
            missing += uncovered(model, table, f"{path}.{star + '.' if star else ''}")
    return missing
