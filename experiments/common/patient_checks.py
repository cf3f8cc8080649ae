"""Deterministic checks of a simulated patient: pure functions of a conversation's turns, no model.

The runner makes them for every study that declares its patient (``Study.patient``, experiments/core/study.py):
into the record (``patient_checks`` and a ``patient-check/<check>`` score each), metrics.json and summary.md.
A conversation is a list of ``(role, text)`` turns, role ``doctor`` or ``patient`` (a live run's transcript
and a released conversation alike). Patient turns are numbered 1, 2, ... in order. The rules, and the rates
measured on released runs, are in docs/protocols.md ("Patient checks"):

- ``leaks_diagnosis``: an affirmed mention of the correct diagnosis in a patient turn before the doctor's
  last turn, which the vignette does not state and no doctor turn named first; None (not checkable)
  when the correct answer is not a diagnosis (:func:`is_diagnosis`).
- ``names_other_choice``: the same for another answer choice (when the run asks the MCQ).
- ``confirms_unsupported``: an affirmed mention of a diagnosis (correct or a choice) a doctor turn named
  first and the vignette does not state: the patient confirms what the vignette never gave.
- ``breaks_character``: the patient speaks of the vignette, case, scenario or prompt, or as an AI.
- ``copies_vignette``: a patient turn shares ``n_words`` or more consecutive words with the vignette.
- ``empty_turn``: a patient turn that is empty or only whitespace.
"""

from __future__ import annotations

import re
from collections import Counter
from difflib import SequenceMatcher

from experiments.common.grade import Grade, score_name
from experiments.common.markdown import md_table
from experiments.common.normalize import words as word_list
from experiments.common.stats import mean_ci

CHECKS = ("leaks_diagnosis", "names_other_choice", "confirms_unsupported", "breaks_character", "copies_vignette", "empty_turn")
DESCRIPTIONS = {
    "leaks_diagnosis": "the patient names the correct diagnosis before the doctor's final turn",
    "names_other_choice": "the patient names another answer choice before the doctor's final turn",
    "confirms_unsupported": "the patient confirms a diagnosis the doctor named that the vignette never gave",
    "breaks_character": "the patient speaks of the vignette, case, scenario or prompt, or as an AI",
    "copies_vignette": "a patient turn copies {n} or more consecutive words of the vignette",
    "empty_turn": "a patient turn is empty",
}
# the longest copied run in the patient turns of released runs and of conversations clinicians labelled as using
# medical terms (docs/protocols.md, patient checks): 6 words catches most of the labelled clinical phrasing
DEFAULT_SPAN_WORDS = 6
STOP = {"of", "the", "a", "an", "and", "with", "in", "to", "due", "or", "on", "by", "for"}
# a clause with one of these words (a negation, a hedge, a test of it) does not affirm a diagnosis it names; nor does a question
NOT_AFFIRMED = {"no", "not", "never", "none", "nobody", "nothing", "nor", "neither", "without", "deny", "denie", "dont", "doesnt", "didnt",
                "havent", "hasnt", "hadnt", "isnt", "wasnt", "arent", "werent", "cant", "cannot", "wont", "wouldnt", "couldnt", "unsure", "unaware", "whether",
                "might", "maybe", "perhap", "possibly", "heard", "tested", "test", "negative", "explain", "immunization", "vaccine", "vaccinated"}
# partial names: a word of a longer name that names a disease on its own (by its ending, or one of these)
DISEASE_ENDINGS = ("itis", "osis", "iasis", "oma", "emia", "aemia", "pathy", "plasia", "trophy", "ectasis")
SHORT_NAMES = {"lupus", "eczema", "acne", "asthma", "gout", "herpe", "scabie", "rosacea", "vitiligo", "urticaria", "pemphigu", "pemphigoid",
               "impetigo", "measle", "shingle", "wart", "diabete", "hemophilia", "leprosy", "syphili", "tetanu", "rabie"}
# answers that are not diagnoses: tests, measurements, procedures, treatments (whole words) and drugs (endings)
NOT_DIAGNOSIS_WORDS = {"test", "testing", "assay", "level", "scan", "measurement", "biopsy", "ultrasound", "ultrasonography", "imaging",
                       "mri", "ct", "radiograph", "radiography", "esophagram", "endoscopy", "colonoscopy", "study", "studie", "serie",
                       "administration", "therapy", "treatment", "medication", "perform", "intake", "culture", "count", "staining", "urine", "serum",
                       "echocardiography", "electrocardiogram", "transfusion", "resection", "repair", "injection", "dose", "mg"}
DRUG_ENDINGS = ("azole", "mab", "nib", "pril", "sartan", "olol", "statin", "cillin", "mycin", "cycline", "floxacin", "vir", "azepam",
                "tidine", "parin", "platin", "taxel", "semide", "thiazide", "dronate", "pheresis")
BREAKS = re.compile(r"\bvignettes?\b|\bscenarios?\b|\bprompts?\b|(?<!\bin )\b(?:the|this) case\b|\bcase (?:notes|description|details)\b"
                    r"|\b(?:information|details|description|text) (?:provided|given)\b|\blanguage model\b|\bas an? (?:ai|assistant)\b"
                    r"|\bi(?: am|'m|’m) (?:an? )?(?:ai|assistant|virtual assistant|chatbot|model)\b|\bai (?:model|assistant)\b", re.I)


def singular(w: str) -> str:
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        return w[:-1]
    return w


def words(text: str | None) -> list[str]:
    """Lowercased word tokens (letters and digits), apostrophes dropped first ("Crohn's" -> "crohn"), plurals singular."""
    return [singular(w) for w in word_list(text, split="letters", drop_apostrophes=True)]


def is_diagnosis(answer: str) -> bool:
    """False for an answer that is not a diagnosis: a number ("70%"), one token of capitals or digits (a gene, marker or
    abbreviation: "BRAF", "CA-125"), a test, measurement, procedure or treatment word, a drug ending, or over 8 words."""
    a = (answer or "").strip().strip('"').strip()
    w = words(a)
    return bool(w) and not (
        not re.search(r"[^\W\d_]{2}", a)
        or (" " not in a and (sum(c.isupper() for c in a) >= 2 or any(c.isdigit() for c in a)))
        or NOT_DIAGNOSIS_WORDS & set(w) or any(x.endswith(DRUG_ENDINGS) for x in w) or len(w) > 8)


def names(term: str) -> list[list[str]]:
    """The word lists a term is named by: the text outside parentheses and each parenthesised alternative."""
    parts = [re.sub(r"\([^)]*\)", " ", term)] + [p for p in re.findall(r"\(([^)]*)\)", term) if re.search(r"[^\W\d_]{4}", p)]
    return [ws for p in parts if (ws := [w for w in words(p) if w not in STOP])]


def partial_names(term: str, others: list[str]) -> list[list[str]]:
    """A longer name's words that name a disease alone (a disease ending or :data:`SHORT_NAMES`): "psoriasis" for
    "Plaque psoriasis", "lupus" for "Systemic lupus erythematosus"; none that is also a word of another choice."""
    taken = {w for o in others for n in names(o) for w in n}
    return [[w] for n in names(term) if len(n) > 1 for w in n if (w.endswith(DISEASE_ENDINGS) or w in SHORT_NAMES) and w not in taken]


def mention(text: str, term_names: list[list[str]]) -> str | None:
    """'affirmed' or 'negated' when one of the names occurs in ``text`` (its words within a window of its length + 2 in
    one clause, in any order); negated when the clause is a question or holds a word of :data:`NOT_AFFIRMED`. Clauses
    end at . ; : ! ? and before "but"; None when no name occurs."""
    found = None
    for clause in re.split(r"(?<=[.;:!?])|\bbut\b", text or "", flags=re.I):
        cw = words(clause)
        for n in term_names:
            if any(cw[i] in n and set(n) <= set(cw[i:i + len(n) + 2]) for i in range(len(cw))):
                if not (NOT_AFFIRMED & set(cw) or clause.strip().endswith("?")):
                    return "affirmed"
                found = "negated"
    return found


def patient_turns(turns: list[tuple[str, str]]) -> list[tuple[int, int, str]]:
    """(index in ``turns``, patient turn number from 1, text) of every patient turn."""
    out = []
    for i, (role, text) in enumerate(turns):
        if role == "patient":
            out.append((i, len(out) + 1, text or ""))
    return out


def diagnosis_mentions(turns: list[tuple[str, str]], vignette: str, correct: str, choices: list[str] | None = None) -> dict:
    """``leaks_diagnosis`` (None when the correct answer is not a diagnosis), ``names_other_choice`` and
    ``confirms_unsupported``: ``[{"patient_turn", "named"}]`` each, over the patient turns before the doctor's last."""
    terms = [(correct, True)] + [(c, False) for c in choices or [] if (c or "").strip() and words(c) != words(correct)]
    last_doctor = max((i for i, (role, _) in enumerate(turns) if role == "doctor"), default=-1)
    out: dict = {"leaks_diagnosis": [] if is_diagnosis(correct) else None, "names_other_choice": [], "confirms_unsupported": []}
    for term, is_correct in terms:
        if not is_diagnosis(term):
            continue
        all_names = names(term) + partial_names(term, [t for t, _ in terms if t != term])
        if mention(vignette, all_names):
            continue  # history the vignette gives: the patient may state it
        for i, n, text in patient_turns(turns):
            if i < last_doctor and mention(text, all_names) == "affirmed":
                doctor_said = any(role == "doctor" and mention(t, all_names) for role, t in turns[:i])
                check = "confirms_unsupported" if doctor_said else "leaks_diagnosis" if is_correct else "names_other_choice"
                out[check].append({"patient_turn": n, "named": term.strip()})
    return out


def breaks_character(turns: list[tuple[str, str]]) -> list[dict]:
    """Patient turns that speak of the vignette, case, scenario or prompt, or as an AI: ``[{"patient_turn", "said"}]``."""
    return [{"patient_turn": n, "said": m.group(0)} for _, n, text in patient_turns(turns) if (m := BREAKS.search(text))]


def longest_copied_run(text: str, vignette: str) -> tuple[int, str]:
    """The longest run of consecutive words ``text`` shares with ``vignette``: (length, the words)."""
    a, b = words(text), words(vignette)
    if not a or not b:
        return 0, ""
    m = SequenceMatcher(None, a, b, autojunk=False).find_longest_match(0, len(a), 0, len(b))
    return m.size, " ".join(a[m.a:m.a + m.size])


def check_conversation(turns: list[tuple[str, str]], *, vignette: str, correct: str, choices: list[str] | None = None,
                       n_words: int = DEFAULT_SPAN_WORDS) -> dict:
    """Every check on one conversation. ``choices``: the answer choices when the run asks the MCQ (else None).
    ``longest_span``: the longest run of vignette words any patient turn copies (the measured distribution)."""
    runs = [(n, *longest_copied_run(text, vignette)) for _, n, text in patient_turns(turns)]
    return {
        **diagnosis_mentions(turns, vignette, correct, choices),
        "breaks_character": breaks_character(turns),
        "copies_vignette": [{"patient_turn": n, "words": size, "span": span} for n, size, span in runs if size >= n_words],
        "empty_turn": [n for _, n, text in patient_turns(turns) if not text.strip()],
        "longest_span": max((size for _, size, _ in runs), default=0),
        "patient_turns": len(runs),
        "span_words": n_words,
    }


def count_checks(records: list[dict]) -> dict:
    """Per check over the records' ``patient_checks``: conversations checked, flagged, patient turns flagged and the
    rate of flagged conversations with its 95% CI (mean over cases of the per-case share, bootstrap over cases); the
    conversations a check could not score (not checkable); the conversations by longest copied run (words)."""
    checked = [(str(r.get("case_id", r.get("id"))), r["patient_checks"]) for r in records if isinstance(r.get("patient_checks"), dict)]
    out: dict = {"conversations": len(checked), "span_words": checked[0][1].get("span_words") if checked else None,
                 "longest_span": dict(sorted(Counter(pc.get("longest_span", 0) for _, pc in checked).items()))}
    for c in CHECKS:
        per: dict[str, list[float]] = {}
        for case, pc in checked:
            if pc.get(c) is not None and c in pc:
                per.setdefault(case, []).append(float(bool(pc[c])))
        flags = [pc[c] for _, pc in checked if pc.get(c)]
        ci = mean_ci([sum(v) / len(v) for v in per.values()])
        out[c] = {"conversations": len(flags), "of": sum(len(v) for v in per.values()), "not_checkable": sum(c in pc and pc[c] is None for _, pc in checked),
                  "turns": sum(len({e["patient_turn"] if isinstance(e, dict) else e for e in f}) for f in flags),
                  "rate": ci.mean if ci.n else None, "ci_low": ci.low if ci.n else None, "ci_high": ci.high if ci.n else None, "cases": ci.n}
    return out


def legacy_counts(checked: list[dict]) -> dict:
    """The counts of records checked before these rules (``names_diagnosis``, ``turn_cap``), as their runs wrote them."""
    out: dict = {"conversations": len(checked)}
    for c in ("names_diagnosis", "copies_vignette", "empty_turn", "turn_cap"):
        flags = [pc.get(c) for pc in checked]
        out[c] = {"conversations": sum(bool(f) for f in flags)}
        if c != "turn_cap":
            out[c]["turns"] = sum(len({e["patient_turn"] if isinstance(e, dict) else e for e in f or []}) for f in flags)
    return out


def flagged(checks: dict) -> list[str]:
    """The checks a conversation failed, in :data:`CHECKS` order."""
    return [c for c in CHECKS if checks.get(c)]


def patient_check_grades(pc: dict) -> dict[str, Grade]:
    """One grade per check a record holds (None: not checkable, the correct answer is no diagnosis)."""
    return {score_name("patient-check", c): Grade(
        value=None if pc[c] is None else int(bool(pc[c])), answer=pc[c] if isinstance(pc[c], list) and pc[c] else None, source="rule",
        judge={"rule": f"patient_checks.{c}" + (f" ({pc.get('span_words')} words)" if c == "copies_vignette" else "")}) for c in CHECKS if c in pc}


def patient_metrics(records: list[dict], span_words: int | None) -> dict | None:
    """metrics.json's ``patient_checks`` over the records checked (None when none was); a run checked before these
    rules keeps its own counts."""
    checked = [r["patient_checks"] for r in records if isinstance(r.get("patient_checks"), dict)]
    if not checked:
        return None
    counts = count_checks(records) if any("longest_span" in pc for pc in checked) else legacy_counts(checked)
    return {**counts, "span_words": span_words}


def span_quantiles(dist: dict) -> str:
    """'median / 90th percentile / max' of the conversations' longest copied runs ({words: conversations})."""
    values = sorted((int(k), v) for k, v in (dist or {}).items())
    n = sum(v for _, v in values)
    if not n:
        return "–"
    def q(p):
        seen = 0
        for k, v in values:
            seen += v
            if seen >= p * n:
                return k
    return f"{q(0.5)} / {q(0.9)} / {values[-1][0]}"


def patient_check_table(rows: list[tuple[str, dict]]) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the patient-check table, one row per (patient, metrics' ``patient_checks``)."""
    def cell(x: dict | None) -> str:
        if not x or x.get("rate") is None:
            return "–"
        na = f"; {x['not_checkable']} not checkable" if x.get("not_checkable") else ""
        return f"{100 * x['rate']:.2f} [{100 * x['ci_low']:.2f}, {100 * x['ci_high']:.2f}] ({x['conversations']}/{x['of']}{na})"
    columns = ["patient-AI of", "conversations", *CHECKS, "longest copied run, words: median / 90th pct / max"]
    return columns, [[name, str(pc.get("conversations", 0)), *(cell(pc.get(c)) for c in CHECKS), span_quantiles(pc.get("longest_span"))]
                     for name, pc in rows]


NOTE = ("Each rate: % of conversations flagged [95% bootstrap CI over cases] (flagged / checked); a leak is not checkable "
        "where the correct answer is not a diagnosis.")


def patient_check_markdown(rows: list[tuple[str, dict]], heading: str, note: str = NOTE) -> str:
    """summary.md's patient-check section: the table of ``rows`` under ``heading``, ``note`` below."""
    return "\n".join(["", f"## {heading}", "", *md_table(*patient_check_table(rows)), "", note]) + "\n"
