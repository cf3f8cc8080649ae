"""Dev: the patient checks (experiments/common/patient_checks.py) over unpacked CRAFT-MD releases, as plain rates.

    PYTHONPATH=$PWD .venv/bin/python scripts/patient_checks_on_releases.py CASES_CSV RELEASE_DIR [RELEASE_DIR ...]

RELEASE_DIR holds the authors' case_*.json files of one release; CASES_CSV is usmle_and_derm_dataset.csv (the
choices). Prints, per release and check, conversations flagged / checked and patient turns flagged / all patient
turns. No CIs: the figures of record come from `medstack import craftmd` (docs/protocols.md, CRAFT-MD patient checks).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

from experiments.common.patient_checks import CHECKS, check_conversation
from experiments.studies.craftmd.data import answer_index, load_cases
from experiments.studies.craftmd.importer import choices_from_question, parse_conversation
from experiments.studies.craftmd.terminology import terms


def release_rates(folder: Path, cases: dict) -> tuple[int, int, Counter, Counter, Counter]:
    conv, turns, flagged, flagged_turns, unchecked = 0, 0, Counter(), Counter(), Counter()
    for path in sorted(folder.glob("case_*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        case = cases.get(str(data["case_id"]), {})
        correct = str(data.get("correct_ans") or "").strip()
        choices = choices_from_question(data.get("question", "")) or case.get("choices") or []
        choices = choices if len(choices) == 4 else []
        vignette = str(data.get("case_vignette") or case.get("vignette") or "")
        for key in (k for k in data if re.fullmatch(r"trial_\d+", k)):
            said = [(t["role"], t["text"]) for t in parse_conversation(data[key].get("multiturn_conversation"), str(path))]
            found = check_conversation(said, vignette=vignette, correct=correct, choices=choices,
                                       answer_index=answer_index(correct, choices) if choices else None, terms=tuple(terms()))
            conv += 1
            turns += found["patient_turns"]
            for c in CHECKS:
                if found[c] is None or (c == "names_other_choice" and not choices):
                    unchecked[c] += 1
                elif found[c]:
                    flagged[c] += 1
                    flagged_turns[c] += len({h["patient_turn"] if isinstance(h, dict) else h for h in found[c]})
    return conv, turns, flagged, flagged_turns, unchecked


def main(cases_csv: str, *folders: str) -> None:
    cases = {str(c["case_id"]): c for c in load_cases(cases_csv)}
    print("| release | check | conversations flagged | % | patient turns flagged | % |\n| --- | --- | --- | --- | --- | --- |")
    for folder in folders:
        conv, turns, flagged, flagged_turns, unchecked = release_rates(Path(folder), cases)
        for c in CHECKS:
            n = conv - unchecked[c]
            print(f"| {Path(folder).name} | {c} | {flagged[c]}/{n} | {100 * flagged[c] / max(n, 1):.2f} | "
                  f"{flagged_turns[c]}/{turns} | {100 * flagged_turns[c] / max(turns, 1):.2f} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
