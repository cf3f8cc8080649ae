"""Model references: how a role names the model that plays it. Parsed here and nowhere else.

``ALIAS``      a registry alias: a running medstack server for it is reused, otherwise one is
               started for the run and stopped after it.
``ALIAS@URL``  an OpenAI-compatible endpoint that is already up (``URL`` ends in ``/v1``),
               e.g. ``llama3-8b-instruct@http://127.0.0.1:8001/v1``. Its API key comes from
               ``--api-key`` or ``$MEDSTACK_API_KEY``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from models.errors import MedstackError

API_KEY_ENV = "MEDSTACK_API_KEY"
_ALIAS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$")


class ModelRefError(MedstackError):
    """A model reference that is neither ALIAS nor ALIAS@URL."""


@dataclass(frozen=True)
class ModelRef:
    alias: str
    url: str | None = None

    @classmethod
    def parse(cls, spec: "str | ModelRef", *, where: str = "model") -> "ModelRef":
        if isinstance(spec, ModelRef):
            return spec
        text = str(spec or "").strip()
        alias, sep, url = text.partition("@")
        if not alias or not _ALIAS.match(alias):
            raise ModelRefError(f"{where}: {text!r} is not a model reference (expected ALIAS or ALIAS@http://HOST:PORT/v1)")
        if sep and not re.match(r"^https?://[^/\s]+", url):
            raise ModelRefError(f"{where}: {text!r}: the part after @ must be a base URL such as http://127.0.0.1:8000/v1")
        return cls(alias, url.rstrip("/") or None) if sep else cls(alias)

    def __str__(self) -> str:
        return f"{self.alias}@{self.url}" if self.url else self.alias


def api_key_for(explicit: str | None = None) -> str:
    """The key sent to ``ALIAS@URL`` endpoints: ``--api-key``, else ``$MEDSTACK_API_KEY``, else none."""
    return explicit or os.environ.get(API_KEY_ENV) or "EMPTY"


def model_name(spec: "str | ModelRef") -> str:
    """The alias of a reference, for run names and tables."""
    return ModelRef.parse(spec).alias
