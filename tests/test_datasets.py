"""The data registry: every registered set's format fetched from a local HTTP server and through --from,
checksums (a corrupted file -> exit 2, nothing kept), resolve_data, and the `medstack data` commands.

No network and no shared data: a test registry mirrors the real one (same sets, file names, main paths,
archives) with small fixture files in each format, served from 127.0.0.1.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import re
import shutil
import tarfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from experiments.datasets import registry as D
from models.errors import DataError

FIX = Path(__file__).resolve().parent / "fixtures"
GRADER_CSV = (",case_0,case_1\ninstructions,count subtypes as incorrect,\ntrial_0,psoriasis,eczema\ntrial_1,psoriasis,tinea\n"
              "trial_2,psoriasis,eczema\ntrial_3,plaque psoriasis,eczema\ntrial_4,psoriasis,eczema\ncorrect_ans,plaque psoriasis,atopic dermatitis\n"
              "dermatologist_accuracy,5,4\n").encode()


def _medqa_line(i: int) -> bytes:
    return (FIX / "dera" / "medqa_open.jsonl").read_bytes().splitlines(keepends=True)[i]


# file name in the real registry -> fixture content in the same format
CONTENT = {
    "usmle_and_derm_dataset.csv": lambda: (FIX / "craftmd" / "cases.csv").read_bytes(),
    "validation_graderai.csv": lambda: GRADER_CSV,
    "dev.jsonl": lambda: _medqa_line(0),
    "test.jsonl": lambda: _medqa_line(1),
    "dialogs.json": lambda: (FIX / "meditod" / "dialogs.json").read_bytes(),
    "train_ids.json": lambda: (FIX / "meditod" / "train_ids.json").read_bytes(),
    "valid_ids.json": lambda: (FIX / "meditod" / "valid_ids.json").read_bytes(),
    "test_ids.json": lambda: (FIX / "meditod" / "test_ids.json").read_bytes(),
    "agentclinic_medqa.jsonl": lambda: (FIX / "craftmd" / "osce.jsonl").read_bytes(),
    **{name: (lambda name=name: (FIX / "craftmd" / "experts" / name).read_bytes())
       for name in ("validation_clinicalllm_patientai_d1.xlsx", "validation_clinicalllm_patientai_d2.xlsx",
                    "validation_clinicallm_patientai_tiebreak_d3.xlsx")},
}


def _targz(folder: Path, arcname: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname=arcname)
    return buf.getvalue()


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A static HTTP server on 127.0.0.1 over a folder; yields (folder, base URL)."""
    root = tmp_path_factory.mktemp("served")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def test_registry(server, tmp_path_factory) -> Path:
    """The real registry with every file replaced by a served fixture of the same format (and its sha256)."""
    root, base = server
    raw = yaml.safe_load(D.REGISTRY_FILE.read_text())
    for name, entry in raw["sets"].items():
        for f in entry["files"]:
            dest = root / name / f["name"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            if f.get("unpack"):
                unpacked = root / name / "unpacked" / entry["main"]
                shutil.copytree(FIX / "craftmd" / "published_demo", unpacked)
                dest.write_bytes(_targz(unpacked, entry["main"]))
                f["tree_sha256"], f["tree_size"] = D.tree_digest(unpacked), None
            else:
                assert f["name"] in CONTENT, f"no fixture for {f['name']}: add one to CONTENT"
                dest.write_bytes(CONTENT[f["name"]]())
            f.update(url=f"{base}/{name}/{f['name']}", sha256=hashlib.sha256(dest.read_bytes()).hexdigest(), size=dest.stat().st_size)
    path = tmp_path_factory.mktemp("registry") / "datasets.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDSTACK_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _nothing_left(home: Path) -> bool:
    return not (home / "data").exists() or not any((home / "data").iterdir())


def _same_content(ds: D.DataSet, served: Path, got: Path) -> None:
    if ds.archive:
        assert D.tree_digest(got) == D.tree_digest(served / "unpacked" / ds.main)
        assert not (got.parent / ds.archive.name).exists(), "the archive is deleted after unpacking"
    elif ds.main == ".":
        for f in ds.files:
            assert (got / f.name).read_bytes() == (served / f.name).read_bytes()
    else:
        assert got.read_bytes() == (served / ds.main).read_bytes()
        for f in ds.files:  # split files lie beside the main file
            assert (got.parent / f.name).is_file()


# ------------------------------------------------------------------ the real registry

def test_real_registry_is_valid():
    reg = D.load_registry(D.REGISTRY_FILE)
    assert {"craftmd-cases", "craftmd-expert-labels", "craftmd-published-gpt3_1106", "craftmd-published-llama2-7b",
            "medqa-open", "meditod-sample", "agentclinic-medqa"} <= set(reg)
    assert re.fullmatch(r"[0-9a-f]{64}", reg["craftmd-cases"].files[0].sha256)
    assert reg["craftmd-cases"].main == "usmle_and_derm_dataset.csv"
    assert reg["medqa-open"].main == "." and reg["meditod-sample"].main == "dialogs.json"
    for ds in reg.values():
        assert ds.license and ds.source and all(f.size for f in ds.files)
        assert all(f.url or f.unpack for f in ds.files), f"{ds.name}: a plain file needs a URL"
        if ds.archive:
            assert ds.archive.tree_sha256, f"{ds.name}: unpacked sets pin their files with tree_sha256"


def test_invalid_registry_is_a_data_error(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("sets:\n  x: {license: MIT, format: csv, main: a.csv, files: [{name: a.csv, sha256: nothex}]}\n")
    with pytest.raises(DataError, match="not valid"):
        D.load_registry(bad)


# ------------------------------------------------------------------ fetch: every set's format

def test_fetch_every_set_by_url(test_registry, server, home):
    reg = D.load_registry(test_registry)
    messages = []
    for name, ds in reg.items():
        got = D.fetch(name, progress=False, registry=reg, log=messages.append)
        assert got == D.main_path(ds) and got.exists()
        _same_content(ds, server[0] / name, got)
        assert D.resolve_data(name, reg) == str(got)
    assert any("license: MIT" in m for m in messages)
    assert all(r["fetched"] for r in D.list_sets(reg))
    assert sorted(p.name for p in (home / "data").iterdir()) == sorted(reg)  # no temporary folders left


def test_fetch_every_set_from_local_path(test_registry, server, home):
    reg = D.load_registry(test_registry)
    for name, ds in reg.items():
        served = server[0] / name
        src = served / ds.files[0].name if len(ds.files) == 1 else served  # a file, or a folder holding the files
        _same_content(ds, served, D.fetch(name, str(src), progress=False, registry=reg, log=lambda m: None))


def test_fetch_unpacked_folder_and_urls_with_from(test_registry, server, home):
    reg = D.load_registry(test_registry)
    root, base = server
    pub = next(ds for ds in reg.values() if ds.archive)
    # the authors' folder itself (e.g. in a clone of their repository), or its parent
    got = D.fetch(pub.name, str(root / pub.name / "unpacked" / pub.main), progress=False, registry=reg, log=lambda m: None)
    _same_content(pub, root / pub.name, got)
    got = D.fetch(pub.name, str(root / pub.name / "unpacked"), progress=False, registry=reg, force=True, log=lambda m: None)
    _same_content(pub, root / pub.name, got)
    # --from a URL: the file's URL for one-file sets, a base URL for multi-file sets
    got = D.fetch("craftmd-cases", f"{base}/craftmd-cases/usmle_and_derm_dataset.csv", progress=False, registry=reg, log=lambda m: None)
    _same_content(reg["craftmd-cases"], root / "craftmd-cases", got)
    got = D.fetch("meditod-sample", f"{base}/meditod-sample/", progress=False, registry=reg, log=lambda m: None)
    _same_content(reg["meditod-sample"], root / "meditod-sample", got)


def test_wrong_unpacked_folder_is_rejected(test_registry, server, home, tmp_path):
    reg = D.load_registry(test_registry)
    pub = next(ds for ds in reg.values() if ds.archive)
    wrong = tmp_path / "wrong" / pub.main
    shutil.copytree(server[0] / pub.name / "unpacked" / pub.main, wrong)
    next(wrong.iterdir()).write_text("{}")
    with pytest.raises(DataError, match="do not match"):
        D.fetch(pub.name, str(wrong), progress=False, registry=reg, log=lambda m: None)
    assert _nothing_left(home)


# ------------------------------------------------------------------ failures leave nothing behind

def test_corrupted_download_fails_and_keeps_nothing(test_registry, server, home):
    reg = D.load_registry(test_registry)
    root, base = server
    (root / "corrupt").mkdir(exist_ok=True)
    for f in reg["medqa-open"].files:  # the second file is corrupted: the first, good one must not be kept either
        data = (root / "medqa-open" / f.name).read_bytes()
        (root / "corrupt" / f.name).write_bytes(data if f.name == "dev.jsonl" else data.replace(b"a", b"e", 1))
    with pytest.raises(DataError, match="sha256 mismatch for test.jsonl"):
        D.fetch("medqa-open", f"{base}/corrupt/", progress=False, registry=reg, log=lambda m: None)
    assert _nothing_left(home)


def test_unreachable_network_and_missing_url(test_registry, home):
    reg = D.load_registry(test_registry)
    ds = reg["craftmd-cases"]
    ds.files[0].url = "http://127.0.0.1:9/usmle_and_derm_dataset.csv"  # nothing listens on the discard port
    with pytest.raises(DataError, match=r"could not download .*--from PATH"):
        D.fetch("craftmd-cases", progress=False, registry=reg, log=lambda m: None)
    pub = next(ds for ds in reg.values() if ds.archive)
    pub.files[0].url = None
    with pytest.raises(DataError, match="no direct download.*--from"):
        D.fetch(pub.name, progress=False, registry=reg, log=lambda m: None)
    assert _nothing_left(home)


def test_refetch_keeps_the_verified_copy(test_registry, server, home, tmp_path):
    reg = D.load_registry(test_registry)
    first = D.fetch("agentclinic-medqa", progress=False, registry=reg, log=lambda m: None)
    bad = tmp_path / "agentclinic_medqa.jsonl"
    bad.write_text("{}\n")
    with pytest.raises(DataError, match="sha256 mismatch"):
        D.fetch("agentclinic-medqa", str(bad), progress=False, registry=reg, force=True, log=lambda m: None)
    assert first.read_bytes() == (server[0] / "agentclinic-medqa" / "agentclinic_medqa.jsonl").read_bytes()
    assert sorted(p.name for p in (home / "data").iterdir()) == ["agentclinic-medqa"]


# ------------------------------------------------------------------ resolve_data

def test_resolve_data(test_registry, home, tmp_path):
    reg = D.load_registry(test_registry)
    path = tmp_path / "mine.csv"
    path.write_text("x\n")
    assert D.resolve_data(str(path), reg) == str(path)
    with pytest.raises(DataError) as e:
        D.resolve_data("craftmd-cases", reg)
    assert "medstack data fetch craftmd-cases" in str(e.value) and "--from" in str(e.value)
    with pytest.raises(DataError, match=r"no such file or registered data set: nope\.csv \(registered: craftmd-cases"):
        D.resolve_data("nope.csv", reg)
    D.fetch("craftmd-cases", progress=False, registry=reg, log=lambda m: None)
    assert D.resolve_data("craftmd-cases", reg) == str(home / "data" / "craftmd-cases" / "usmle_and_derm_dataset.csv")
    D.fetch("medqa-open", progress=False, registry=reg, log=lambda m: None)
    assert D.resolve_data("medqa-open", reg) == str(home / "data" / "medqa-open")


# ------------------------------------------------------------------ the CLI, as a user runs it

def test_cli_list_fetch_path(cli, test_registry, server, tmp_path):
    env = {"MEDSTACK_HOME": str(tmp_path / "home"), "MEDSTACK_DATA_REGISTRY": str(test_registry)}
    r = cli("data", "list", env=env, check=True)
    assert "craftmd-cases" in r.stdout and "medstack data fetch craftmd-cases" in r.stdout
    r = cli("data", "path", "craftmd-cases", env=env)
    assert r.returncode == 2 and "medstack data fetch craftmd-cases" in r.stderr

    src = server[0] / "craftmd-cases" / "usmle_and_derm_dataset.csv"
    r = cli("data", "fetch", "craftmd-cases", "--from", str(src), env=env, check=True)
    main = tmp_path / "home" / "data" / "craftmd-cases" / "usmle_and_derm_dataset.csv"
    assert r.stdout.strip() == str(main) and "license: MIT" in r.stderr
    r = cli("data", "fetch", "meditod-sample", "--no-progress", env=env, check=True)  # by URL from the local server
    assert r.stdout.strip().endswith("meditod-sample/dialogs.json")
    rows = {row["name"]: row for row in json.loads(cli("data", "list", "--json", env=env, check=True).stdout)}
    assert rows["craftmd-cases"]["fetched"] and rows["craftmd-cases"]["where"] == str(main)
    assert rows["meditod-sample"]["fetched"] and not rows["medqa-open"]["fetched"]

    r = cli("data", "fetch", "no-such-set", env=env)
    assert r.returncode == 2 and "registered:" in r.stderr


def test_meditod_commands_take_the_registered_name(cli, test_registry, server, tmp_path):
    """`data meditod`, `score meditod-*` and `finetune meditod-*` read --data by name like the study runner."""
    env = {"MEDSTACK_HOME": str(tmp_path / "home"), "MEDSTACK_DATA_REGISTRY": str(test_registry)}
    r = cli("finetune", "meditod-nlu", "--data", "meditod-sample", "--base", "embedded", env=env)
    assert r.returncode == 2 and "medstack data fetch meditod-sample" in r.stderr  # not fetched yet: the exact command
    cli("data", "fetch", "meditod-sample", "--no-progress", env=env, check=True)
    stats = json.loads(cli("data", "meditod", "--data", "meditod-sample", "--json", env=env, check=True).stdout)
    assert stats
    pred = tmp_path / "pred.jsonl"
    pred.write_text("")
    r = cli("score", "meditod-nlu", "--data", "meditod-sample", "--pred", str(pred), env=env)
    assert "not fetched" not in r.stderr and "does not exist" not in r.stderr


def test_cli_corrupted_file_exits_2_and_keeps_nothing(cli, test_registry, server, tmp_path):
    root, base = server
    home = tmp_path / "home"
    env = {"MEDSTACK_HOME": str(home), "MEDSTACK_DATA_REGISTRY": str(test_registry)}
    bad = tmp_path / "usmle_and_derm_dataset.csv"
    bad.write_bytes((root / "craftmd-cases" / "usmle_and_derm_dataset.csv").read_bytes() + b"\n")
    r = cli("data", "fetch", "craftmd-cases", "--from", str(bad), env=env)
    assert r.returncode == 2 and "sha256 mismatch" in r.stderr
    assert _nothing_left(home)

    # by the registry's URL: the served file changed after the registry was written
    raw = yaml.safe_load(test_registry.read_text())
    (root / "changed").mkdir(exist_ok=True)
    (root / "changed" / "agentclinic_medqa.jsonl").write_text('{"OSCE_Examination": {}}\n')
    raw["sets"]["agentclinic-medqa"]["files"][0]["url"] = f"{base}/changed/agentclinic_medqa.jsonl"
    changed = tmp_path / "registry.yaml"
    changed.write_text(yaml.safe_dump(raw))
    r = cli("data", "fetch", "agentclinic-medqa", env={**env, "MEDSTACK_DATA_REGISTRY": str(changed)})
    assert r.returncode == 2 and "sha256 mismatch" in r.stderr
    assert _nothing_left(home)


def test_a_study_folders_data_sets_join_the_registry_once(tmp_path, monkeypatch):
    """A study folder's datasets.yaml (here one on $MEDSTACK_STUDIES) adds its sets to the registry; a name that is
    registered already is an error naming the file."""
    raw = yaml.safe_load(D.REGISTRY_FILE.read_text())["sets"]
    name, entry = next(iter(raw.items()))
    folder = tmp_path / "mystudy"
    folder.mkdir()
    (folder / "datasets.yaml").write_text(yaml.safe_dump({"sets": {"mystudy-cases": entry}}))
    monkeypatch.delenv("MEDSTACK_STUDIES", raising=False)
    monkeypatch.delenv("MEDSTACK_DATA_REGISTRY", raising=False)
    before = set(D.load_registry())  # the global registry and the study folders' under experiments/
    assert set(raw) <= before
    monkeypatch.setenv("MEDSTACK_STUDIES", str(folder))
    reg = D.load_registry()
    assert set(reg) == before | {"mystudy-cases"} and reg["mystudy-cases"].files == reg[name].files
    (folder / "datasets.yaml").write_text(yaml.safe_dump({"sets": {name: entry}}))
    with pytest.raises(DataError, match=f"{folder / 'datasets.yaml'}: {name} registered already"):
        D.load_registry()
