"""DERA's results for the tools over results (experiments/core/study.py, ``StudyResults``): the typed scores of a record
written before them, and the two LLM judges of open-ended DERA-QA (review, calibrate, rescore).

The typed scores (``llm-exact/<arm>``, ``llm-similarity/<arm>``, ``bertscore/<arm>``, ``accuracy/<arm>``,
``gptf1/<arm>[/<section>]``) are listed in experiments/studies/dera/README.md, Records and results. An arm without an answer
was never judged: 0 by the rule ``no answer``. An older QA record kept them per arm under ``scores`` with a ``correct``
flag (the DERA arm's): read as the typed scores (:func:`qa_scores`), the flag dropped.
"""

from __future__ import annotations

from experiments.common.grade import Grade, grades
from experiments.core.judging import BINARY, UNIT, Judge
from experiments.core.study import CaseContext, StudyResults
from experiments.studies.dera.calls import CaseLog
from experiments.studies.dera.prompts import PROMPTS
from experiments.studies.dera.qa_metrics import ARMS, NO_ANSWER, arm_grades, ask_exact, ask_similarity, normalize_similarity
from experiments.studies.dera.report import gptf1_scores
from experiments.studies.dera.settings import QASettings

def _judge(record: dict, settings, template: str) -> dict:
    """Who judged: the judge role's model and the hash of the template, as the record used it when it says."""
    h = (record.get("prompt_hashes") or {}).get(template) or PROMPTS.hash(template)
    return {"model": (settings.roles or {}).get("judge"), "prompt_hash": h}


# ------------------------------------------------------------------ typed scores

def qa_scores(record: dict, settings) -> dict[str, Grade]:
    """An older record's typed scores, from the per-arm values it kept under ``scores``."""
    bert = {"encoder": settings.bertscore_model, "layer": settings.bertscore_layer}
    return {name: g for arm, s in (record.get("scores") or {}).items()
            for name, g in arm_grades(arm, s, bool(record.get("mcq")), lambda t: _judge(record, settings, t), bert).items()}


def upgrade(record: dict) -> dict:
    """An older record in today's shape: without the fields that restated the DERA arm's grade, and with each arm's
    answer under ``answers`` (an older QA record kept it among the arm's values under ``scores``)."""
    out = {k: v for k, v in record.items() if k not in ("correct", "score", "improved")}
    if "answers" not in out and out.get("question") is not None and isinstance(out.get("scores"), dict):
        out["answers"] = {arm: s.get("answer") for arm, s in out["scores"].items() if isinstance(s, dict)}
    return out


def dialogue_scores(record: dict, settings) -> dict[str, Grade]:
    """An older record's GPT-F1 per arm (initial, dera, dera_vs_initial) and section (and its ``score`` and ``improved``
    dropped by :func:`upgrade`: they restated the DERA arm's average)."""
    return gptf1_scores(record.get("gptf1") or {}, (settings.roles or {}).get("judge"))


# ------------------------------------------------------------------ the LLM judges of open-ended DERA-QA

def show(record: dict, part: str | None, config: dict) -> dict:
    """What both judges were given: the question, the gold answer and the arm's prediction."""
    return {"question": record.get("question"), "gold answer": record.get("gold_text") or record.get("gold"),
            "prediction": (record.get("answers") or {}).get(part)}


def _items(step: str):
    """Review items as the review showed them before typed scores: one per question and arm that the judge was asked
    (an arm without an answer has no decision to check); similarity as the run reports it, normalized over the run."""
    unit = step == "llm-similarity"

    def build(records, config, path):
        rows = [(r, arm, grades(r).get(f"{step}/{arm}")) for r in records if not r.get("mcq") for arm in ARMS]
        rows = [(r, arm, g) for r, arm, g in rows if g is not None]
        vals = [g.value for _, _, g in rows]
        vals = normalize_similarity(vals) if unit else vals
        items = []
        for (r, arm, g), v in zip(rows, vals):
            if v is None or not g.answer:
                continue
            level = ("high" if v >= 0.5 else "low") if unit else str(int(v))
            items.append({"id": f"{r['id']}|{arm}", "verdict": float(v) if unit else int(v), "stratum": f"{level}|{arm}|{r.get('model', '')}",
                          "show": show(r, arm, config)})
        return (UNIT if unit else BINARY), items

    return build


def _ask(step: str):
    """Ask the judge again over the stored prediction of arm ``part``, with the study's prompt, sampling and parser;
    an arm without an answer is 0 by rule, as in the run (nothing is asked)."""
    exact = step == "llm-exact"

    async def ask(ctx: CaseContext, record: dict, part: str | None, settings: QASettings, role: str) -> Grade:
        pred = (record.get("answers") or {}).get(part)
        if not pred:
            return Grade(value=0 if exact else 0.0, answer=pred, source="no answer", judge=NO_ANSWER)
        log = CaseLog(ctx)
        question, gold = record.get("question"), record.get("gold_text") or record.get("gold")
        value, reply = await (ask_exact if exact else ask_similarity)(log, question, gold, pred, settings, part, role)
        template = "judge_exact" if exact else "judge_similarity"
        return Grade(value=value, answer=pred, source="first line True/False" if exact else "first number", explanation=reply,
                     metadata={} if exact else {"normalized": "over the run"},
                     judge={"model": settings.roles[role], "prompt_hash": PROMPTS.hash(template)})

    return ask


QA_JUDGES = (
    Judge("llm-exact", BINARY, "Does the prediction give the same answer as the gold answer?", show=show,
          items=_items("llm-exact"), ask=_ask("llm-exact")),
    Judge("llm-similarity", UNIT, "How close is the prediction to the gold answer, from 0 (unrelated) to 1 (the same answer)?",
          show=show, items=_items("llm-similarity"), ask=_ask("llm-similarity")),
)

QA_RESULTS = StudyResults(experiment="dera-qa", scores=qa_scores, upgrade=upgrade, judges=QA_JUDGES)
DIALOGUE_RESULTS = {name: StudyResults(experiment=name, scores=dialogue_scores, upgrade=upgrade)
                    for name in ("dera-summarize", "dera-careplan", "dera-corrupt")}
