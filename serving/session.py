"""Wire roles to running servers and hand experiments one :class:`LLMClient`.

A role is given as a model reference (``serving.refs.ModelRef``): ``ALIAS`` (a registry alias;
a running server is reused, otherwise one is started for the run and stopped after it, also
when the run is interrupted) or ``ALIAS@URL`` (an endpoint that is already up, e.g.
``llama3-8b-instruct@http://127.0.0.1:8001/v1``, whose key comes from ``api_key`` or
``$MEDSTACK_API_KEY``). A LoRA adapter is
attached to a role with ``lora={NAME: DIR}``; requests then name the adapter. It is loaded into
the server either way: at start for a server started here, at run time for ``ALIAS@URL``
(the server must allow runtime LoRA updates, e.g. ``medstack serve --runtime-lora``).

The dtype each role is served in is part of its cache key: from the server's record, else asked of an
``ALIAS@URL`` endpoint (``serving.served_dtype``). An endpoint whose dtype stays unknown is said once, in one
line, when the client opens, and its answers are cached under its URL, apart from any known dtype's.
"""

from __future__ import annotations

import hashlib
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path

from serving.cache import ResponseCache
from serving.client import Endpoint, LLMClient, check_local
from serving.launcher import ensure_server, load_adapter, plan_gpu_shares, running_servers, server_identity, will_start
from serving.refs import ModelRef, api_key_for
from serving.served_dtype import ask_dtype, dtype_name


async def _ensure_url_adapters(alias: str, url: str, adapters: dict[str, str], api_key: str) -> None:
    """An ``ALIAS@URL`` server is not started by us: load each adapter it does not serve yet."""
    if not adapters:
        return
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key=api_key, max_retries=0)
    try:
        served = {m.id async for m in client.models.list()}
    finally:
        await client.close()
    for name, path in adapters.items():
        if name not in served:
            load_adapter({"alias": alias, "base_url": url, "port": 0, "api_key": api_key}, name, path)


def dtype_key(ident: dict) -> str:
    """The dtype part of a cache key. A bfloat16 server answers differently from a float32 one: a run resumed against
    a server of the other dtype asks again instead of reusing the other one's answers. An unknown (or mixed, e.g. a
    router over 'bfloat16+float32' workers) dtype is keyed with the endpoint's URL too, so it shares no entry with a
    known dtype's nor with another such endpoint's."""
    dtype = ident.get("dtype")
    return dtype if dtype_name(dtype) else f"{dtype or 'dtype-unknown'}@{ident.get('base_url')}"


def endpoint_identity(alias: str, ident: dict, suffix: str = "") -> str:
    """The model identity in every response cache key: alias, weights hash, the dtype it is served in, adapters."""
    return f"{alias}:{ident.get('weights_sha256') or ident['weights']}:{dtype_key(ident)}{suffix}"


def adapter_hash(path: str) -> str:
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("adapter_model.*")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


@asynccontextmanager
async def open_client(
    roles: dict[str, str],
    *,
    lora: dict[str, dict[str, str]] | None = None,
    concurrency: int = 32,
    timeout: float = 600.0,
    retries: int = 5,
    use_cache: bool = True,
    cache_path: str | None = None,
    allow_remote: bool = False,
    api_key: str | None = None,
    send_seed: bool = False,
    startup_timeout: float | None = None,
    dtype: str | None = None,
    log=print,
):
    """Yield ``(client, identities)``: identities maps role -> model identity for the results directory."""
    lora = lora or {}
    refs = {role: ModelRef.parse(spec, where=f"role {role}") for role, spec in roles.items()}
    for ref in refs.values():  # refuse a remote endpoint before any server starts
        if ref.url:
            check_local(ref.url, allow_remote)
    url_key = api_key_for(api_key)
    endpoints: dict[str, Endpoint] = {}
    identities: dict[str, dict] = {}
    # one server per alias, carrying the union of the adapters its roles need
    needed: dict[str, dict[str, str]] = {}
    for role, ref in refs.items():
        if not ref.url:
            needed.setdefault(ref.alias, {}).update(lora.get(role, {}))
    with ExitStack() as stack:
        own_key = None if url_key == "EMPTY" else url_key  # reuses a running keyed server with the same key
        # servers started together on one GPU: each its share of the memory, or a refusal with the numbers (before any starts)
        shares = plan_gpu_shares([a for a, ad in needed.items() if will_start(a, ad, own_key, dtype)], dtype=dtype, log=log)
        servers = {alias: stack.enter_context(ensure_server(alias, lora=ad, log=log, api_key=own_key, startup_timeout=startup_timeout,
                                                                    dtype=dtype, gpu_memory_utilization=shares.get(alias)))
                   for alias, ad in needed.items()}
        for role, ref in refs.items():
            alias, url = ref.alias, ref.url
            adapters = lora.get(role, {})
            served = next(iter(adapters), alias)
            ident_suffix = "".join(f"+lora:{n}:{adapter_hash(p)}" for n, p in adapters.items())
            if url:
                await _ensure_url_adapters(alias, url, adapters, url_key)
                # a medstack server behind the URL: record its command line and environment too; else ask the server its dtype
                known = next((r for r in running_servers() if r["base_url"].rstrip("/") == url.rstrip("/")), None)
                ident = server_identity(known) if known else {}
                if not ident.get("dtype"):
                    ident["dtype"], ident["dtype_reason"] = ask_dtype(url, url_key)
                identities[role] = {**ident, "alias": alias, "base_url": url, "adapters": adapters,
                                    "keyed": url_key != "EMPTY"}  # whether a key was sent (never the key)
                endpoints[role] = Endpoint(url, served, f"{alias}@{url}:{dtype_key(identities[role])}{ident_suffix}", url_key)
                continue
            rec = servers[alias]
            ident = server_identity(rec)
            identities[role] = {**ident, "adapters": adapters}
            endpoints[role] = Endpoint(rec["base_url"], served, endpoint_identity(alias, ident, ident_suffix), rec.get("api_key") or "EMPTY")
        unknown = {i["base_url"]: (i["alias"], i.get("dtype_reason")) for i in identities.values() if not i.get("dtype")}
        for url, (alias, why) in unknown.items():  # once per endpoint, however many roles it serves
            log(f"dtype unknown for {alias}@{url} ({why or 'its server record names none'}): its answers are cached apart, under this URL")
        cache = ResponseCache(cache_path, log=log) if use_cache else None
        client = LLMClient(endpoints, concurrency=concurrency, timeout=timeout, retries=retries, cache=cache, allow_remote=allow_remote,
                           send_seed=send_seed)
        try:
            yield client, identities
        finally:
            await client.aclose()
            if cache:
                cache.close()
