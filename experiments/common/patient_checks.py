"""Deterministic checks of a simulated patient: pure functions of a conversation's turns, no model.

experiments/core/patient.py makes them one scorer (``patient-check/<check>`` grades, rates per conversation and per
patient turn) for every study whose records hold a doctor-patient conversation. A conversation is a list of ``(role,
text)`` turns, role ``doctor`` or ``patient`` (a live run's transcript and a released conversation alike). Patient
turns are numbered 1, 2, ... in order. The rules are in docs/protocols.md ("CRAFT-MD patient checks"):

- ``confirms_unsupported``: the patient affirms a diagnosis (the correct answer or a choice) that a doctor turn named
  first and the vignette does not state: a yes-reply to a doctor's question whether it was diagnosed, mentioned or
  told, or an affirmed mention ("diagnosed with GVHD"). Each hit says whether it is the correct answer.
- ``leaks_diagnosis``: the same affirmation of the correct diagnosis, unprompted (no doctor turn named it first);
  None (not checkable) when the correct answer is not a checkable diagnosis (:func:`is_diagnosis`).
- ``names_other_choice``: the same for another answer choice (when the run asks the MCQ).
- ``suggests_diagnosis``: a hedged mention ("which might suggest a condition like thalassemia") of such a diagnosis.
- ``breaks_character``: the patient speaks of a source (the vignette, case, scenario, prompt, "no mention of",
  "wasn't described"), as "just a patient", or as an AI.
- ``script_talk``: the patient speaks of their own script ("I didn't mention taking any medications").
- ``copies_vignette``: a patient turn copies a run of vignette words that carries clinical content.
- ``empty_turn``: no reply: a patient turn empty in the transcript (a release or transport artifact, not behaviour).
All of them look at patient turns before the doctor's last turn only where the doctor could use them (the diagnosis
checks); the others look at every patient turn.
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from experiments.common.normalize import words as word_list

CHECKS = ("leaks_diagnosis", "names_other_choice", "confirms_unsupported", "suggests_diagnosis", "breaks_character", "script_talk",
          "copies_vignette", "empty_turn")
DESCRIPTIONS = {
    "leaks_diagnosis": "the patient names the correct diagnosis before the doctor's final turn",
    "names_other_choice": "the patient names another answer choice before the doctor's final turn",
    "confirms_unsupported": "the patient confirms a diagnosis the doctor named that the vignette never gave",
    "suggests_diagnosis": "the patient suggests, hedged, a diagnosis the vignette never gave",
    "breaks_character": "the patient speaks of a source (vignette, case, what was provided), as just a patient, or as an AI",
    "script_talk": "the patient speaks of their script (\"I didn't mention ...\")",
    "copies_vignette": "a patient turn copies a run of vignette wording with clinical content ({n}+ words; 4+ with a lab value, a unit or a chart phrase)",
    "empty_turn": "no reply: a patient turn missing from the transcript (empty), not a patient behaviour",
}
# a copied run counts from this many words when it carries clinical content (docs/protocols.md, patient checks) ...
DEFAULT_SPAN_WORDS = 6
# ... and from this many when it holds a lab value, gene or number with a unit ("the HLA-DQ2 allele")
SHORT_SPAN_WORDS = 4
STOP = {"of", "the", "a", "an", "and", "with", "in", "to", "due", "or", "on", "by", "for"}
# a clause with one of these words (a negation, not knowing, a vaccine) does not affirm a diagnosis it names; nor does a question
NOT_AFFIRMED = {"no", "not", "never", "none", "nobody", "nothing", "nor", "neither", "without", "deny", "denie", "dont", "doesnt", "didnt",
                "havent", "hasnt", "hadnt", "isnt", "wasnt", "arent", "werent", "cant", "cannot", "wont", "wouldnt", "couldnt", "unsure", "unaware", "whether",
                "heard", "negative", "explain", "immunization", "vaccine", "vaccinated"}
TESTED_FOR = re.compile(r"\b(?:tested|test|tests|screened|checked) for\b", re.I)  # "tested for X": not affirmed; "a bone density test": no matter
# a clause with one of these names a diagnosis as a possibility: a suggestion, not an affirmation
HEDGE = re.compile(r"\b(?:might|maybe|perhaps|possibly|possible|probably|suggests?|suggesting|suspect\w*|wonder\w*|could be|may be|may have|"
                   r"could have|something like|condition like|like|similar to|resembl\w*|a form of|some kind of|some sort of)\b", re.I)
# partial names: a word of a longer name that names a disease on its own (by its ending, or one of these) ...
DISEASE_ENDINGS = ("itis", "osis", "iasis", "oma", "emia", "aemia", "pathy", "plasia", "trophy", "ectasis")
SHORT_NAMES = {"lupus", "eczema", "acne", "asthma", "gout", "herpe", "scabie", "rosacea", "vitiligo", "urticaria", "pemphigu", "pemphigoid",
               "impetigo", "measle", "shingle", "wart", "diabete", "hemophilia", "leprosy", "syphili", "tetanu", "rabie"}
# ... except a generic head word, which names a family of diseases, never one of them
GENERIC_HEADS = {"anemia", "anaemia", "arthritis", "dermatitis", "infection", "disease", "disorder", "syndrome", "cancer", "carcinoma",
                 "tumor", "tumour", "neoplasm", "lymphoma", "leukemia", "hepatitis", "pneumonia", "fibrosis", "neuropathy", "myopathy",
                 "cardiomyopathy", "nephropathy", "vasculitis", "deficiency", "insufficiency", "failure", "stenosis", "sclerosis",
                 "keratosis", "dermatosis", "alopecia", "diabete", "eczema", "herpe", "wart", "acne", "infarction", "hemorrhage", "thrombosis"}
# words a diagnosis is named by as a disease: a multi-word name without one of them (nor a disease ending, a short name,
# a capitalised eponym) is matched only as the exact phrase ("brittle nails" is not "my nails are more brittle")
DISEASE_WORDS = GENERIC_HEADS | {"palsy", "fever", "pox", "poisoning", "injury", "fracture", "ulcer", "hernia", "cyst", "abscess", "atresia",
                                 "dysplasia", "sarcoma", "melanoma", "nevu", "whitlow", "planu", "rubra", "nigrican", "venereum", "reflux"}
# answers that are not diagnoses: tests, measurements, procedures, treatments (whole words) and drugs (endings) ...
NOT_DIAGNOSIS_WORDS = {"test", "testing", "assay", "level", "scan", "measurement", "biopsy", "ultrasound", "ultrasonography", "imaging",
                       "mri", "ct", "radiograph", "radiography", "esophagram", "endoscopy", "colonoscopy", "study", "studie", "serie",
                       "administration", "therapy", "treatment", "medication", "perform", "intake", "culture", "count", "staining", "urine", "serum",
                       "echocardiography", "electrocardiogram", "transfusion", "resection", "repair", "injection", "dose", "mg"}
# ... nor symptom-type answers: a sign or finding, a normal state, a history ("Raynaud phenomenon", "Normal pregnancy")
SYMPTOM_TYPE = re.compile(r"^\W*(?:normal|physiologic(?:al)?)\b(?! pressure)|\bsigns?\b|\bphenomenon\b|\bhistory\b|\bfindings?\b", re.I)
DRUG_ENDINGS = ("azole", "mab", "nib", "pril", "sartan", "olol", "statin", "cillin", "mycin", "cycline", "floxacin", "vir", "azepam",
                "tidine", "parin", "platin", "taxel", "semide", "thiazide", "dronate", "pheresis")
# shortened words in a choice's name, read as the word ("β-thal major": beta thalassemia major)
EXPANSIONS = {"thal": "thalassemia", "β": "beta", "α": "alpha"}
SYNONYMS_FILE = Path(__file__).with_name("diagnosis_synonyms.tsv")
YES = re.compile(r"^\W*(?:yes|yeah|yep|yup|right|correct|exactly|indeed|that'?s right|that is right|that'?s correct|that is correct)\b", re.I)
# a doctor's question whether the patient was given a diagnosis (a yes to it confirms the diagnosis it names)
ASKS_DIAGNOSED = re.compile(r"\bdiagnos\w*|\bmention\w*|\btold\b|\bsaid\b|\bsuspect\w*|\bconfirm\w*|\bthe term\b|\bcalled\b|\blabel\w*|"
                            r"\bany chance\b|\bcould (?:it|this|that) be\b|\bthink (?:it|this|that) (?:is|could|might)\b", re.I)
SUCH_AS = re.compile(r"\b(?:such as|like|including|e\.g\.|for example|for instance|or other|and other)\b", re.I)
# the patient's reply says the diagnosis was given to it ("that's what the pediatrician mentioned"): a yes to any
# doctor's question naming it, whatever the question asked
TOLD_SO = re.compile(r"\bthat'?s what (?:they|he|she|the \w+|my \w+|our \w+|i was|we were|i've been|we've been) (?:\w+ )?(?:told|said|mentioned|thought|suspected|called it|diagnosed)\b", re.I)
AFFIRMED_HOW = re.compile(r"\bdiagnos\w*|\btold me\b|\bconfirmed\b", re.I)


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
    abbreviation: "BRAF", "CA-125"), a test, measurement, procedure or treatment word, a symptom-type answer (a sign,
    a normal state, a history), a drug ending, or over 8 words."""
    a = (answer or "").strip().strip('"').strip()
    w = words(a)
    return bool(w) and not (
        not re.search(r"[^\W\d_]{2}", a)
        or (" " not in a and (sum(c.isupper() for c in a) >= 2 or any(c.isdigit() for c in a)))
        or NOT_DIAGNOSIS_WORDS & set(w) or SYMPTOM_TYPE.search(a) or any(x.endswith(DRUG_ENDINGS) for x in w) or len(w) > 8)


def names(term: str) -> list[list[str]]:
    """The word lists a term is named by: the text outside parentheses and each parenthesised alternative."""
    parts = [re.sub(r"\([^)]*\)", " ", term)] + [p for p in re.findall(r"\(([^)]*)\)", term) if re.search(r"[^\W\d_]{4}", p)]
    return [ws for p in parts if (ws := [EXPANSIONS.get(w, w) for w in words(p) if w not in STOP])]


def names_a_disease(w: str) -> bool:
    return w.endswith(DISEASE_ENDINGS) or w in SHORT_NAMES


def partial_names(term: str, others: list[str]) -> list[list[str]]:
    """A longer name's words that name a disease alone (a disease ending or :data:`SHORT_NAMES`): "psoriasis" for
    "Plaque psoriasis", "lupus" for "Systemic lupus erythematosus"; never a generic head word (:data:`GENERIC_HEADS`:
    "anemia" of "Folate deficiency anemia") nor a word of another choice."""
    taken = {w for o in others for n in names(o) for w in n}
    return [[w] for n in names(term) if len(n) > 1 for w in n if names_a_disease(w) and w not in GENERIC_HEADS and w not in taken]


def exact_only(term: str, name: list[str]) -> bool:
    """A name of ordinary words (no disease word or ending, no eponym) matches only as the exact phrase."""
    eponym = re.search(r"\b[A-Z][a-z]+(?:'s|’s)?\b", term.strip()[1:]) or "'" in term or "’" in term
    return len(name) > 1 and not eponym and not any(names_a_disease(w) or w in DISEASE_WORDS for w in name)


MODIFIERS = {"acute", "chronic", "primary", "secondary", "congenital", "acquired", "recurrent", "early", "late", "severe", "mild"}


def abbreviations(term: str, doctor_texts: Iterable[str] = ()) -> list[str]:
    """Abbreviations a diagnosis goes by: its initialism when it has three words or more ("Graft-versus-host disease"
    -> GVHD; without a leading modifier too: "Acute graft-versus-host disease" -> AGVHD, GVHD), a parenthesised abbreviation in the choice, and "Name (ABBR)" in a doctor's turn."""
    out = [p.strip() for p in re.findall(r"\(([^)]*)\)", term) if re.fullmatch(r"[A-Z][A-Za-z0-9-]{1,7}", p.strip())
           and sum(c.isupper() for c in p) >= 2]
    main = [w for w in words(re.sub(r"\([^)]*\)", " ", term)) if w not in STOP]
    for ws in (main, main[1:] if main and main[0] in MODIFIERS else []):
        if len(ws) >= 3 and all(w[0].isalpha() for w in ws):
            out.append("".join(w[0] for w in ws).upper())
    for text in doctor_texts:
        for m in re.finditer(r"\(([A-Z][A-Za-z0-9-]{1,7})\)", text or ""):
            before, k = words(text[:m.start()])[-(len(main) + 2):], sum(c.isalpha() for c in m.group(1))
            if main and sum(c.isupper() for c in m.group(1)) >= 2 and set(main[-k:]) <= set(before):
                out.append(m.group(1))
    return list(dict.fromkeys(out))


@lru_cache(maxsize=None)
def synonym_groups() -> tuple[tuple[tuple[str, ...], ...], ...]:
    """The groups of :data:`SYNONYMS_FILE` (diagnosis_synonyms.tsv), each name as its words."""
    out = []
    for line in SYNONYMS_FILE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            out.append(tuple(tuple(w for w in words(n) if w not in STOP) for n in line.split("\t") if n.strip()))
    return tuple(out)


def with_synonyms(name: list[str]) -> list[list[str]]:
    """The name and every lay or alternate name of its group (:func:`synonym_groups`)."""
    return [name] + [list(n) for g in synonym_groups() if tuple(name) in g for n in g if list(n) != name]


def _clauses(text: str) -> list[str]:
    return [c for c in re.split(r"(?<=[.;:!?])|\bbut\b", text or "", flags=re.I) if c.strip()]


def _has(cw: list[str], clause: str, name: list[str], exact: bool = False) -> bool:
    if exact:
        return f" {' '.join(name)} " in f" {' '.join(cw)} "
    return any(cw[i] in name and set(name) <= set(cw[i:i + len(name) + 2]) for i in range(len(cw)))


def _has_abbr(clause: str, abbrs: Iterable[str]) -> bool:
    return any(re.search(rf"(?<![\w-]){re.escape(a)}s?(?![\w-])", clause) for a in abbrs)


def mentions(text: str, term_names: list[list[str]], abbrs: Iterable[str] = (), exact: Iterable[tuple[str, ...]] = ()) -> set[str]:
    """How the names occur in ``text``, clause by clause: 'affirmed'; 'hedged' (a clause with a hedge, :data:`HEDGE`);
    'negated' (a question, a word of :data:`NOT_AFFIRMED`, or "tested for"). A name's words occur within a window of
    its length + 2 in one clause, in any order (an ``exact`` name: as the phrase); an abbreviation as written, case
    and all. Clauses end at . ; : ! ? and before "but"."""
    exact, found = {tuple(e) for e in exact}, set()
    for clause in _clauses(text):
        cw = words(clause)
        if any(_has(cw, clause, n, tuple(n) in exact) for n in term_names) or _has_abbr(clause, abbrs):
            if NOT_AFFIRMED & set(cw) or clause.strip().endswith("?") or TESTED_FOR.search(clause):
                found.add("negated")
            elif HEDGE.search(clause):
                found.add("hedged")
            else:
                found.add("affirmed")
    return found


def mention(text: str, term_names: list[list[str]], abbrs: Iterable[str] = (), exact: Iterable[tuple[str, ...]] = ()) -> str | None:
    """The strongest of :func:`mentions`: 'affirmed' > 'hedged' > 'negated'; None when no name occurs."""
    found = mentions(text, term_names, abbrs, exact)
    return next((k for k in ("affirmed", "hedged", "negated") if k in found), None)


def patient_turns(turns: list[tuple[str, str]]) -> list[tuple[int, int, str]]:
    """(index in ``turns``, patient turn number from 1, text) of every patient turn."""
    out = []
    for i, (role, text) in enumerate(turns):
        if role == "patient":
            out.append((i, len(out) + 1, text or ""))
    return out


def yes_reply(doctor: str, patient: str, term_names: list[list[str]], abbrs: Iterable[str] = (), exact=()) -> bool:
    """The patient's turn opens with a yes to a doctor's question whether the diagnosis was given (diagnosed,
    mentioned, told, suspected, "the term", "could it be"; any question, where the reply says it was given: "Yes,
    that's what they told me") that names it before any "such as"/"like" (a listed example is no question about it); the yes stands unless its first sentence holds a negation or "tested for" or
    is a question ("Yes, could you tell me what causes it?" asks; it confirms nothing)."""
    if not YES.match(patient or ""):
        return False
    first = re.split(r"(?<=[.!?])\s", patient.strip(), maxsplit=1)[0]
    if NOT_AFFIRMED & set(words(first)) or TESTED_FOR.search(first) or first.endswith("?"):
        return False
    told_so = bool(TOLD_SO.search(first))
    for clause in _clauses(doctor):
        head = SUCH_AS.split(clause, maxsplit=1)[0]
        if (told_so or ASKS_DIAGNOSED.search(clause)) and clause.strip().endswith("?") and mention(head, term_names, abbrs, exact):
            return True
    return False


def diagnosis_terms(correct: str, choices: list[str] | None, answer_index: int | None) -> list[tuple[str, list[str], bool]]:
    """(the name reported, its wordings, is it the correct answer) of every diagnosis checked: the correct answer found
    by ``answer_index`` in the choices (its wording there and the target's both name it), else by wording."""
    choices = [c for c in choices or []]
    if choices and answer_index is not None and 0 <= answer_index < len(choices):
        right = choices[answer_index]
        out = [(right.strip(), [right] + ([correct] if words(correct) != words(right) else []), True)]
        return out + [(c.strip(), [c], False) for j, c in enumerate(choices) if j != answer_index and (c or "").strip()]
    return [(correct.strip(), [correct], True)] + [(c.strip(), [c], False) for c in choices if (c or "").strip() and words(c) != words(correct)]


def diagnosis_mentions(turns: list[tuple[str, str]], vignette: str, correct: str, choices: list[str] | None = None,
                       answer_index: int | None = None) -> dict:
    """The diagnosis checks over the patient turns before the doctor's last: ``leaks_diagnosis`` (None when the
    correct answer is not a diagnosis), ``names_other_choice``, ``confirms_unsupported`` and ``suggests_diagnosis``,
    each ``[{"patient_turn", "named", "correct", "how"}]`` (how: yes-reply, diagnosed, named, hedged)."""
    terms = diagnosis_terms(correct, choices, answer_index)
    last_doctor = max((i for i, (role, _) in enumerate(turns) if role == "doctor"), default=-1)
    doctor_texts = [t for role, t in turns if role == "doctor"]
    out: dict = {"leaks_diagnosis": [] if is_diagnosis(correct) and all(is_diagnosis(w) for w in terms[0][1]) else None,
                 "names_other_choice": [], "confirms_unsupported": [], "suggests_diagnosis": []}
    for named, wordings, is_correct in terms:
        if not all(is_diagnosis(w) for w in wordings):
            continue
        full = [n for w in wordings for n in names(w)]
        others = [w for _, ws, _ in terms for w in ws if w not in wordings]
        partial = [p for w in wordings for p in partial_names(w, others)]
        abbrs = [a for w in wordings for a in abbreviations(w, doctor_texts)]
        exact = [tuple(n) for w in wordings for n in names(w) if exact_only(w, n)]
        if any(mention(vignette, with_synonyms(n), exact=exact) for n in full) or _has_abbr(vignette, abbrs):
            continue  # history the vignette gives: the patient may state it
        # a partial name or abbreviation the vignette states (itself or a synonym) names what the vignette gave
        partial = [p for p in partial if not mention(vignette, with_synonyms(p))]
        term_names = full + partial
        for i, n, text in patient_turns(turns):
            if i >= last_doctor:
                continue
            found = mentions(text, term_names, abbrs, exact)
            yes = i > 0 and turns[i - 1][0] == "doctor" and yes_reply(turns[i - 1][1], text, term_names, abbrs, exact)
            hit = {"patient_turn": n, "named": named, "correct": is_correct}
            if yes or "affirmed" in found:
                how = "yes-reply" if yes and "affirmed" not in found else "diagnosed" if AFFIRMED_HOW.search(text) else "named"
                doctor_said = yes or any(role == "doctor" and mention(t, term_names, abbrs, exact) for role, t in turns[:i])
                check = "confirms_unsupported" if doctor_said else "leaks_diagnosis" if is_correct else "names_other_choice"
                out[check].append({**hit, "how": how})
            elif "hedged" in found:
                out["suggests_diagnosis"].append({**hit, "how": "hedged"})
    # a disease name two choices share ("thalassemia" of beta thalassemia major and alpha thalassemia trait) names
    # neither choice, but a yes to a doctor naming it confirms the family, and hedged it suggests it
    shared = {w for _, ws, _ in terms if all(is_diagnosis(x) for x in ws) for x in ws for n in names(x) if len(n) > 1 for w in n
              if names_a_disease(w) and w not in GENERIC_HEADS}
    shared = {w for w in shared if sum(any(w in n for x in ws for n in names(x)) for _, ws, _ in terms) > 1
              and not mention(vignette, with_synonyms([w]))}
    suggested = {h["patient_turn"] for h in out["suggests_diagnosis"]}
    confirmed = {h["patient_turn"] for h in out["confirms_unsupported"]}
    for w in sorted(shared):
        correct_family = any(w in m for x in terms[0][1] for m in names(x))
        for i, n, text in patient_turns(turns):
            if i < last_doctor and n not in confirmed and i > 0 and turns[i - 1][0] == "doctor" and yes_reply(turns[i - 1][1], text, [[w]]):
                out["confirms_unsupported"].append({"patient_turn": n, "named": w, "correct": correct_family, "how": "yes-reply, a name choices share"})
                confirmed.add(n)
            elif i < last_doctor and n not in suggested and mention(text, [[w]]) == "hedged":
                out["suggests_diagnosis"].append({"patient_turn": n, "named": w, "correct": correct_family, "how": "hedged, a name choices share"})
                suggested.add(n)
    return out


# ------------------------------------------------------------------ out of character

# a source spoken of: the vignette, case, scenario, prompt, or what was or was not mentioned, provided, described
SOURCE = (r"\bvignettes?\b|\bprompts?\b|\b(?:this|the|given|provided|my|our|original|current) scenario\b|\bscenario (?:provided|given|described)\b"
          r"|(?<!\bin )\b(?:the|this) case\b|\bcase (?:notes|description|details|information|file)\b"
          r"|\b(?:information|details|description|text|info) (?:provided|given|available|i have|i was given|i've been given|i've got)\b"
          r"|\bno mention of\b|\bnothing (?:is |was )?(?:mentioned|specified|provided|described|reported|stated)\b"
          r"|\b(?:wasn'?t|was not|hasn'?t been|has not been|haven'?t been|have not been|isn'?t|is not|weren'?t|were not|aren'?t|are not|not been)"
          r"\s+(?:\w+ly\s+)?(?:mentioned|specified|provided|described|reported|stated|detailed|documented|indicated|noted|included)\b"
          r"|\b(?:you|they) didn'?t give me (?:that |this |any |the |much )?(?:information|details?|info)\b")
PATIENT_ROLE = r"\bjust (?:an? |the )patient\b|\bas an? patient\b|\bmy medical knowledge\b|\bi(?:'m| am) not (?:an? )?(?:doctor|medical professional)\b"
JOB = r"(?! (?:manager|director|professor|coach|principal|editor|teacher|nurse|to|at|in|for|of|with)\b)"  # "assistant manager": a job
AI = (r"\blanguage model\b|\bas an? (?:ai|language model|virtual assistant|assistant" + JOB + r")\b|\bai (?:model|assistant)\b"
      r"|\bi(?: am|'m|’m) (?:an? )?(?:ai|chatbot|virtual assistant|assistant" + JOB + r")\b")
BREAKS = re.compile("|".join((SOURCE, PATIENT_ROLE, AI)), re.I)
# idioms and jobs the patterns would otherwise take: "that's (not) the case", "if that's the case", "in the case of"
IDIOMS = re.compile(r"\b(?:is|was|be|been|being|s|not|if|as|just|exactly|always|often|ever|isn'?t|wasn'?t)\s+(?:not\s+)?(?:really\s+)?the case\b"
                    r"|[’']s (?:not )?the case\b|\bthe case (?:with|for|of)\b", re.I)
SCRIPT = re.compile(r"\bi(?:'ve|’ve)? (?:didn'?t|did not|not|haven'?t|have not|hadn'?t|had not|never|wasn'?t|was not) (?:\w+ly )?(?:mention|mentioned|share|shared|specify|specified"
                    r"|state|stated|describe|described|provide|provided|include|included|bring up|brought up|say|said|note|noted|report|reported)"
                    r"(?! to\b)\b", re.I)


def breaks_character(turns: list[tuple[str, str]]) -> list[dict]:
    """Patient turns that speak of a source, as just a patient, or as an AI: ``[{"patient_turn", "said"}]``."""
    return [{"patient_turn": n, "said": m.group(0)} for _, n, text in patient_turns(turns) if (m := BREAKS.search(IDIOMS.sub(" ", text)))]


def script_talk(turns: list[tuple[str, str]]) -> list[dict]:
    """Patient turns that speak of their script: what they did or did not mention, share or specify."""
    return [{"patient_turn": n, "said": m.group(0)} for _, n, text in patient_turns(turns) if (m := SCRIPT.search(text))]


# ------------------------------------------------------------------ copied vignette wording

UNITS = {"cm", "mm", "m", "km", "mg", "g", "kg", "mcg", "ug", "ml", "dl", "l", "mmhg", "hg", "min", "bpm", "c", "f", "iu", "u", "meq", "mmol",
         "umol", "mol", "lb", "oz", "sec", "ms", "mosm", "cells", "cell", "mm3", "ul", "fl", "pg", "ng"}
CHART_WORDS = {"effaced", "effacement", "unremarkable", "insignificant", "noncontributory", "auscultation", "palpation", "palpated",
               "gravida", "afebrile", "examination", "laboratory", "bilaterally", "serum", "vitals", "notable", "dilated", "tenderness",
               "nontender", "percussion", "erythematous", "supine", "distended"}
CHART_PHRASES = ("past medical history", "medical history is", "on examination", "physical examination", "vital sign", "within normal limit",
                 "is notable for", "significant for", "history of present illness", "review of system", "history of serious illness",
                 "medical history is unremarkable", "history is unremarkable")


def copy_tokens(text: str) -> list[str]:
    """Lowercased tokens for copying: words, and numbers with a % kept ("40%"), apostrophes dropped, plurals singular."""
    return [singular(w) for w in re.findall(r"\d+(?:\.\d+)?%|[^\W_]+", re.sub(r"['’`]", "", (text or "").lower()))]


def lab_tokens(text: str) -> set[str]:
    """Tokens written as a lab value, gene or marker: letters and digits together ("DQ2", "HbA1c", "B12"); not a
    decade, an ordinal or a time ("50s", "3rd", "5pm")."""
    return {tok.lower() for tok in re.findall(r"[^\W_]+", text or "") if re.search(r"\d", tok) and re.search(r"[^\W\d_]", tok)
            and not re.fullmatch(r"\d+(?:s|st|nd|rd|th|am|pm|yo|y|h|hr|hrs|d|wk|min)", tok, re.I)}


@lru_cache(maxsize=4096)
def _term_words(term: str) -> str:
    return " ".join(copy_tokens(term))


def clinical_content(span: list[str], labs: set[str], terms: Iterable[str] = ()) -> str | None:
    """Why a copied run carries clinical content, or None: a lab/gene token, a number with a unit, a term of the
    terminology list, or chart wording (:data:`CHART_WORDS`, :data:`CHART_PHRASES`)."""
    lab = next((w for w in span if w in labs), None)
    if lab:
        return f"lab: {lab}"
    for a, b in zip(span, span[1:] + [""]):
        if re.fullmatch(r"\d+(?:\.\d+)?%", a):
            return f"unit: {a}"
        if re.fullmatch(r"\d+(?:\.\d+)?", a) and b in UNITS:
            return f"unit: {a} {b}"
    text = f" {' '.join(span)} "
    for t in terms:
        tw = _term_words(t)
        if tw and f" {tw} " in text:
            return f"term: {t}"
    phrase = next((p for p in CHART_PHRASES if f" {p} " in text), None)
    if phrase:
        return f"chart phrase: {phrase}"
    chart = next((w for w in span if w in CHART_WORDS), None)
    return f"chart: {chart}" if chart else None


def copied_runs(text: str, vignette: str, n_words: int = DEFAULT_SPAN_WORDS, terms: Iterable[str] = ()) -> list[dict]:
    """The runs of consecutive words ``text`` shares with ``vignette`` that count as copying: ``n_words`` or more with
    clinical content, or :data:`SHORT_SPAN_WORDS` or more holding a lab/gene token, a number with a unit or a chart
    phrase (:data:`CHART_PHRASES`: "past medical history is unremarkable"). An
    ordinary phrase ("chest pain and shortness of breath") is no copying however long: ``[{"words", "span", "why"}]``."""
    a, b = copy_tokens(text), copy_tokens(vignette)
    if not a or not b:
        return []
    labs = lab_tokens(text) & lab_tokens(vignette)
    out = []
    for m in SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        span = a[m.a:m.a + m.size]
        if m.size < min(n_words, SHORT_SPAN_WORDS) or not (why := clinical_content(span, labs, terms)):
            continue
        if m.size >= n_words or why.startswith(("lab:", "unit:", "chart phrase:")):
            out.append({"words": m.size, "span": " ".join(span), "why": why})
    return out


def longest_copied_run(text: str, vignette: str) -> tuple[int, str]:
    """The longest run of consecutive words ``text`` shares with ``vignette``: (length, the words) — descriptive only."""
    a, b = words(text), words(vignette)
    if not a or not b:
        return 0, ""
    m = SequenceMatcher(None, a, b, autojunk=False).find_longest_match(0, len(a), 0, len(b))
    return m.size, " ".join(a[m.a:m.a + m.size])


def check_conversation(turns: list[tuple[str, str]], *, vignette: str, correct: str, choices: list[str] | None = None,
                       answer_index: int | None = None, n_words: int = DEFAULT_SPAN_WORDS, terms: Iterable[str] = ()) -> dict:
    """Every check on one conversation. ``choices``: the answer choices when the run asks the MCQ (else None);
    ``answer_index``: the correct one's place in them; ``terms``: clinical terms whose copying counts (a study's term
    list). ``longest_span``: the longest run of vignette words any patient turn copies (a descriptive figure)."""
    terms = tuple(terms)
    pts = patient_turns(turns)
    copied = [{"patient_turn": n, **r} for _, n, text in pts for r in copied_runs(text, vignette, n_words, terms)]
    return {
        **diagnosis_mentions(turns, vignette, correct, choices, answer_index),
        "breaks_character": breaks_character(turns),
        "script_talk": script_talk(turns),
        "copies_vignette": copied,
        "empty_turn": [n for _, n, text in pts if not text.strip()],
        "longest_span": max((longest_copied_run(text, vignette)[0] for _, _, text in pts), default=0),
        "patient_turns": len(pts),
        "span_words": n_words,
    }
