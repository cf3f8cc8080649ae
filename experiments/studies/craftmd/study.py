"""`medstack run craftmd`: cases × trials through the study runner (declared in __init__.py, with `medstack meld`).
Its scorers: experiments/studies/craftmd/scorers.py; older records in today's shape: :func:`upgrade_record`."""

from __future__ import annotations

import re
from pathlib import Path

from experiments.common.grade import Grade, grades, score_name, to_disk
from experiments.core.config import ConfigError, config_dir
from experiments.core.patient import check_grades
from experiments.core.record import RUNNER_FIELDS, is_typed, record
from experiments.core.study import CaseContext, Study
from experiments.tables.render import run_paper_tables
from experiments.studies.craftmd import paper_values
from experiments.studies.craftmd.data import load_cases, synthetic_cases
from experiments.studies.craftmd.metrics import conversation_markdown, per_specialty, run_metrics, summary_markdown
from experiments.studies.craftmd.prompts import PROMPTS, render
from experiments.studies.craftmd.protocol import solve
from experiments.studies.craftmd.scorers import EXPERTS, EXPERTS_RULE, MCQ_RULE, SCORERS, assess_grade, grader_judge
from experiments.studies.craftmd.settings import CraftSettings, additions, loop_line, requests_line
from serving.refs import model_name

CONFIGS = config_dir(__file__)
PUBLISHED = ("craftmd-published-gpt4_1106", "craftmd-published-gpt3_1106", "craftmd-published-mistral-v2", "craftmd-published-llama2-7b")  # experiments/datasets/datasets.yaml


def units_for(cases: list[dict], trials: int) -> list[dict]:
    """One unit of work per (case, trial), id ``<case_id>/t<trial>``."""
    return [{"id": f"{c['case_id']}/t{t}", "case": c, "trial": t} for c in cases for t in range(trials)]


def paper_model(alias: str) -> str | None:
    """The paper's model (a normalised name of experts.PAPER_MODELS) a doctor-model alias is, or None."""
    a = re.sub(r"[^a-z0-9.]", "", (alias or "").lower())
    if a.startswith("gpt4") and not a.startswith("gpt4o"):
        return "gpt-4"
    if a.startswith(("gpt3.5", "gpt35")):
        return "gpt-3.5"
    if "mistral" in a and "7b" in a and ("v0.2" in a or "v2" in a):
        return "mistral-v2-7b"
    if ("llama2" in a or "llama-2" in a) and "7b" in a:
        return "llama-2-7b"
    return None


# ------------------------------------------------------------------ older records in today's typed shape

def old_answer_grade(mode: str, a: dict, judge: dict | None) -> Grade:
    """An answer's grade from the fields an older record kept beside it (``correct``, ``grade_source`` / ``parsed_by``)."""
    frq = mode == "frq"
    match = a.get("grader_match_reply")
    if isinstance(match, dict):
        match = "\n".join(f"{given}: {reply}" for given, reply in match.items())
    meta = {"extraction_status": a.get("extraction_status"), "grader_reasks": int(a.get("grader_reasks") or 0)} if frq else {"choice": a.get("choice")}
    if frq and a.get("extracted") is not None:
        meta["extracted"] = a["extracted"]
    return Grade(value=a.get("correct"), answer=a.get("answer"), source=a["grade_source"] if "grade_source" in a else a.get("parsed_by"),
                 skipped=bool(a.get("skipped")), metadata=meta, explanation=(match or a.get("grader_extract_reply")) if frq else None,
                 judge=judge if frq else {"rule": MCQ_RULE})


def expert_labels(r: dict) -> dict[str, bool | None]:
    """The dermatologists' label per question: ``experts`` (a calibration) or ``expert_label_<Q>`` (the expert import)."""
    if isinstance(r.get("experts"), dict):
        return dict(r["experts"])
    return {k.removeprefix("expert_label_"): None if v is None else v == "yes" for k, v in r.items() if k.startswith("expert_label_")}


def old_scores(r: dict, s) -> dict[str, Grade]:
    """The typed scores of a record written before them (records_schema 1), from its own fields."""
    roles = s.roles if isinstance(getattr(s, "roles", None), dict) else {}
    published = getattr(s, "grades", None) == "published"  # an imported release's config
    judge = {"model": "published"} if published else grader_judge(roles.get("grader"), getattr(s, "verdict_rule", None))
    out = {score_name(mode, fmt): old_answer_grade(mode, a, judge) for fmt, d in (r.get("answers") or {}).items()
           for mode, a in d.items() if isinstance(a, dict)}
    out.update({f"assess-{q}": assess_grade(q, a, roles.get("assessor")) for q, a in (r.get("assessment") or {}).items() if isinstance(a, dict)})
    if isinstance(r.get("patient_checks"), dict):
        out.update({score_name("patient-check", c): g for c, g in check_grades(r["patient_checks"], r.get("choices")).items()})
    return out


def upgrade_record(r: dict, s, greeting: bool = True) -> dict:
    """A CRAFT-MD record of an older shape (its own fields: ``answers``, ``correct_answer``, ``transcript`` of
    ``agent``/``content``, ...) in today's typed shape. ``greeting``: the conversation lacks the doctor's fixed greeting
    (a live run's did; a release's holds it)."""
    if is_typed(r):
        return r
    scores = grades(r) if r.get("scores") else old_scores(r, s)
    for q, v in expert_labels(r).items():
        scores[score_name(f"assess-{q}", judge=EXPERTS)] = Grade(value=None if v is None else int(bool(v)), source=EXPERTS,
                                                                  judge={"model": "dermatologists", "rule": EXPERTS_RULE})
    said = [{"role": t.get("agent") or t.get("role"), "text": t.get("content", t.get("text")) or "", "turn": t.get("turn")}
            for t in r.get("transcript") or [] if isinstance(t, dict)]
    if greeting and said and said[0]["role"] == "patient" and not r.get("imported"):
        said = [{"role": "doctor", "text": render("greeting"), "turn": 0}, *said]
    answers = {fmt: {mode: a.get("answer") for mode, a in d.items() if isinstance(a, dict) and not a.get("skipped")}
               for fmt, d in (r.get("answers") or {}).items()}
    keep = ("model", "source", "stop_reason", "n_doctor_turns", "summary", "timing", "prompt_hashes", "imported", "final_diagnosis",
            "expert_raters", "dual_labelled", "assessment", "patient_checks")
    out = record(r["id"], r.get("case_id"), trial=int(r.get("trial") or 0),
                 inputs={"question": r.get("question"), "facts": r.get("vignette"), "choices": r.get("choices") or [],
                         "answer_index": r.get("answer_index"), "specialty": r.get("specialty"), "dataset": r.get("dataset")},
                 target=r.get("correct_answer"), transcript=said, answer=answers or r.get("answer"), scores={**to_disk(scores)},
                 metadata={k: r[k] for k in keep if k in r})
    return {**{k: v for k, v in r.items() if k in RUNNER_FIELDS}, **out}


# A paper-protocol case-trial (four formats, MCQ and FRQ) as serving/bench/README.md "Paper scale on a GPU" models it:
# 10,020 case-trials, 338,876 calls, 168,449,356 prompt tokens (46,568,942 after prefix caching), 14,752,947 output tokens
PAPER_CASE_TRIAL = {"calls": 338_876 / 10_020, "prompt": 168_449_356 / 10_020, "uncached": 46_568_942 / 10_020, "output": 14_752_947 / 10_020}


def worst_case(unit: dict, s: CraftSettings):
    """A case-trial at the protocol's limit (experiments/core/plan.py): the conversation at its turn cap, every reply at
    its max_tokens; then the summary, each format's MCQ and FRQ, the grader on each FRQ with every re-ask, the
    assessors. The conversation grows by a doctor and a patient turn a turn: the doctor's, the patient's and the
    answers' longest requests carry all of it."""
    import json

    from experiments.core.plan import WorstCase, text_tokens

    t, sp = s.max_turns, s.sampling
    d, p, a = sp["doctor"].max_tokens, sp["patient"].max_tokens, sp["answer"].max_tokens
    raw = lambda *names: "".join((PROMPTS.folder / f"{x}.txt").read_text(encoding="utf-8") for x in names)  # noqa: E731
    case = text_tokens(json.dumps(unit.get("case") or {}, ensure_ascii=False))
    talk = p + t * (d + p)  # the patient's opening, then every turn
    nf = len(s.formats)
    asked = nf * (int(s.mcq) + int(s.frq))
    longest = {"clinical": text_tokens(raw("doctor_system", "identity_specialist", "ask_mcq", "ask_frq")) + case + talk + max(d, a),
               "patient": text_tokens(raw("patient_system", "patient_authors")) + case + talk + p}
    longest["summarizer"] = text_tokens(raw("summarize")) + talk + sp["summarizer"].max_tokens
    longest["grader"] = text_tokens(raw("grader_extract", "grader_match")) + case + a + sp["grader"].max_tokens
    summary = int("summarized" in s.formats)
    grades = nf * int(s.frq) * (1 + s.grader_reasks) * 2  # extraction and match, each re-asked
    assessed = 5 if s.assess_conversations else 0
    calls = 1 + 2 * t + summary + asked + grades + assessed
    prompt = (t * (longest["clinical"] + longest["patient"] - 2 * talk) + t * t * (d + p)  # each turn's view of the talk so far
              + summary * longest["summarizer"] + asked * longest["clinical"] + grades * longest["grader"])
    output = talk + summary * sp["summarizer"].max_tokens + asked * a + grades * sp["grader"].max_tokens
    return WorstCase(longest, calls, prompt, output,
                     budget=f"{t} doctor turns, replies of at most {d} (doctor) and {p} (patient) tokens, {nf} format(s)")


class CraftmdStudy(Study):
    settings_cls = CraftSettings
    roles = ("clinical", "patient", "grader", "summarizer", "assessor")
    primary_role = "clinical"
    prompts = PROMPTS
    sweep_roles = ("clinical",)  # the doctor-AI varies; patient-AI and grader-AI stay fixed (Johri et al.)
    role_follows = {"summarizer": "grader", "assessor": "grader"}
    strata = ("dataset", "specialty")  # --sample keeps the whole set's mix of data sets and specialties
    unit_noun = "case-trials"  # each case once per trial (expand)
    scorers = SCORERS
    published = PUBLISHED
    # a dry run's doctor-AI asks once, then gives its final diagnosis; the grader's extraction and verdict, the summary
    # and the assessor's questions all follow (experiments/core/dryrun.py)
    standins = {"patient": ("(dry run) I have had an itchy rash on my arms for a week.",),
                "clinical": ("(dry run) Have you had a fever?", "Final Diagnosis: (dry run) a stand-in diagnosis", "A",
                             "(dry run) a stand-in diagnosis"),
                "summarizer": ("(dry run) a stand-in summary of the conversation.",),
                "grader": ("Yes",), "assessor": ("Verdict: Yes",)}

    @classmethod
    def runner_scale(cls, case_trials: int, trials: int, ref: str):
        """This study over synthetic cases, the paper run's call pattern (`bench --runner-scale`), and its settings:
        the paper config (all formats, MCQ + FRQ, 14-turn cap, sampled turns), every role but the assessor on ``ref``."""

        class RunnerScaleStudy(cls):
            name = "craftmd-runner-scale"

            def prepare(self, s):
                return s.model_copy(update={"name": s.name or "instant"})

            def load_cases(self, s):
                return synthetic_cases(-(-case_trials // s.trials))

            def expand(self, cases, s):
                return units_for(cases, s.trials)[:case_trials]

        return RunnerScaleStudy(), {"trials": trials, "data": "synthetic", "roles": {r: ref for r in ("clinical", "patient", "grader", "summarizer")}}

    def fixed_roles(self, s: CraftSettings) -> tuple[str, ...]:
        talks = any(f != "vignette" for f in s.formats)  # every format but the vignette has a patient-AI
        return ((("patient",) if talks else ()) + (("grader",) if s.frq else ()) + (("summarizer",) if "summarized" in s.formats else ())
                + (("assessor",) if talks and s.assess_conversations else ()))

    def default_config(self, overrides: dict) -> Path:
        return CONFIGS / "paper.yaml"

    def prepare(self, s: CraftSettings) -> CraftSettings:
        if not s.data:
            raise ConfigError("no case file: pass --data CASES.csv (or a registered name such as craftmd-cases), or an AgentClinic OSCE .jsonl")
        if not (s.mcq or s.frq):
            raise ConfigError("nothing to ask: --no-mcq and --no-frq together leave no question")
        roles = dict(s.roles)
        if not s.assess_conversations:  # the assessor is not called: not a role of this run (earlier runs' settings unchanged)
            roles.pop("assessor", None)
        return s.model_copy(update={"name": s.name or model_name(s.roles["clinical"]), "roles": roles})

    def load_cases(self, s: CraftSettings) -> list[dict]:
        return load_cases(s.data, specialty=s.specialty)

    def expand(self, cases: list[dict], s: CraftSettings) -> list[dict]:
        return units_for(cases, s.trials)

    def worst_case(self, s: CraftSettings, unit: dict):
        return worst_case(unit, s)

    def typical(self, s: CraftSettings):
        """The paper protocol's case-trial as modelled at paper scale (only for its four formats, MCQ and FRQ, 14 turns)."""
        from experiments.core.plan import Typical

        if sorted(s.formats) != sorted(["vignette", "multiturn", "singleturn", "summarized"]) or not (s.mcq and s.frq) or s.max_turns != 14:
            return None
        f = PAPER_CASE_TRIAL
        return Typical(f["calls"], f["prompt"], f["output"], f["uncached"],
                       source="serving/bench/README.md, paper scale on a GPU: 10,020 case-trials modelled from a run's templates "
                              "and the authors' LLaMA-2-7b conversations")

    async def solve(self, ctx: CaseContext, unit: dict, s: CraftSettings) -> dict:
        return await solve(ctx, unit, s)

    def upgrade(self, r: dict, s) -> dict:
        return upgrade_record(r, s)

    def metrics(self, records: list[dict], s: CraftSettings) -> dict:
        metrics = run_metrics(records)
        metrics["per_specialty"] = per_specialty(records)
        metrics["grades"] = "local grader"
        metrics["concurrent_rule"] = s.concurrent_rule
        metrics["requests"] = loop_line(s)  # the settings unlike the authors' follow under the title (the runner's metrics["deviations"])
        metrics["additions"] = additions(s)
        return metrics

    def describe(self, s: CraftSettings) -> list[str]:
        adds = additions(s)
        return [requests_line(s)] + ([f"additions to the protocol: {'; '.join(adds)}"] if adds else [])

    def summary(self, metrics: dict, s: CraftSettings, run) -> str:
        paper = paper_model(model_name(s.roles["clinical"]))
        return (summary_markdown(s.name, metrics) + conversation_markdown(metrics, paper_values.EXPERT_PUBLISHED, paper)
                + "\n" + run_paper_tables(run, self))

    def compare(self, run_dirs: list[str], out: Path) -> dict:
        from experiments.studies.craftmd.compare import run_compare

        return run_compare(run_dirs, out, self)

    def import_published(self, name: str, dest: Path, cases: str | None) -> dict:
        """One of the authors' released runs (a registered data set name) into ``dest``, named ``<release>-published``."""
        from experiments.datasets.registry import resolve_data
        from experiments.studies.craftmd.importer import default_cases, import_folder

        return import_folder(Path(resolve_data(name)), f"{name.removeprefix('craftmd-published-')}-published", dest, cases or default_cases())


class ExpertsImport(Study):
    """The kind ``craftmd-experts`` (`medstack import craftmd-experts`): released conversations, the dermatologists'
    labels their grades of the assessor's questions (``assess-<Q>@experts``)."""

    scorers = tuple(s for s in SCORERS if s.name.startswith("assess-"))

    def upgrade(self, r: dict, s) -> dict:
        return upgrade_record(r, s)
