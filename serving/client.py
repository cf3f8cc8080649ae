"""The one client every experiment uses.

``LLMClient.chat(messages, role=..., gen=...)`` returns a :class:`ChatResult`; agents never
import ``openai`` nor build HTTP requests, and never know which engine answers. Roles
(e.g. ``clinical``, ``patient``, ``grader``) map to endpoints by configuration.

Features: a concurrency limit, per-request timeout, retries with exponential backoff on
connection errors / 429 / 5xx / timeouts, token accounting per role, and the on-disk response
cache. Failures are data (``ChatResult.error``), never exceptions, so one bad request
does not sink a run.

Transport: one ``aiohttp`` session (keep-alive connection pool) per endpoint, JSON bodies (orjson) sent as
they are to vLLM's OpenAI-compatible routes. Measured at 256 requests in flight against an endpoint
that answers at once (``serving/bench/README.md``, "Runner at paper scale"): 0.4-0.5 ms of CPU per
request, against 2.2-2.9 ms through the OpenAI SDK's ``post`` (its request building and httpx's
connection pool) -- the bulk of the runner's own cost per call at paper scale.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from urllib.parse import urlparse

import aiohttp
import orjson

from models.errors import MedstackError
from models.jsontext import loads

from serving.cache import ResponseCache, request_key
from serving.types import ErrorKind, GenConfig, shallow_dict


class RemoteEndpointError(MedstackError):
    """A base URL that is not on this machine, without --allow-remote."""


class StructuredOutputsUnsupported(MedstackError):
    """An endpoint that rejects or ignores vLLM's `structured_outputs` field, in a run with answers: constrained."""


# the probe of a constrained run: a reply no model writes unasked, forced by a choice constraint
PROBE_CHOICE = "zq7"


LOCAL_HOSTS = {"localhost", "localhost.localdomain"}
AUTH_MARK = "the endpoint refused the API key"  # the words of a 401/403 in ChatResult.error
AUTH_STATUS = (401, 403)


def is_local_url(url: str) -> bool:
    host = (urlparse(url).hostname or "").lower()
    if host in LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_local(url: str, allow_remote: bool) -> None:
    if not allow_remote and not is_local_url(url):
        raise RemoteEndpointError(
            f"refusing non-local endpoint {url}: patient data must not leave this machine. "
            "Pass --allow-remote if this endpoint is yours and that is intended."
        )


@dataclass(frozen=True)
class Endpoint:
    """Where a role's requests go. ``model`` is the served model name (alias or LoRA adapter name)."""

    base_url: str
    model: str
    identity: str  # alias + weights hash + adapter: part of the cache key
    api_key: str = "EMPTY"


@dataclass
class ChatResult:
    texts: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency: float = 0.0
    finish_reasons: list[str] = field(default_factory=list)
    error: str | None = None
    error_kind: ErrorKind | None = None  # transport | status | auth (serving/types.py)
    cached: bool = False
    key: str | None = None  # the response-cache key (None: not cacheable)

    @property
    def text(self) -> str:
        return self.texts[0] if self.texts else ""

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict:
        """The cache entry (only answered results are cached: no ``error_kind``, so entries stay those of earlier versions)."""
        out = shallow_dict(self)
        del out["error_kind"]
        return out


@dataclass
class Usage:
    requests: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_hits: int = 0
    seconds: float = 0.0


class TransportError(Exception):
    """No usable answer: connection refused or dropped, a timeout, HTTP 429 or 5xx. Retried with back-off."""


class StatusError(Exception):
    """HTTP 4xx (not 429): the request itself is wrong (too long, bad field, refused key); retrying will not help."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def error_message(raw: bytes) -> str:
    """The server's own words from an error body: vLLM's ``{"error": {"message": ...}}`` (or a top-level
    ``message`` / ``detail``), else the body's start."""
    text = raw.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:500] or "(empty body)"
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            for k in ("message", "detail"):
                if inner.get(k):
                    return str(inner[k])[:2000]
        elif isinstance(inner, str) and inner:
            return inner[:2000]
    return text.strip()[:500]


JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}


class LLMClient:
    def __init__(
        self,
        endpoints: dict[str, Endpoint],
        *,
        concurrency: int = 32,
        timeout: float = 600.0,
        retries: int = 5,
        backoff: float = 1.0,
        cache: ResponseCache | None = None,
        allow_remote: bool = False,
        send_seed: bool = False,
    ):
        self.send_seed = send_seed  # see _send: seeded sampling crashes the vLLM CPU engine
        if "default" not in endpoints and endpoints:
            endpoints = {**endpoints, "default": next(iter(endpoints.values()))}
        for ep in endpoints.values():
            check_local(ep.base_url, allow_remote)
        self.endpoints = endpoints
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.cache = cache
        self.concurrency = concurrency
        self._sem = asyncio.Semaphore(concurrency)
        self._sessions: dict[tuple[str, str], aiohttp.ClientSession] = {}
        self.usage: dict[str, Usage] = defaultdict(Usage)

    def endpoint(self, role: str) -> Endpoint:
        return self.endpoints.get(role) or self.endpoints["default"]

    def _session(self, ep: Endpoint) -> aiohttp.ClientSession:
        """The endpoint's keep-alive pool, made on first use inside the running event loop. At most `concurrency`
        connections (the semaphore never lets more requests out); proxies from the environment are ignored
        (trust_env off): a request for a local server never takes a detour through one."""
        key = (ep.base_url, ep.api_key)
        s = self._sessions.get(key)
        if s is None or s.closed:
            s = self._sessions[key] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=max(1, self.concurrency)),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                headers={"Authorization": f"Bearer {ep.api_key}", **JSON_HEADERS},  # set once, not merged per request
                trust_env=False,
            )
        return s

    async def _http(self, ep: Endpoint, method: str, path: str, body: dict | None = None) -> dict:
        """One HTTP exchange with the endpoint, its JSON answer parsed. Raises TransportError (retried) or
        StatusError (not)."""
        url = ep.base_url.rstrip("/") + path
        data = None if body is None else orjson.dumps(body)
        try:
            async with self._session(ep).request(method, url, data=data) as resp:
                status, raw = resp.status, await resp.read()
        except asyncio.TimeoutError as e:
            raise TransportError(f"no answer from {url} within {self.timeout:g} s") from e
        except aiohttp.ClientError as e:  # refused, reset, server gone mid-answer
            raise TransportError(f"{type(e).__name__}: {e}") from e
        if status == 429 or status >= 500:
            raise TransportError(f"HTTP {status}: {error_message(raw)}")
        if status >= 400:
            raise StatusError(status, error_message(raw))
        try:
            data = loads(raw)
        except ValueError as e:
            raise TransportError(f"HTTP {status} with a body that is not JSON ({e}): {raw[:200]!r}") from e
        if not isinstance(data, dict):
            raise TransportError(f"HTTP {status} with a JSON {type(data).__name__}, not an object: {raw[:200]!r}")
        return data

    async def chat(self, messages: list[dict], role: str = "default", gen: GenConfig = GenConfig()) -> ChatResult:
        return await self._request("chat", messages, role, gen)

    async def complete(self, prompt: str, role: str = "default", gen: GenConfig = GenConfig()) -> ChatResult:
        return await self._request("completion", prompt, role, gen)

    async def _request(self, kind: str, content, role: str, gen: GenConfig) -> ChatResult:
        ep = self.endpoint(role)
        cacheable = self.cache is not None and (gen.temperature == 0 or gen.seed is not None)
        key = request_key({"kind": kind, "model": ep.identity, "content": content, "gen": gen.key_fields()}) if cacheable else None
        usage = self.usage[role]
        if key:
            hit = self.cache.get(key)
            if hit is not None:
                usage.cache_hits += 1
                return ChatResult(**{**hit, "cached": True, "key": key})
        async with self._sem:
            result = await self._send_with_retries(kind, content, ep, gen)
        usage.requests += 1
        usage.prompt_tokens += result.prompt_tokens
        usage.completion_tokens += result.completion_tokens
        usage.seconds += result.latency
        result.key = key
        if result.ok and key:
            await self.cache.store(key, result.to_dict())  # committed before the answer is used
        elif not result.ok:
            usage.failed += 1
        return result

    async def _send_with_retries(self, kind, content, ep: Endpoint, gen: GenConfig) -> ChatResult:
        delay = self.backoff
        last_error = ""
        for attempt in range(self.retries + 1):
            t0 = time.perf_counter()
            try:
                return await self._send(kind, content, ep, gen, t0)
            except TransportError as e:
                last_error = str(e)
            except StatusError as e:  # 4xx: our request is wrong, retrying will not help
                if e.status in AUTH_STATUS:  # a missing or wrong key: every other request would get the same
                    return ChatResult(error=f"HTTP {e.status} from {ep.base_url}: {AUTH_MARK} ({e.message})", error_kind="auth",
                                      latency=time.perf_counter() - t0)
                return ChatResult(error=str(e), error_kind="status", latency=time.perf_counter() - t0)
            if attempt < self.retries:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        return ChatResult(error=f"gave up after {self.retries + 1} attempts: {last_error}", error_kind="transport")

    async def _send(self, kind, content, ep: Endpoint, gen: GenConfig, t0: float) -> ChatResult:
        params = dict(
            model=ep.model,
            temperature=gen.temperature,
            top_p=gen.top_p,
            max_tokens=gen.max_tokens,
            frequency_penalty=gen.frequency_penalty,
            n=gen.n,
        )
        # The seed stays in the cache key but is sent only with send_seed: on the vLLM CPU build (0.32) a seeded
        # request that hits chunked prefill kills the engine ("CPU Generator does not use offset"). Servers
        # medstack starts on CPU have chunked prefill off, where seeds work; a server started elsewhere may not.
        if gen.seed is not None and self.send_seed:
            params["seed"] = gen.seed
        if gen.stop:
            params["stop"] = list(gen.stop)
        if gen.structured:  # vLLM >= 0.12: `structured_outputs` (the removed guided_* fields are ignored silently)
            params["structured_outputs"] = json.loads(gen.structured)
        body = {**params, ("messages" if kind == "chat" else "prompt"): content}
        data = await self._http(ep, "POST", "/chat/completions" if kind == "chat" else "/completions", body)
        choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
        if kind == "chat":
            texts = [(c.get("message") or {}).get("content") or "" for c in choices]
        else:
            texts = [c.get("text") or "" for c in choices]
        u = data.get("usage") or {}
        return ChatResult(
            texts=texts,
            prompt_tokens=u.get("prompt_tokens") or 0,
            completion_tokens=u.get("completion_tokens") or 0,
            latency=time.perf_counter() - t0,
            finish_reasons=[c.get("finish_reason") or "" for c in choices],
        )

    async def check_structured_outputs(self, roles=None) -> list[dict]:
        """Probe every endpoint once (one short greedy request per endpoint, never cached) with a choice
        constraint whose only choice no model writes unasked; raise StructuredOutputsUnsupported naming the
        endpoint when it refuses the field or answers something else (a server that ignores the field).
        An endpoint that does not answer at all is left to the run's own failure policy."""
        seen, report = set(), []
        for role in roles or list(self.endpoints):
            ep = self.endpoint(role)
            if (ep.base_url, ep.model) in seen:
                continue
            seen.add((ep.base_url, ep.model))
            gen = GenConfig(temperature=0.0, max_tokens=8, structured=json.dumps({"choice": [PROBE_CHOICE]}))
            where = f"{ep.base_url} (model {ep.model}, role {role})"
            refusals = []
            for kind, content in (("chat", [{"role": "user", "content": "Reply with one word."}]), ("completion", "One word:")):
                async with self._sem:
                    r = await self._send_with_retries(kind, content, ep, gen)
                if r.error_kind not in ("status", "auth"):
                    break
                refusals.append(f"{kind}: {r.error[:240]}")  # e.g. a base model without a chat template: try the other API
            if refusals and len(refusals) == 2:
                raise StructuredOutputsUnsupported(
                    f"answers: constrained needs vLLM structured outputs, and {where} refused a constrained request "
                    f"({'; '.join(refusals)}). Use a vLLM >= 0.12 server, or --set answers=free")
            if r.ok and r.text.strip() != PROBE_CHOICE:
                raise StructuredOutputsUnsupported(
                    f"answers: constrained needs vLLM structured outputs, and {where} ignored the `structured_outputs` field "
                    f"(a choice-constrained probe answered {r.text[:60]!r}). Use a vLLM >= 0.12 server, or --set answers=free")
            report.append({"endpoint": ep.base_url, "model": ep.model, "ok": r.ok, "error": r.error})
        return report

    async def served_context_length(self, role: str = "default") -> int | None:
        """The context length the role's server was started with (vLLM's ``/v1/models`` ``max_model_len``
        of the served model or adapter); None when the endpoint does not say or does not answer."""
        ep = self.endpoint(role)
        try:
            async with self._sem:
                listing = await self._http(ep, "GET", "/models")
        except (TransportError, StatusError):  # unknown: the caller falls back to the registry's length
            return None
        for m in listing.get("data") or []:  # _http returns a JSON object or raises
            if isinstance(m, dict) and m.get("id") == ep.model:
                n = m.get("max_model_len")
                return int(n) if isinstance(n, int) and n > 0 else None
        return None

    def usage_summary(self) -> dict:
        out = {role: asdict(u) for role, u in self.usage.items()}
        total = Usage()
        for u in self.usage.values():
            for k, v in asdict(u).items():
                setattr(total, k, getattr(total, k) + v)
        out["total"] = asdict(total)
        return out

    async def aclose(self) -> None:
        for s in self._sessions.values():
            await s.close()
        self._sessions.clear()
