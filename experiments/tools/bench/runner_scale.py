"""`medstack bench --runner-scale`: our own cost at paper scale (docs/protocols.md, Paper scale), the model's time taken out.

The first registered study that declares a paper-scale workload over synthetic cases (``Study.runner_scale``) runs
through the real runner, client, response cache and results directory against ``instant_endpoint.py`` (a separate
process, so its CPU is not ours); the figures and what each measures: serving/bench/README.md, "Runner at paper
scale".
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from experiments.common.markdown import md_table
from experiments.core import registry
from experiments.core.concurrency import run_async
from experiments.core.config import load_settings
from experiments.core.results import git_commit, read_run
from models.errors import MedstackError
from serving.launcher import free_port


def runner_scale_study(case_trials: int, trials: int, ref: str):
    """The first registered study that declares a paper-scale workload over synthetic cases (``Study.runner_scale``):
    the study and the settings it runs with, every role on ``ref``."""
    entry = next((e for e in registry.studies().values() if getattr(e.make, "runner_scale", None)), None)
    if entry is None:
        raise MedstackError("--runner-scale: no registered study declares a runner-scale workload (Study.runner_scale)")
    return entry.make.runner_scale(case_trials, trials, ref)


class InstantEndpoint:
    """The stand-in endpoint as a child process (so its CPU is not counted as ours)."""

    def __init__(self, port: int | None = None, delay_ms: float = 0.0):
        self.port = port or free_port()
        self.delay_ms = delay_ms
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "InstantEndpoint":
        self.proc = subprocess.Popen([sys.executable, "-m", "serving.bench.instant_endpoint", "--port", str(self.port),
                                      "--delay-ms", str(self.delay_ms)],
                                     cwd=Path(__file__).resolve().parents[3], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise MedstackError(f"the instant endpoint exited at start: {self.proc.stderr.read().decode()[-500:]}")
            try:
                urllib.request.urlopen(self.base_url + "/models", timeout=2).read()
                return self
            except OSError:
                time.sleep(0.2)
        self.__exit__()
        raise MedstackError(f"the instant endpoint did not answer on {self.base_url} within 60 s")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _size_mb(*paths: Path) -> float:
    return round(sum(p.stat().st_size for p in paths if p.exists()) / 1e6, 1)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def _run(study, settings, cache_path: Path, url: str, log):
    from experiments.core.runner import prepare_run, run_study
    from serving.cache import ResponseCache
    from serving.client import Endpoint, LLMClient

    settings, cases = prepare_run(study, settings)
    ep = Endpoint(url, "instant", f"instant@{url}")
    cache = ResponseCache(cache_path)
    client = LLMClient({r: ep for r in study.roles}, concurrency=settings.concurrency, timeout=settings.timeout,
                       retries=settings.retries, cache=cache)
    try:
        outcome = await run_study(study, settings, cases, client=client, log=log)
    finally:
        await client.aclose()
        cache.close()
    return outcome, client.usage_summary()["total"]


def measure(case_trials: int, *, trials: int = 5, concurrency: int = 64, out: Path, profile: Path | None = None, log=print) -> dict:
    """Run the workload once (fresh directory), then resume it; the figures of docs/protocols.md, Paper scale."""
    if out.exists() and any(out.iterdir()):
        raise MedstackError(f"--out {out} is not empty: the scale benchmark needs a fresh directory")
    out.mkdir(parents=True, exist_ok=True)
    rundir, cache_path = out / "run", out / "cache.sqlite"
    row: dict = {"case_trials": case_trials, "trials": trials, "concurrency": concurrency, "load_before": _load()}
    with InstantEndpoint() as ep:
        study, overrides = runner_scale_study(case_trials, trials, f"instant@{ep.base_url}")  # its default (paper) config, and these
        settings = load_settings(study.settings_cls, study.default_config({}), {**overrides, "out": str(rundir), "concurrency": concurrency})
        prof = None
        if profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        cpu0, t0 = _cpu(), time.perf_counter()
        outcome, usage = run_async(_run(study, settings, cache_path, ep.base_url, log))
        wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
        if prof:
            prof.disable()
            prof.dump_stats(str(profile))
        row.update({"load_after_run": _load(), "finished": outcome.finished, "failed": outcome.failed, "calls": usage["requests"],
                    "cache_hits": usage["cache_hits"], "wall_s": round(wall, 1), "calls_per_s": round(usage["requests"] / wall, 1),
                    "cpu_ms_per_call": round(1000 * cpu / max(1, usage["requests"]), 2), "calls_per_case_trial": round(usage["requests"] / case_trials, 1),
                    "peak_rss_mb_run": round(_rss_mb()), "records_mb": _size_mb(rundir / "records.jsonl"),
                    "cache_mb": _size_mb(cache_path, cache_path.with_name(cache_path.name + "-wal"))})
        t0 = time.perf_counter()
        again, _ = run_async(_run(study, settings, cache_path, ep.base_url, log))
        row["resume_s"] = round(time.perf_counter() - t0, 2)
        row["resume_ran_cases"] = again.metrics["run"]["cases_run"]
    t0 = time.perf_counter()
    run = read_run(rundir)
    run.metrics = study.metrics(run.finished, settings)
    study.summary(run.metrics, settings, run)
    row["metrics_s"] = round(time.perf_counter() - t0, 2)
    row["peak_rss_mb"] = round(_rss_mb())
    row["report_s"], row["peak_rss_mb_report"] = report_rss(rundir, out / "report.html")
    row["load_end"] = _load()
    return row


# `medstack report`'s own code in a fresh process that says its peak: VmHWM of its own memory. Not the
# rusage of the child: Linux carries the parent's RSS at fork over the exec into the child's ru_maxrss.
REPORT_PEAK = ("import sys\nfrom experiments.tools.report.build import build_report\nbuild_report([sys.argv[1]], sys.argv[2])\n"
               "print(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')))")


def report_rss(rundir: Path, html: Path) -> tuple[float, int]:
    """The report over the run (what `medstack report RUN` does, 500 cases rendered) in its own process:
    (seconds, its peak RSS in MB)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", REPORT_PEAK, str(rundir), str(html)], cwd=Path(__file__).resolve().parents[3],
                          capture_output=True, text=True)
    if proc.returncode:
        raise MedstackError(f"the report over {rundir} failed (exit {proc.returncode}): {proc.stderr[-500:]}")
    return round(time.perf_counter() - t0, 1), round(int(proc.stdout.split()[-1]) / 1024)


COLUMNS = [("case_trials", "case-trials"), ("calls", "calls"), ("calls_per_case_trial", "calls/case-trial"), ("wall_s", "wall s"),
           ("calls_per_s", "calls/s"), ("cpu_ms_per_call", "CPU ms/call"), ("peak_rss_mb_run", "peak RSS MB (run)"),
           ("peak_rss_mb", "peak RSS MB (all)"), ("peak_rss_mb_report", "peak RSS MB (`medstack report`)"),
           ("records_mb", "records.jsonl MB"), ("cache_mb", "cache MB"), ("resume_s", "resume s"), ("metrics_s", "metrics s"),
           ("report_s", "report s"), ("load_before", "load (1/5/15 min) before"), ("load_after_run", "load after run")]


def table(row: dict) -> str:
    return "\n".join(md_table(["figure", "value"], [[label, row.get(key)] for key, label in COLUMNS]))


def run_scale(case_trials: int, trials: int, concurrency: int, out: Path | None, profile: bool, log=print) -> dict:
    out = out or Path("runs/bench") / f"runner-scale-{case_trials}-{time.strftime('%Y%m%d-%H%M%S')}"
    row = measure(case_trials, trials=trials, concurrency=concurrency, out=out, profile=(out / "profile.pstats") if profile else None, log=log)
    row["git_commit"] = git_commit()
    (out / "runner-scale.json").write_text(json.dumps(row, indent=2))
    md = table(row)
    (out / "runner-scale.md").write_text(md + "\n")
    print(md)
    log(f"written to {out}")
    return row
