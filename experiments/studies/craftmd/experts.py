"""The CRAFT-MD authors' expert assessment of multi-turn conversations: read, combined, summarised.

The release: three workbooks (raters d1, d2 and the tie-breaker d3), one sheet per model, a few instruction lines
then the header row :data:`HEADER` + Q1, Q2, Q3. The questions and how labels are combined: the study README.
"""

from __future__ import annotations

import itertools
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from experiments.common.markdown import md_table, num
from experiments.common.stats import mcnemar_test, mean_ci
from experiments.studies.craftmd.importer import doctor_turns, parse_conversation
from experiments.studies.craftmd.metrics import PAPER_LABELS
from models.errors import DataError

EXPERT_QUESTIONS = ("Q1", "Q2", "Q3")
QUESTION_TEXT = {
    "Q1": "one most likely diagnosis reachable from the conversation",
    "Q2": "the conversation covers the vignette's key information",
    "Q3": "the patient-AI uses medical terminology",
}
# normalised model names, in the paper's order; sheet names as released -> ours
PAPER_MODELS = ("gpt-4", "gpt-3.5", "mistral-v2-7b", "llama-2-7b")
SHEETS = {"gpt-4": "gpt-4", "gpt4": "gpt-4", "gpt-3.5": "gpt-3.5", "gpt3.5": "gpt-3.5", "llama2": "llama-2-7b",
          "llama-2": "llama-2-7b", "llama-2-7b": "llama-2-7b", "mistral-v2": "mistral-v2-7b", "mistral-v2-7b": "mistral-v2-7b"}
RATER_FILES = {
    "d1": "validation_clinicalllm_patientai_d1.xlsx",
    "d2": "validation_clinicalllm_patientai_d2.xlsx",
    "d3": "validation_clinicallm_patientai_tiebreak_d3.xlsx",
}
HEADER = ("case_id", "case_vignette", "question", "multi-turn conversation", "final diagnosis", "correct diagnosis")


@dataclass(frozen=True)
class ExpertConversation:
    """One released conversation with its experts' labels (True = yes, False = no, None = blank)."""

    model: str
    case_id: str
    vignette: str
    question: str
    conversation: str
    final_diagnosis: str
    correct_diagnosis: str
    raters: dict = field(default_factory=dict)    # "d1"/"d2"/"d3" -> {"Q1": bool | None, ...}
    combined: dict = field(default_factory=dict)  # "Q1" -> bool | None (None: the raters disagree and no tie-break)

    @property
    def id(self) -> str:
        return f"{self.model}/{self.case_id}"

    @property
    def dual(self) -> bool:
        """Labelled by both of the first two raters."""
        return "d1" in self.raters and "d2" in self.raters

    @property
    def transcript(self) -> list[dict]:
        """The conversation as a typed record's transcript: [{role: doctor|patient, text, turn}]."""
        return parse_conversation(self.conversation, f"{self.id}: multi-turn conversation")


def _yes_no(value, where: str) -> bool | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    word = str(value).strip().lower().rstrip(".")
    if word in ("yes", "y"):
        return True
    if word in ("no", "n"):
        return False
    raise DataError(f"{where}: expected yes, no or blank, found {str(value)[:40]!r}")


def _model_of(sheet: str, where: str) -> str:
    model = SHEETS.get(sheet.strip().lower().replace(" ", ""))
    if model is None:
        raise DataError(f"{where}: sheet {sheet!r} names none of the paper's models ({', '.join(PAPER_LABELS.values())})")
    return model


def read_workbook(path: Path) -> dict[tuple[str, str], dict]:
    """One rater's workbook -> {(model, case_id): {fields..., "labels": {Q: bool | None}}}."""
    import openpyxl

    try:
        wb = openpyxl.load_workbook(path, read_only=True, data_only=True)
    except (zipfile.BadZipFile, KeyError, OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable .xlsx workbook ({type(e).__name__}: {e})") from None
    out: dict[tuple[str, str], dict] = {}
    try:
        for ws in wb.worksheets:
            model = _model_of(ws.title, f"{path}")
            header_at = None
            for n, row in enumerate(ws.iter_rows(values_only=True), 1):
                cells = [("" if c is None else str(c).strip()) for c in row]
                if header_at is None:
                    if cells and cells[0].lower() == "case_id":
                        got = tuple(c.lower() for c in cells[:len(HEADER)])
                        if got != HEADER or len(cells) < 9:
                            raise DataError(f"{path} [{ws.title}] row {n}: header {cells[:9]} is not {list(HEADER) + ['Q1', 'Q2', 'Q3']}")
                        header_at = n
                    continue
                if not any(cells):
                    continue
                where = f"{path} [{ws.title}] row {n}"
                case_id = cells[0].removesuffix(".json")
                if not case_id:
                    raise DataError(f"{where}: no case_id")
                if (model, case_id) in out:
                    raise DataError(f"{where}: case {case_id} appears twice in sheet {ws.title!r}")
                out[(model, case_id)] = {
                    "vignette": cells[1], "question": cells[2], "conversation": str(row[3] or ""),
                    "final_diagnosis": cells[4], "correct_diagnosis": cells[5],
                    "labels": {q: _yes_no(row[6 + i] if len(row) > 6 + i else None, f"{where}, {q}") for i, q in enumerate(EXPERT_QUESTIONS)},
                }
            if header_at is None:
                raise DataError(f"{path} [{ws.title}]: no header row starting with case_id")
    finally:
        wb.close()
    return out


def combine(raters: dict[str, dict]) -> dict[str, bool | None]:
    """Per question: the shared label of d1 and d2, d3's where they disagree, the one rater's otherwise."""
    out: dict[str, bool | None] = {}
    for q in EXPERT_QUESTIONS:
        a, b = (raters.get("d1") or {}).get(q), (raters.get("d2") or {}).get(q)
        if "d1" in raters and "d2" in raters and a is not None and b is not None:
            out[q] = a if a == b else (raters.get("d3") or {}).get(q)
        else:
            out[q] = a if a is not None else b
    return out


def load_expert_labels(path: str | Path) -> list[ExpertConversation]:
    """The folder of the three workbooks (the registered set ``craftmd-expert-labels``) -> conversations."""
    folder = Path(path)
    if not folder.is_dir():
        raise DataError(f"{folder}: not a folder (expected the folder of the three expert workbooks: "
                        f"{', '.join(RATER_FILES.values())}; `medstack data fetch craftmd-expert-labels` gets it)")
    missing = [name for name in RATER_FILES.values() if not (folder / name).is_file()]
    if missing:
        raise DataError(f"{folder}: missing {', '.join(missing)} (`medstack data fetch craftmd-expert-labels` gets them)")
    per_rater = {rater: read_workbook(folder / name) for rater, name in RATER_FILES.items()}
    keys = list(dict.fromkeys(k for r in ("d1", "d2") for k in per_rater[r]))
    stray = [k for k in per_rater["d3"] if k not in keys]
    if stray:
        raise DataError(f"{folder / RATER_FILES['d3']}: case {stray[0][1]} ({stray[0][0]}) is in neither rater's workbook")
    convs = []
    for key in sorted(keys, key=lambda k: (PAPER_MODELS.index(k[0]), k[1])):
        first = per_rater["d1"].get(key) or per_rater["d2"][key]
        raters = {r: per_rater[r][key]["labels"] for r in RATER_FILES if key in per_rater[r]}
        convs.append(ExpertConversation(
            model=key[0], case_id=key[1], vignette=first["vignette"], question=first["question"],
            conversation=first["conversation"], final_diagnosis=first["final_diagnosis"],
            correct_diagnosis=first["correct_diagnosis"], raters=raters, combined=combine(raters)))
    return convs


# ------------------------------------------------------------------ figures

def truncate(p: float, places: int = 4) -> str:
    """p cut (not rounded) to ``places`` decimals, as the paper prints its tables; below the last place ``< 0.0001``."""
    if p != p:
        return "n/a"
    if p < 10 ** -places:
        return f"< {10 ** -places:.{places}f}"
    return f"{math.floor(p * 10 ** places) / 10 ** places:.{places}f}"


NOT_IN_SOURCES = "not in our sources"
RECOMPUTED = "released labels, recomputed"  # the authors' own labels, recomputed here: no model's output


def rate(values: list[bool | None], *, n_boot: int = 10_000) -> dict:
    """Share of yes among the labelled values, in %, with a 95 % bootstrap CI; blanks counted apart."""
    known = [int(v) for v in values if v is not None]
    ci = mean_ci(known, n_boot=n_boot) if known else None
    return {"n": len(known), "yes": sum(known), "unlabelled": len(values) - len(known),
            "pct": 100 * ci.mean if ci else None, "ci_low": 100 * ci.low if ci else None, "ci_high": 100 * ci.high if ci else None}


def expert_metrics(convs: list[ExpertConversation], *, n_boot: int = 10_000) -> dict:
    """Rates per model and question, Q3 overall, exact McNemar per model pair (Q1, Q2), dual-label agreement."""
    models = [m for m in PAPER_MODELS if any(c.model == m for c in convs)]
    by_model = {m: [c for c in convs if c.model == m] for m in models}
    rates = {m: {q: rate([c.combined[q] for c in by_model[m]], n_boot=n_boot) for q in EXPERT_QUESTIONS} for m in models}
    overall = {q: rate([c.combined[q] for c in convs], n_boot=n_boot) for q in EXPERT_QUESTIONS}
    mcnemar = {}
    for q in ("Q1", "Q2"):
        for a, b in itertools.combinations(models, 2):
            la = {c.case_id: c.combined[q] for c in by_model[a]}
            lb = {c.case_id: c.combined[q] for c in by_model[b]}
            paired = [cid for cid in la if cid in lb and la[cid] is not None and lb[cid] is not None]
            if not paired:
                continue
            t = mcnemar_test([la[c] for c in paired], [lb[c] for c in paired], exact=True)
            mcnemar[f"{q}|{a}|{b}"] = {"question": q, "a": a, "b": b, "n_pairs": len(paired), "table": t["table"], "p_value": t["p_value"]}
    agreement = {}
    for m in models:
        dual = [c for c in by_model[m] if c.dual]
        for q in EXPERT_QUESTIONS:
            both = [c for c in dual if c.raters["d1"].get(q) is not None and c.raters["d2"].get(q) is not None]
            agreement[f"{m}|{q}"] = {"model": m, "question": q, "agree": sum(c.raters["d1"][q] == c.raters["d2"][q] for c in both),
                                     "n": len(both), "tie_broken": sum(c.raters["d1"][q] != c.raters["d2"][q] and c.combined[q] is not None for c in both),
                                     "unresolved": sum(c.combined[q] is None for c in by_model[m])}
    return {"conversations": len(convs), "per_model": {m: len(by_model[m]) for m in models},
            "dual_labelled": {m: sum(c.dual for c in by_model[m]) for m in models},
            "rates": rates, "overall": overall, "mcnemar_exact": mcnemar, "agreement": agreement}


def _pct(x: dict) -> str:
    return "n/a" if x["pct"] is None else f"{x['pct']:.2f} [{x['ci_low']:.1f}, {x['ci_high']:.1f}] ({x['yes']}/{x['n']})"


def expert_summary(metrics: dict, published: dict, source: str) -> str:
    """summary.md of an import: every figure beside its published value (docs/protocols.md, CRAFT-MD)."""
    models = list(metrics["rates"])
    lines = [
        "# CRAFT-MD expert assessment of conversations (the authors' released labels)", "",
        f"Source: {source}. {metrics['conversations']} conversations "
        f"({', '.join(f'{PAPER_LABELS[m]} {n}' for m, n in metrics['per_model'].items())}); "
        f"dual-labelled: {', '.join(f'{PAPER_LABELS[m]} {n}' for m, n in metrics['dual_labelled'].items())}.",
        "Label of a conversation: the two raters' shared label; the tie-breaker's where they disagree; "
        "the one rater's where only one labelled it. Rates are % yes with 95 % bootstrap CIs (10,000 resamples, seed 0).", "",
        "Questions: " + "; ".join(f"{q}: {t}" for q, t in QUESTION_TEXT.items()) + ".", "",
    ]
    for q, fig in (("Q1", "Fig. 3i"), ("Q2", "Fig. 3j"), ("Q3", None)):
        rows = [[PAPER_LABELS[m], _pct(metrics["rates"][m][q]), num((published.get(q) or {}).get(m), 2, NOT_IN_SOURCES)] for m in models]
        if q == "Q3":
            rows.append([f"all {metrics['conversations']}", _pct(metrics["overall"]["Q3"]), num(published.get("Q3_overall"), 2, NOT_IN_SOURCES)])
        lines += [f"## {q}: {QUESTION_TEXT[q]}" + (f" ({fig})" if fig else ""), "",
                  *md_table(["model", f"{RECOMPUTED}: % yes [95% CI] (yes/n)", "published %"], rows)]
        if q in ("Q1", "Q2"):
            lines += ["", "The paper truncates to two decimals: its 35.55 and 8.88 are 35.56 and 8.89 rounded."]
        lines.append("")
    lines += ["## Exact McNemar tests between models (Supplementary Table 18)", "",
              "Paired by case; exact binomial test on the discordant pairs; p truncated to 4 decimals as the paper prints it "
              "(below 0.0001: < 0.0001). Published: the values of the paper's Supplementary Table 18 that our sources give.", "",
              *md_table(["question", "model A", "model B", "pairs", "A yes/B no", "A no/B yes", f"p ({RECOMPUTED})", "p (published)"], [
                  [t["question"], PAPER_LABELS[t["a"]], PAPER_LABELS[t["b"]], t["n_pairs"], t["table"][0][1], t["table"][1][0], truncate(t["p_value"]),
                   num((published.get("mcnemar") or {}).get(key), 4, NOT_IN_SOURCES)] for key, t in metrics["mcnemar_exact"].items()])]
    lines += ["", "## Agreement of the two raters on the dual-labelled conversations (Extended Data Table 3)", "",
              *md_table(["model", *EXPERT_QUESTIONS], [
                  [PAPER_LABELS[m], *(f"{a['agree']}/{a['n']}" for a in (metrics["agreement"][f"{m}|{q}"] for q in EXPERT_QUESTIONS))] for m in models])]
    unresolved = sum(a["unresolved"] for a in metrics["agreement"].values())
    lines += ["", f"Disagreements broken by the third rater: {sum(a['tie_broken'] for a in metrics['agreement'].values())}; "
                  f"left without a label (no tie-break): {unresolved}.", ""]
    return "\n".join(lines)


def to_record(c: ExpertConversation) -> dict:
    """A released conversation as a typed record: the experts' labels its grades ``assess-<Q>@experts``."""
    from experiments.common.grade import Grade, score_name, to_disk
    from experiments.core.record import record
    from experiments.studies.craftmd.scorers import EXPERTS, EXPERTS_RULE

    transcript = c.transcript
    scores = {score_name(f"assess-{q}", judge=EXPERTS): Grade(value=None if v is None else int(v), source=EXPERTS,
                                                               judge={"model": "dermatologists", "rule": EXPERTS_RULE})
              for q, v in c.combined.items()}
    rec = record(c.id, c.case_id, inputs={"question": c.question, "facts": c.vignette}, target=c.correct_diagnosis, transcript=transcript,
                 answer=c.final_diagnosis, scores=to_disk(scores),
                 metadata={"model": c.model, "imported": True, "n_doctor_turns": doctor_turns(transcript),
                           "expert_raters": {r: dict(v) for r, v in c.raters.items()}, "dual_labelled": c.dual})
    rec["roles"] = {"clinical": c.model}
    return rec


def import_experts(src: str | Path, out: str | Path, *, n_boot: int = 10_000) -> dict:
    """`medstack import craftmd-experts`: records, metrics.json and summary.md in ``out``."""
    from experiments.core.results import RunDir
    from experiments.studies.craftmd.paper_values import EXPERT_PUBLISHED

    src = Path(src)
    convs = load_expert_labels(src)  # every workbook valid before anything is written
    config = {"experiment": "craftmd-experts", "name": "craftmd-experts", "imported_from": str(src.resolve())}
    rundir = RunDir(Path(out), config)
    done = rundir.done_ids()
    rundir.append_many([to_record(c) for c in convs if c.id not in done])
    rundir.write_identity({"experts": {"alias": "dermatologists", "imported_from": str(src.resolve())}})
    metrics = expert_metrics(convs, n_boot=n_boot)
    rundir.write_metrics(metrics)
    rundir.write_summary(expert_summary(metrics, EXPERT_PUBLISHED, "the CRAFT-MD authors' expert annotations (MIT)"))
    return metrics
