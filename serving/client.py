"""The one client every experiment uses.

``LLMClient.chat(messages, role=..., gen=...)`` returns a :class:`ChatResult`; agents never
import ``openai`` nor build HTTP requests, and never know which engine answers. Roles
(e.g. ``clinical``, ``patient``, ``grader``) map to endpoints by configuration.

Features: a concurrency limit, per-request timeout, retries with exponential backoff on
connection errors / 5xx / timeouts, token accounting per role, and the on-disk response
cache. Failures are data (``ChatResult.error``), never exceptions, so one bad request
does not sink a run.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from urllib.parse import urlparse

import openai

from models.errors import MedstackError

from serving.cache import ResponseCache, request_key


class RemoteEndpointError(MedstackError):
    """A base URL that is not on this machine, without --allow-remote."""


LOCAL_HOSTS = {"localhost", "localhost.localdomain"}
AUTH_MARK = "the endpoint refused the API key"  # in ChatResult.error of a 401/403: the runner stops the run on it
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


@dataclass(frozen=True)
class GenConfig:
    """Output-affecting sampling settings (all part of the cache key)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    frequency_penalty: float = 0.0
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] | None = None

    def replace(self, **kw) -> "GenConfig":
        return GenConfig(**{**asdict(self), **kw})


@dataclass
class ChatResult:
    texts: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency: float = 0.0
    finish_reasons: list[str] = field(default_factory=list)
    error: str | None = None
    cached: bool = False
    key: str | None = None  # the response-cache key (None: not cacheable)

    @property
    def text(self) -> str:
        return self.texts[0] if self.texts else ""

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Usage:
    requests: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_hits: int = 0
    seconds: float = 0.0


RETRYABLE = (openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError, openai.RateLimitError)


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
        self._sem = asyncio.Semaphore(concurrency)
        self._clients: dict[tuple[str, str], openai.AsyncOpenAI] = {}
        self.usage: dict[str, Usage] = defaultdict(Usage)

    def endpoint(self, role: str) -> Endpoint:
        return self.endpoints.get(role) or self.endpoints["default"]

    def _sdk(self, ep: Endpoint) -> openai.AsyncOpenAI:
        key = (ep.base_url, ep.api_key)
        if key not in self._clients:
            # retries are ours (with logging and backoff), so the SDK's are off
            self._clients[key] = openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, timeout=self.timeout, max_retries=0)
        return self._clients[key]

    async def chat(self, messages: list[dict], role: str = "default", gen: GenConfig = GenConfig()) -> ChatResult:
        return await self._request("chat", messages, role, gen)

    async def complete(self, prompt: str, role: str = "default", gen: GenConfig = GenConfig()) -> ChatResult:
        return await self._request("completion", prompt, role, gen)

    async def _request(self, kind: str, content, role: str, gen: GenConfig) -> ChatResult:
        ep = self.endpoint(role)
        cacheable = self.cache is not None and (gen.temperature == 0 or gen.seed is not None)
        key = request_key({"kind": kind, "model": ep.identity, "content": content, "gen": asdict(gen)}) if cacheable else None
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
            self.cache.put(key, result.to_dict())
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
            except RETRYABLE as e:
                last_error = f"{type(e).__name__}: {e}"
            except openai.APIStatusError as e:  # 4xx: our request is wrong, retrying will not help
                if e.status_code in AUTH_STATUS:  # a missing or wrong key: every other request would get the same
                    return ChatResult(error=f"HTTP {e.status_code} from {ep.base_url}: {AUTH_MARK} ({e.message})", latency=time.perf_counter() - t0)
                return ChatResult(error=f"HTTP {e.status_code}: {e.message}", latency=time.perf_counter() - t0)
            if attempt < self.retries:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        return ChatResult(error=f"gave up after {self.retries + 1} attempts: {last_error}")

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
        sdk = self._sdk(ep)
        if kind == "chat":
            resp = await sdk.chat.completions.create(messages=content, **params)
            texts = [c.message.content or "" for c in resp.choices]
        else:
            resp = await sdk.completions.create(prompt=content, **params)
            texts = [c.text or "" for c in resp.choices]
        u = resp.usage
        return ChatResult(
            texts=texts,
            prompt_tokens=u.prompt_tokens if u else 0,
            completion_tokens=u.completion_tokens if u else 0,
            latency=time.perf_counter() - t0,
            finish_reasons=[c.finish_reason or "" for c in resp.choices],
        )

    def usage_summary(self) -> dict:
        out = {role: asdict(u) for role, u in self.usage.items()}
        total = Usage()
        for u in self.usage.values():
            for k, v in asdict(u).items():
                setattr(total, k, getattr(total, k) + v)
        out["total"] = asdict(total)
        return out

    async def aclose(self) -> None:
        for c in self._clients.values():
            await c.close()
