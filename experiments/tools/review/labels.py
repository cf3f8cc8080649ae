"""The review sample and the reviewers' labels, as files in ``RUN_DIR/reviews/`` (docs/protocols.md, Judge calibration;
the files and the sampling are described in experiments/tools/review/README.md).

``sample-<step>.json``  the stratified, reproducible sample of one judge's items (ids and strata only).
``<reviewer>.jsonl``    one line per label as it is entered (appended, fsync'ed, 0600); the last line per
                        (judge, item) wins.

Blind: the page knows the items only by their number in the sample, never by their record id (ids name the
model, the arm, the format); a file downloaded from the offline page holds ``"n"`` and the sample's tag
(:func:`sample_tag`), and :func:`read_labels` turns them back into ids with the run's sample file.
Every stratum gets an equal share of the sample so rare verdicts -- where disagreements hide -- are seen with
few labels; the weights undo this in the agreement figures.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import time
from pathlib import Path

from models.errors import DataError, StorageError, read_utf8
from models.paths import private_dir, private_file

REVIEWER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def reviews_dir(run_dir: str | Path) -> Path:
    p = Path(run_dir) / "reviews"
    try:
        return private_dir(p)
    except OSError as e:
        raise StorageError.from_os(p, e) from None


def check_reviewer(name: str, where: str = "--reviewer") -> str:
    if not REVIEWER.match(name or ""):
        raise DataError(f"{where}: reviewer name {name!r} is not allowed: letters, digits, '_', '.', '-' (up to 64), not starting with a sign")
    return name


def stratified_sample(items: list[dict], n: int, seed: int) -> dict:
    """Equal allocation over strata (capped by each stratum's size), seeded draw within each, shown in a seeded shuffle."""
    if n < 1:
        raise DataError(f"--sample {n}: must be at least 1")
    strata: dict[str, list[str]] = {}
    for it in items:
        strata.setdefault(it["stratum"], []).append(it["id"])
    keys = sorted(strata)
    take = {k: 0 for k in keys}
    left = min(n, len(items))
    while left:
        open_ = [k for k in keys if take[k] < len(strata[k])]
        share = max(1, left // len(open_))
        for k in open_:
            add = min(share, len(strata[k]) - take[k], left)
            take[k] += add
            left -= add
            if not left:
                break
    rng = random.Random(seed)
    chosen = []
    for k in keys:
        ids = sorted(strata[k])
        chosen += [(i, k) for i in rng.sample(ids, take[k])]
    rng.shuffle(chosen)
    weights = {k: len(strata[k]) / take[k] for k in keys if take[k]}
    return {"seed": seed, "requested": n, "population": len(items),
            "strata": {k: {"N": len(strata[k]), "n": take[k], "weight": weights.get(k)} for k in keys},
            "items": [{"id": i, "stratum": k, "weight": weights[k]} for i, k in chosen]}


def sample_path(run_dir: str | Path, step: str) -> Path:
    return Path(run_dir) / "reviews" / f"sample-{step}.json"


def write_sample(run_dir: str | Path, judge: dict, n: int, seed: int) -> dict:
    """The sample file of this judge: made once, then reused; another size or seed is refused (labels refer to it)."""
    path = sample_path(run_dir, judge["step"])
    if path.exists():
        old = read_sample(path)
        if old.get("requested") != n or old.get("seed") != seed:
            raise DataError(f"{path} holds a sample of {old.get('requested')} with seed {old.get('seed')}; "
                            f"--sample {n} --seed {seed} would make another one: use those values, or move the folder's reviews aside")
        return old
    s = {"judge": judge["step"], "experiment": judge["experiment"], "scale": judge["scale"], **stratified_sample(judge["items"], n, seed)}
    reviews_dir(run_dir)
    tmp = path.with_suffix(".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(s, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        private_file(tmp)
        tmp.replace(path)
    except OSError as e:
        raise StorageError.from_os(path, e) from None
    return s


def read_sample(path: Path) -> dict:
    try:
        s = json.loads(read_utf8(path))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(s, dict) or not isinstance(s.get("items"), list):
        raise DataError(f"{path}: not a review sample (no items list)")
    return s


def sample_tag(sample: dict) -> str:
    """A short opaque name of one sample (its judge and ids in the order shown): an offline page's labels
    say which sample their item numbers count in, without naming anything."""
    text = json.dumps([sample.get("judge"), [it["id"] for it in sample["items"]]])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def check_label(value, scale: dict, where: str):
    """A label on the judge's scale (None for a skip), or a DataError naming where it came from."""
    if value is None:
        return None
    if scale["kind"] == "unit":
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1:
            return float(value)
        raise DataError(f"{where}: label {value!r} is not a number from 0 to 1")
    if isinstance(value, bool) or value not in scale["values"]:
        raise DataError(f"{where}: label {value!r} is not on the judge's scale {scale['values']}")
    return int(value)


def append_label(run_dir: str | Path, reviewer: str, entry: dict) -> dict:
    """Append one label line to reviews/<reviewer>.jsonl, durable when this returns."""
    check_reviewer(reviewer, "reviewer")
    path = reviews_dir(run_dir) / f"{reviewer}.jsonl"
    line = {**entry, "reviewer": reviewer, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        private_file(path)
    except OSError as e:
        raise StorageError.from_os(path, e, hint="labels entered before are kept") from None
    return line


def read_labels(source: str | Path, run_dir: str | Path | None = None) -> dict[str, dict[tuple[str, str], dict]]:
    """reviewer -> {(judge, item): last line} from a reviews folder (every *.jsonl) or one file (a
    download from the offline page). A torn last line (a kill mid-write) is ignored; anything else
    unreadable is an error naming the file and line. Lines that name their item by number (the offline
    page's) are resolved with ``run_dir``'s sample of that judge, which must be the one they were entered on."""
    p = Path(source)
    if p.is_dir():
        files = sorted(p.glob("*.jsonl"))
        if not files:
            raise DataError(f"{p}: no label files (*.jsonl) in it")
    elif p.exists():
        files = [p]
    else:
        raise DataError(f"{p}: no such file or directory")
    out: dict[str, dict] = {}
    samples: dict[str, tuple[str, list[str]]] = {}
    for f in files:
        for lineno, row in _label_lines(f):
            where = f"{f}:{lineno}"
            for k in ("judge", "reviewer"):
                if not isinstance(row.get(k), str) or not row[k]:
                    raise DataError(f"{where}: label line without a {k!r}")
            if "item" not in row and "n" in row:
                judge, item = _numbered(row, run_dir, samples, where)
                row = {**row, "judge": judge, "item": item}
            if not isinstance(row.get("item"), str) or not row["item"]:
                raise DataError(f"{where}: label line without an 'item' (or an item number 'n')")
            check_reviewer(row["reviewer"], where)
            out.setdefault(row["reviewer"], {})[(row["judge"], row["item"])] = row
    return out


def _numbered(row: dict, run_dir, samples: dict, where: str) -> tuple[str, str]:
    """(judge, record id) of an item the offline page named by its number in the sample: the run's sample whose tag
    the line carries (the page names the judge by its step only, never by the label of a rescore's judge)."""
    judge, n = row["judge"], row.get("n")
    if run_dir is None:
        raise DataError(f"{where}: the item is named by its number; read it with the run whose sample it counts in")
    if row.get("sample") not in samples:
        for path in sorted((Path(run_dir) / "reviews").glob("sample-*.json")):
            s = read_sample(path)
            samples[sample_tag(s)] = (s.get("judge") or path.stem.removeprefix("sample-"), [it["id"] for it in s["items"]])
    if row.get("sample") not in samples:
        path = sample_path(run_dir, judge)
        if not path.exists():
            raise DataError(f"{where}: item number {n!r} of judge {judge}, but {path} does not exist")
        raise DataError(f"{where}: these labels were entered on another sample of judge {judge} (tag {row.get('sample')!r}, "
                        f"{path} has {sample_tag(read_sample(path))}): their item numbers do not count in it")
    judge, ids = samples[row["sample"]]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(ids):
        raise DataError(f"{where}: item number {n!r} is not in 1..{len(ids)}")
    return judge, ids[n - 1]


def _label_lines(f: Path):
    """(line number, object) per line; a torn LAST line (a kill mid-write) is left out, any other bad line is an error."""
    lines = [(n, ln) for n, ln in enumerate(read_utf8(f).splitlines(), 1) if ln.strip()]
    for k, (n, ln) in enumerate(lines):
        try:
            row = json.loads(ln)
        except ValueError as e:
            if k == len(lines) - 1:
                return
            raise DataError(f"{f}:{n}: not valid JSON ({e})") from None
        if not isinstance(row, dict):
            raise DataError(f"{f}:{n}: expected a JSON object")
        yield n, row
