"""Reading JSON text fast, with the standard library's meaning.

:func:`loads` parses with orjson (several times faster than ``json``; used for every answer the client reads and
every answer the response cache returns) and hands to ``json`` what only ``json`` reads, or reads differently:
NaN / Infinity, integers beyond 64 bits, lone surrogates, UTF-16/32 bytes. For text both parse, both give the
same value; for text neither parses, ``json``'s ``JSONDecodeError`` (a ``ValueError``) is raised, so error
messages are the standard library's. Writes stay with ``json.dumps`` where the bytes on disk matter (records,
cache keys).

:func:`iter_jsonl` is the one reader of JSONL data files (every loader reads through it); :func:`lines_at` walks a
file's lines with their byte offsets (a results folder's records are read from an offset on).

:func:`for_script` writes JSON that an HTML page embeds in a ``<script>`` element: whatever text the data
holds (model output is untrusted input), the element cannot end early and the JSON parses back to the same data.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson

from models.errors import DataError

# orjson reads an integer beyond 64 bits as a float (3.13: 18446744073709551616 -> 1.8446744073709552e+19) where
# ``json`` keeps it exact. Such an integer has at least 19 digits (-9223372036854775809), so text with a run of 19
# digits anywhere (also inside a string: rare, and only slower) goes to ``json``. The run is found by mapping every
# digit to "0" and everything else to " " (bytes.translate, in C).
_DIGITS = bytes(0x30 if 0x30 <= c <= 0x39 else 0x20 for c in range(256))
_RUN = b"0" * 19


def loads(data: bytes | str):
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if _RUN in raw.translate(_DIGITS):
        return json.loads(data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


# inside <script> the HTML parser looks for "</script", "<!--" and "-->"; U+2028/U+2029 end a line in older JS
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def for_script(data) -> str:
    """JSON text of ``data`` safe inside an HTML ``<script>`` element (``type="application/json"`` or code):
    ``<``, ``>``, ``&``, U+2028 and U+2029 are written as ``\\u003c`` etc. -- only inside JSON strings
    (nowhere else can they occur), so ``JSON.parse`` gives back every character as it was."""
    # ASCII out: any other character (a lone surrogate from a model's JSON too) is a \uXXXX escape, so the page
    # is valid UTF-8 whatever the data holds
    return json.dumps(data, ensure_ascii=True).translate(_SCRIPT_SAFE)


def iter_jsonl(path: str | Path, *, objects: bool = True):
    """Yield (line number, value) for each non-blank line of a JSONL file; every data loader reads JSONL through this.
    Invalid JSON, or (with ``objects``) a line that is not a JSON object, is a DataError naming the file and line."""
    with open(path, "rb") as f:
        for lineno, _, line in lines_at(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if objects and not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object")
            yield lineno, row


def lines_at(f, start: int = 0):
    """(line number, byte offset, line) of a file opened in binary mode, from byte ``start`` on."""
    f.seek(start)
    at = start
    for lineno, line in enumerate(f, 1):
        yield lineno, at, line
        at += len(line)
