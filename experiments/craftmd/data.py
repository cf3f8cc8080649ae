"""Case loaders: the CRAFT-MD case CSV and AgentClinic OSCE JSONL, both into one case shape.

A case is a dict: ``case_id``, ``vignette`` (the case text WITHOUT its closing question: what the
patient-AI gets and the vignette format shows), ``vignette_full`` (the text as published),
``question`` (the case's own question, SPEC section 3: the last question sentence, "of the following"
dropped, e.g. "Which is the most likely diagnosis?"; a default when the text asks none),
``question_source`` (``vignette`` | ``default``), ``choices`` (list of 4, or [] when the source has
none), ``answer`` (correct diagnosis text), ``answer_index`` (0-based index into choices, or None),
``specialty``, ``dataset``. Bad input raises :class:`DataError` naming the file and line.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from experiments.core.results import iter_jsonl
from models.errors import DataError
from experiments.common.parsing import match_choice

CSV_COLUMNS = ("case_vignette", "choice_1", "choice_2", "choice_3", "choice_4", "answer", "category", "dataset", "case_id")


# The authors' question for a case whose text asks none (every dermatology case; their released
# per-case files carry exactly this string for those cases).
DEFAULT_QUESTION = "What is the final diagnosis?"

# words after which a full stop does not end a sentence
_ABBREV = {"dr", "mr", "mrs", "ms", "st", "vs", "no", "approx", "fig", "e.g", "i.e", "etc", "dept", "prof", "sr", "jr", "mt"}
_CLOSERS = "\"'”’)]"


def _sentence_start(text: str, end: int) -> int:
    """Index where the sentence ending at ``end`` starts: after the previous sentence end (., !, ?, :
    or ; followed by space and a capital, digit or quote; or a line break), a few abbreviations (Dr., vs., e.g.) excepted; decimals need no exception since
    the next character must be a space."""
    start = 0
    for m in re.finditer(r"([.!?;:])[" + re.escape(_CLOSERS) + r"]*(\s+)(?=[\"“‘'(A-Z0-9])|\n+", text[:end]):
        if m.group(0).startswith("\n") or "\n" in (m.group(2) or ""):
            start = m.end()
            continue
        before = text[: m.start(1)]
        word = re.search(r"([A-Za-z.]+)$", before)
        if m.group(1) == "." and word and (word.group(1).lower().rstrip(".") in _ABBREV):
            continue
        start = m.end()
    return start


def clean_question(q: str) -> str:
    """'Which of the following is ...?' -> 'Which is ...?' (the authors drop "of the following");
    'Of the following, which ...' -> 'Which ...'; whitespace collapsed, stray closing quotes removed."""
    q = re.sub(r"\s+", " ", q).strip()
    q = re.sub(r"^[\"“”'‘’]+|(?<=[?:])[\"“”'’]+$", "", q).strip()
    q = re.sub(r"\b(which|what)\s+of\s+the\s+following\b", r"\1", q, flags=re.I)
    q = re.sub(r"^of\s+the\s+following(?:\s+(?:options|choices|answers))?\s*,\s*", "", q, flags=re.I)
    q = re.sub(r",?\s+of\s+the\s+following\b(?:\s+(?:options|choices))?", "", q, flags=re.I)
    q = re.sub(r"\s+([?:,])", r"\1", q)
    if q.endswith(":") and re.match(r"^(which|what|who|how)\b", q, re.I):
        q = q[:-1].rstrip() + "?"  # 'Which is the most likely diagnosis:' is a question
    return q[:1].upper() + q[1:]


def split_question(text: str, default: str = DEFAULT_QUESTION) -> tuple[str, str, str]:
    """(vignette without its question, question, source) for one case text (SPEC section 3).

    The question is the text's last sentence when it ends in "?" (closing quotes and trailing
    whitespace tolerated) or in ":" (MedQA's "Which of the following is the most likely
    diagnosis:" / "... findings would most likely include:"); it is cleaned by
    :func:`clean_question`. A "?" inside an earlier quoted remark is not the question. Without such a
    closing sentence the whole text is the vignette and ``default`` the question (source ``default``).
    """
    body = (text or "").strip()
    tail = re.search(r"([?:])[" + re.escape(_CLOSERS) + r"\s]*$", body)
    if not tail:
        return body, default, "default"
    end = tail.start(1) + 1
    start = _sentence_start(body, end - 1)
    question = clean_question(body[start:end])
    vignette = body[:start].strip()
    if not vignette or len(question.split()) < 2:
        return body, default, "default"
    return vignette, question, "vignette"


def answer_index(answer: str, choices: list[str]) -> int | None:
    """Which choice is the correct answer: the same matcher as for model answers, without the letter step.

    Catches trailing-space variants in the published file ('Melanoma ' vs 'Melanoma'); returns None
    when the answer matches no choice (one published case: 'Henoch-Scholein vasculitis' vs 'IgA vasculitis').
    """
    if not choices:
        return None
    stripped = [c.strip().lower() for c in choices]
    if answer.strip().lower() in stripped:
        return stripped.index(answer.strip().lower())
    idx, how = match_choice(answer, choices, fuzzy_threshold=90.0)
    return idx if how in ("exact", "contains", "fuzzy") else None


def load_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in CSV_COLUMNS if c not in header]
        if missing:
            raise DataError(f"{path}:1: missing column(s) {', '.join(missing)} (expected {', '.join(CSV_COLUMNS)}; an unnamed index column first is allowed)")
        cases, seen = [], set()
        for row in reader:
            line = reader.line_num
            cid = (row.get("case_id") or "").strip()
            if not cid:
                raise DataError(f"{path}:{line}: empty case_id")
            if cid in seen:
                raise DataError(f"{path}:{line}: duplicate case_id {cid!r}")
            seen.add(cid)
            vignette = (row.get("case_vignette") or "").strip()
            answer = (row.get("answer") or "").strip()
            if not vignette or not answer:
                raise DataError(f"{path}:{line}: case {cid}: empty case_vignette or answer")
            choices = [(row.get(f"choice_{i}") or "").strip() for i in range(1, 5)]
            if any(not c for c in choices):
                raise DataError(f"{path}:{line}: case {cid}: empty choice")
            body, question, qsource = split_question(vignette)
            cases.append({
                "case_id": cid, "vignette": body, "vignette_full": vignette, "question": question, "question_source": qsource, "choices": choices, "answer": answer,
                "answer_index": answer_index(answer, choices), "specialty": (row.get("category") or "").strip() or "unknown",
                "dataset": (row.get("dataset") or "").strip(), "source": f"{path.name}:{line}",
            })
    return cases


def _flatten(value, indent: str = "") -> list[str]:
    """OSCE sub-objects (nested dicts/lists) as readable lines."""
    if isinstance(value, dict):
        lines = []
        for k, v in value.items():
            label = k.replace("_", " ")
            if isinstance(v, (dict, list)):
                lines.append(f"{indent}{label}:")
                lines.extend(_flatten(v, indent + "  "))
            else:
                lines.append(f"{indent}{label}: {v}")
        return lines
    if isinstance(value, list):
        return [f"{indent}- {', '.join(map(str, value))}"] if all(not isinstance(x, (dict, list)) for x in value) else [l for x in value for l in _flatten(x, indent)]
    return [f"{indent}{value}"]


def osce_vignette(actor: dict) -> str:
    """The patient-actor section of an OSCE case as a vignette paragraph (what the patient can tell)."""
    parts = []
    demo = actor.get("Demographics")
    if demo:
        parts.append(f"A {demo}.")
    if actor.get("History"):
        parts.append(str(actor["History"]).strip())
    sym = actor.get("Symptoms") or {}
    if isinstance(sym, dict):
        if sym.get("Primary_Symptom"):
            parts.append(f"Main symptom: {sym['Primary_Symptom']}.")
        sec = sym.get("Secondary_Symptoms")
        if sec:
            parts.append(f"Other symptoms: {', '.join(map(str, sec)) if isinstance(sec, list) else sec}.")
    for key, label in (("Past_Medical_History", "Past medical history"), ("Medications", "Medications"), ("Current_Medications", "Current medications"),
                       ("Drug_History", "Drug history"), ("Social_History", "Social history"), ("Review_of_Systems", "Review of systems")):
        v = actor.get(key)
        if v:
            text = v if isinstance(v, str) else "; ".join(l.strip() for l in _flatten(v))
            parts.append(f"{label}: {str(text).strip().rstrip('.')}.")
    return " ".join(parts)


def load_osce(path: Path) -> list[dict]:
    """AgentClinic OSCE JSONL: Patient_Actor -> vignette, Correct_Diagnosis -> answer.

    The OSCE cases carry no answer choices, so ``choices`` is [] and only FRQ is asked
    (MCQ is skipped and recorded as such). Case ids are ``osce_<line-1>``; specialty is 'OSCE'.
    """
    cases = []
    for lineno, row in iter_jsonl(path):
        osce = row.get("OSCE_Examination")
        if not isinstance(osce, dict) or not isinstance(osce.get("Patient_Actor"), dict) or not osce.get("Correct_Diagnosis"):
            raise DataError(f"{path}:{lineno}: expected OSCE_Examination with Patient_Actor and Correct_Diagnosis")
        choices = osce.get("Choices") or []
        answer = str(osce["Correct_Diagnosis"]).strip()
        text = osce_vignette(osce["Patient_Actor"])
        cases.append({
            "case_id": str(row.get("id", f"osce_{lineno - 1}")), "vignette": text, "vignette_full": text,
            "question": DEFAULT_QUESTION, "question_source": "default",
            "choices": choices, "answer": answer, "answer_index": answer_index(answer, choices) if choices else None,
            "specialty": "OSCE", "dataset": "agentclinic", "source": f"{path.name}:{lineno}",
        })
    return cases


def load_cases(path: str | Path, *, specialty: str | None = None, limit: int | None = None) -> list[dict]:
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file")
    if p.suffix.lower() == ".csv":
        cases = load_csv(p)
    elif p.suffix.lower() in (".jsonl", ".json"):
        cases = load_osce(p)
    else:
        raise DataError(f"{p}: unknown case format (expected a CRAFT-MD .csv or an AgentClinic OSCE .jsonl)")
    if specialty:
        wanted = specialty.strip().lower()
        known = sorted({c["specialty"] for c in cases})
        cases = [c for c in cases if c["specialty"].lower() == wanted]
        if not cases:
            raise DataError(f"{p}: no case of specialty {specialty!r}; specialties here: {', '.join(known)}")
    return cases[:limit] if limit else cases
