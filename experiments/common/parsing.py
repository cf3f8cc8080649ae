"""Parsing of model output: bracketed tags, marked lines and JSON. One place for all of it.

Small models break formats often; every parser here returns ``None`` (or an empty
value) instead of raising, and the callers count those as parse errors.
"""

from __future__ import annotations

import json
import re


def extract_tag(text: str, tag: str) -> str | None:
    """Content of ``[TAG: "..."]`` / ``[TAG: ...]`` (first occurrence), or None."""
    return next(iter(extract_tags(text, tag)), None)


def extract_tags(text: str, tag: str) -> list[str]:
    return [m.strip().strip('"“”').strip() for m in re.findall(rf"\[\s*{re.escape(tag)}\s*:\s*(.*?)\]", text, flags=re.S | re.I)]


def has_marker(text: str, marker: str) -> bool:
    """True when ``marker`` (e.g. ``[STOP]`` or ``STOP``) appears as a word."""
    return re.search(rf"(?<![A-Za-z]){re.escape(marker)}(?![A-Za-z])", text) is not None


def extract_after(text: str, label: str) -> str | None:
    """Text after ``label:`` up to the end of that line (e.g. ``Answer: X``), markdown bold tolerated."""
    m = re.search(rf"\**{re.escape(label)}\**\s*:\s*\**\s*(.+)", text, flags=re.I)
    return m.group(1).strip().strip("*").strip() if m else None


def extract_json(text: str):
    """First JSON value in ``text``: tolerates code fences, leading prose and trailing text. None if none."""
    if text is None:
        return None
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, flags=re.S)
    candidates = [fenced.group(1)] if fenced else []
    candidates.append(text)
    decoder = json.JSONDecoder()
    for cand in candidates:
        for i, ch in enumerate(cand):
            if ch in "[{":
                try:
                    value, _ = decoder.raw_decode(cand[i:])
                    return value
                except json.JSONDecodeError:
                    continue
    return None


def split_sections(text: str, names: list[str]) -> dict[str, str]:
    """Split a text with headed sections (``Name:`` / ``## Name`` / ``**Name**``) into {name: body}.

    Missing sections map to ``""``; the caller decides whether that is a parse error.
    """
    pattern = "|".join(re.escape(n) for n in names)
    heads = list(re.finditer(rf"^[\s#*>-]*({pattern})\s*[*:]*\s*[:*]*", text, flags=re.I | re.M))
    out = {n: "" for n in names}
    lookup = {n.lower(): n for n in names}
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        name = lookup[m.group(1).lower()]
        if not out[name]:
            out[name] = text[m.end():end].strip()
    return out


_NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def extract_rating(text: str, label: str = "Rating", lo: int = 1, hi: int = 5) -> int | None:
    """Whole-number score after the first ``label:`` (e.g. ``Rating: 4``, ``**Rating:** 4/5``, ``Rating: [4]``,
    ``Rating: four``). None when the label is missing, the value is not a whole number, or it lies outside lo..hi."""
    if not text:
        return None
    m = re.search(rf"\**{re.escape(label)}\**\s*[:=]\s*\**\s*[\[(]?\s*([0-9]+(?:\.[0-9]+)?|[A-Za-z]+)\b(?!\.[0-9])", text, flags=re.I)
    if not m:
        return None
    token = m.group(1).lower()
    if token.isdigit():
        value = int(token)
    elif token in _NUMBER_WORDS:
        value = _NUMBER_WORDS[token]
    else:
        return None  # "3.5", "high", "<number>"
    return value if lo <= value <= hi else None


# -- verdicts (CRAFT-MD's grader, MediTOD's adjudication) ------------------------------------


def extract_verdict(text: str, yes: tuple[str, ...] = ("yes", "correct", "true", "match", "same"),
                    no: tuple[str, ...] = ("no", "incorrect", "false", "different"), *, anywhere: bool = False) -> bool | None:
    """A yes/no verdict: the first word after a ``Verdict:`` label if there is one, else the reply's first word.

    Strict on purpose: a judge that rambles ("Decide whether ... correct diagnosis") gives None, not a verdict.
    ``anywhere`` (MediTOD's adjudication, ``positive``/``negative``): True when a ``yes`` word occurs anywhere
    in the reply (case-insensitive substring), else False when a ``no`` word does.
    """
    if not text:
        return None
    if anywhere:
        low = text.lower()
        return True if any(w in low for w in yes) else False if any(w in low for w in no) else None
    words = sorted(yes + no, key=len, reverse=True)
    pattern = r"^[\W_]*(" + "|".join(map(re.escape, words)) + r")(?![a-z])(?!\s*:)"
    labelled = extract_after(text, "Verdict")
    m = re.match(pattern, (labelled if labelled is not None else text).strip().lower())
    return (m.group(1) in yes) if m else None


# -- lists and numbers (added for DERA; generic) --------------------------------------------

_NONE_WORDS = {"none", "nothing", "no concepts", "n/a", "na", "[]", "empty"}


def extract_list(text: str) -> list[str] | None:
    """Items of a list reply: a JSON array, else bullet/numbered lines, else comma-separated.

    ``[]`` / ``none`` give an empty list; an empty or missing reply gives None.
    """
    if text is None or not text.strip():
        return None
    stripped = text.strip()
    if stripped.lower().strip(" .") in _NONE_WORDS:
        return []
    value = extract_json(stripped)
    if isinstance(value, list):
        return [str(v).strip() for v in value if str(v).strip()]
    lines = [ln.strip() for ln in stripped.splitlines() if ln.strip()]
    items: list[str] = []
    for ln in lines:
        ln = re.sub(r"^(?:[-*•]+|\d+[.)])\s*", "", ln).strip()
        if len(lines) == 1:
            items.extend(p.strip() for p in ln.split(","))
        else:
            items.append(ln)
    items = [i.strip().strip('"“”').strip() for i in items]
    return [i for i in items if i and i.lower().strip(" .") not in _NONE_WORDS]


def extract_indices(text: str, n: int) -> list[int] | None:
    """1-based item numbers in ``1..n`` named by a reply (JSON array or bare numbers), sorted, unique.

    ``[]`` / ``none`` give an empty list; a reply with no number in range gives None.
    """
    if text is None or not text.strip():
        return None
    if text.strip().lower().strip(" .") in _NONE_WORDS:
        return []
    value = extract_json(text)
    nums = value if isinstance(value, list) else re.findall(r"(?<![\w.])\d+(?![\w.])", text)
    out = set()
    for v in nums:
        try:
            i = int(v)
        except (TypeError, ValueError):
            continue
        if 1 <= i <= n:
            out.add(i)
    if not out and not (isinstance(value, list) and not value):
        return None
    return sorted(out)


def extract_bool(text: str) -> bool | None:
    """A True/False (yes/no) verdict: the first such word in the reply, or None."""
    m = re.search(r"\b(true|false|yes|no)\b", text or "", flags=re.I)
    if not m:
        return None
    return m.group(1).lower() in ("true", "yes")


def extract_number(text: str) -> float | None:
    """The first number in the reply (``0.8``, ``.8``, ``80``), or None."""
    m = re.search(r"-?\d*\.?\d+", text or "")
    return float(m.group(0)) if m else None
