"""Constrained answers: the declared output format of a protocol step, as vLLM structured outputs.

The constraints.yaml file, placeholders, the ``$words`` bound and why: docs/constrained-answers.md.
An endpoint is probed once before a constrained run (:meth:`serving.client.LLMClient.check_structured_outputs`)
because servers ignore the older ``guided_*`` fields without an error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

import yaml

from models.errors import MedstackError

KINDS = ("choice", "regex", "json", "grammar")
ANSWER_MODES = ("free", "constrained")
DECLARATION_FILE = "constraints.yaml"
MAX_BOUNDED_REPEAT = 16  # larger {m,n} in a regex compile for minutes in xgrammar (vLLM's default back end)
TOKENS_PER_WORD = 3  # budget per bounded word: English ~1.3 tokens a word, long medical terms up to ~5
WORDS = "words"  # reserved placeholder: a free-text word count, filled from the step's max_tokens at the call
_SENTINEL = 65521  # stands in for $words while a regex is parsed


class ConstraintError(MedstackError):
    """A malformed constraint declaration or a missing placeholder value."""


@dataclass(frozen=True)
class Constraint:
    """One step's output format: ``kind`` (choice | regex | json | grammar) and ``spec`` (its value),
    ``source`` = the template that declared it (for the call log)."""

    kind: str
    spec_json: str  # the value as canonical JSON (hashable; part of the request and the cache key)
    source: str = ""

    @classmethod
    def make(cls, kind: str, spec: Any, source: str = "") -> "Constraint":
        if kind not in KINDS:
            raise ConstraintError(f"{source or 'constraint'}: unknown kind {kind!r}; valid: {', '.join(KINDS)}")
        if kind == "choice" and not (isinstance(spec, list) and spec and all(isinstance(x, str) and x for x in spec)):
            raise ConstraintError(f"{source or 'constraint'}: choice needs a non-empty list of non-empty strings, got {spec!r}")
        if kind in ("regex", "grammar") and not (isinstance(spec, str) and spec):
            raise ConstraintError(f"{source or 'constraint'}: {kind} needs a non-empty string")
        if kind == "regex":
            try:
                re.compile(spec)
            except re.error as e:
                raise ConstraintError(f"{source or 'constraint'}: invalid regex ({e})") from None
            big = _big_repeats(spec)
            if big:
                raise ConstraintError(f"{source or 'constraint'}: bounded repetition {big[0]} above {{{MAX_BOUNDED_REPEAT}}}: vLLM's xgrammar back end "
                                      "expands it state by state (measured: {1,500} over a character class took 50 s to compile, past vLLM's "
                                      "5 s limit, so the request fails with HTTP 500); bound words instead: [^\\s]+( [^\\s]+){0,$words}")
        if kind == "json":
            if not isinstance(spec, dict):
                raise ConstraintError(f"{source or 'constraint'}: json needs a JSON schema (a mapping)")
            import jsonschema

            try:
                jsonschema.Draft202012Validator.check_schema(spec)
            except jsonschema.SchemaError as e:
                raise ConstraintError(f"{source or 'constraint'}: not a valid JSON schema ({e.message})") from None
        return cls(kind, json.dumps(spec, sort_keys=True, ensure_ascii=False), source)

    @property
    def spec(self) -> Any:
        return json.loads(self.spec_json)

    def request(self) -> dict:
        """The value of vLLM's ``structured_outputs`` request field."""
        return {self.kind: self.spec}

    def request_json(self) -> str:
        return json.dumps(self.request(), sort_keys=True, ensure_ascii=False)

    def log(self) -> dict:
        return {"kind": self.kind, "spec": self.spec, "declared_by": self.source}

    def check(self, text: str) -> bool | None:
        """Does ``text`` obey the constraint? (None: cannot be checked here, i.e. a grammar)."""
        text = text or ""
        if self.kind == "choice":
            return text in self.spec
        if self.kind == "regex":  # an unfilled {0,$words} (not yet bounded at a call) reads {0,}: any count
            return re.fullmatch(self.spec.replace(f"${WORDS}", ""), text) is not None
        if self.kind == "json":
            import jsonschema

            try:
                value = json.loads(text)
            except (json.JSONDecodeError, ValueError):
                return False
            return jsonschema.Draft202012Validator(self.spec).is_valid(value)
        return None

    def bounded(self, max_tokens: int | None) -> "Constraint":
        """This constraint with ``$words`` filled from the step's ``max_tokens`` (see the module docstring)."""
        if self.kind not in ("regex", "grammar") or f"${WORDS}" not in self.spec:
            return self
        spec = self.spec
        n = word_bounds(spec) if self.kind == "regex" else spec.count(f"${WORDS}")
        words = max(1, ((max_tokens or 256) - 8) // (TOKENS_PER_WORD * max(n, 1)))
        return Constraint.make(self.kind, spec.replace(f"${WORDS}", str(words)), self.source)

    def continuing(self, prefix: str) -> "Constraint":
        """The constraint of a reply that continues ``prefix`` already written into the prompt (a completion
        prefilled with e.g. ``Good:``): a regex must start with that literal text, which is dropped."""
        if not prefix:
            return self
        lit = re.escape(prefix)
        if self.kind != "regex" or not (self.spec.startswith(lit) or self.spec.startswith(prefix)):
            raise ConstraintError(f"{self.source}: a {self.kind} constraint cannot continue the prefilled text {prefix!r}")
        rest = self.spec[len(lit):] if self.spec.startswith(lit) else self.spec[len(prefix):]
        return Constraint.make("regex", rest, self.source)


# -- the regex checks: a small reader of the regex syntax constraints use (Python's), giving the tree the checks walk ------
# Nodes: ("lit", ch), ("class", items, negated) with items ("lit", ch) | ("range", lo, hi) | ("cat", letter of \\s \\d \\w,
# upper case negated), ("any",), ("anchor", text), ("group", seq), ("look", seq), ("branch", [seq, ...]),
# ("repeat", min, max or None, seq). A seq is a list of nodes. re.compile checks the pattern first: this reader
# assumes a valid one.

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a", "0": "\0"}
_QUANT = re.compile(r"\{(\d*)(,?)(\d*)\}")


class _Reader:
    def __init__(self, text: str):
        self.text, self.i = text, 0

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.text[j] if j < len(self.text) else ""

    def take(self) -> str:
        ch = self.peek()
        self.i += 1
        return ch

    def alternation(self) -> list:
        alts = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.sequence())
        return alts[0] if len(alts) == 1 else [("branch", alts)]

    def sequence(self) -> list:
        seq: list = []
        while self.peek() and self.peek() not in "|)":
            atom = self.atom()
            if atom is None:
                continue
            quant = self.quantifier()
            seq.append(("repeat", quant[0], quant[1], [atom]) if quant else atom)
        return seq

    def quantifier(self):
        ch = self.peek()
        if ch in ("*", "+", "?"):
            self.i += 1
            q = {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        elif ch == "{" and (m := _QUANT.match(self.text, self.i)) and (m.group(1) or m.group(3)):
            self.i = m.end()
            lo = int(m.group(1) or 0)
            q = (lo, (int(m.group(3)) if m.group(3) else None) if m.group(2) else lo)
        else:
            return None
        if self.peek() in ("?", "+"):  # lazy / possessive: the same repetition
            self.i += 1
        return q

    def atom(self):
        ch = self.take()
        if ch == "(":
            return self.group()
        if ch == "[":
            return self.char_class()
        if ch == ".":
            return ("any",)
        if ch in ("^", "$"):
            return ("anchor", ch)
        if ch == "\\":
            return self.escape(in_class=False)
        return ("lit", ch)

    def group(self):
        kind = "group"
        if self.peek() == "?":
            self.i += 1
            nxt = self.take()
            if nxt == "#":  # a comment
                while self.take() not in (")", ""):
                    pass
                return None
            if nxt in ("=", "!"):
                kind = "look"
            elif nxt == "<" and self.peek() in ("=", "!"):
                self.i += 1
                kind = "look"
            elif nxt == "P" and self.peek() == "<":
                self.i = self.text.index(">", self.i) + 1
            elif nxt == "P" and self.peek() == "=":  # a named back reference
                self.i = self.text.index(")", self.i) + 1
                return ("anchor", "ref")
            elif nxt != ":":  # inline flags: (?i) alone, or (?i:...)
                while self.peek() not in (":", ")"):
                    self.i += 1
                if self.take() == ")":
                    return None
        body = self.alternation()
        self.take()  # ")"
        return (kind, body)

    def escape(self, in_class: bool):
        ch = self.take()
        if ch.lower() in ("s", "d", "w"):
            return ("cat", ch) if in_class else ("class", [("cat", ch)], False)
        if ch in _ESCAPES:
            return ("lit", _ESCAPES[ch])
        if ch in ("x", "u", "U"):
            n = {"x": 2, "u": 4, "U": 8}[ch]
            code, self.i = self.text[self.i:self.i + n], self.i + n
            return ("lit", chr(int(code, 16)))
        if not in_class and (ch in "bBAZ" or ch.isdigit()):
            return ("anchor", "\\" + ch)
        if in_class and ch == "b":
            return ("lit", "\b")
        return ("lit", ch)

    def char_class(self):
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        items: list = []
        first = True
        while self.peek() and (self.peek() != "]" or first):
            first = False
            ch = self.take()
            item = self.escape(in_class=True) if ch == "\\" else ("lit", ch)
            if item[0] == "lit" and self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.i += 1
                end = self.take()
                hi = self.escape(in_class=True) if end == "\\" else ("lit", end)
                item = ("range", ord(item[1]), ord(hi[1]))
            items.append(item)
        self.take()  # "]"
        return ("class", items, negated)


def _parse(spec: str) -> list:
    """A regex (``$words`` as the sentinel bound) as the tree the checks below walk; re.error for an invalid one."""
    text = spec.replace(f"${WORDS}", str(_SENTINEL))
    re.compile(text)
    return _Reader(text).alternation()


def _walk(tree: list, times: int = 1):
    """(min, max, body, how many times the enclosing repeats let it occur) for every repeat in a parsed regex
    (max None: unbounded)."""
    for node in tree:
        if node[0] == "repeat":
            _, lo, hi, body = node
            yield lo, hi, body, times
            inner = 1 if hi == _SENTINEL else (hi if hi is not None else 1)
            yield from _walk(body, times * inner)
        elif node[0] in ("group", "look"):
            yield from _walk(node[1], times)
        elif node[0] == "branch":
            for b in node[1]:
                yield from _walk(b, times)


def _is_class(body: list) -> bool:
    return len(body) == 1 and (body[0][0] in ("class", "lit", "any") or body[0][0] == "group" and _is_class(body[0][1]))


def _big_repeats(spec: str) -> list[str]:
    """Bounded repetitions above MAX_BOUNDED_REPEAT of one character class (slow to compile in xgrammar)."""
    try:
        tree = _parse(spec)
    except re.error:
        return []
    return [f"{{{lo},{hi}}}" for lo, hi, body, _ in _walk(tree) if hi not in (_SENTINEL, None) and _is_class(body)
            and max(lo, hi) > MAX_BOUNDED_REPEAT]


def word_bounds(spec: str) -> int:
    """How many ``{0,$words}`` bounds one reply can pass through (a bound inside a group repeated up to n times counts n)."""
    return sum(times for _, hi, _, times in _walk(_parse(spec)) if hi == _SENTINEL)


def unbounded_free_text(spec: str) -> str | None:
    """The first repetition without an upper bound over anything but a word (one class that admits no
    space, tab or newline, or one non-space character); None when every free text is bounded."""
    for lo, hi, body, _ in _walk(_parse(spec)):
        if hi is not None:
            continue
        one = body[0] if len(body) == 1 else (None,)
        word = (one[0] == "class" and not any(_admits(one[1], one[2], ch) for ch in " \t\n")
                or one[0] == "lit" and not one[1].isspace())
        if not word:
            return "*" if lo == 0 else "+"
    return None


_CATEGORIES = {"s": str.isspace, "d": str.isdigit, "w": lambda x: x.isalnum() or x == "_"}


def _admits(items: list, negated: bool, ch: str) -> bool:
    """Does a parsed character class admit ``ch``?"""
    hit = False
    for item in items:
        if item[0] == "lit":
            hit |= item[1] == ch
        elif item[0] == "range":
            hit |= item[1] <= ord(ch) <= item[2]
        elif item[0] == "cat":
            base = _CATEGORIES[item[1].lower()](ch)
            hit |= (not base) if item[1].isupper() else base
    return hit != negated


def _fill(node: Any, values: dict, where: str) -> Any:
    if isinstance(node, dict):
        return {k: _fill(v, values, where) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(v, values, where) for v in node]
    if isinstance(node, str) and "$" in node:
        m = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", node)
        if m:
            if m.group(1) not in values:
                raise ConstraintError(f"{where}: the constraint needs a value for ${m.group(1)}")
            return values[m.group(1)]
        try:  # $words stays for the call to fill (Constraint.bounded)
            return Template(node).substitute({WORDS: f"${WORDS}", **{k: str(v) for k, v in values.items()}})
        except KeyError as e:
            raise ConstraintError(f"{where}: the constraint needs a value for ${e.args[0]}") from None
        except ValueError as e:
            raise ConstraintError(f"{where}: {e} (write $$ for a literal dollar sign)") from None
    return node


def read_declarations(path: Path) -> dict[str, dict]:
    """``constraints.yaml``: template name -> {kind: spec}; {} when the folder has none."""
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConstraintError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConstraintError(f"{path}: expected a mapping of template name -> {{kind: spec}}")
    for name, decl in data.items():
        if not isinstance(decl, dict) or len(decl) != 1 or next(iter(decl)) not in KINDS:
            raise ConstraintError(f"{path}: {name}: declare exactly one of {', '.join(KINDS)}, e.g. {{choice: [Yes, No]}}")
    return data


def build(declaration: dict, values: dict, where: str) -> Constraint:
    """A declaration ({kind: spec with $placeholders}) + the call's values -> a Constraint."""
    kind, spec = next(iter(declaration.items()))
    c = Constraint.make(kind, _fill(spec, values, where), where)
    if kind == "regex" and (loose := unbounded_free_text(c.spec)):
        raise ConstraintError(f"{where}: free text without a length bound (a repetition '{loose}' over more than one word): a small "
                              "model then writes until max_tokens and the reply is cut; write it as words with a bounded count, "
                              "e.g. [^\\s]+( [^\\s]+){0,$words} ($words is filled from the step's max_tokens)")
    words = r'"(\\.|[^"\\])*"|\[\^[^\]]* [^\]]*\][*+]|\[(\\.|[^\]\\])*\]'  # literals; a word (a class without space)+; classes
    if kind == "grammar" and re.search(r"[*+]", re.sub(words, "", c.spec)):
        raise ConstraintError(f"{where}: a grammar's repetitions need bounds ({{0,$words}}), not * or + (only a word, "
                              "[^ \\t\\n]+, may repeat unbounded): an unbounded one lets a small model write until max_tokens")
    return c
