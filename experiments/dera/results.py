"""DERA's results for the tools over results (experiments/core/study.py, ``StudyResults``): each record's typed scores,
the upgrade of an older DERA-QA record, and the two LLM judges of open-ended DERA-QA (review, calibrate, rescore).

Typed scores (experiments/common/grade.py), values equal to the record's own fields that the metrics read:

- dera-qa, open-ended: ``llm-exact/<arm>`` (``exact``), ``llm-similarity/<arm>`` (``similarity_raw``, the judge's number
  as given: the metrics and the review set out-of-range values over the run, :func:`~experiments.dera.qa_metrics.normalize_similarity`),
  ``bertscore/<arm>`` (a rule); judge = the judge role's model and the hash of its template. An arm without an answer
  was never judged: 0 by the rule ``no answer`` (as the metrics count it).
- dera-qa, multiple choice: ``accuracy/<arm>`` (the rule: the voted letter is ``answer_idx``).
- dera-summarize / dera-careplan / dera-corrupt: ``gptf1/<arm>`` (the average over the scored sections) and
  ``gptf1/<arm>/<section>``, each ``{precision, recall, f1}`` (None when unscored); judge = the judge role's model and the
  hash of the two GPT-F1 templates.
"""

from __future__ import annotations

from dataclasses import replace

from experiments.common.grade import Grade, grades
from experiments.core.judging import BINARY, UNIT, Judge
from experiments.core.study import CaseContext, StudyResults
from experiments.dera.calls import CaseLog
from experiments.dera.prompts import PROMPTS
from experiments.dera.qa_metrics import ARMS, arm_scores, ask_exact, ask_similarity, normalize_similarity, upgrade
from experiments.dera.report import gptf1_grades
from experiments.dera.settings import QASettings

NO_ANSWER = {"rule": "no answer"}  # every sample unusable: not judged, scored 0
GPTF1_TEMPLATES = ("gptf1_extract", "gptf1_verify")


def _judge(record: dict, settings, *templates: str) -> dict:
    """Who judged: the judge role's model and the hash of the template(s), as the record used them when it says."""
    stored = record.get("prompt_hashes") or {}
    h = stored[templates[0]] if len(templates) == 1 and templates[0] in stored else PROMPTS.hash(*templates)
    return {"model": (settings.roles or {}).get("judge"), "prompt_hash": h}


# ------------------------------------------------------------------ typed scores

def qa_scores(record: dict, settings) -> dict[str, Grade]:
    out: dict[str, Grade] = {}
    for arm, s in arm_scores(record).items():
        answer = s.get("answer")
        if record.get("mcq"):
            out[f"accuracy/{arm}"] = Grade(value=s.get("accuracy"), answer=answer, source="letter",
                                           judge={"rule": "the voted letter is answer_idx"})
            continue
        asked = bool(answer)
        out[f"llm-exact/{arm}"] = Grade(value=s.get("exact"), answer=answer, source="first line True/False" if asked else "no answer",
                                        explanation=s.get("exact_explanation"),
                                        judge=_judge(record, settings, "judge_exact") if asked else NO_ANSWER)
        out[f"llm-similarity/{arm}"] = Grade(value=s.get("similarity_raw"), answer=answer, source="first number" if asked else "no answer",
                                             explanation=s.get("similarity_reply"), metadata={"normalized": "over the run"} if asked else {},
                                             judge=_judge(record, settings, "judge_similarity") if asked else NO_ANSWER)
        out[f"bertscore/{arm}"] = Grade(value=s.get("bertscore"), answer=answer, source="bertscore F1" if asked else "no answer",
                                        judge={"rule": "bertscore F1" if asked else "no answer"},
                                        metadata={"encoder": settings.bertscore_model, "layer": settings.bertscore_layer} if asked else {})
    return out


def dialogue_scores(record: dict, settings) -> dict[str, Grade]:
    """GPT-F1 per arm (initial, dera, dera_vs_initial) and section, from :func:`~experiments.dera.report.gptf1_grades`."""
    judge = _judge(record, settings, *GPTF1_TEMPLATES)
    out: dict[str, Grade] = {}
    for arm, (sections, average) in gptf1_grades(record).items():
        out[f"gptf1/{arm}"] = replace(average, judge=judge, source="mean over the scored sections")
        for section, g in sections.items():
            out[f"gptf1/{arm}/{section}"] = replace(g, judge=judge, metadata={k: v for k, v in g.metadata.items() if v})
    return out


# ------------------------------------------------------------------ the LLM judges of open-ended DERA-QA

def show(record: dict, part: str | None, config: dict) -> dict:
    """What both judges were given: the question, the gold answer and the arm's prediction."""
    return {"question": record.get("question"), "gold answer": record.get("gold_text") or record.get("gold"),
            "prediction": (arm_scores(record).get(part) or {}).get("answer")}


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
        pred = (arm_scores(record).get(part) or {}).get("answer")
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
DIALOGUE_RESULTS = {name: StudyResults(experiment=name, scores=dialogue_scores)
                    for name in ("dera-summarize", "dera-careplan", "dera-corrupt")}
