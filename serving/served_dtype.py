"""The dtype a server computes in, asked from the server itself.

vLLM (0.32, the CPU build here) names its model's dtype in no endpoint a client can read by default: not in
``/v1/models``, ``/version`` nor ``/metrics`` (``vllm:cache_config_info``'s ``cache_dtype`` is the KV cache's,
"auto"), and ``/server_info`` answers only with ``VLLM_SERVER_DEV_MODE=1``, which also opens unauthenticated
control endpoints. So:

- every server medstack starts runs :func:`announce_dtype` (vLLM's ``--middleware``): each ``200`` answer to
  ``/v1/models`` carries the engine's own resolved ``model_config.dtype`` in the header ``X-Medstack-Dtype``
  (a keyed server tells it only to a key holder, as the answer itself);
- :func:`ask_dtype` reads that header, else ``/server_info`` of a vLLM server in development mode, else says
  it does not know. ``serve router`` asks each worker with it; a run asks an ``ALIAS@URL`` endpoint with it.

Importable in the vLLM server's process: standard library and :mod:`serving.types` only.
"""

from __future__ import annotations

import json
import urllib.error

from serving.secrets import open_keyed
from serving.types import DTYPES

HEADER = "X-Medstack-Dtype"
_SYNONYMS = {"half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32", "bf16": "bfloat16"}
UNKNOWN_WHY = (f"no {HEADER} header on /v1/models (servers medstack starts send it) and no /server_info "
               "(vLLM answers it only with VLLM_SERVER_DEV_MODE=1)")


def dtype_name(value) -> str | None:
    """``torch.bfloat16`` / ``"torch.float32"`` / ``"half"`` / ``"bfloat16"`` -> medstack's name; None for anything else."""
    if value is None:
        return None
    name = str(value).strip().lower().removeprefix("torch.")
    name = _SYNONYMS.get(name, name)
    return name if name in DTYPES and name != "auto" else None


async def announce_dtype(request, call_next):
    """vLLM ``--middleware``: the engine's dtype on every successful ``/v1/models`` answer."""
    response = await call_next(request)
    if response.status_code == 200 and request.url.path.rstrip("/") == "/v1/models":
        config = getattr(request.app.state, "vllm_config", None)
        named = dtype_name(getattr(getattr(config, "model_config", None), "dtype", None))
        if named:
            response.headers[HEADER] = named
    return response


def ask_dtype(url: str, api_key: str | None = None, timeout: float = 10.0) -> tuple[str | None, str]:
    """(dtype, how it was learnt) from the server at ``url`` (``http://host:port`` or ``.../v1``); (None, why not)."""
    base = url.strip().rstrip("/")
    base = base[:-3] if base.endswith("/v1") else base
    refused = None
    try:
        with open_keyed(base + "/v1/models", api_key, timeout) as r:
            named = dtype_name(r.headers.get(HEADER))
        if named:
            return named, f"asked of the server: its /v1/models header {HEADER}"
    except urllib.error.HTTPError as e:
        refused = f"its /v1/models answered HTTP {e.code}" + (" (the key)" if e.code in (401, 403) else "")
    except (OSError, ValueError) as e:
        refused = f"its /v1/models did not answer ({getattr(e, 'reason', e)})"
    try:
        with open_keyed(base + "/server_info?config_format=json", api_key, timeout) as r:
            info = json.loads(r.read().decode("utf-8", errors="replace"))
        named = dtype_name(((info.get("vllm_config") or {}).get("model_config") or {}).get("dtype"))
        if named:
            return named, "asked of the server: vLLM's /server_info (development mode)"
    except (OSError, ValueError, AttributeError):
        pass
    return None, refused or UNKNOWN_WHY
