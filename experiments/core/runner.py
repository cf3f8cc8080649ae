"""The one study runner: settings -> cases -> client -> results directory, for every study.

Failure policy: docs/running-studies.md ("A failed request is never a result") and docs/exit-codes.md. Two faults
stop the run at once instead of failing case after case: an endpoint that refuses our key
(:class:`~experiments.core.study.EndpointAuthError`) and a disk that refuses a write
(:class:`~models.errors.StorageError`).
"""

from __future__ import annotations

import asyncio
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from experiments.core.concurrency import kv_bound, resolve_concurrency

from experiments.core.config import ConfigError, RunSettings
from experiments.core.plan import CONTEXT_HINT, fit_hint, fit_warning, is_context_error
from experiments.core.deviations import call_protocol, deviations_line, protocol_lines, protocol_stats, settings_deviations
from experiments.core.recordwriter import RecordWriter
from experiments.core.record import is_typed
from experiments.core.results import CALL_LOG, Run, RunDir
from experiments.core.runlock import RunLock
from experiments.core.scope import scope_line, take
from experiments.core.scorers import figures, score_record, scores_markdown
from experiments.core.study import CaseContext, RequestFailed, Study, call_formats, format_stats
from models.errors import DataError, MedstackError, StorageError
from serving import server_metrics
from serving.refs import ModelRef
from serving.replicas import metrics_targets, scrape_targets
from serving.session import open_client


@dataclass
class LoopState:
    """The case loop's counts, shared by the concurrent cases of one run."""

    finished: int = 0
    failed: int = 0
    not_started: int = 0
    consecutive: int = 0  # cases in a row that failed in transport
    stopped: bool = False  # no new case starts
    storage: str | None = None  # the first write the disk refused


@dataclass
class RunOutcome:
    out: Path
    metrics: dict
    summary: str
    finished: int
    failed: int
    not_started: int
    storage_error: str | None = None  # the write the disk refused, when that stopped the run

    @property
    def exit_code(self) -> int:
        return 3 if self.failed or self.not_started or self.storage_error else 0


def resolve_roles(study: Study, settings: RunSettings) -> dict[str, str]:
    """Every declared role -> a model reference; unknown roles are an error listing the valid ones."""
    given = dict(settings.roles)
    fallback = given.pop("default", None)
    unknown = sorted(set(given) - set(study.roles))
    if unknown:
        import difflib

        close = [c for u in unknown for c in difflib.get_close_matches(u, study.roles, n=1, cutoff=0.6)]
        raise ConfigError(f"{study.name}: unknown role(s) {', '.join(unknown)}" + (f"; did you mean {', '.join(close)}?" if close else "")
                          + f" (valid roles: {', '.join(study.roles)})")
    roles = {}
    for role in study.roles:
        spec = given.get(role) or fallback or "embedded"
        roles[role] = str(ModelRef.parse(spec, where=f"role {role}"))
    return roles


def default_out(study: Study, roles: dict[str, str]) -> str:
    return str(Path("runs") / f"{study.name}-{ModelRef.parse(roles[study.primary_role]).alias}")


def load_checked_cases(study: Study, settings: RunSettings) -> list[dict]:
    """The units of work of the cases this run takes: the study's cases, ``--limit`` / ``--sample`` of them (the scope
    goes to ``study.scope``: metrics.json and summary.md say it), expanded by the study (CRAFT-MD: its trials); at
    least one, each id once."""
    try:
        loaded = study.load_cases(settings)
    except DataError as e:  # a file of another study's format: said what this study reads
        from experiments.datasets.registry import expected_data

        hint = expected_data(study.name, settings.data) if settings.data else ""
        raise DataError(f"{e}; {hint}" if hint else str(e)) from None
    cases, study.scope = take(loaded, settings, study.strata)
    study.scope["noun"] = study.case_noun
    units = study.expand(cases, settings)
    if not units:
        raise DataError(f"{settings.data or study.name}: no cases to run (empty input, or --limit/filters left none)")
    seen: set[str] = set()
    for c in units:
        cid = str(c["id"])
        if cid in seen:
            raise DataError(f"{settings.data}: case id {cid!r} appears twice; ids must be unique")
        seen.add(cid)
    return units


def check_scorers(study: Study, settings: RunSettings) -> None:
    """Every optional scorer a run names is one of the study's."""
    optional = [s.name for s in study.scorers if s.optional]
    unknown = [n for n in settings.scorers if n not in optional]
    if unknown:
        raise ConfigError(f"--scorers {','.join(unknown)}: not an optional scorer of {study.name}; "
                          + (f"its optional scorers: {', '.join(optional)}" if optional else "it has none"))


def prepare_run(study: Study, settings: RunSettings) -> tuple[RunSettings, list[dict]]:
    """Everything that can be checked without a model: settings, roles, cases. Raises MedstackError."""
    check_scorers(study, settings)
    roles = resolve_roles(study, settings)
    settings = study.prepare(settings.model_copy(update={"roles": roles, "experiment": study.name}))
    settings = settings.model_copy(update={"out": settings.out or default_out(study, roles)})
    return settings, load_checked_cases(study, settings)


def _open(settings: RunSettings, study: Study, api_key: str | None, client, log, concurrency: int):
    """The run's client: ours over the roles' servers, or one given (tests: a scripted backend)."""
    if client is not None:
        return nullcontext((client, {}))
    lora = {study.primary_role: settings.lora} if settings.lora else None
    return open_client(settings.roles, lora=lora, concurrency=concurrency, timeout=settings.timeout, retries=settings.retries,
                       use_cache=settings.use_cache, allow_remote=settings.allow_remote, api_key=api_key,
                       send_seed=settings.send_seed, startup_timeout=settings.startup_timeout, dtype=settings.dtype,
                       log=log)


async def run_study(study: Study, settings: RunSettings, cases: list[dict] | None = None, *, api_key: str | None = None,
                    resume_command: str | None = None, client=None, log=print) -> RunOutcome:
    if cases is None:
        settings, cases = prepare_run(study, settings)
    fresh = not Path(settings.out).exists()
    try:
        with RunLock(settings.out, settings.experiment, study.formerly):  # one process per results directory, of this study's kind (exit 2)
            return await _run_locked(study, settings, cases, api_key=api_key, resume_command=resume_command, client=client, log=log)
    except MedstackError:  # refused before it started (a server that will not start, weights missing): no folder left behind
        if fresh:
            discard_unstarted(Path(settings.out))
        raise


UNSTARTED = ("config.yaml", "identity.json", ".medstack.lock")  # what a run writes before its first case


def discard_unstarted(out: Path) -> None:
    """Remove a results folder this run made and left before any record: its own files, then the folder if empty."""
    if not out.is_dir() or (out / "records.jsonl").exists():
        return  # never made (a path below a file, a folder it may not create), or it holds results
    try:
        for name in UNSTARTED:
            (out / name).unlink(missing_ok=True)
        out.rmdir()
    except OSError:  # something else is in it, or it cannot be touched: kept, the refusal stands
        pass


async def _run_locked(study: Study, settings: RunSettings, cases: list[dict], *, api_key, resume_command, client, log) -> RunOutcome:
    prompt_files = study.prompts.file_hashes() if study.prompts else {}
    if settings.answers == "constrained" and study.prompts:  # the declared formats shape a constrained run's answers
        prompt_files.update(study.prompts.constraint_file_hash())
    rundir = RunDir(settings.out, settings.model_dump(mode="json"), prompt_files=prompt_files,
                    settings_cls=type(settings), formerly=study.formerly)  # its resume rules, how it reads an older config.yaml
    for note in rundir.notes:
        log(note)
    warning = context_check(study, settings, cases)  # by the registry's context lengths, before any server starts
    if warning:  # said before the first request; the run goes on (the user may know better: a server with a longer context)
        log(f"[yellow]{escape(warning)}[/yellow]")
    case_ids = [str(c["id"]) for c in cases]
    # one pass over the file, without the call logs (the bulk of every record); the end of the run reads only what it appended
    known, offset = rundir.latest(drop=CALL_LOG), rundir.size()
    done = {i for i in case_ids if i in known and known[i].get("status") != "failed"}
    retry = [i for i in case_ids if i in known and known[i].get("status") == "failed"]
    todo = [c for c in cases if str(c["id"]) not in done]
    if done or retry:
        log(f"resuming {rundir.path}: {len(done)} case(s) already finished" + (f", {len(retry)} failed last time and run again" if retry else ""))

    limit = resolve_concurrency(settings.concurrency)  # auto: by this machine's device
    async with _open(settings, study, api_key, client, log, limit) as (client, identities):
        served = {role: n for role in settings.roles if identities.get(role) and not identities[role].get("started_by_run")
                  and (n := await client.served_context_length(role))}  # a server the run found running, or elsewhere
        if served and (again := context_check(study, settings, cases, served)) != warning:
            log(f"[yellow]{escape(again)}[/yellow]" if again else "the servers' own context lengths fit this configuration")
            warning = again
        fit = context_check(study, settings, cases, served, hint=True) if warning else None  # what a case that fails for its length says
        if settings.concurrency == "auto":  # then by what the servers' KV caches hold
            limit = kv_bound(limit, [i.get("kv_cache_tokens") for i in identities.values()], log)
            settings = settings.model_copy(update={"concurrency": limit})
        if settings.answers == "constrained":  # an endpoint without structured outputs: exit 2 before any case runs
            await client.check_structured_outputs(list(settings.roles) or None)
        urls = sorted({ep.base_url for ep in getattr(client, "endpoints", {}).values()})
        targets = metrics_targets(urls)  # a replica group's URL -> its replicas' URLs (the router has no engine metrics)
        before = scrape_targets(targets)
        t0, identity = time.perf_counter(), None
        try:
            identity = rundir.write_identity(identities, {"experiment": study.name, "roles": settings.roles, "answers": answers_identity(study, settings)})
            await study.setup(client, settings, todo, rundir.path)
            state = await _dispatch(study, settings, todo, rundir, client, identities, log, fit)
        except RequestFailed as e:  # the study's one-off set-up calls got no answer
            if e.kind == "auth":
                raise e.auth_error() from None
            log(f"[red]set-up request failed:[/red] {escape(str(e))}")
            state = LoopState(not_started=len(todo), stopped=True)
        except StorageError as e:  # before any case started (identity, set-up files)
            state = LoopState(not_started=len(todo), stopped=True, storage=str(e))
        wall = time.perf_counter() - t0
        stats = _run_stats(client, wall, settings, len(done), state)
        stats["served"] = served_by(identities)
        # the servers' own view of the run (prefix-cache hit rate, queueing vs prefill), where /metrics answers
        stats["server"] = server_metrics.endpoint_figures(targets, before, scrape_targets(targets))

    metrics, finished, failed = _score(study, settings, rundir, known, offset, case_ids)  # empties `known`
    metrics["run"] = stats
    n_finished, not_started = metrics["case_status"]["finished"], metrics["case_status"]["not_started"]
    storage = state.storage
    unwritten = None
    try:
        rundir.write_metrics(metrics)
    except StorageError as e:
        if not storage:
            raise
        unwritten = e
    # the run as computed, handed to the summary (and its paper tables): never read back from the folder just written
    run = Run(rundir.path, finished + failed, [], settings.model_dump(mode="json"), metrics=metrics, identity=identity)
    summary = (with_answers_line(study.summary(metrics, settings, run), metrics).rstrip("\n") + "\n\n"
               + scores_markdown(metrics["scores"], study.scorers) + "\n" + _footer(metrics, failed, not_started, resume_command, settings.roles))
    if storage:
        log(f"[red]the run stopped: {escape(storage)}[/red]\nno new case was started; {n_finished} finished record(s) are kept in {rundir.records_path}")
        summary += f"\n**The run stopped: {storage}.** No new case was started after that; finished records are kept.\n"
    if unwritten is None:
        try:
            rundir.write_summary(summary)
        except StorageError as e:
            if not storage:
                raise
            unwritten = e
    if unwritten is not None:
        log(f"metrics and summary were not written either ({escape(str(unwritten))})")
    return RunOutcome(rundir.path, metrics, summary, n_finished, len(failed), not_started, storage)


def _score(study: Study, settings: RunSettings, rundir: RunDir, known: dict[str, dict], offset: int,
           case_ids: list[str]) -> tuple[dict, list[dict], list[dict]]:
    """Metrics over the finished records: ``known`` (read at the start, without call logs) and what this run
    appended after byte ``offset``, upgraded to today's shape. Returns the metrics, the finished and the failed
    records (the summary and its paper tables are made from these). ``known`` is emptied and the records of other
    ids are let go on return, so the run never holds its records twice."""
    latest = known
    latest.update(rundir.latest(drop=CALL_LOG, start=offset))  # metrics never read the call log
    records = [latest.pop(i) for i in case_ids if i in latest]
    latest.clear()
    records = [r if is_typed(r) or r.get("status") == "failed" else study.upgrade(r, settings) for r in records]  # a resumed folder's older records
    finished = [r for r in records if r.get("status") != "failed"]
    failed = [r for r in records if r.get("status") == "failed"]
    metrics = study.metrics(finished, settings)
    metrics["scores"] = [f.json() for f in figures(finished, study.scorers)]  # every score's figures, through its scorer, resampled by case
    metrics["case_status"] = {"total": len(case_ids), "finished": len(finished), "failed": len(failed),
                              "not_started": len(case_ids) - len(records)}
    metrics["answers"] = settings.answers
    metrics["answer_formats"] = format_stats(finished)
    metrics["protocol"] = protocol_stats(finished)
    metrics.setdefault("deviations", settings_deviations(settings))  # every setting unlike the authors' (its study's table; a rescore: its source's)
    if study.scope:
        metrics["scope"] = study.scope  # which cases: all, the first N, a stratified sample (experiments/core/scope.py)
    if judged := self_judged(study, settings):
        metrics["self_judged"] = judged  # judging roles played by the model under test: a caveat in summary.md
    return metrics, finished, failed


def context_check(study: Study, settings: RunSettings, cases: list[dict], served: dict[str, int] | None = None,
                  hint: bool = False) -> str | None:
    """The warning of a configuration whose longest request may exceed a role's model context (experiments/core/plan.py),
    or None; ``hint``: only what fits, in a few words. A study whose worst case cannot be computed for these cases is
    not checked."""
    try:
        return fit_hint(study, settings, cases) if hint else fit_warning(study, settings, cases, served)
    except Exception:  # noqa: BLE001 - an estimate: never the reason a run does not start
        return None


def self_judged(study: Study, settings: RunSettings) -> dict[str, str]:
    """Judging role -> model, for the judging roles this run calls that the model under test plays itself (it grades
    its own answers)."""
    under_test = settings.roles.get(study.primary_role)
    return {r: under_test for r in study.judge_roles if r in study.fixed_roles(settings) and settings.roles.get(r) == under_test}


async def _dispatch(study: Study, settings: RunSettings, todo: list[dict], rundir: RunDir, client, identities: dict, log,
                    fit: str | None = None) -> LoopState:
    sem = asyncio.Semaphore(settings.concurrency)
    writer = RecordWriter(rundir, getattr(client, "cache", None))  # the record after its answers are committed; grouped fsyncs
    state = LoopState()
    served_dtypes = {role: i.get("dtype") for role, i in identities.items()}
    scorers = study.scorers_for(settings)

    async def one(case: dict, progress: Progress, task) -> None:
        async with sem:
            if state.stopped:
                state.not_started += 1
                return
            ctx = CaseContext(client, case["id"], settings.seed, answers=settings.answers)
            t0 = time.perf_counter()
            try:
                record = {"id": case["id"], **(await study.solve(ctx, case, settings)), "status": "ok"}
                await score_record(scorers, ctx, record, settings)  # the judges and checks, over the finished record
                state.consecutive = 0
                state.finished += 1
            except RequestFailed as e:
                if e.kind == "auth":  # a refused key fails every case alike: the whole run stops (exit 2), nothing recorded
                    raise e.auth_error() from None
                record = {"id": case["id"], "status": "failed", "error": str(e)}
                if is_context_error(e.error):  # the conversation outgrew the model: say so first, and what fits
                    record["error"] = (f"{e.step} ({e.role}): {CONTEXT_HINT} (" + (fit or "a shorter turn budget or max_tokens (--set), "
                                       "or a model with a longer context, fits it") + f"): {e.error}")
                state.consecutive = state.consecutive + 1 if e.kind == "transport" else 0
                state.failed += 1
            except StorageError as e:  # the disk refused a write (the response cache): stop starting cases
                _storage_stop(state, e, progress)
                return
            except MedstackError:
                raise  # bad input met mid-run (a prompt placeholder, a malformed case): the whole run stops
            except Exception as e:  # a bug in one case: recorded as failed, retried on resume
                record = {"id": case["id"], "status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
                state.failed += 1
            record["calls"] = ctx.calls
            formats = call_formats(ctx.calls)  # kept beside the call log: metrics are computed without it
            if formats["calls"]:
                record["answer_formats"] = formats
            shortfall = call_protocol(ctx.calls)  # requests that carried less than the protocol asks, per quantity
            if shortfall:
                record["protocol"] = shortfall
            record["usage"] = ctx.usage()
            record["roles"] = dict(settings.roles)  # role -> model reference: which model played which part
            record["served_dtype"] = dict(served_dtypes)  # role -> dtype of the server that answered (a resume may have another)
            record["seconds"] = round(time.perf_counter() - t0, 3)
            try:
                await writer.append(record)
            except StorageError as e:  # disk full / read-only: this record is lost, the ones before are not
                if record["status"] == "ok":
                    state.finished -= 1
                else:
                    state.failed -= 1
                _storage_stop(state, e, progress)
                return
            progress.advance(task)
            if state.consecutive >= settings.max_consecutive_failures and not state.stopped:
                state.stopped = True
                _report_endpoint_down(state.consecutive, identities, log)

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task(study.name, total=len(todo))
        tasks = [asyncio.ensure_future(one(c, progress, task)) for c in todo]
        try:
            await asyncio.gather(*tasks)
        except BaseException:  # a fault that stops the whole run (refused key, bad input): cases in flight end here
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
    return state


def answers_identity(study: Study, settings: RunSettings) -> dict:
    """identity.json's account of the answer mode: the mode and, when constrained, the declarations file used."""
    out: dict = {"mode": settings.answers}
    if settings.answers == "constrained" and study.prompts:
        out["declarations"] = {str(study.prompts.folder / name): h for name, h in study.prompts.constraint_file_hash().items()}
        out["request_field"] = "structured_outputs"
    return out


def answers_line(metrics: dict) -> str:
    """The line every summary.md carries under its title: the answer mode and how many replies kept their format."""
    mode = metrics.get("answers", "free")
    f = metrics.get("answer_formats") or {}
    text = (f"**answers: {mode}** — " + ("steps with a fixed format were decoded under vLLM structured outputs (docs/constrained-answers.md)"
                                        if mode == "constrained" else "free text parsed afterwards (the papers' protocol)"))
    if f.get("replies"):
        text += (f"; replies of fixed-format steps in their declared format: {f['replies_in_format']} of {f['replies']}"
                 + (" (the others were cut at max_tokens or a stop string: counted as format errors below)" if mode == "constrained" else ""))
    text += "."
    for line in protocol_lines(metrics.get("protocol")):  # what this run sent less of than the protocol asks
        text += f"\n\n**{line[0].upper() + line[1:]}.**"
    if "deviations" in metrics:  # the run's settings against the authors' (absent in metrics written before the table)
        line = deviations_line(metrics["deviations"])
        text += f"\n\n**{line[0].upper() + line[1:]}**"
    scope = metrics.get("scope")
    if scope:
        line = scope_line(scope, scope.get("noun", "cases"))
        text += f"\n\n**{line[0].upper() + line[1:]}.**"
    for role, model in (metrics.get("self_judged") or {}).items():
        text += (f"\n\n**Caveat: the {role} is the model under test ({model}): it grades its own answers, which may favour them. "
                 f"Name another model for it (--role {role}=ALIAS) to measure apart.**")
    return text


def with_answers_line(summary: str, metrics: dict) -> str:
    """``summary`` with :func:`answers_line` after its title line (or first, when it has no title)."""
    lines = summary.split("\n")
    at = 1 if lines and lines[0].startswith("#") else 0
    return "\n".join(lines[:at] + ["", answers_line(metrics)] + lines[at:] if at else [answers_line(metrics), ""] + lines)


def _storage_stop(state: LoopState, e: StorageError, progress: Progress) -> None:
    """The first refused write stops the run from starting cases (those in flight finish or fail alike)."""
    state.stopped = True
    state.storage = state.storage or str(e)
    state.not_started += 1  # this case's result could not be kept: it runs again on resume


def _report_endpoint_down(n: int, identities: dict, log) -> None:
    log(f"[red]{n} cases in a row got no answer from the model endpoint: no new case is started.[/red]")
    for role, ident in identities.items():
        if ident.get("started_by_run") and ident.get("log"):
            lines = Path(ident["log"]).read_text(errors="replace").splitlines()[-15:] if Path(ident["log"]).exists() else []
            log(f"the server medstack started for this run ({ident.get('alias')}, role {role}) logs to {ident['log']}; last lines:\n" + "\n".join(lines))
            break


def _run_stats(client, wall: float, settings: RunSettings, resumed: int, state: LoopState) -> dict:
    total = client.usage_summary()["total"]
    return {
        "cases_run": state.finished + state.failed, "cases_resumed": resumed,
        "cases_failed": state.failed, "cases_not_started": state.not_started, "stopped_early": state.stopped, "wall_seconds": round(wall, 2),
        "requests": total["requests"], "failed_requests": total["failed"], "cache_hits": total["cache_hits"],
        "prompt_tokens": total["prompt_tokens"], "completion_tokens": total["completion_tokens"],
        "output_tokens_per_s": round(total["completion_tokens"] / wall, 2) if wall > 0 else None,
        "concurrency": settings.concurrency, "usage_by_role": client.usage_summary(),
    }


def served_by(identities: dict) -> dict:
    """role -> what served it: alias, device and dtype (None where the endpoint names none: serving/served_dtype.py)."""
    return {role: {"alias": i.get("alias"), "device": i.get("device"), "dtype": i.get("dtype"), "dtype_reason": i.get("dtype_reason")}
            for role, i in identities.items()}


def _footer(metrics: dict, failed: list[dict], not_started: int, resume_command: str | None, roles: dict | None = None) -> str:
    c, r = metrics["case_status"], metrics["run"]
    text = f"Roles: {', '.join(f'{k}: {v}' for k, v in roles.items())}.\n" if roles else ""
    text += (f"Run: {c['finished']} of {c['total']} cases finished ({r['cases_resumed']} from earlier runs), "
            f"{r['wall_seconds']} s wall, {r['completion_tokens']} output tokens, {r['output_tokens_per_s']} output tokens/s, "
            f"{r['requests']} requests, {r['cache_hits']} cache hits.\n")
    if r.get("served"):
        text += "Served by: " + "; ".join(f"{role} = {s['alias']} ({s['device'] or 'device unknown'}, dtype {s['dtype'] or 'unknown'})"
                                          for role, s in r["served"].items()) + ".\n"
    for url, srv in (r.get("server") or {}).items():
        rate = srv.get("prefix_cache_hit_rate")
        text += f"Server {url}: prefix-cache hit rate {'-' if rate is None else f'{rate:.3f}'}, mean queueing {srv.get('queue_ms_mean')} ms, mean prefill {srv.get('prefill_ms_mean')} ms.\n"
    if failed or not_started:
        again = f" `{resume_command}`" if resume_command else ""
        parts = ([f"{len(failed)} failed cases"] if failed else []) + ([f"{not_started} cases not started"] if not_started else [])
        text += (f"\n**{' and '.join(parts)}** — left out of every metric above (a failed request is never a wrong answer); "
                 f"run the same command again to retry them:{again}\n")
        for rec in failed[:5]:
            text += f"- {rec['id']}: {str(rec.get('error'))[:200]}\n"
    return text
