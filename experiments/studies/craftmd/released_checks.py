"""Recompute ``released_patient_checks.yaml``: the patient checks of the CRAFT-MD authors' four released runs.

    python -m experiments.studies.craftmd.released_checks --releases DIR --cases CSV [--write]

DIR holds the four releases unpacked, one folder each (the registered data sets ``craftmd-published-gpt4_1106``,
``-gpt3_1106``, ``-mistral-v2``, ``-llama2-7b``, fetched with `medstack data fetch`). Each release is converted
record by record as `medstack import craftmd` converts it (the same checks, the same scorer) and aggregated as a run
is (``scores.figures``): every check's rate per conversation and per patient turn with its interval, the counts
behind them, and the distribution of the longest copied run. Prints the table docs/protocols.md shows; ``--write``
replaces the yaml the summaries, `compare` and the report read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
from collections import Counter
from pathlib import Path

import yaml

from experiments.common.grade import grades
from experiments.core.scorers import figures, validation_cell
from experiments.studies.craftmd.data import load_cases
from experiments.studies.craftmd.importer import convert_file
from experiments.common.patient_checks import CHECKS, DESCRIPTIONS
from experiments.studies.craftmd.scorers import PATIENT, RELEASED_CHECKS, check_validation

# the four releases: the folder each is unpacked to (its registered data set craftmd-published-<folder>) -> its label
RELEASES = {"gpt4_1106": "GPT-4", "gpt3_1106": "GPT-3.5", "mistral-v2": "Mistral-v2-7b", "llama2-7b": "LLaMA-2-7b"}


def release_entry(folder: Path, label: str, cases: dict) -> dict:
    records = [rec for f in sorted(folder.glob("*.json")) for rec in convert_file(f, label, cases)]
    figs = [f.json() for f in figures(records, [PATIENT]) if f.score.startswith(PATIENT.name + "/")]
    counts: dict = {}
    spans: Counter = Counter()
    patient_turns = 0
    for rec in records:
        gs = {k.split("/", 1)[1]: g for k, g in grades(rec).items() if k.startswith(PATIENT.name + "/")}
        for check, g in gs.items():
            c = counts.setdefault(check, {"conversations": 0, "turns": 0, "not_checkable": 0})
            if g.skipped:
                c["not_checkable"] += 1
            elif g.value:
                c["conversations"] += 1
                c["turns"] += int(g.metadata.get("turns", 0))
            if "longest_span" in g.metadata:
                spans[int(g.metadata["longest_span"])] += 1
        patient_turns += max((int(g.metadata.get("patient_turns", 0)) for g in gs.values()), default=0)
    return {"conversations": len(records), "patient_turns": patient_turns, "counts": counts,
            "longest_span": dict(sorted(spans.items())), "figures": {f"{f['score']}|{f['metric']}": f for f in figs}}


def _span_quantiles(dist: dict) -> str:
    """median / 90th percentile / max of a {length: conversations} distribution."""
    xs = sorted((int(k), int(v)) for k, v in dist.items())
    total = sum(v for _, v in xs)
    if not total:
        return "–"

    def q(p):
        seen = 0
        for k, v in xs:
            seen += v
            if seen >= p * total:
                return k
        return xs[-1][0]
    return f"{q(0.5)} / {q(0.9)} / {xs[-1][0]}"


def table(releases: dict, validation: dict | None = None) -> str:
    """The release table of docs/protocols.md: a row per check, a column per release (% of conversations / % of patient
    turns, each with its 95 % interval, and the counts), and the check's precision / recall on the labelled set's
    held-out part."""
    validation = validation or {}
    checks = [c for c in CHECKS if any(f"patient-check/{c}|per conversation" in r["figures"] for r in releases.values())]
    pct = lambda f: f"{100 * f['value']:.2f} [{100 * f['low']:.2f}, {100 * f['high']:.2f}]"  # noqa: E731
    out = ["| check | " + " | ".join(f"{label} (authors' release)" for label in releases) + " | precision / recall (held-out) |",
           "| --- | " + " | ".join("---" for _ in releases) + " | --- |"]
    for c in checks:
        cells = []
        for r in releases.values():
            conv, turn = (r["figures"].get(f"patient-check/{c}|{m}") for m in ("per conversation", "per patient turn"))
            k = r["counts"].get(c, {})
            if conv is None or conv.get("value") is None:
                cells.append("not checkable")
                continue
            cells.append(f"{pct(conv)} / {pct(turn)} ({k.get('conversations', 0)} conv., {k.get('turns', 0)} turns"
                         + (f"; {k['not_checkable']} not checkable" if k.get("not_checkable") else "") + ")")
        pr = validation_cell(validation.get(c))
        out.append(f"| {DESCRIPTIONS[c].format(n='N').split(':')[0]} (`{c}`) | " + " | ".join(cells) + f" | {pr} |")
    out.append("| patient turns / conversations | " + " | ".join(f"{r['patient_turns']} / {r['conversations']}" for r in releases.values()) + " | |")
    out.append("| longest copied run, words: median / 90th pct / max (descriptive) | "
               + " | ".join(_span_quantiles(r.get("longest_span") or {}) for r in releases.values()) + " | |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", required=True, type=Path, help="the four releases unpacked, one folder each")
    ap.add_argument("--cases", required=True, type=Path, help="the CRAFT-MD case set (usmle_and_derm_dataset.csv)")
    ap.add_argument("--write", action="store_true", help=f"replace {RELEASED_CHECKS.name}")
    a = ap.parse_args(argv)
    cases = {c["case_id"]: c for c in load_cases(a.cases)}
    releases = {label: release_entry(a.releases / folder, label, cases) for folder, label in RELEASES.items()}
    print(table(releases, check_validation()))
    if a.write:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "?"
        head = ("# The patient checks (experiments/common/patient_checks.py) of the CRAFT-MD authors' four released runs: the\n"
                "# patient-AI (GPT-4) of each, 2,004 cases x 5 trials; every check's rate per conversation and per patient turn\n"
                "# (figures, as a run's metrics.json holds them), the counts behind them, the longest copied run's distribution.\n"
                f"# Written by `python -m experiments.studies.craftmd.released_checks --releases DIR --cases CSV --write` on\n"
                f"# {dt.date.today()}, commit {commit}; re-measure after a rule changes (docs/protocols.md, CRAFT-MD patient checks).\n"
                "# Read by experiments/studies/craftmd/scorers.py (released_reference): every table of patient checks shows these rows.\n")
        RELEASED_CHECKS.write_text(head + yaml.safe_dump({"releases": releases}, sort_keys=False, width=200), encoding="utf-8")
        print(f"-> {RELEASED_CHECKS}")


if __name__ == "__main__":
    main()
