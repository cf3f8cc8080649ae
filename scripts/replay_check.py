"""Behaviour-unchanged check: replay six small runs from one response cache and compare the results.

    .venv/bin/python -m scripts.replay_check run --home HOME --out BEFORE [--repo OLD_CHECKOUT]   # fills HOME's cache
    .venv/bin/python -m scripts.replay_check run --home HOME --out AFTER                         # replays it
    .venv/bin/python -m scripts.replay_check diff BEFORE AFTER

`run` runs CRAFT-MD (2 cases, 1 trial, embedded-small.yaml), DERA-QA (3 questions, demo-qa.yaml), MediTOD NLU, POL
and NLG in context (3 turns of the fixture's test split, k=2, 64 tokens) and the rubric auto-evaluation
(2 fixture dialogues, 2 criteria, 48 tokens) with the embedded model through the real CLI (`python -m scripts.cli`
in --repo, default this checkout) with MEDSTACK_HOME=HOME, so every answer lands in (or comes from) HOME/cache.
Each run starts a vLLM server of its own, even when every call is a cache hit (wrap the command in `flock LOCKFILE`
where other jobs start servers). A HOME without the embedded model gets the default home's prepared one linked
in (the same weights hash, which keys the cache) instead of converting it again.

`diff` reads BEFORE's records in today's typed shape (each through its study's upgrade, as the one reader does),
matches each run's records.jsonl by id (the file's order follows which case finished first) and compares
them key by key, and metrics.json likewise, after dropping what differs between two runs of one commit from one
cache, the first answered by the server and the second all cache hits (calibrated so; the key names are dropped
at any depth):

- records: `t_start`, `t_end`, `latency` (each call's clock times and duration), `seconds`, `timing` (a case's
  and a role's durations), `cached` (a call's cache flag; a role's count of cache hits in `usage`); the call log
  `calls` is compared in step order without `index` and `after` (concurrent calls are numbered as they are issued,
  and `after` names the call that finished last before one started: both follow timing, and replayed calls
  finish at once);
- metrics.json: its `run` section, the run's statistics, not its results: wall time, requests sent and tokens
  sent (0 when every call is a cache hit), cache hits, tokens/s, the server's own metrics, cases run and resumed;
  `wall_seconds` wherever it is (a set-up step's wall time). NaN (a mean over no cases) equals NaN and null. A key only
  in BEFORE each of whose numbers AFTER's metrics hold (a figure now among the scorers' `scores`), and a key only in
  AFTER (a new figure), are listed, not counted as differences.

A record's typed `scores` are its result: a field of a BEFORE record that the AFTER record lacks, at any depth, each
of whose values (but None) is among the values of the AFTER record's `scores` or names one of them (`mcq/multiturn`,
or the older `multiturn.mcq`; a true/false one: or among their grades' scored flags), is an expected difference (a field that only restated a score), reported by run: which fields, in
how many records; so is any field the AFTER record lacks where both records' `scores` are empty (a case not scored:
nothing there was a score), reported apart. Any other difference (`scores` included), or an id on one side only,
is unexpected: exit 1 (0 when none; 2 when a results file is missing). Paths in BEFORE under a folder of experiments/
that this checkout no longer has (`experiments/NAME/`) are first read at its place today (`experiments/studies/NAME/`,
`experiments/tools/NAME/`, `serving/NAME/`), so a moved folder is no difference (a constraint's `declared_by`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OLD_PATH = re.compile(r"\bexperiments/(\w+)/([\w.-]+)")  # a folder that moved since: read at its place today (moved_path)
RUNS = {  # name -> the medstack command line (data: the studies' shipped samples and the test fixtures)
    "craftmd": ["run", "craftmd", "--data", "tests/fixtures/craftmd/cases.csv", "--limit", "2", "--trials", "1",
                "--config", "experiments/studies/craftmd/configs/embedded-small.yaml"],
    "dera-qa": ["run", "dera-qa", "--data", "experiments/studies/dera/data/sample_medqa_open.jsonl", "--limit", "3",
                "--config", "experiments/studies/dera/configs/demo-qa.yaml"],
    **{f"meditod-{task}": ["run", f"meditod-{task}", "--data", "tests/fixtures/meditod/dialogs.json", "--limit", "3", "--k", "2",
                           "--max-tokens", "64", "--config", f"experiments/studies/meditod/configs/{task}_icl.yaml"] for task in ("nlu", "pol", "nlg")},
    "autoeval": ["autoeval", "tests/fixtures/autoeval/results", "--limit", "2", "--criteria", "empathy,concerns",
                 "--max-tokens", "48", "--reference", "tests/fixtures/autoeval/reference.csv"],
}
VOLATILE_RECORD = {"t_start", "t_end", "latency", "seconds", "timing", "cached"}  # key names dropped at any depth
VOLATILE_METRICS = {"run", "wall_seconds"}


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
        proc = subprocess.run([sys.executable, "-m", "scripts.cli", *args, "--model", "embedded", "--out", str(out / name)],
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


def leaves(value) -> list:
    if isinstance(value, dict):
        return [x for v in value.values() for x in leaves(v)]
    return [x for v in value for x in leaves(v)] if isinstance(value, list) else [value]


def names_score(v, scores: dict) -> bool:
    """A string that names one of the scores, in today's spelling (``mcq/multiturn``) or the older dotted one
    (``multiturn.mcq``), optionally followed by ``: why`` (a count of unparsed answers said so)."""
    name = v.split(":")[0].strip() if isinstance(v, str) else ""
    return name in scores or "/".join(reversed(name.split("."))) in scores


def moved(a: dict, b: dict, scores: dict | None = None, unscored: bool | None = None, at: str = "") -> list[str]:
    """The fields of BEFORE's record ``a`` that AFTER's ``b`` lacks, at any depth, and that its typed ``scores`` hold
    (every value but None found among the scores' values or named as a score, a true/false one also among their
    grades' scored flags), or any such field where neither side has a score (a case not scored): gone from ``a`` on
    return, named by their path (module docstring)."""
    if scores is None:
        scores = b.get("scores") if isinstance(b.get("scores"), dict) else {}
        unscored = a.get("scores") == {} == scores
    held, flags = leaves(scores), [isinstance(g, dict) and g.get("value") is not None and not g.get("skipped") for g in scores.values()]
    out = [k for k in sorted(set(a) - set(b), key=str) if unscored or (scores and all(
        v is None or v in held or names_score(v, scores) or (isinstance(v, bool) and v in flags) for v in leaves(a[k])))]
    for k in out:
        del a[k]
    found = [f"{at}{k} on a record without scores" if unscored else f"{at}{k}" for k in out]
    for k in sorted(set(a) & set(b), key=str):  # deeper, only what the scores hold moves (not all of an unscored case)
        if k != "scores" and isinstance(a[k], dict) and isinstance(b[k], dict):
            found += moved(a[k], b[k], scores, False, f"{at}{k}.")
    return found


def moved_path(m: re.Match) -> str:
    """A path of an older layout (``experiments/NAME/PART``) at its place in this checkout: the folder of that name
    under experiments/studies/, experiments/tools/ or serving/ that holds PART (else the first that exists)."""
    name, part = m.group(1), m.group(2)
    if (REPO / "experiments" / name).is_dir():
        return m.group(0)
    places = [p for p in (f"experiments/studies/{name}/", f"experiments/tools/{name}/", f"serving/{name}/") if (REPO / p).is_dir()]
    return next((p for p in places if (REPO / p / part).exists()), places[0] if places else m.group(0)[: -len(part)]) + part


def today(value):
    """BEFORE's keys and strings with the paths of an older layout read at their place in this checkout."""
    if isinstance(value, dict):
        return {today(k): today(v) for k, v in value.items()}
    if isinstance(value, list):
        return [today(v) for v in value]
    return OLD_PATH.sub(moved_path, value) if isinstance(value, str) else value


def compare(label: str, a: dict, b: dict, drop: set, unexpected: list, expected: dict | None = None) -> None:
    """``expected`` (records): field -> how many records' moved into ``scores``; metrics.json: None, nothing moves."""
    a, b = strip(calls_in_step_order(today(a)), drop), strip(calls_in_step_order(b), drop)
    for k in moved(a, b) if expected is not None else ():
        expected[k] = expected.get(k, 0) + 1
    unexpected += [f"{label}: {p}" for p in differing(a, b)]


def read(path: Path, lines: bool = False):
    """A results file (records.jsonl: one record a line, by id); a missing or unreadable one: one line, exit 2."""
    try:
        text = path.read_text()
        return {r["id"]: r for r in map(json.loads, text.splitlines())} if lines else json.loads(text)
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"{path}: cannot read ({type(e).__name__}: {e})")


def as_today(folder: Path, records: dict) -> dict:
    """BEFORE's records in today's typed shape, through their study's own upgrade (the one reader's, call logs kept):
    a record of an older shape compares field by field with the record the AFTER run wrote."""
    from experiments.core.record import is_typed
    from experiments.core.registry import study_of
    from experiments.core.results import read_run, settings_of

    run = read_run(folder)
    study = study_of(run)
    if study is None:
        return records
    settings = settings_of(run.config, study.settings_cls)
    return {i: r if is_typed(r) or r.get("status") == "failed" else study.upgrade(dict(r), settings) for i, r in records.items()}


def plain_numbers(value) -> list:
    """The numbers among a value's leaves (NaN and None left out: a mean over nothing)."""
    return [v for v in leaves(value) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v]


def reshaped(a: dict, b: dict) -> tuple[list[str], list[str]]:
    """metrics.json keys only in BEFORE whose every number AFTER's metrics hold (a figure restated: ``scores``), gone from
    ``a`` on return, and keys only in AFTER (new figures), gone from ``b``."""
    held = set(plain_numbers(b))
    gone = [k for k in sorted(set(a) - set(b)) if all(v in held for v in plain_numbers(a[k]))]
    new = sorted(set(b) - set(a))
    for k in gone:
        del a[k]
    for k in new:
        del b[k]
    return gone, new


def nan_as_none(value):
    if isinstance(value, dict):
        return {k: nan_as_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [nan_as_none(v) for v in value]
    return None if isinstance(value, float) and value != value else value


def diff(before: Path, after: Path) -> int:
    unexpected, expected, metrics_moved = [], {}, {}
    for name in RUNS:
        ra, rb = before / name, after / name
        a, b = as_today(ra, read(ra / "records.jsonl", lines=True)), read(rb / "records.jsonl", lines=True)
        unexpected += [f"{name}: id {i} only in {before if i in a else after}" for i in sorted(set(a) ^ set(b))]
        fields = expected[name] = {}
        for i in sorted(set(a) & set(b)):
            compare(f"{name} {i}", a[i], b[i], VOLATILE_RECORD, unexpected, fields)
        ma, mb = (nan_as_none(strip(read(r / "metrics.json"), VOLATILE_METRICS)) for r in (ra, rb))
        metrics_moved[name] = reshaped(ma, mb)
        compare(f"{name} metrics.json", ma, mb, VOLATILE_METRICS, unexpected)
        print(f"{name}: {len(a)} / {len(b)} records compared")
    print("expected differences (fields only in BEFORE, their values in AFTER's scores):")
    for name, fields in expected.items():
        print(f"  {name}: " + (", ".join(f"{k} ({n} records)" for k, n in fields.items()) or "none"))
    print("metrics.json: keys only in BEFORE whose every number AFTER's metrics hold / keys only in AFTER:")
    for name, (gone, new) in metrics_moved.items():
        print(f"  {name}: {', '.join(gone) or 'none'} / {', '.join(new) or 'none'}")
    print(f"unexpected differences: {len(unexpected)}")
    for line in unexpected[:50]:
        print("  " + line)
    return 1 if unexpected else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replay_check", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the small runs with MEDSTACK_HOME=HOME into OUT")
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
