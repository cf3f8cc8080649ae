"""Behaviour-unchanged check: replay three small runs from one response cache and compare the results.

    .venv/bin/python -m scripts.replay_check run --home HOME --out BEFORE [--repo OLD_CHECKOUT]   # fills HOME's cache
    .venv/bin/python -m scripts.replay_check run --home HOME --out AFTER                         # replays it
    .venv/bin/python -m scripts.replay_check diff BEFORE AFTER

`run` runs CRAFT-MD (2 cases, 1 trial, embedded-small.yaml), DERA-QA (3 questions, demo-qa.yaml) and MediTOD NLU
in context (the 3 turns of the fixture's test dialogue, k=2, 64 tokens) with the embedded model through the real
CLI (`python -m scripts.cli run` in --repo, default this checkout) with MEDSTACK_HOME=HOME, so every answer lands
in (or comes from) HOME/cache.
Each run starts a vLLM server of its own, even when every call is a cache hit (wrap the command in `flock LOCKFILE`
where other jobs start servers). A HOME without the embedded model gets the default home's prepared one linked
in (the same weights hash, which keys the cache) instead of converting it again.

`diff` matches each run's records.jsonl by id (the file's order follows which case finished first) and compares
them key by key, and metrics.json likewise, after dropping what differs between two runs of one commit from one
cache, the first answered by the server and the second all cache hits (calibrated so; the key names are dropped
at any depth):

- records: `t_start`, `t_end`, `latency` (each call's clock times and duration), `seconds`, `timing` (a case's
  and a role's durations), `cached` (a call's cache flag; a role's count of cache hits in `usage`); the call log
  `calls` is compared in step order without `index` and `after` (concurrent calls are numbered as they are issued,
  and `after` names the call that finished last before one started: both follow timing, and replayed calls
  finish at once);
- metrics.json: its `run` section, the run's statistics, not its results: wall time, requests sent and tokens
  sent (0 when every call is a cache hit), cache hits, tokens/s, the server's own metrics, cases run and resumed.
  NaN (a mean over no cases) equals NaN.

`scores` and `arm_scores` (a record's typed scores; DERA's per-arm scores, called `scores` before they were
renamed) are compared apart and reported as expected differences: which ids, which sub-keys; where only AFTER has
`arm_scores`, they must equal BEFORE's `scores` (a difference there is unexpected). Any other
difference, or an id on one side only, is unexpected: exit 1 (0 when none; 2 when a results file is missing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNS = {  # name -> the arguments of `medstack run` (data: the studies' shipped samples and the test fixtures)
    "craftmd": ["craftmd", "--data", "tests/fixtures/craftmd/cases.csv", "--limit", "2", "--trials", "1",
                "--config", "experiments/craftmd/configs/embedded-small.yaml"],
    "dera-qa": ["dera-qa", "--data", "experiments/dera/data/sample_medqa_open.jsonl", "--limit", "3",
                "--config", "experiments/dera/configs/demo-qa.yaml"],
    "meditod-nlu": ["meditod-nlu", "--data", "tests/fixtures/meditod/dialogs.json", "--limit", "3", "--k", "2",
                    "--max-tokens", "64", "--config", "experiments/meditod/configs/nlu_icl.yaml"],
}
VOLATILE_RECORD = {"t_start", "t_end", "latency", "seconds", "timing", "cached"}  # key names dropped at any depth
VOLATILE_METRICS = {"run"}
SCORE_KEYS = ("scores", "arm_scores")


def fail(line: str):
    print(line, file=sys.stderr)
    sys.exit(2)


def run(home: Path, out: Path, repo: Path) -> int:
    home, out, repo = home.resolve(), out.resolve(), repo.resolve()
    if not (repo / "scripts" / "cli.py").is_file():
        fail(f"--repo {repo}: not a medstack checkout (no scripts/cli.py)")
    models, default = home / "models" / "embedded", Path.home() / ".cache" / "medstack" / "models" / "embedded"
    if not models.exists() and (default / "medstack_prepared.json").exists():
        models.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        models.symlink_to(default)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    env, walls, rc = {**os.environ, "MEDSTACK_HOME": str(home)}, {}, 0
    for name, args in RUNS.items():
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "scripts.cli", "run", *args, "--model", "embedded", "--out", str(out / name)],
                              cwd=repo, env=env, capture_output=True, text=True)
        walls[name] = round(time.monotonic() - t0, 1)
        (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
        print(f"{name}: exit {proc.returncode}, {walls[name]} s (output: {out / name}.log)", flush=True)
        rc = rc or proc.returncode
    (out / "walls.json").write_text(json.dumps(walls, indent=1))
    return rc


def strip(value, drop: set):
    if isinstance(value, dict):
        return {k: strip(v, drop) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [strip(v, drop) for v in value]
    return value


def differing(a, b, path: str = "") -> list[str]:
    """Paths (a.b[3].c) where a and b differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in sorted(set(a) | set(b), key=str)
                for p in (differing(a[k], b[k], f"{path}.{k}") if k in a and k in b else [f"{path}.{k} (one side only)"])]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in differing(x, y, f"{path}[{i}]")]
    same_nan = isinstance(a, float) and isinstance(b, float) and a != a and b != b  # metrics.json writes NaN for no data
    return [] if a == b or same_nan else [path or "."]


def calls_in_step_order(record: dict) -> dict:
    """The call log in (step, issue order) order, without `index` and `after` (they follow timing: module docstring)."""
    calls = record.get("calls")
    if not isinstance(calls, list):
        return record
    calls = sorted(calls, key=lambda c: str(c.get("step")))  # stable: a step's repeats stay in issue order
    return {**record, "calls": [{k: v for k, v in c.items() if k not in ("index", "after")} for c in calls]}


def compare(label: str, a: dict, b: dict, drop: set, unexpected: list, expected: list) -> None:
    a, b = strip(calls_in_step_order(a), drop), strip(calls_in_step_order(b), drop)
    if "arm_scores" in b and "arm_scores" not in a and "scores" in a:  # the rename: the old per-arm scores, unchanged
        unexpected += [f"{label}: {p} (AFTER's arm_scores against BEFORE's scores)" for p in differing(a["scores"], b["arm_scores"], "arm_scores")]
    for k in SCORE_KEYS:  # reported apart: the refactor changes them on purpose
        sa, sb = a.pop(k, None), b.pop(k, None)
        if differing(sa, sb, k):
            expected.append(f"{label}: {k}: " + ", ".join(differing(sa, sb, k)[:6]))
    unexpected += [f"{label}: {p}" for p in differing(a, b)]


def read(path: Path, lines: bool = False):
    """A results file (records.jsonl: one record a line, by id); a missing or unreadable one: one line, exit 2."""
    try:
        text = path.read_text()
        return {r["id"]: r for r in map(json.loads, text.splitlines())} if lines else json.loads(text)
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"{path}: cannot read ({type(e).__name__}: {e})")


def diff(before: Path, after: Path) -> int:
    unexpected, expected = [], []
    for name in RUNS:
        ra, rb = before / name, after / name
        a, b = read(ra / "records.jsonl", lines=True), read(rb / "records.jsonl", lines=True)
        unexpected += [f"{name}: id {i} only in {before if i in a else after}" for i in sorted(set(a) ^ set(b))]
        for i in sorted(set(a) & set(b)):
            compare(f"{name} {i}", a[i], b[i], VOLATILE_RECORD, unexpected, expected)
        compare(f"{name} metrics.json", read(ra / "metrics.json"), read(rb / "metrics.json"), VOLATILE_METRICS, unexpected, expected)
        print(f"{name}: {len(a)} / {len(b)} records compared")
    print(f"expected differences (scores / arm_scores): {len(expected)}")
    for line in expected:
        print("  " + line)
    print(f"unexpected differences: {len(unexpected)}")
    for line in unexpected[:50]:
        print("  " + line)
    return 1 if unexpected else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replay_check", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the three small runs with MEDSTACK_HOME=HOME into OUT")
    p.add_argument("--home", type=Path, required=True, help="MEDSTACK_HOME: its cache/ holds the responses replayed")
    p.add_argument("--out", type=Path, required=True, help="output folder: one results folder per run, logs, walls.json")
    p.add_argument("--repo", type=Path, default=REPO, help="the checkout whose CLI runs (default: this one)")
    p = sub.add_parser("diff", help="compare two output folders of `run`; exit 1 on an unexpected difference")
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    return run(args.home, args.out, args.repo) if args.command == "run" else diff(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
