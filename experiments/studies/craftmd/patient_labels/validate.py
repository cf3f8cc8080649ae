"""Each patient check's precision and recall on the labelled set (PROTOCOL.md), weighted back to the releases.

    python -m experiments.studies.craftmd.patient_labels.validate --releases DIR --cases CSV [--part dev|held-out|both] [--write]

Runs the checks as `medstack import craftmd` runs them (the importer's records, the patient-check scorer) on every
labelled conversation, reads each labelled patient turn's verdict, and prints, per check and part, the precision and
recall weighted by the sampling design (an item weighs its stratum's size over the items drawn from it) with 95 %
intervals from a bootstrap that redraws each stratum's items, and the raw counts. ``--write`` stores the held-out
figures in ``validation.yaml`` beside this file, which the patient-check scorer shows beside its rates. The dev part
is for tuning rules; the held-out part reports.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import yaml

from experiments.common.grade import grades
from experiments.common.stats import stratified_bootstrap, weighted_precision_recall
from experiments.core.scorers import validation_cell
from experiments.studies.craftmd.data import load_cases
from experiments.studies.craftmd.importer import convert_file
from experiments.studies.craftmd.released_checks import RELEASES

HERE = Path(__file__).parent
STRATA, LABELS, VALIDATION = HERE / "strata.json", HERE / "labels.jsonl", HERE / "validation.yaml"
# check -> (the labelled family it is measured on, the labels that are its positives)
MEASURED = {
    "breaks_character": ("character", {"break"}),
    "script_talk": ("character", {"script_talk"}),
    "copies_vignette": ("copying", {"clinical_copy"}),
    "confirms_diagnosis": ("affirmation", {"confirms"}),
    "suggests_diagnosis": ("affirmation", {"suggests"}),
}
# checks whose flags together answer one labelled question (the diagnosis checks: any affirmed diagnosis)
COMBINED = {"confirms_diagnosis": ("leaks_diagnosis", "names_other_choice", "confirms_unsupported")}


def load_labels(path: Path = LABELS, strata_path: Path = STRATA) -> list[dict]:
    """Every labelled item: its label joined with its place, stratum, part and weight (strata.json)."""
    strata = json.loads(strata_path.read_text(encoding="utf-8"))
    items = strata["items"]
    drawn = Counter((i["stratum"], i["release"], iid.split("-")[0]) for iid, i in items.items())
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        lab = json.loads(line)
        it = items.get(lab["id"])
        if it is None:
            raise SystemExit(f"{path}:{n}: item {lab['id']!r} is not in {strata_path.name}")
        family = lab["id"].split("-")[0]
        size = strata["sizes"][f"{family}|{it['stratum']}|{it['release']}"]
        out.append({**it, **lab, "family": family, "weight": size / drawn[it["stratum"], it["release"], family]})
    return out


def flagged_turns(labels: list[dict], releases: Path, cases_csv: Path) -> dict[tuple, set[str]]:
    """(release, case_id, trial, patient_turn) -> the checks that flag that patient turn, for every labelled turn."""
    cases = {c["case_id"]: c for c in load_cases(cases_csv)}
    folder = {label: name for name, label in RELEASES.items()}
    wanted = {(i["release"], i["case_id"]) for i in labels}
    out: dict[tuple, set[str]] = {}
    for release, cid in sorted(wanted):
        for rec in convert_file(releases / folder[release] / f"{cid}.json", release, cases):
            for name, g in grades(rec).items():
                if not name.startswith("patient-check/") or not g.answer:
                    continue
                check = name.split("/", 1)[1]
                for hit in g.answer:
                    turn = hit.get("patient_turn") if isinstance(hit, dict) else hit
                    out.setdefault((release, cid, rec["trial"], turn), set()).add(check)
    return out


def figures(labels: list[dict], flags: dict[tuple, set[str]], check: str, part: str | None) -> dict | None:
    family, positives = MEASURED[check]
    items = [i for i in labels if i["family"] == family and (part is None or i["part"] == part)]
    if not items:
        return None
    names = set(COMBINED.get(check, (check,)))
    flagged = [bool(names & flags.get((i["release"], i["case_id"], i["trial"], i["patient_turn"]), set())) for i in items]
    positive = [i["label"] in positives for i in items]
    weights = [i["weight"] for i in items]

    def stat(idx):
        return weighted_precision_recall([flagged[j] for j in idx], [positive[j] for j in idx], [weights[j] for j in idx])
    est = stat(range(len(items)))
    ci = stratified_bootstrap(stat, [(i["stratum"], i["release"]) for i in items], n_boot=2000)
    tp = sum(f and p for f, p in zip(flagged, positive))
    nan = lambda x: None if x != x else round(x, 3)  # noqa: E731
    return {"precision": nan(est["precision"]), "precision_ci": [nan(x) for x in ci.get("precision", (float("nan"),) * 2)],
            "recall": nan(est["recall"]), "recall_ci": [nan(x) for x in ci.get("recall", (float("nan"),) * 2)],
            "n": len(items), "positives": sum(positive), "flagged": sum(flagged), "tp": tp, "part": part or "all",
            "labelled_as": sorted(positives), "weighted": True}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", required=True, type=Path, help="the four releases unpacked, one folder each")
    ap.add_argument("--cases", required=True, type=Path, help="the CRAFT-MD case set (usmle_and_derm_dataset.csv)")
    ap.add_argument("--part", choices=("dev", "held-out", "both"), default="both", help="dev while rules are tuned; held-out once they are final")
    ap.add_argument("--write", action="store_true", help="store the held-out figures in validation.yaml")
    a = ap.parse_args(argv)
    labels = load_labels()
    flags = flagged_turns(labels, a.releases, a.cases)
    out = {}
    print(f"{'check':<22} {'part':<9} {'n':>4} {'pos':>4} {'flag':>4} {'tp':>4}  precision [95% CI] / recall [95% CI]")
    for check in MEASURED:
        for part in ("dev", "held-out") if a.part == "both" else (a.part,):
            f = figures(labels, flags, check, part)
            if f is None:
                continue
            print(f"{check:<22} {part:<9} {f['n']:>4} {f['positives']:>4} {f['flagged']:>4} {f['tp']:>4}  {validation_cell(f)}")
            if part == "held-out":
                # a combined figure is shown beside each check it combines: the label asks whether any of them holds
                for name in COMBINED.get(check, (check,)):
                    out[name] = {**f, "measured_as": " or ".join(COMBINED[check])} if check in COMBINED else f
    if a.write and out:
        head = ("# Each patient check's precision and recall on the held-out part of the labelled set (PROTOCOL.md), weighted back\n"
                "# to the releases by the sampling design, with 95 % stratified-bootstrap intervals. Written by\n"
                "# `python -m experiments.studies.craftmd.patient_labels.validate --releases DIR --cases CSV --write`.\n")
        VALIDATION.write_text(head + yaml.safe_dump(out, sort_keys=False), encoding="utf-8")
        print(f"-> {VALIDATION}")


if __name__ == "__main__":
    main()
