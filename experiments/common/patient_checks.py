"""Deterministic checks of a simulated patient: pure functions of a conversation's turns, no model.

experiments/core/patient.py makes them one scorer (``patient-check/<check>`` grades, rates per conversation and per
patient turn) for every study whose records hold a doctor-patient conversation. A conversation is a list of ``(role, text)`` turns, role ``doctor`` or ``patient`` (a live run's transcript
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
from difflib import SequenceMatcher

from experiments.common.normalize import words as word_list

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
