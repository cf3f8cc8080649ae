"""AgentClinic's loop, as the authors' ``agentclinic.py`` (``main`` and its four agents) builds its requests.

Per case: up to ``inferences`` doctor requests. A doctor reply that holds ``DIAGNOSIS READY`` is the case's answer and
ends the loop; else a reply holding ``REQUEST TEST`` goes to the measurement agent, any other to the patient, and that
answer is what the doctor reads next. The last doctor request carries the final-request notice after that answer (as
theirs, the patient or measurement agent still answers the last doctor reply). The moderator (correct diagnosis + the
whole diagnosis line -> yes/no) is a scorer the runner asks after the loop (:func:`moderate`, experiments/studies/agentclinic/study.py);
a case whose doctor never gives a diagnosis is wrong, the moderator never called.

Each agent keeps its own history as one text block, sent in a single user message beside its system prompt:
the doctor's holds every (reply it read, its answer) pair; the patient's holds (doctor line, its answer) pairs and the
measurement results; the measurement agent's holds (request, result) pairs and the patient's answers. Every reply's
whitespace runs are collapsed to one space before it is used (their GPT path; ``collapse_whitespace``). Biases: one
added trait each (prompts/biases.yaml). ``final_notice`` off: no notice (their code of 13 May to 1 June 2024).
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path

import yaml

from experiments.studies.agentclinic.settings import IMPLICIT, AgentClinicSettings
from experiments.common.grade import Grade
from experiments.core.prompts import PromptSet
from experiments.core.record import record
from experiments.core.constraints import Constraint
from experiments.core.study import CaseContext

PROMPTS = PromptSet(Path(__file__).with_name("prompts"))
DIAGNOSIS, TEST = "DIAGNOSIS READY", "REQUEST TEST"
MODERATOR_TEMPLATES = ("moderator_system", "moderator_user")
NO_DIAGNOSIS = "no diagnosis within the budget: wrong, the moderator not called"
RULES = {"exact": "the reply lower-cased equals 'yes' (the authors')", "first_word": "the reply's first word yes/no, else unscored"}


@lru_cache(maxsize=None)
def biases() -> dict:
    return yaml.safe_load((PROMPTS.folder / "biases.yaml").read_text(encoding="utf-8"))


def bias_text(agent: str, kind: str) -> str:
    """The bias instruction added to ``agent``'s system prompt ('' for none), on lines of its own as theirs."""
    if kind == "none":
        return ""
    b = biases()
    text = b[agent]["implicit"].replace("$group", b["groups"][kind][agent == "patient"]) if kind in IMPLICIT else b[agent][kind]
    return f"\n{text}\n"


def facts(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def verdict(reply: str, rule: str) -> int | None:
    """The moderator's yes (1) / no (0); None (unscored) only under ``first_word`` for a reply that starts with neither."""
    said = reply.lower()
    if rule == "exact":
        return int(said == "yes")
    first = re.match(r"\W*(\w+)", said)
    return {"yes": 1, "no": 0}.get(first.group(1) if first else "")


# the demo's doctor actions (settings ``doctor_actions``): the reply held to one branch of the loop by its format
# words and their lengths are bounded, so that a small model's reply ends well within its max_tokens (a reply cut by
# the cap fails its format and counts as empty): a question of 3-12 words, a test name like Chest_X-Ray, a diagnosis
# of 1-6 words
ACTIONS = {"ask": r"[A-Za-z][A-Za-z',-]{0,11}( [A-Za-z',-]{1,12}){2,11}\?",
           "test": TEST + r": [A-Za-z][A-Za-z-]{1,15}(_[A-Za-z][A-Za-z-]{0,15}){0,2}",
           "diagnose": DIAGNOSIS + r": [A-Za-z][A-Za-z0-9']{0,14}(-[A-Za-z0-9']{1,15}){0,2}( [A-Za-z0-9'][A-Za-z0-9']{0,14}(-[A-Za-z0-9']{1,15}){0,2}){0,5}"}


def doctor_action(s: AgentClinicSettings, i: int) -> Constraint | None:
    """The format the doctor's ``i``-th reply is held to (``doctor_actions``, the last repeating), or None (the authors')."""
    if not s.doctor_actions:
        return None
    action = s.doctor_actions[min(i, len(s.doctor_actions) - 1)]
    return Constraint.make("regex", ACTIONS[action], f"agentclinic doctor_actions: {action}")


async def ask(ctx: CaseContext, agent: str, system: str, user: str, s: AgentClinicSettings, constraint: Constraint | None = None) -> str:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    r = await ctx.chat(messages, role=agent, gen=getattr(s.sampling, agent).gen(), step=agent, constraint=constraint)
    return re.sub(r"\s+", " ", r.text or "") if s.collapse_whitespace else r.text or ""


async def moderate(ctx: CaseContext, line: str, correct: str, s: AgentClinicSettings, role: str = "moderator", rule: str | None = None) -> Grade:
    """The moderator's grade of the doctor's diagnosis line (``role``: the run's moderator, or a rescore's judge), its
    reply read by ``rule`` (default: the run's ``verdict_rule``)."""
    rule = rule or s.verdict_rule
    judge = {"model": s.roles.get(role), "prompt_hash": PROMPTS.hash(*MODERATOR_TEMPLATES), "rule": rule}
    system, user = PROMPTS.render("moderator_system"), PROMPTS.render("moderator_user", correct=correct, diagnosis=line)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    r = await ctx.chat(messages, role=role, gen=s.sampling.moderator.gen(), step="moderator", constraint=PROMPTS.constraint("moderator_user"))
    reply = re.sub(r"\s+", " ", r.text or "") if s.collapse_whitespace else r.text or ""
    return Grade(value=verdict(reply, rule), answer=line, source=RULES[rule], explanation=reply, judge=judge)


@lru_cache(maxsize=None)
def prompt_hashes() -> dict[str, str]:
    """Every template and the bias instructions -> hash (a record keeps them: an edited prompt never mixes into a run)."""
    return {**PROMPTS.file_hashes(), "biases.yaml": hashlib.sha256((PROMPTS.folder / "biases.yaml").read_bytes()).hexdigest()}


def no_diagnosis() -> Grade:
    return Grade(value=0, source=NO_DIAGNOSIS, judge={"rule": NO_DIAGNOSIS})


async def solve(ctx: CaseContext, case: dict, s: AgentClinicSettings) -> dict:
    osce = case["osce"]
    findings = {**osce["Physical_Examination_Findings"], "tests": osce["Test_Results"]}  # theirs: the exam with the tests added
    systems = {"patient": PROMPTS.render("patient_system", bias=bias_text("patient", s.patient_bias), facts=facts(osce["Patient_Actor"])),
               "measurement": PROMPTS.render("measurement_system", findings=facts(findings))}
    history = {"doctor": "", "patient": "", "measurement": ""}
    transcript: list[dict] = []
    reply, line = "", None
    for i in range(s.inferences):
        if s.final_notice and i == s.inferences - 1:
            reply += PROMPTS.render("final_notice") + "\n"
        system = PROMPTS.render("doctor_system", budget=s.inferences, asked=i, bias=bias_text("doctor", s.doctor_bias),
                                objective=facts(osce["Objective_for_Doctor"]))
        said = await ask(ctx, "doctor", system, PROMPTS.render("doctor_user", history=history["doctor"], reply=reply), s, doctor_action(s, i))
        history["doctor"] += f"{reply}\n\n{said}\n\n"
        transcript.append({"role": "doctor", "text": said})
        if DIAGNOSIS in said:
            line = said
            break
        if TEST in said:
            reply = await ask(ctx, "measurement", systems["measurement"], PROMPTS.render("measurement_user", history=history["measurement"], request=said), s)
            history["measurement"] += f"{said}\n\n{reply}\n\n"
            history["patient"] += f"{reply}\n\n"
            transcript.append({"role": "measurement", "text": reply})
        else:
            reply = await ask(ctx, "patient", systems["patient"], PROMPTS.render("patient_user", history=history["patient"], question=said), s)
            history["patient"] += f"{said}\n\n{reply}\n\n"
            history["measurement"] += f"{reply}\n\n"
            transcript.append({"role": "patient", "text": reply})
    return record(case["id"], inputs={"objective": osce["Objective_for_Doctor"], "facts": facts(osce["Patient_Actor"]), "findings": findings},
                  target=case["correct_diagnosis"], transcript=transcript, answer=line,
                  metadata={"sex": case["sex"], "stop_reason": "diagnosis" if line else "budget",
                            "doctor_inferences": sum(t["role"] == "doctor" for t in transcript),
                            "tests_requested": sum(t["role"] == "measurement" for t in transcript),
                            "biases": {"doctor": s.doctor_bias, "patient": s.patient_bias}, "prompt_hashes": prompt_hashes()})


def worst_case(case: dict, s: AgentClinicSettings):
    """A case at the loop's limit (experiments/core/plan.py): every doctor inference of the budget used, each answered,
    every reply at its max_tokens. Each agent's history grows by a (doctor line, answer) pair a turn, so its longest
    request is its templates and case text + inferences x (doctor + answer max_tokens). A diagnosis ends the loop
    sooner, but one that misses its format (``doctor_actions``: cut at max_tokens) does not: the whole budget counts."""
    from experiments.core.plan import WorstCase, text_tokens

    n = s.inferences
    d = s.sampling.doctor.max_tokens
    a = max(s.sampling.patient.max_tokens, s.sampling.measurement.max_tokens)
    raw = lambda *names: "".join((PROMPTS.folder / f"{x}.txt").read_text(encoding="utf-8") for x in names)  # noqa: E731
    osce = case.get("osce") or {}
    bias = max((len(x) for v in biases().values() if isinstance(v, dict) for x in v.values() if isinstance(x, str)), default=0)
    base = {"doctor": text_tokens(raw("doctor_system", "doctor_user", "final_notice") + facts(osce.get("Objective_for_Doctor", ""))) + bias // 4,
            "patient": text_tokens(raw("patient_system", "patient_user") + facts(osce.get("Patient_Actor", ""))) + bias // 4,
            "measurement": text_tokens(raw("measurement_system", "measurement_user") + facts(osce.get("Physical_Examination_Findings", ""))
                                       + facts(osce.get("Test_Results", "")))}
    grow = n * (d + a)
    longest = {role: b + grow for role, b in base.items()}
    longest["moderator"] = text_tokens(raw(*MODERATOR_TEMPLATES)) + d + s.sampling.moderator.max_tokens
    answerer = max(base["patient"], base["measurement"])
    prompt = n * (base["doctor"] + answerer) + n * (n - 1) * (d + a) + longest["moderator"]
    return WorstCase(longest, calls=2 * n, prompt_tokens=prompt, output_tokens=n * (d + a) + s.sampling.moderator.max_tokens,
                     budget=f"{n} doctor inference(s), each answered, replies of at most {d} (doctor) and {a} (patient, measurement) tokens")

