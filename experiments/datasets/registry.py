"""Published data sets by name: the registry (``datasets.yaml``), fetching with checksums, name resolution.

``fetch(NAME)`` downloads every file of a set (or copies it from ``from_``: a file, a folder, or a URL),
checks sha256 (and, for unpacked archives, the digest of the unpacked tree) in a temporary folder beside
the target, and only then moves the set into ``$MEDSTACK_HOME/data/NAME/``: a failed fetch leaves
nothing behind. ``resolve_data(value)`` is what every ``--data`` option calls: a path is returned as it
is, a fetched name becomes its main path, a name not yet fetched is an error naming the fetch command.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from models.errors import DataError
from models.paths import sha256_file, user_home

REGISTRY_FILE = Path(__file__).with_name("datasets.yaml")
REGISTRY_ENV = "MEDSTACK_DATA_REGISTRY"  # another registry YAML (tests, private sets)
STUDIES_ENV = "MEDSTACK_STUDIES"  # study folders outside experiments/ (experiments/core/registry.py); their datasets.yaml merged in
EXPERIMENTS = REGISTRY_FILE.parent.parent  # experiments/: its studies/ folders may each ship a datasets.yaml
MARKER = ".medstack-data.json"  # written last into a fetched set's folder
SHA256 = r"^[0-9a-f]{64}$"
CHUNK = 1 << 20


class DataFile(BaseModel):
    name: str = Field(pattern=r"^[^/\\]+$")
    url: Optional[str] = None
    sha256: str = Field(pattern=SHA256)
    size: Optional[int] = None
    unpack: bool = False  # a .tar.gz that fetch unpacks (and then deletes)
    tree_sha256: Optional[str] = Field(None, pattern=SHA256)  # digest of the unpacked files under `main`
    tree_size: Optional[int] = None


class DataSet(BaseModel):
    name: str
    description: str = ""
    source: list[str] = Field(default_factory=list)
    license: str
    license_url: Optional[str] = None
    format: str
    reads: list[str] = Field(default_factory=list)
    main: str
    files: list[DataFile] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "DataSet":
        archives = [f for f in self.files if f.unpack]
        if archives and len(self.files) != 1:
            raise ValueError("a set with an archive (unpack: true) has exactly one file")
        if archives and (self.main in (".", archives[0].name) or "/" in self.main):
            raise ValueError("main of an unpacked set is the folder the archive holds")
        if not archives and self.main not in {".", *(f.name for f in self.files)}:
            raise ValueError(f"main {self.main!r} is neither '.' nor one of the files")
        return self

    @property
    def archive(self) -> Optional[DataFile]:
        return self.files[0] if self.files[0].unpack else None

    @property
    def size(self) -> int:
        return sum(f.size or 0 for f in self.files)


# ------------------------------------------------------------------ registry and places

def registry_path() -> Path:
    return Path(os.environ.get(REGISTRY_ENV) or REGISTRY_FILE)


def study_folders(extra: str | None = None) -> list[Path]:
    """The study folders outside ``experiments/`` (``extra``, default ``$MEDSTACK_STUDIES``: os.pathsep-separated)."""
    return [Path(x).resolve() for x in (os.environ.get(STUDIES_ENV, "") if extra is None else extra).split(os.pathsep) if x.strip()]


def load_registry(path: Optional[Path] = None) -> dict[str, DataSet]:
    """The data sets of ``path``; by default of the registry with each study folder's ``datasets.yaml`` merged in."""
    files = [Path(path)] if path else [registry_path()] + [f for d in [*(EXPERIMENTS / "studies").iterdir(), *study_folders()]
                                                          if (f := d / "datasets.yaml").is_file() and f != REGISTRY_FILE]
    out: dict[str, DataSet] = {}
    for f in files:
        try:
            sets = {name: DataSet(name=name, **entry) for name, entry in yaml.safe_load(f.read_text())["sets"].items()}
        except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError, ValidationError) as e:
            raise DataError(f"data registry {f} is not valid: {e}") from e
        if twice := sorted(set(sets) & set(out)):
            raise DataError(f"data registry {f}: {', '.join(twice)} registered already")
        out.update(sets)
    return out


def _get(name: str, registry: dict[str, DataSet]) -> DataSet:
    if name not in registry:
        raise DataError(f"no such registered data set: {name} (registered: {', '.join(registry)})")
    return registry[name]


def data_root() -> Path:
    return user_home() / "data"  # a Slurm job reads the user's (models/paths.py)


def set_dir(name: str) -> Path:
    return data_root() / name


def main_path(ds: DataSet) -> Path:
    return set_dir(ds.name) / ds.main if ds.main != "." else set_dir(ds.name)


def is_fetched(ds: DataSet) -> bool:
    folder = set_dir(ds.name)
    # every plain file too: a set that gained files (e.g. craftmd-expert-labels) is fetched again
    return (folder / MARKER).is_file() and main_path(ds).exists() and all((folder / f.name).is_file() for f in ds.files if not f.unpack)


def _from_what(ds: DataSet) -> str:
    """What `--from PATH` should be for this set."""
    if ds.archive:
        return f"the archive {ds.archive.name} or the unpacked folder {ds.main}/"
    return f"the file {ds.files[0].name}" if len(ds.files) == 1 else "a folder holding " + ", ".join(f.name for f in ds.files)


def fetch_hint(ds: DataSet) -> str:
    offline = f"`medstack data fetch {ds.name} --from PATH` (PATH = {_from_what(ds)})"
    return f"`medstack data fetch {ds.name}` (offline: {offline})" if all(f.url for f in ds.files) else offline


def resolve_data(value: str | None, registry: Optional[dict[str, DataSet]] = None) -> str | None:
    """A path that exists -> unchanged; a fetched set's name -> its main path; None -> None; anything else -> DataError."""
    if not value or Path(value).expanduser().exists():
        return value
    registry = load_registry() if registry is None else registry
    if value in registry:
        ds = registry[value]
        if is_fetched(ds):
            return str(main_path(ds))
        raise DataError(f"data set {value} is registered but not fetched yet: run {fetch_hint(ds)}")
    raise DataError(f"no such file or registered data set: {value} (registered: {', '.join(registry)})")


def _commands(read: str) -> set[str]:
    """The commands one ``reads`` entry names: 'run meditod-nlu/-pol/-nlg' -> {'run meditod-nlu', 'run meditod-pol', ...}."""
    head, *rest = read.split()[:2] if read.startswith("run ") else [read.split()[0]]
    if head != "run":
        return {head}
    first, *more = rest[0].split("/")
    return {f"run {first}", *(f"run {first.rsplit('-', 1)[0]}{m}" for m in more if m.startswith("-"))}


def expected_data(study: str, data: str | None = None, registry: Optional[dict[str, DataSet]] = None) -> str:
    """What `run STUDY --data` reads, said after a data file it could not read: the registered sets it reads and their
    format, and, where ``data`` is another registered set, what that one is (``''``: nothing registered to say)."""
    registry = load_registry() if registry is None else registry
    mine = [ds for ds in registry.values() if any(f"run {study}" in _commands(r) or r == study for r in ds.reads)]
    given = next((ds for ds in registry.values() if data and ds not in mine and (data == ds.name or Path(data) == main_path(ds))), None)
    parts = [f"{given.name} is {given.format}, read by {', '.join(given.reads)}"] if given else []
    if mine:
        formats = list(dict.fromkeys(ds.format for ds in mine))
        parts.append(f"run {study} reads {', '.join(ds.name for ds in mine)} ({'; '.join(formats)})")
    return "; ".join(parts)


def fetch_command(ds: DataSet) -> str:
    if all(f.url for f in ds.files):
        return f"medstack data fetch {ds.name}"
    return f"medstack data fetch {ds.name} --from PATH  (PATH = {_from_what(ds)})"


def list_sets(registry: Optional[dict[str, DataSet]] = None) -> list[dict]:
    registry = load_registry() if registry is None else registry
    return [{"name": ds.name, "license": ds.license, "size": ds.size, "size_h": human_size(ds.size), "fetched": is_fetched(ds),
             "where": str(main_path(ds)) if is_fetched(ds) else "", "fetch": fetch_command(ds), "reads": ds.reads,
             "description": ds.description} for ds in registry.values()]


def human_size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


# ------------------------------------------------------------------ fetch

def _is_url(s: str) -> bool:
    return s.startswith(("http://", "https://"))


def tree_digest(folder: Path) -> str:
    """sha256 over "RELPATH\\tSHA256\\n" of every file under folder, sorted by RELPATH (see datasets.yaml)."""
    lines = sorted(f"{p.relative_to(folder).as_posix()}\t{sha256_file(p)}\n" for p in folder.rglob("*") if p.is_file())
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _source(ds: DataSet, f: DataFile, from_: Optional[str]) -> str | Path:
    """Where one file comes from: its URL, the --from URL (or base URL), or a local file / folder."""
    if from_ is None:
        if not f.url:
            raise DataError(f"{ds.name} has no direct download (the authors publish {', '.join(ds.source)}); run {fetch_hint(ds)}")
        return f.url
    if _is_url(from_):
        return from_ if len(ds.files) == 1 and not from_.endswith("/") else f"{from_.rstrip('/')}/{f.name}"
    p = Path(from_).expanduser()
    if p.is_file():
        if len(ds.files) > 1:
            raise DataError(f"{ds.name} has {len(ds.files)} files ({', '.join(x.name for x in ds.files)}): give --from the folder holding them")
        return p
    if p.is_dir():
        if (p / f.name).is_file():
            return p / f.name
        if f.unpack:  # the unpacked folder (e.g. in a clone of the authors' repository), or its parent
            return p / ds.main if (p / ds.main).is_dir() else p
        raise DataError(f"--from {p}: the folder holds no {f.name}")
    raise DataError(f"--from {from_}: no such file or folder")


def _copy_verified(src: str | Path, dest: Path, f: DataFile, ds: DataSet, bar) -> None:
    """Stream src (URL or file) into dest while hashing; a wrong sha256 is a DataError."""
    import httpx

    h = hashlib.sha256()
    task = bar.add_task(f"{ds.name}/{f.name}", total=f.size)
    with open(dest, "wb") as out:
        def take(chunks):
            for chunk in chunks:
                out.write(chunk)
                h.update(chunk)
                bar.advance(task, len(chunk))

        if isinstance(src, Path):
            with open(src, "rb") as inp:
                take(iter(lambda: inp.read(CHUNK), b""))
        else:
            try:
                with httpx.stream("GET", src, follow_redirects=True, timeout=httpx.Timeout(30.0, connect=10.0)) as r:
                    r.raise_for_status()
                    take(r.iter_bytes(CHUNK))
            except httpx.HTTPError as e:
                raise DataError(f"could not download {src}: {str(e) or type(e).__name__}. No network? Get the files elsewhere and run "
                                f"`medstack data fetch {ds.name} --from PATH` (PATH = {_from_what(ds)})") from e
    if h.hexdigest() != f.sha256:
        raise DataError(f"{ds.name}: sha256 mismatch for {f.name} from {src}: expected {f.sha256}, got {h.hexdigest()}; nothing was kept")


def _unpack(archive: Path, into: Path, ds: DataSet) -> None:
    try:
        with tarfile.open(archive, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(into, filter="data")
            else:  # pragma: no cover - Python without tarfile filters
                if any(m.name.startswith(("/", "..")) or ".." in Path(m.name).parts for m in tar.getmembers()):
                    raise DataError(f"{archive.name}: unsafe member paths")
                tar.extractall(into)
    except (tarfile.TarError, OSError) as e:
        raise DataError(f"{ds.name}: cannot unpack {archive.name}: {e}") from e
    archive.unlink()


def _check_tree(ds: DataSet, folder: Path, src) -> None:
    f = ds.archive
    if not folder.is_dir():
        raise DataError(f"{ds.name}: {src} does not hold the folder {ds.main}/")
    if f.tree_sha256 and (got := tree_digest(folder)) != f.tree_sha256:
        raise DataError(f"{ds.name}: the files under {ds.main}/ from {src} do not match the registry "
                        f"(tree sha256 expected {f.tree_sha256}, got {got}); nothing was kept")


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), disable=not enabled)


def _say(msg: str) -> None:
    from rich.console import Console

    Console(stderr=True).print(msg, highlight=False, soft_wrap=True)


def fetch(name: str, from_: Optional[str] = None, progress: bool = True, *, force: bool = False,
          registry: Optional[dict[str, DataSet]] = None, log: Callable[[str], None] = _say) -> Path:
    """Fetch a registered set into $MEDSTACK_HOME/data/NAME/ (verified) and return its main path."""
    registry = load_registry() if registry is None else registry
    ds = _get(name, registry)
    target = set_dir(name)
    if is_fetched(ds) and not force:
        log(f"{name}: already fetched at {main_path(ds)} (--force fetches it again)")
        return main_path(ds)
    if target.exists() and not (target / MARKER).exists():
        raise DataError(f"{target} exists but was not written by `medstack data fetch`; move it away first")
    data_root().mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.partial-", dir=data_root()))
    try:
        sources = []
        with _progress(progress) as bar:
            for f in ds.files:
                src = _source(ds, f, from_)
                sources.append(str(src))
                if isinstance(src, Path) and src.is_dir():  # an unpacked folder given with --from
                    shutil.copytree(src, tmp / ds.main)
                else:
                    _copy_verified(src, tmp / f.name, f, ds, bar)
                    if f.unpack:
                        _unpack(tmp / f.name, tmp, ds)
                if f.unpack:
                    _check_tree(ds, tmp / ds.main, src)
        marker = {"name": name, "files": [f.model_dump(include={"name", "sha256", "tree_sha256"}) for f in ds.files],
                  "from": sources, "license": ds.license, "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        tmp.chmod(0o755)  # mkdtemp made it private
        old = None
        if target.exists():  # --force: swap the verified copy in, then drop the old one
            old = target.rename(target.with_name(f".{name}.old-{os.getpid()}"))
        tmp.rename(target)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"{name}: fetched into {target} (sha256 verified)")
    log(f"license: {ds.license}" + (f" — {ds.license_url}" if ds.license_url else "") + f"; source: {', '.join(ds.source)}")
    return main_path(ds)
