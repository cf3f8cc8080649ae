"""Parsing of model output: bracketed tags, marked lines and JSON. One place for all of it.

Small models break formats often; every parser here returns ``None`` (or an empty
value) instead of raising, and the callers count those as parse errors.
"""

from __future__ import annotations

import json
import re


def extract_tag(text: str, tag: str) -> str | None:
    """Content of ``[TAG: "..."]`` / ``[TAG: ...]`` (first occurrence), or None."""
    m = re.search(rf"\[\s*{re.escape(tag)}\s*:\s*(.*?)\]", text, flags=re.S | re.I)
    if not m:
        return None
    return m.group(1).strip().strip('"“”').strip()


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
