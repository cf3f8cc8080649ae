"""Check our question split against the authors' released per-case files.

    python -m experiments.studies.craftmd.check_split CASES.csv RELEASE_DIR

RELEASE_DIR is an unpacked release folder (e.g. ``gpt3_1106``). Each case's vignette and question are compared with
theirs up to whitespace (docs/protocols.md, CRAFT-MD). Exit 0 when all are equal, 1 otherwise, 2 on bad input.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

from experiments.common.normalize import normalize
from experiments.studies.craftmd.data import load_csv
from models.errors import DataError


def compare(cases: list[dict], release: Path) -> dict:
    """{checked, missing, question: [ids], vignette: [ids]} over the cases with a release file."""
    spaced = partial(normalize, split="space", lower=False)  # equal but for runs of whitespace
    out: dict = {"checked": 0, "missing": [], "question": [], "vignette": []}
    for c in cases:
        path = release / f"{c['case_id']}.json"
        if not path.exists():
            out["missing"].append(c["case_id"])
            continue
        theirs = json.loads(path.read_text(encoding="utf-8"))
        out["checked"] += 1
        if spaced(c["question"]) != spaced(theirs.get("question")):
            out["question"].append(c["case_id"])
        if spaced(c["vignette"]) != spaced(theirs.get("case_vignette")):
            out["vignette"].append(c["case_id"])
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    csv_path, release = Path(argv[0]), Path(argv[1])
    if not release.is_dir():
        print(f"{release}: not a folder (unpack the release archive first)", file=sys.stderr)
        return 2
    try:
        cases = load_csv(csv_path)
    except (DataError, OSError) as e:
        print(e, file=sys.stderr)
        return 2
    res = compare(cases, release)
    for key in ("question", "vignette"):
        for cid in res[key]:
            print(f"{cid}: {key} differs")
    print(f"checked {res['checked']} case(s) ({len(res['missing'])} without a release file): "
          f"{len(res['question'])} question(s) and {len(res['vignette'])} vignette(s) differ")
    return 0 if not (res["question"] or res["vignette"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
