"""Draw the labelled set of released patient turns (PROTOCOL.md): a stratified random sample per check.

    python -m experiments.studies.craftmd.patient_labels.sample --releases DIR --cases CSV --out FOLDER

DIR holds the authors' four released runs unpacked, one folder each (gpt4_1106, gpt3_1106, mistral-v2, llama2-7b), of
case_<id>.json files. Writes ``items.jsonl`` (what a labeller sees: the texts, no stratum, no check verdict; drawn again from the releases,
never committed) and ``strata.json`` (each item's place in the releases, its stratum and part, and every stratum's
size in the releases: the sampling weights). The strata are defined here,
fixed, by wide nets that do not depend on any check's rule, so that a changed rule is judged on the same set.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import defaultdict
from pathlib import Path

from experiments.common.patient_checks import longest_copied_run, words
from experiments.studies.craftmd.data import load_cases
from experiments.studies.craftmd.importer import parse_conversation
from experiments.studies.craftmd.released_checks import RELEASES

SEED = 58
# patient turns drawn per (check, stratum); every stratum is drawn evenly over the four releases
SIZES = {"character": {"narrow": 50, "wide": 70, "rest": 40},
         "copying": {"run>=6": 60, "run4-5": 50, "run<4": 30},
         "confirmation": {"narrow": 70, "wide": 60, "rest": 20},
         # a second draw for confirmations, which the first found none of (they are rare): a reply that agrees, or speaks
         # of a diagnosis given, after a doctor's turn that names a disease-like word; the rest of such replies
         "affirmation": {"agrees": 90, "diagnosed": 60, "rest": 10}}
# character: narrow, words that name a source or a role; wide, any word that could start one
CHAR_NARROW = re.compile(r"\b(?:vignettes?|scenarios?|prompts?|script|role|(?:the|this) case|mention(?:s|ed)?|specified|provided|described|reported"
                         r"|(?:information|details?) (?:given|provided)|just (?:a|the) patient|as a patient|medical knowledge|ai|language model|assistant|chatbot)\b", re.I)
CHAR_WIDE = re.compile(r"\b(?:case|details?|information|given|told|patient|model|records?|notes?|text|knowledge|aware|sure|know|recall|remember|say|said)\b", re.I)
# confirmation: narrow, a diagnosis-like statement about oneself; wide, a word of the answer or a choice
CONF_NARROW = re.compile(r"\bdiagnos\w*|\btold (?:me )?(?:that )?i (?:have|had)\b|\b(?:condition|disease|disorder) (?:like|such as|called)\b"
                         r"|\bthat'?s what\b|\b(?:might|could|may) (?:be|have|suggest)\b|\bi (?:have|had) (?:been )?(?:a history of|history of)\b", re.I)
AGREES = re.compile(r"^\W*(?:yes|yeah|yep|right|correct|exactly|indeed|that'?s (?:right|correct|what))\b", re.I)
DIAGNOSED = re.compile(r"\bdiagnos\w*|\btold (?:me )?(?:that )?(?:i|it) (?:have|had|has|was|is|might|may|could)\b|\b(?:mentioned|said|thought) (?:it|that) (?:might|may|could)\b", re.I)
DISEASE_LIKE = re.compile(r"\b\w+(?:itis|osis|iasis|oma|emia|aemia|pathy|plasia)\b|\b(?:syndrome|disease|disorder|deficiency|infection|cancer|palsy|fever|allergy)\b", re.I)
GENERIC = {"disease", "syndrome", "disorder", "infection", "deficiency", "acute", "chronic", "primary", "secondary", "type", "normal",
           "history", "family", "benign", "malignant", "cell", "left", "right", "cancer"}


def conversations(releases: Path, cases: dict):
    for folder, release in RELEASES.items():
        for path in sorted((releases / folder).glob("case_*.json"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0)):
            data = json.loads(path.read_text(encoding="utf-8"))
            cid = str(data["case_id"])
            case = cases.get(cid, {})
            for k in range(5):
                trial = data.get(f"trial_{k}")
                if not isinstance(trial, dict):
                    continue
                turns = [(t["role"], t["text"]) for t in parse_conversation(trial.get("multiturn_conversation"), str(path))]
                yield {"release": release, "case_id": cid, "trial": k, "vignette": str(data.get("case_vignette") or ""),
                       "correct": str(data.get("correct_ans") or ""), "choices": case.get("choices") or [], "turns": turns}


def answer_words(conv: dict) -> set[str]:
    return {w for t in [conv["correct"], *conv["choices"]] for w in words(t) if len(w) >= 5 and w not in GENERIC}


def new_name(conv: dict, doctor_turn: str) -> bool:
    """The doctor's turn names a disease-like word, or a word of the answer or a choice, that the vignette does not hold."""
    said = {m.group(0).lower() for m in DISEASE_LIKE.finditer(doctor_turn)} | (answer_words(conv) & set(words(doctor_turn)))
    held = set(words(conv["vignette"])) | {w.lower() for w in re.findall(r"\w+", conv["vignette"])}
    return bool(said - held)


def strata_of(conv: dict, doctor_before: str, text: str) -> dict[str, str]:
    run = longest_copied_run(text, conv["vignette"])[0]
    named = answer_words(conv) & set(words(text))
    return {
        "character": "narrow" if CHAR_NARROW.search(text) else "wide" if CHAR_WIDE.search(text) else "rest",
        "copying": "run>=6" if run >= 6 else "run4-5" if run >= 4 else "run<4",
        "confirmation": "narrow" if CONF_NARROW.search(text) or (named and named & set(words(doctor_before))) else "wide" if named else "rest",
        "affirmation": ("agrees" if AGREES.search(text) else "diagnosed" if DIAGNOSED.search(text) else "rest") if new_name(conv, doctor_before) else "rest",
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", required=True, type=Path)
    ap.add_argument("--cases", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args(argv)
    cases = {c["case_id"]: c for c in load_cases(a.cases)}
    pools: dict = defaultdict(list)  # (check, stratum, release) -> turns
    for conv in conversations(a.releases, cases):
        n, doctor_before = 0, ""
        for role, text in conv["turns"]:
            if role == "doctor":
                doctor_before = text
                continue
            n += 1
            if not text.strip():
                continue  # an empty reply: reported as "no reply", nothing to label
            ref = (conv["release"], conv["case_id"], conv["trial"], n)
            for check, stratum in strata_of(conv, doctor_before, text).items():
                pools[check, stratum, conv["release"]].append((ref, doctor_before, text, conv))
    rng = random.Random(SEED)
    items, strata = [], {"seed": SEED, "sizes": {}, "items": {}}
    for check, sizes in SIZES.items():
        for stratum, n in sizes.items():
            for i, release in enumerate(RELEASES.values()):
                pool = pools[check, stratum, release]
                take = n // 4 + (1 if i < n % 4 else 0)
                strata["sizes"][f"{check}|{stratum}|{release}"] = len(pool)
                drawn = rng.sample(pool, min(take, len(pool)))
                for j, ((rel, cid, trial, turn), doctor_before, text, conv) in enumerate(drawn):
                    item_id = f"{check}-{len(items):04d}"
                    part = "dev" if rng.random() < 0.5 else "held-out"
                    strata["items"][item_id] = {"stratum": stratum, "release": rel, "part": part, "case_id": cid, "trial": trial, "patient_turn": turn}
                    item = {"id": item_id, "check": check, "release": rel, "case_id": cid, "trial": trial, "patient_turn": turn,
                            "doctor_before": doctor_before, "patient": text}
                    if check in ("copying", "confirmation", "affirmation"):
                        item["vignette"] = conv["vignette"]
                    if check in ("confirmation", "affirmation"):
                        item["correct"], item["choices"] = conv["correct"], conv["choices"]
                    items.append(item)
    rng.shuffle(items)  # the labeller sees no order that betrays a stratum
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "items.jsonl").write_text("".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items), encoding="utf-8")
    (a.out / "strata.json").write_text(json.dumps(strata, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(items)} items -> {a.out}/items.jsonl; strata -> {a.out}/strata.json")


if __name__ == "__main__":
    main()
