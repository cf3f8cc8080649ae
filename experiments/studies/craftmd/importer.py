"""`medstack import craftmd`: the CRAFT-MD authors' per-case result files -> one typed record per (case, trial), as
a local run's, its grades the release's (FRQ: the authors' grader; MCQ: our one choice mapper) and the patient checks
run over it, so `compare` treats both alike (the input, MCQ mapping and published grades: the study README).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

from experiments.common.choice import MCQ_RULES, map_choice
from experiments.common.grade import Grade, score_name, to_disk
from experiments.common.markdown import pct
from experiments.common.patient_checks import DEFAULT_SPAN_WORDS
from experiments.core.record import record
from experiments.core.results import ConfigView, Run, RunDir
from experiments.core.scorers import figures, scores_markdown
from experiments.studies.craftmd import grading
from experiments.studies.craftmd.data import answer_index, load_cases
from experiments.studies.craftmd.metrics import figure_of, grades, per_specialty, run_metrics, summary_markdown
from experiments.studies.craftmd.protocol import stop_reason_for
from experiments.studies.craftmd.scorers import MCQ_RULE, PATIENT, SCORERS, frq_grade, mcq_grade
from experiments.studies.craftmd.settings import FORMATS
from experiments.tables.render import run_paper_tables
from models.errors import DataError, MedstackError

CASES_SET = "craftmd-cases"  # the registered case set whose choices and specialties an import takes by default

ROLE_TO_AGENT = {"user": "patient", "patient": "patient", "human": "patient", "assistant": "doctor", "doctor": "doctor", "clinician": "doctor", "model": "doctor"}


def choices_from_question(question: str) -> list[str]:
    found = re.findall(r"^\s*\(?([A-Da-d])[.):]\s*(.+?)\s*$", question or "", flags=re.M)
    return [t for _, t in found] if len(found) == 4 else []


def is_doctor_instruction(text: str) -> bool:
    """The doctor's prompt as a message: the open-model release sends it as the first ``user`` turn."""
    return bool(re.match(r"\s*you are an? ", text or "", flags=re.I))


def parse_conversation(conv, where: str) -> list[dict]:
    """A published conversation (list of {role, content} / [role, text] pairs, or 'Doctor: ...' / 'Doctor-AI : ...' lines)
    -> transcript, the doctor's instructions dropped and its greeting turn 0 (the study README, `import craftmd`)."""
    if conv is None:
        return []
    turns: list[tuple[str, str]] = []
    if isinstance(conv, str):
        for line in conv.splitlines():
            m = re.match(r"^\s*\**\s*(doctor|patient|assistant|user|clinician)(?:[- ]?ai)?\s*\**\s*:\s*(.*)$", line, flags=re.I)
            if m:
                turns.append((ROLE_TO_AGENT[m.group(1).lower()], m.group(2).strip()))
            elif turns and line.strip():
                turns[-1] = (turns[-1][0], (turns[-1][1] + " " + line.strip()).strip())
    elif isinstance(conv, list):
        for i, t in enumerate(conv):
            if isinstance(t, dict):
                role, content = str(t.get("role", "")).lower(), t.get("content", "")
            elif isinstance(t, (list, tuple)) and len(t) == 2:
                role, content = str(t[0]).lower(), t[1]
            else:
                raise DataError(f"{where}: conversation item {i} is neither {{role, content}} nor [role, text]")
            if role == "system":
                continue
            if role not in ROLE_TO_AGENT:
                raise DataError(f"{where}: conversation item {i} has unknown role {role!r}")
            turns.append((ROLE_TO_AGENT[role], str(content).strip()))
    else:
        raise DataError(f"{where}: multiturn_conversation must be a list or a string")
    if turns and turns[0][0] == "patient" and is_doctor_instruction(turns[0][1]):
        turns = turns[1:]
    out, turn, patient_spoke = [], 0, False
    for agent, content in turns:
        patient_spoke = patient_spoke or agent == "patient"
        if agent == "doctor" and patient_spoke:
            turn += 1
        out.append({"role": agent, "text": content, "turn": turn})
    return out


def doctor_turns(transcript: list[dict]) -> int:
    """The doctor's turns after the patient first spoke (a greeting before it is turn 0, not counted)."""
    return sum(t["role"] == "doctor" and t["turn"] > 0 for t in transcript)


def infer_stop(transcript: list[dict], cap: int | None = None) -> str | None:
    """The stop reason of a published conversation, by the run's rules on its closing doctor turn; a question at
    ``cap`` doctor turns (or a cut after the patient's answer) -> turn_cap, before it -> unknown."""
    if not transcript:
        return None
    last = transcript[-1]
    if last["role"] == "patient":
        return "turn_cap"
    if last["turn"] == 0:
        return "unknown"
    reason = stop_reason_for(last["text"], "Final Diagnosis")
    if reason:
        return reason
    return "turn_cap" if cap is not None and doctor_turns(transcript) >= cap else "unknown"


def infer_cap(transcripts: list[list[dict]]) -> int | None:
    """The release's turn cap in doctor turns: the most common length of the conversations that end on a doctor's
    question without the marker (only a cap stops those); None when there are none (the GPT releases)."""
    lengths = Counter(doctor_turns(t) for t in transcripts
                      if t and t[-1]["role"] == "doctor" and t[-1]["turn"] > 0 and stop_reason_for(t[-1]["text"], "Final Diagnosis") is None)
    return lengths.most_common(1)[0][0] if lengths else None


def mcq_graded(text, choices: list[str], correct: str) -> Grade:
    """A released MCQ answer mapped by our one rule: to the case's four choices, or, where the release has none, to the
    correct answer alone (``metadata.mapping``)."""
    text = "" if text is None else str(text)
    if choices:
        g = mcq_grade(text, choices, answer_index(correct, choices))
        return replace(g, metadata={**g.metadata, "mapping": "choices"})
    idx, how = map_choice(text, [correct])
    return Grade(value=int(idx == 0), answer=text, source=how, metadata={"choice": None, "mapping": "answer_only"}, judge={"rule": MCQ_RULE})


def frq_graded(trial: dict, fmt: str) -> Grade:
    """The published grade: 1 right, 0 wrong, -1 (the authors' "no answer") counted as wrong (0)."""
    ev = trial.get(f"evaluation_{fmt}_frq")
    extracted = trial.get(f"extracted_ans_{fmt}_frq")
    try:
        published = None if ev is None or ev == "" else int(float(ev))
    except (TypeError, ValueError):
        published = None
    correct = None if published is None else int(published == 1)
    status = grading.classify_extracted(extracted)[1] if isinstance(extracted, str) else None
    g = frq_grade(trial.get(f"{fmt}_frq"), {"extracted": extracted, "extraction_status": status, "correct": correct,
                                            "grade_source": "published" if correct is not None else "unscored_missing"}, {"model": "published"})
    if published is not None and published not in (0, 1):
        g = replace(g, metadata={**g.metadata, "published_evaluation": published})
    return g


def convert_file(path: Path, name: str, cases_by_id: dict) -> list[dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, dict) or "case_id" not in data:
        raise DataError(f"{path}: expected an object with case_id, case_vignette, correct_ans and trial_0..")
    cid = str(data["case_id"])
    correct = str(data.get("correct_ans") or data.get("answer") or "").strip()
    if not correct:
        raise DataError(f"{path}: case {cid}: no correct_ans")
    case = cases_by_id.get(cid, {})
    choices = data.get("choices") or data.get("options") or choices_from_question(data.get("question", "")) or case.get("choices") or []
    if isinstance(choices, dict):
        choices = [choices[k] for k in sorted(choices)]
    trials = sorted((k for k in data if re.fullmatch(r"trial_\d+", k)), key=lambda k: int(k.split("_")[1]))
    if not trials:
        raise DataError(f"{path}: case {cid}: no trial_<k> entries")
    # an MCQ format another trial of this case has but this one lacks is recorded unparsed (= wrong), never dropped
    mcq_formats = [f for f in FORMATS if any(isinstance(data[k], dict) and f"{f}_mcq" in data[k] for k in trials)]
    inputs = {"question": data.get("question"), "facts": str(data.get("case_vignette") or case.get("vignette") or ""),
              "choices": choices if len(choices) == 4 else [], "answer_index": answer_index(correct, choices) if len(choices) == 4 else None,
              "specialty": data.get("category") or data.get("specialty") or case.get("specialty") or "unknown", "dataset": data.get("dataset") or case.get("dataset")}
    records = []
    for key in trials:
        trial, k = data[key], int(key.split("_")[1])
        where = f"{path} ({key})"
        if not isinstance(trial, dict):
            raise DataError(f"{where}: expected an object")
        transcript = parse_conversation(trial.get("multiturn_conversation"), where)
        answers, scores = {}, {}  # the published grades and our MCQ mapping, typed
        for fmt in FORMATS:
            if f"{fmt}_mcq" in trial or fmt in mcq_formats:
                answers.setdefault(fmt, {})["mcq"] = trial.get(f"{fmt}_mcq")
                g = mcq_graded(trial.get(f"{fmt}_mcq"), choices, correct)
                scores[score_name("mcq", fmt)] = g if f"{fmt}_mcq" in trial else replace(g, metadata={**g.metadata, "missing": True})
            if f"{fmt}_frq" in trial or f"evaluation_{fmt}_frq" in trial:
                answers.setdefault(fmt, {})["frq"] = trial.get(f"{fmt}_frq")
                scores[score_name("frq", fmt)] = frq_graded(trial, fmt)
        rec = record(f"{cid}/t{k}", cid, trial=k, inputs=inputs, target=correct, transcript=transcript, answer=answers,
                     scores=to_disk(scores), metadata={"model": name, "source": path.name, "imported": True,
                                                       "stop_reason": None,  # import_folder infers it once the release's turn cap is known
                                                       "n_doctor_turns": doctor_turns(transcript), "summary": trial.get("summarized_conversation")})
        rec["roles"] = {"clinical": name}
        rec["scores"].update(to_disk(PATIENT.rule(rec, ConfigView({"copy_span_words": DEFAULT_SPAN_WORDS}))))  # a rule: as a run runs it
        records.append(rec)
    return records


def import_stats(records: list[dict]) -> dict:
    """MCQ mapping counts per rule (overall and per format), the unmapped answers themselves, and
    the published FRQ grades of -1 (counted as wrong)."""
    by_rule, by_fmt, unmapped = Counter(), {}, []
    answer_only = 0
    minus_one: Counter = Counter()
    for r in records:
        for (fmt, mode), g in grades(r).items():
            if mode == "frq":
                minus_one[fmt] += g.metadata.get("published_evaluation") == -1
                continue
            rule = g.source
            by_rule[rule] += 1
            by_fmt.setdefault(fmt, Counter())[rule] += 1
            answer_only += g.metadata.get("mapping") == "answer_only"
            if rule == "unparsed":
                unmapped.append({"id": r["id"], "format": fmt, "answer": "(no answer in the file)" if g.metadata.get("missing") else g.answer})
    minus_one = +minus_one
    order = {k: i for i, k in enumerate(MCQ_RULES)}
    return {
        "grades": "published", "concurrent_rule": "any",
        "mcq_mapping": {"rule": " > ".join(MCQ_RULES), "counts": dict(sorted(by_rule.items(), key=lambda kv: order.get(kv[0], 99))),
                        "per_format": {f: dict(sorted(c.items(), key=lambda kv: order.get(kv[0], 99))) for f, c in by_fmt.items()},
                        "answer_only": answer_only, "unmapped": len(unmapped)},
        "mcq_unmapped": unmapped,
        "frq_published_minus_one": dict(minus_one),
    }


def default_cases() -> str | None:
    """The registered case set's file when it is fetched (an import takes choices and specialties from it), else None."""
    from experiments.datasets.registry import is_fetched, load_registry, main_path

    ds = load_registry().get(CASES_SET)
    return str(main_path(ds)) if ds is not None and is_fetched(ds) else None


def lacks_case_fields(records: list[dict]) -> bool:
    """Whether some record has no MCQ choices or no specialty: what a case file gives an import."""
    return any(not (r.get("inputs") or {}).get("choices") or (r.get("inputs") or {}).get("specialty") == "unknown" for r in records)


def import_folder(src: str | Path, name: str, out: str | Path, cases_csv: str | None = None, *, need_cases: bool = False) -> dict:
    """The release folder ``src`` as a results folder ``out``. ``need_cases``: without ``cases_csv``, a release whose files
    lack MCQ choices or specialties is refused (DataError naming --cases) instead of imported with them unknown."""
    src = Path(src)
    if not src.is_dir():
        raise MedstackError(f"{src} is not a folder of CRAFT-MD result files")
    files = sorted(src.glob("*.json"))
    if not files:
        raise DataError(f"{src}: no *.json result files")
    cases_by_id = {c["case_id"]: c for c in load_cases(cases_csv)} if cases_csv else {}
    config = {"experiment": "craftmd", "name": name, "imported_from": str(src.resolve()), "cases": cases_csv,
              "mcq_mapping": "experiments.studies.craftmd.grading.map_choice: " + " > ".join(MCQ_RULES),
              "grades": "published", "concurrent_rule": "any"}
    converted = [rec for f in files for rec in convert_file(f, name, cases_by_id)]  # all files valid before anything is written
    if need_cases and not cases_csv and lacks_case_fields(converted):
        from experiments.datasets.registry import fetch_hint, load_registry

        raise DataError(f"{src}: the result files hold no MCQ choices or specialties and {CASES_SET} is not fetched: pass --cases "
                        f"CASES.csv, or fetch it and the import reads it: {fetch_hint(load_registry()[CASES_SET])}")
    cap = infer_cap([rec["transcript"] for rec in converted])  # the turn cap is a property of the whole release
    for rec in converted:
        rec["metadata"]["stop_reason"] = infer_stop(rec["transcript"], cap)
    rundir = RunDir(Path(out), config)
    done = rundir.done_ids()
    rundir.append_many([rec for rec in converted if rec["id"] not in done])
    identity = rundir.write_identity({"clinical": {"alias": name, "imported_from": str(src.resolve())}})
    records = rundir.records()
    metrics = run_metrics(records)
    metrics["per_specialty"] = per_specialty(records)
    metrics.update(import_stats(records))
    metrics["turn_cap_inferred"] = cap
    metrics["scores"] = [f.json() for f in figures(records, SCORERS)]  # as the runner aggregates a live run's
    rundir.write_metrics(metrics)
    run = Run(rundir.path, records, [], config, metrics=metrics, identity=identity)
    rundir.write_summary(summary_markdown(name, metrics) + "\n" + run_paper_tables(run, importing_study()) + "\n"
                         + scores_markdown(metrics["scores"], SCORERS))
    return metrics


def importing_study():
    """The study whose runs an import is (its paper tables)."""
    from experiments.core.registry import study_for

    return study_for("craftmd")


def import_lines(metrics: dict, out: str | Path, cases_csv: str | None) -> list[str]:
    """What the terminal says of an import: a few lines and where summary.md is (never the summary itself)."""
    acc = lambda mode: ", ".join(f"{f} {pct(fig['value'])}" for f in FORMATS if (fig := figure_of(metrics, f, mode)))  # noqa: E731
    mapping = metrics.get("mcq_mapping") or {}
    n_mcq = sum((mapping.get("counts") or {}).values())
    specialties = [s for s in metrics.get("per_specialty") or {} if s != "unknown"]
    lines = [f"imported {metrics['records']} records ({metrics['cases']} cases) into {out}",
             *([f"MCQ accuracy: {a}"] if (a := acc("mcq")) else []), *([f"FRQ accuracy (published grades): {a}"] if (a := acc("frq")) else [])]
    if n_mcq:
        lines.append(f"MCQ answers mapped to a choice: {pct(1 - mapping.get('unmapped', 0) / n_mcq)} "
                     f"({mapping.get('unmapped', 0)} of {n_mcq} unmapped, scored wrong)")
    lines.append(f"specialties: {len(specialties)}" + (f" (cases from {cases_csv})" if cases_csv else " (no case file)")
                 + ("; some unknown" if "unknown" in (metrics.get("per_specialty") or {}) else ""))
    lines.append(f"summary: {Path(out) / 'summary.md'}")
    return lines
