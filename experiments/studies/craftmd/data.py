"""Case loaders: the CRAFT-MD case CSV and AgentClinic OSCE JSONL into one case shape (and synthetic cases of that
shape: `bench --runner-scale`): ``case_id``, ``vignette`` (the text WITHOUT its closing question), ``vignette_full``
(as published), ``question`` and ``question_source`` (:func:`split_question`), ``choices`` (4, or [] when the source
has none), ``answer``, ``answer_index`` (into choices, or None), ``specialty``, ``dataset``. Bad input raises
:class:`DataError` naming the file and line.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from experiments.core.results import iter_jsonl
from models.errors import DataError, read_utf8
from experiments.common.choice import LETTERS, map_choice, pick_letter

CSV_COLUMNS = ("case_vignette", "choice_1", "choice_2", "choice_3", "choice_4", "answer", "category", "dataset", "case_id")


# The authors' question for a case whose text asks none (every dermatology case; their released
# per-case files carry exactly this string for those cases).
DEFAULT_QUESTION = "What is the final diagnosis?"

# One sentence as the authors' splitter sees it (src/utils.py get_case_without_question): from a letter
# (their class [A-z], which also takes [ \\ ] ^ _ `) up to the first run of . ! ? and an optional closing quote.
_SENTENCE = re.compile(r'([A-z][^.!?]*[.!?]*"?)')


def _ws(text: str) -> str:
    """Runs of spaces collapsed, lines stripped (line breaks kept)."""
    return "\n".join(re.sub(r"[ \t]+", " ", line).strip() for line in text.strip().split("\n"))


def split_question(text: str, default: str = DEFAULT_QUESTION) -> tuple[str, str, str]:
    """(vignette without its question, question, source) for one case text, as the authors split it
    (``get_case_without_question``; docs/protocols.md, CRAFT-MD). Our only change is whitespace: both parts are
    collapsed to single spaces (their removal leaves doubled spaces), as :mod:`experiments.studies.craftmd.check_split`
    compares them with their released case files."""
    body = text or ""  # as published: a trailing line break makes the last line empty, as in theirs
    scope = body.split("\n")[-1] if "\n" in body else body
    question = next((s for s in _SENTENCE.findall(scope) if "?" in s), None)
    if question is None:
        return _ws(body), default, "default"
    return _ws(body.replace(question, "")), _ws(question.replace("of the following", "")), "vignette"


def answer_index(answer: str, choices: list[str]) -> int | None:
    """Which choice is the correct answer: the one mapper (experiments.common.choice) by text alone, exact > contains >
    fuzzy (token_set_ratio >= 90), so 'Melanoma ' finds 'Melanoma'; a letter answer ("B") names no choice; None when
    the answer matches no choice (one published case: 'Henoch-Scholein vasculitis' vs 'IgA vasculitis')."""
    if not choices:
        return None
    stripped = [c.strip().lower() for c in choices]
    if answer.strip().lower() in stripped:
        return stripped.index(answer.strip().lower())
    return None if pick_letter(answer, LETTERS[: len(choices)]) else map_choice(answer, choices, letters=False, stated=False, first=False, fuzzy=90.0)[0]


def load_csv(path: Path) -> list[dict]:
    with io.StringIO(read_utf8(path), newline="") as f:  # not UTF-8: one line naming the file, line and byte
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
            raw = row.get("case_vignette") or ""
            vignette = raw.strip()
            answer = (row.get("answer") or "").strip()
            if not vignette or not answer:
                raise DataError(f"{path}:{line}: case {cid}: empty case_vignette or answer")
            choices = [(row.get(f"choice_{i}") or "").strip() for i in range(1, 5)]
            if any(not c for c in choices):
                raise DataError(f"{path}:{line}: case {cid}: empty choice")
            body, question, qsource = split_question(raw)
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
    """AgentClinic OSCE JSONL: Patient_Actor -> vignette, Correct_Diagnosis -> answer; no choices, so only FRQ is asked
    (MCQ skipped and recorded as such). Case ids are ``osce_<line-1>``; specialty is 'OSCE'."""
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


def load_cases(path: str | Path, *, specialty: str | None = None) -> list[dict]:
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
    return cases


SPECIALTIES = ("Dermatology", "Cardiology", "Neurology", "Gastroenterology", "Pulmonology", "Endocrinology")
VIGNETTE = ("A {age}-year-old patient presents with complaint number {i}: a {days}-day history of symptoms that began "
            "gradually and have worsened over the last few days. The patient reports intermittent discomfort, mild fatigue "
            "and poor sleep, and denies recent travel or sick contacts. Past history includes seasonal allergies; there are "
            "no regular medicines. On examination the temperature is 37.{t} C, pulse {pulse}/min and blood pressure "
            "12{bp}/8{bp} mmHg. Findings localised to the affected area are described in detail by the examining clinician, "
            "with no lymphadenopathy. Laboratory studies, including a complete blood count, are within normal limits.")


def synthetic_cases(n: int) -> list[dict]:
    """n synthetic cases as :func:`load_csv` makes them (a ~650-character vignette like the published set's)."""
    out = []
    for i in range(n):
        choices = [f"Condition {(i + k) % 40}" for k in range(4)]
        out.append({"case_id": f"case_{i}", "vignette": VIGNETTE.format(age=20 + i % 60, i=i, days=2 + i % 25, t=i % 10, pulse=60 + i % 40, bp=i % 10),
                    "question": "What is the most likely diagnosis?", "question_source": "synthetic", "choices": choices,
                    "answer": choices[i % 4], "answer_index": i % 4, "specialty": SPECIALTIES[i % len(SPECIALTIES)],
                    "dataset": "synthetic", "source": f"synthetic:{i}"})
    return out
