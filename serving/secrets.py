"""Secrets and exposure, in one place: what a key may never reach, and when a server may listen.

- :func:`redact_argv` is the one redaction of a command line (ours or vLLM's) before it is shown,
  logged or written: the value of every secret option becomes ``***``.
- :func:`public_env` keeps only environment variables that are safe to record (never a key).
- :func:`key_fingerprint` lets a server record say which key a server wants without holding it.
- :func:`check_exposure` refuses a server on a non-loopback interface without a key.
- :func:`check_adapter_name` is the one rule for adapter (LoRA) names, wherever they are given.
- :func:`open_keyed` is the one way a key reaches a plain HTTP request to a server (as a bearer token).

The API key of a server medstack starts reaches vLLM through its environment (``VLLM_API_KEY``),
never its argv (which every local user sees in ``ps``).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import urllib.request

from models.errors import MedstackError

SECRET_OPTIONS = ("--api-key", "--hf-token", "--token", "--password")
SECRET_ENV = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
SERVER_KEY_ENV = "VLLM_API_KEY"  # how vLLM's OpenAI server reads its key when --api-key is not on its command line
REDACTED = "***"
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*$")


class ExposureError(MedstackError):
    """A server that would listen beyond this machine without a key."""


def redact_argv(argv: list[str]) -> list[str]:
    """A copy of ``argv`` with the value of every secret option (``--api-key K``, ``--api-key=K``) replaced by ***."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        opt, eq, _ = arg.partition("=")
        if opt in SECRET_OPTIONS:
            if eq:
                out.append(f"{opt}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


def public_env(env: dict[str, str] | None) -> dict[str, str]:
    """Environment variables worth recording (engine settings), without anything that looks like a secret."""
    return {k: v for k, v in (env or {}).items() if not SECRET_ENV.search(k)}


def key_fingerprint(key: str | None) -> str | None:
    """A short hash that identifies a key without revealing it (server records hold this, never the key)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16] if key else None


def is_loopback_host(host: str) -> bool:
    h = host.strip("[]").lower()
    if h in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: str | None, no_auth: bool = False) -> None:
    """A server reachable from other machines must require a key, unless the user says --no-auth."""
    if api_key or no_auth or is_loopback_host(host):
        return
    raise ExposureError(
        f"--host {host} makes the server reachable from other machines, and no API key is set: anyone who can reach "
        f"this port could read and send clinical prompts. Give a key with --api-key KEY or $MEDSTACK_API_KEY "
        f"(clients then pass the same), bind 127.0.0.1, or pass --no-auth if an open server is intended"
    )


def check_adapter_name(name: str, where: str = "--lora") -> str:
    """Adapter names: letters, digits, _ . - and not starting with - (a name reaches vLLM's command line)."""
    if not ADAPTER_NAME.match(name or ""):
        raise MedstackError(f"{where}: adapter name {name!r} is not allowed: use letters, digits, '_', '.', '-', not starting with '-'")
    return name


def open_keyed(url: str, api_key: str | None, timeout: float, data: bytes | None = None):
    """``urlopen`` of ``url`` (a JSON POST with ``data``), with the key as a bearer token where there is one."""
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if api_key and api_key != "EMPTY":
        headers["Authorization"] = f"Bearer {api_key}"
    return urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout)
