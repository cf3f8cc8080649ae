"""`medstack sweep ... --executor slurm`: the sweep's entries as Slurm jobs (plain sbatch scripts), one join.

Files, requeue, the join and status: docs/cluster.md. An entry job runs ``medstack sweep slurm-job SWEEP LABEL``
(the sweep's own planning, then :func:`experiments.tools.sweep.run.run_entry` for its one entry); the join job runs
``medstack sweep slurm-join SWEEP``, submitting itself again behind an entry that is back in the queue.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from experiments.common.markdown import md_table
from experiments.core.config import ConfigError
from experiments.core.results import make_results_dir
from experiments.core.runlock import RunDirInUse, RunLock
from experiments.tools.sweep.run import Plan, SweepOutcome, check_gpu_fit, finished_ids, is_finished, join, run_entry
from models.errors import MedstackError
from models.paths import USER_HOME_ENV, medstack_home, private_dir
from models.registry import fetch_command, get_spec, resolve_weights
from serving.launcher import GPU_PLAN_ENV
from serving.refs import ModelRef
from serving.slurm import (QueueUnknown, SlurmError, SlurmOptions, header, job_identity, log_tail, queue_states, read_state,
                           sbatch_script, shown_state, slurm_command, submit, write_script, write_state)

PLAN_FILE = "sweep.json"
JOB_LOG, JOB_STATE, JOB_HOME = "slurm-job.log", "slurm-job.json", ".home"


def slurm_dir(sweep_dir: Path) -> Path:
    return sweep_dir / "slurm"


def read_plan(sweep_dir: Path) -> dict:
    path = slurm_dir(Path(sweep_dir)) / PLAN_FILE
    if not path.exists():
        raise ConfigError(f"{sweep_dir}: no Slurm sweep here ({path} not found); start one with `medstack sweep STUDY ... --executor slurm --out {sweep_dir}`")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ConfigError(f"{path}: not JSON ({e})") from None


def _write_plan(sweep_dir: Path, plan: dict) -> None:
    write_state(slurm_dir(sweep_dir) / PLAN_FILE, **plan)


def served(roles: dict[str, str]) -> list[str]:
    """The models an entry's job serves itself (the model under test and the fixed roles; not an ALIAS@URL endpoint)."""
    return sorted({ModelRef.parse(ref).alias for ref in roles.values() if not ModelRef.parse(ref).url})


def entry_resources(roles: dict[str, str]) -> tuple[int, int | None]:
    """(GPUs, memory GB) of one entry's job: every model it serves, each with the GPUs and memory the registry gives it."""
    specs = [get_spec(a) for a in served(roles)]
    mems = [s.memory_gb for s in specs if s.memory_gb]
    return sum(s.gpus for s in specs), (sum(mems) if mems else None)


def gpu_plan(roles: dict[str, str], visible: str) -> dict[str, str]:
    """{$MEDSTACK_GPU_PLAN: 'ALIAS=0;ALIAS2=1,2'}: the job's GPUs split between the models it serves (each as many as
    the registry gives it), so two servers in one job never share a GPU; nothing when it serves at most one on GPUs."""
    need = [(a, get_spec(a).gpus) for a in served(roles) if get_spec(a).gpus]
    devices = [d for d in visible.split(",") if d.strip()]
    if len(need) < 2 or sum(n for _, n in need) > len(devices):
        return {}
    plan, i = [], 0
    for alias, n in need:
        plan.append(f"{alias}={','.join(devices[i:i + n])}")
        i += n
    return {GPU_PLAN_ENV: ";".join(plan)}


# ------------------------------------------------------------------ submit (the login node)

class SlurmSubmit:
    """The executor ``run_sweep`` hands the checked plan to: submit what is left, or join when all is done. With the
    study's --dry-run: write the scripts and the plan, say what would be submitted, run no Slurm command."""

    def __init__(self, opts: SlurmOptions, spec: dict, python: str | None = None):
        # the plan the jobs re-read runs for real: a dry run's scripts, submitted by hand, do what they say
        self.spec = {**spec, "args": [a for a in spec.get("args", []) if a != "--dry-run"]}
        self.opts, self.python = opts, python or sys.executable

    def __call__(self, plan: Plan) -> SweepOutcome:
        sweep_dir, log, out = plan.sweep_dir, plan.log, plan.outcome
        dry = any(common.get("dry_run") for _, common, *_ in plan.planned)
        with RunLock(sweep_dir):  # one submitter (or join) at a time per sweep folder
            old = _read_plan_or_empty(sweep_dir)
            entries = old.get("entries", {})
            queued = {} if dry else self._queued(plan, entries, old)
            in_queue = {lbl for lbl, e in entries.items() if e.get("job") in queued}
            if in_queue and old.get("spec") != self.spec:  # the plan is what they run: it cannot change under them
                jobs = sorted({entries[lbl]["job"].split("_")[0] for lbl in in_queue})
                live = ", ".join(f"{lbl}: job {entries[lbl]['job']}" for lbl in sorted(in_queue))
                raise ConfigError(f"{sweep_dir}: its plan cannot change while its jobs are queued or running with other arguments "
                                  f"({live}); "
                                  f"wait for them (`medstack sweep status {sweep_dir}`), or cancel them (`scancel {' '.join(jobs)}`) and run "
                                  "this command again; --dry-run shows the new plan without touching it")
            todo = []
            for r, _common, _given, _settings, case_ids in plan.planned:
                e = entries.setdefault(r.label, {})
                e.update(model=r.model, out=str(r.out), cases=len(case_ids))
                if is_finished(r.out, case_ids):
                    r.status, r.message = "skipped", "finished earlier"
                elif r.label in in_queue:
                    r.status, r.message = "submitted", f"job {e['job']} {shown_state(queued[e['job']], {})}"
                else:
                    todo.append(r)
            missing = check_visible(todo, dry)  # a dry run says what is missing and writes the scripts all the same
            plan_doc = {"spec": self.spec, "cwd": str(Path.cwd()), "python": self.python, "home": str(medstack_home().absolute()),
                        "weights": _abs(os.environ.get("MEDSTACK_WEIGHTS")), "options": self.opts.__dict__, "entries": entries,
                        "join_job": old.get("join_job"), "unit_noun": getattr(plan.study, "unit_noun", "cases")}
            if not todo and not in_queue and not dry:  # every entry finished: the join, here and now
                _write_plan(sweep_dir, plan_doc)
                log(f"sweep: every entry of {sweep_dir} is finished; joining")
                return join(plan)
            if dry:
                return self._dry_run(plan, plan_doc, todo, missing)
            private_dir(slurm_dir(sweep_dir))
            new_jobs, previous = [], None
            for group, limit, chained in _arrays(todo, self.opts.max_parallel):
                script, labels = self._entry_script(sweep_dir, group, len(list(slurm_dir(sweep_dir).glob("entries-*.sbatch"))), limit)
                try:
                    job = submit(script, cwd=Path.cwd(), args=[f"--dependency=afterany:{previous}"] if chained and previous else [])
                except SlurmError as e:  # nothing half-made: its script and its entries' plan lines go
                    for r in group:
                        if not entries.get(r.label, {}).get("job"):
                            entries.pop(r.label, None)
                    _unmade(sweep_dir, script, plan_doc, bool(new_jobs))
                    raise SlurmError(submit_failed(e, self.opts)) from None
                previous = job
                for i, r in enumerate(group):
                    make_results_dir(r.out)
                    write_state(r.out / JOB_STATE, state="submitted", job_id=f"{job}_{i}", submitted=time.time(), script=str(script))
                    entries[r.label].update(job=f"{job}_{i}", script=str(script))
                    r.status, r.message = "submitted", f"job {job}_{i}"
                _write_plan(sweep_dir, plan_doc)  # each array's ids kept at once: a failure after it never submits it twice
                log(f"sweep: submitted {', '.join(labels)} as Slurm job array {job} ({script})")
                new_jobs += [f"{job}_{i}" for i in range(len(group))]
            join_queued = plan_doc.get("join_job") in queued
            if new_jobs or not join_queued:  # the join waits for every entry job in the queue (a finished one is gone from it)
                if join_queued:  # an earlier join waits on earlier jobs only: this one replaces it
                    _scancel(plan_doc["join_job"])
                try:
                    plan_doc["join_job"] = submit_join(sweep_dir, plan_doc, new_jobs + [entries[lbl]["job"] for lbl in sorted(in_queue)])
                except SlurmError as e:  # the entries are queued (their ids kept); the same command again submits the join
                    (slurm_dir(sweep_dir) / "join.sbatch").unlink(missing_ok=True)
                    raise SlurmError(submit_failed(e, self.opts, join=True) + "; the entry jobs are queued: the same command again "
                                     "submits only the join") from None
                _write_plan(sweep_dir, plan_doc)
            log(f"sweep: the join (compare, summary, report) runs as job {plan_doc['join_job']} when every entry job has ended; "
                f"`medstack sweep status {sweep_dir}` shows where they are")
            return out

    @staticmethod
    def _queued(plan: Plan, entries: dict, old: dict) -> dict[str, str]:
        """The queue's states of this sweep's jobs; a queue that cannot be read while entries that have a job are
        unfinished: :class:`SlurmError` (exit 3) naming them, nothing submitted (they may still be running)."""
        try:
            return queue_states([e.get("job", "") for e in entries.values()] + [old.get("join_job") or ""])
        except QueueUnknown as e:
            unknown = [f"{r.label} (job {entries[r.label]['job']})" for r, *_, case_ids in plan.planned
                       if entries.get(r.label, {}).get("job") and not is_finished(r.out, case_ids)]
            if unknown:
                raise SlurmError(f"sweep: the state of {', '.join(unknown)} is unknown ({e}); nothing was submitted. Run the same "
                                 f"command again when squeue answers (`medstack sweep status {plan.sweep_dir}` shows the jobs)") from None
            return {}

    def _dry_run(self, plan: Plan, plan_doc: dict, todo: list, missing: list[str] = ()) -> SweepOutcome:
        """The scripts and the plan a submission would write, in a folder of their own (``slurm/dry-run``): the live
        plan, which queued jobs re-read when they start, is never touched."""
        sweep_dir, log = plan.sweep_dir, plan.log
        where = slurm_dir(sweep_dir) / "dry-run"
        shutil.rmtree(where, ignore_errors=True)
        private_dir(where)
        write_state(where / PLAN_FILE, **plan_doc)
        commands, scripts = [], []
        for k, (group, limit, chained) in enumerate(_arrays(todo, self.opts.max_parallel)):
            script, labels = self._entry_script(sweep_dir, group, k, limit, where)
            scripts.append(str(script))
            after = [f"--dependency=afterany:$JOB{k - 1}"] if chained and k else []
            commands.append(f"JOB{k}=$(sbatch --parsable {' '.join(after + [shlex.quote(str(script))])})  # {', '.join(labels)}")
            for i, r in enumerate(group):
                make_results_dir(r.out)  # where the job's log goes, should the script be submitted by hand
                r.status, r.message = "dry run", f"task {i} of {script}; nothing submitted"
        join_script = write_join(sweep_dir, plan_doc, where)
        scripts.append(str(join_script))
        deps = ":".join(f"$JOB{k}" for k in range(len(commands)))
        commands.append(f"sbatch --parsable {'--dependency=afterany:' + deps + ' ' if deps else ''}{shlex.quote(str(join_script))}  # the join")
        log(f"sweep: dry run: no Slurm command was run, nothing submitted, the live plan untouched. What a submission would write: "
            f"the plan {where / PLAN_FILE}; the scripts, to read: {', '.join(scripts)}")
        for line in missing:
            log(f"[yellow]sweep: dry run: {line}[/yellow]")
        log("sweep: submitting would run:\n" + "\n".join("    " + c for c in commands)
            + "\n(the same command without --dry-run submits them and keeps the job ids for `medstack sweep status`)")
        return plan.outcome

    def _entry_script(self, sweep_dir: Path, group: list, n: int, limit: int | None, where: Path | None = None) -> tuple[Path, list[str]]:
        gpus, mem = group[0].resources
        labels = [r.label for r in group]
        script = (where or slurm_dir(sweep_dir)) / f"entries-{n}.sbatch"
        python = self.opts.python_argv(self.python)
        body = [f"LABELS=({' '.join(shlex.quote(x) for x in labels)})",
                'LABEL="${LABELS[${SLURM_ARRAY_TASK_ID:-0}]}"',
                f'exec >>{shlex.quote(str(sweep_dir))}/"$LABEL"/{JOB_LOG} 2>&1  # the job\'s log, beside its results',
                'echo "== $(date -Is) job ${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}_${SLURM_ARRAY_TASK_ID:-0} on $(hostname), '
                'restart ${SLURM_RESTART_COUNT:-0}"',
                "exec " + shlex.join([*python, "-m", "scripts.cli", "sweep", "slurm-job", str(sweep_dir)]) + ' "$LABEL"']
        hdr = header(f"medstack-sweep-{self.spec['study']}", self.opts, gpus=gpus, mem_gb=mem,
                     output=slurm_dir(sweep_dir) / "entries-%A_%a.out", array=f"0-{len(group) - 1}" + (f"%{limit}" if limit else ""))
        write_script(script, sbatch_script(hdr, body, chdir=Path.cwd(), opts=self.opts,
                                           comment=f"medstack sweep {self.spec['study']}: entries {', '.join(labels)} of {sweep_dir}"))
        return script, labels


def _abs(path: str | None) -> str | None:
    return os.path.abspath(os.path.expanduser(path)) if path else None


def check_visible(runs: list, dry: bool = False) -> list[str]:
    """Before anything is submitted: the weights of every model an entry job will serve are where the job looks (the
    data sets and releases were resolved by the sweep's own checks, in the home the jobs read). One line, exit 2.
    ``dry``: nothing is refused; the lines saying what is missing are returned (a dry run prints them and writes the
    scripts, to be read before the weights are downloaded)."""
    said: list[str] = []
    for r in runs:
        for alias in served(r.roles):
            try:
                resolve_weights(alias)
            except MedstackError as e:
                if not dry:
                    raise ConfigError(f"sweep --executor slurm: entry {r.label} would fail in its job: {e}") from None
                line = f"the weights of {alias} are not here yet; entry {r.label}'s job would fail until they are ({fetch_command(alias)})"
                if line not in said:
                    said.append(line)
    return said


def submit_failed(e: SlurmError, opts: SlurmOptions, join: bool = False) -> str:
    """A refused submission in one line: sbatch's own reason, then what to check next."""
    asked = ", ".join(f"--{k} {v}" for k, v in (("partition", opts.join_partition or opts.partition if join else opts.partition),
                                                  ("account", opts.account), ("time", JOIN_TIME if join else opts.time)) if v)
    return (f"{e}; nothing of it was kept. Check the partition, account and time limit the job asks for"
            + (f" ({asked})" if asked else "") + " with `sinfo -s` and `sacctmgr show assoc user=$USER` (or your site's docs), then run the same command again")


def _unmade(sweep_dir: Path, script: Path, plan_doc: dict, kept: bool) -> None:
    """After a refused submission: its script goes; the plan is written only when earlier jobs of this command were
    submitted (their ids are kept), and a slurm/ folder left with nothing is removed."""
    script.unlink(missing_ok=True)
    if kept or any(e.get("job") for e in plan_doc["entries"].values()):
        _write_plan(sweep_dir, plan_doc)
    folder = slurm_dir(sweep_dir)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def _read_plan_or_empty(sweep_dir: Path) -> dict:
    try:
        return read_plan(sweep_dir)
    except ConfigError:
        return {}


def _groups(runs: list) -> list[list]:
    """Entries with the same resources (GPUs, memory) share one job array."""
    out: dict[tuple, list] = {}
    for r in runs:
        r.resources = entry_resources(r.roles)
        out.setdefault(r.resources, []).append(r)
    return list(out.values())


def _arrays(runs: list, max_parallel: int | None) -> list[tuple[list, int | None, bool]]:
    """(entries, its %limit, whether it waits for the array before it) per job array, so that at most ``max_parallel``
    entry jobs submitted together run at once: the limit shared out between the arrays (each at least one), or, with
    fewer than one per array, the arrays one after another."""
    groups = _groups(runs)
    if not max_parallel:
        return [(g, None, False) for g in groups]
    if max_parallel < len(groups):
        return [(g, max_parallel, True) for g in groups]
    limits = [1] * len(groups)
    for _ in range(max_parallel - len(groups)):
        room = [i for i, g in enumerate(groups) if limits[i] < len(g)]
        if not room:
            break
        limits[max(room, key=lambda i: len(groups[i]) - limits[i])] += 1
    return [(g, n, False) for g, n in zip(groups, limits)]


def _scancel(job: str) -> None:
    try:
        slurm_command(["scancel", job])
    except SlurmError:
        pass  # an earlier join left queued finds the entries again when it runs, and waits for them


JOIN_TIME = "0:30:00"  # the join's time limit: compare, summary and report over finished folders take minutes


def write_join(sweep_dir: Path, plan_doc: dict, where: Path | None = None) -> Path:
    """The join's script: one CPU, 4 GB, no GPU, :data:`JOIN_TIME`, on ``--slurm-join-partition`` (default: the entries' partition)."""
    given = SlurmOptions(**plan_doc["options"])
    opts = SlurmOptions(**{**plan_doc["options"], "cpus": 1, "max_parallel": None, "time": JOIN_TIME,
                           "partition": given.join_partition or given.partition})
    opts.extra = {k: v for k, v in opts.extra.items() if not k.startswith(("gres", "gpu", "mem", "cpu", "constraint"))}  # no GPU for the join
    python = opts.python_argv(plan_doc["python"])
    body = ["exec " + shlex.join([*python, "-m", "scripts.cli", "sweep", "slurm-join", str(sweep_dir)])]
    hdr = header("medstack-sweep-join", opts, gpus=0, mem_gb=4, output=sweep_dir / "slurm" / "join.log", requeue=False)
    return write_script((where or slurm_dir(sweep_dir)) / "join.sbatch",
                        sbatch_script(hdr, body, chdir=Path(plan_doc["cwd"]), opts=opts, comment=f"medstack sweep: the join of {sweep_dir}"))


def submit_join(sweep_dir: Path, plan_doc: dict, after: list[str], begin: str | None = None) -> str:
    """The join job, waiting for ``after`` (job ids) to end, or starting no sooner than ``begin`` (sbatch --begin)."""
    args = ([f"--dependency=afterany:{':'.join(sorted(set(after)))}"] if after else []) + ([f"--begin={begin}"] if begin else [])
    return submit(write_join(sweep_dir, plan_doc), cwd=Path(plan_doc["cwd"]), args=args)


# ------------------------------------------------------------------ inside the jobs

class EntryJob:
    """The executor of ``medstack sweep slurm-job SWEEP LABEL``: run that one entry (no sweep lock: each entry's
    run lock holds its own folder, so entry jobs run side by side)."""

    def __init__(self, label: str):
        self.label = label

    def __call__(self, plan: Plan) -> SweepOutcome:
        match = [p for p in plan.planned if p[0].label == self.label]
        if not match:
            raise ConfigError(f"sweep slurm-job: {self.label!r} is not an entry of {plan.sweep_dir} "
                              f"({', '.join(p[0].label for p in plan.planned)})")
        r, common, given, settings, case_ids = match[0]
        state = r.out / JOB_STATE
        try:  # a second job of this entry (an sbatch that queued it twice) finds its folder held: it leaves the state alone
            RunLock(r.out).acquire().release()
        except RunDirInUse as e:
            plan.log(f"sweep slurm-job: {self.label}: {e}; this job ends, the entry's state is the holder's")
            r.status, r.message = "in use", str(e)
            return plan.outcome
        write_state(state, state="running", started=time.time(), **job_identity())
        os.environ.update(gpu_plan(r.roles, os.environ.get("CUDA_VISIBLE_DEVICES", "")))
        check_gpu_fit(settings)  # on the GPUs this job was given, each server on its own where the plan split them
        try:
            run_entry(plan, r, common, given, case_ids)
        except BaseException:  # SIGTERM from Slurm (preemption, requeue, scancel), Ctrl-C: requeued jobs resume
            write_state(state, state="interrupted", ended=time.time())
            raise
        if r.status == "in use":  # took the folder's lock between our look and the run: the holder's state stays
            return plan.outcome
        if r.status in ("finished", "skipped"):
            write_state(state, state="done", ended=time.time(), exit_code=0, message="")
        else:
            sys.stderr.flush()
            sys.stdout.flush()
            write_state(state, state="failed", ended=time.time(), exit_code=3, message=r.message,
                        log_tail=log_tail(r.out / JOB_LOG))
        return plan.outcome


def record_failure(out: Path, message: str) -> None:
    """An entry job that stopped before its run started (its input changed since it was submitted)."""
    write_state(out / JOB_STATE, state="failed", ended=time.time(), exit_code=2, message=message, log_tail=log_tail(out / JOB_LOG),
                **job_identity())


def job_environment(doc: dict, sweep_dir: Path, label: str | None = None) -> None:
    """Inside a job: the data sets, released runs, embedded model and weights are read where the submitter's checks
    found them (its medstack home, $MEDSTACK_WEIGHTS), also where the site passes no environment to jobs; an entry
    job's own medstack home (``SWEEP/LABEL/.home``) holds only its servers, their logs and its response cache."""
    if doc.get("home"):
        os.environ[USER_HOME_ENV] = doc["home"]
    if doc.get("weights"):
        os.environ["MEDSTACK_WEIGHTS"] = doc["weights"]
    if label is not None:
        os.environ["MEDSTACK_HOME"] = str(private_dir(Path(sweep_dir) / label / JOB_HOME))


class JoinJob:
    """The executor of ``medstack sweep slurm-join SWEEP``: join when every entry job has ended."""

    def __call__(self, plan: Plan) -> SweepOutcome:
        sweep_dir, log = plan.sweep_dir, plan.log
        doc = read_plan(sweep_dir)
        with RunLock(sweep_dir):
            entries = doc.get("entries", {})
            try:
                queued = queue_states([e.get("job", "") for e in entries.values()])
            except QueueUnknown as e:  # no state is no answer: entries whose job has not said it ended are waited for
                unsure = [r.label for r, *_, case_ids in plan.planned if not is_finished(r.out, case_ids)
                          and read_state(r.out / JOB_STATE).get("state") in ("submitted", "running", "interrupted")]
                if unsure:
                    doc["join_job"] = submit_join(sweep_dir, doc, [], begin="now+60")
                    _write_plan(sweep_dir, doc)
                    log(f"sweep: the state of {', '.join(unsure)} is unknown ({e}); the join tries again as job {doc['join_job']} in a minute")
                    return plan.outcome
                queued = {}
            waiting = [e["job"] for e in entries.values() if e.get("job") in queued]
            if waiting:  # requeued entries: wait for them again
                doc["join_job"] = submit_join(sweep_dir, doc, waiting)
                _write_plan(sweep_dir, doc)
                log(f"sweep: entry jobs {', '.join(waiting)} are back in the queue; the join waits for them as job {doc['join_job']}")
                return plan.outcome
            for r, _c, _g, _s, case_ids in plan.planned:
                st = read_state(r.out / JOB_STATE)
                if is_finished(r.out, case_ids):
                    r.status = "finished"
                else:
                    r.status = "error"
                    r.message = f"job {st.get('job_id', '?')}: " + (st.get("message") or "ended without finishing its cases") + \
                        f"; log: {r.out / JOB_LOG}"
            out = join(plan)
            return out


# ------------------------------------------------------------------ status (anywhere, any time)

def status_rows(sweep_dir: Path) -> tuple[dict, list[dict]]:
    doc = read_plan(sweep_dir)
    entries = doc.get("entries", {})
    try:
        queued, unknown = queue_states([e.get("job", "") for e in entries.values()] + [doc.get("join_job") or ""]), None
    except QueueUnknown as e:  # a job it cannot see is "unknown", never "failed"
        queued, unknown = {}, e.reason
    rows = []
    for label, e in entries.items():
        out = Path(e["out"])
        st = read_state(out / JOB_STATE)
        done, total = len(finished_ids(out)), int(e.get("cases", 0))
        state = "done" if done == total and total and (out / "metrics.json").exists() and not queued.get(e.get("job")) \
            else shown_state(queued.get(e.get("job")), st, unknown)
        rows.append({"entry": label, "model": e.get("model"), "job": e.get("job", "-"), "state": state,
                     "cases": f"{done}/{total}", "restarts": st.get("restarts", 0),
                     "message": st.get("message", "") if state == "failed" else "",
                     "log_tail": st.get("log_tail", "") if state == "failed" else "", "log": str(out / JOB_LOG)})
    join_job = doc.get("join_job")
    join_state = (shown_state(queued.get(join_job), {}) if join_job in queued else "done" if (sweep_dir / "summary.md").exists()
                  else f"unknown (squeue: {unknown})" if unknown is not None and join_job
                  else "left the queue without a summary (its log: slurm/join.log)" if join_job else "not submitted yet")
    return {"join_job": join_job, "join_state": join_state, "study": doc.get("spec", {}).get("study"),
            "unit_noun": doc.get("unit_noun", "cases")}, rows


def status_lines(sweep_dir: Path) -> list[str]:
    head, rows = status_rows(sweep_dir)
    columns = ["entry", "model", "job", "state", "cases", "restarts"]
    shown = [head["unit_noun"] if c == "cases" else c for c in columns]  # a study whose cases expand into trials counts case-trials
    lines = [f"sweep {head['study']}: {sweep_dir}", "", *md_table(shown, [[r[c] for c in columns] for r in rows])]
    lines += ["", f"join: job {head['join_job']} {head['join_state']}" if head["join_job"] else f"join: {head['join_state']}"]
    for r in rows:
        if r["state"] == "failed":
            lines += ["", f"{r['entry']} failed: {r['message'] or 'the job left the queue without finishing'} (log: {r['log']})"]
            lines += ["    " + x for x in (r["log_tail"] or log_tail(Path(r["log"]))).splitlines()]
    return lines

