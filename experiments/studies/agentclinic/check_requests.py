"""Compare our AgentClinic requests with the authors' for the same cases and the same replies, slot by slot.

    python -m experiments.studies.agentclinic.check_requests AGENTCLINIC_REPO CASES.jsonl [LIMIT]

AGENTCLINIC_REPO is a clone of github.com/SamuelSchmidgall/AgentClinic: its ``agentclinic.py`` is loaded with the
libraries it imports for its API calls (openai, anthropic, replicate, transformers) replaced by empty stand-ins and
its ``query_model`` by a recorder answering from a script, so nothing is sent anywhere; its ``main`` then runs each
case alone. Our loop, then the runner's scorers, run the same case with the same scripted replies.

Each case runs under every condition: each scripted doctor (:data:`DOCTORS`: one that asks, requests tests and
diagnoses; one that never diagnoses, so the budget ends the case) with no bias and with every bias kind
(:func:`conditions`), the moderator answering one of :data:`VERDICTS` in turn. Every request is reduced to its slots
(:func:`shape`): the agent; the history it sees (which earlier replies, in which order) and the latest reply; the
case facts its system prompt holds, parsed as data (each fact's path); the correct diagnosis; the budget and count the
doctor is told; the final notice; the bias kind each side's own bias texts find; the behaviour-changing instructions
each side's own wording is found for (:data:`THEIRS`, :data:`OURS`); raw whitespace; the moderator's inputs in order;
temperature and max_tokens (theirs read from their ``query_model``). After the requests, the verdict: whether the
case counts as correct. The slot lists must be equal. Prints each differing case with its first differing slot, then
the counts; exit 0 when none differ. ``tests/test_agentclinic_requests.py`` runs the same comparison against a
restatement of their loop, and mutated copies of ours, each of which it must catch.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import io
import json
import os
import re
import sys
import tempfile
import types
from pathlib import Path
from typing import Callable

from experiments.studies.agentclinic import protocol
from experiments.studies.agentclinic.protocol import PROMPTS, bias_text
from experiments.studies.agentclinic.settings import DOCTOR_BIASES, PATIENT_BIASES, AgentClinicSettings
from experiments.studies.agentclinic.study import AgentClinicStudy, load_cases
from experiments.core.config import config_dir, load_settings
from experiments.core.registry import named
from experiments.core.scorers import grades, score_record
from experiments.core.study import CaseContext
from serving.client import ChatResult

CONFIG = config_dir(__file__) / "paper.yaml"
TAG = re.compile(r"doctor line \d+|patient reply \d+|measurement reply \d+")
# the scripted doctors: the kind of each of its replies in turn; past the list, a question (None: never a diagnosis)
DOCTORS = {"diagnoses": ("question", "test", "question", "test", "diagnosis"), "never diagnoses": None}
# the moderator's reply, case by case in turn: the authors count only a reply that is exactly "yes" once lower-cased
VERDICTS = ("Yes", "Yes.", "no", "YES")
# the instructions that change behaviour, per agent: the name the docs give each, and how each side words it
INSTRUCTIONS = {
    "doctor": ("question budget", "test keyword", "diagnosis keyword"),
    "patient": ("never name the illness", "symptoms only when asked"),
    "measurement": ("results format", "normal readings fallback"),
    "moderator": ("same disease", "yes or no only"),
}
THEIRS = {"final": "This is the final question", "budget": r"allowed to ask (\d+) questions total.*?asked (\d+) questions so far",
          "says": {"question budget": r"allowed to ask \d+ questions total before you must make a decision",
                   "test keyword": r'"REQUEST TEST: \[test\]"', "diagnosis keyword": r'"DIAGNOSIS READY: \[diagnosis here\]"',
                   "never name the illness": r"must not reveal your disease explicitly",
                   "symptoms only when asked": r"convey the symptoms you have .*if you are asked",
                   "results format": r'"RESULTS: \[results here\]"', "normal readings fallback": r"not in your data then you can respond with NORMAL READINGS",
                   "same disease": r"are the same disease", "yes or no only": r"respond only with Yes or No\. Nothing else"}}
OURS = {"final": PROMPTS.render("final_notice"), "budget": r"make (\d+) requests in all.*?made (\d+) so far",
        "says": {"question budget": r"make \d+ requests in all before you must decide",
                 "test keyword": r'"REQUEST TEST: \[test\]"', "diagnosis keyword": r'"DIAGNOSIS READY: \[diagnosis\]"',
                 "never name the illness": r"Never name your illness", "symptoms only when asked": r"only when the doctor asks about them",
                 "results format": r'"RESULTS: \[results\]"', "normal readings fallback": r"not among your findings, answer that the readings are normal",
                 "same disease": r"name the same disease", "yes or no only": r"Answer with Yes or No and nothing else"},
        "biases": {agent: {k: bias_text(agent, k).strip() for k in kinds if k != "none"}
                                     for agent, kinds in (("doctor", DOCTOR_BIASES), ("patient", PATIENT_BIASES))}}


def conditions() -> list[tuple[str, str]]:
    """(doctor bias, patient bias): none, then each kind for every agent that has it (23 kinds in 14 runs)."""
    kinds = dict.fromkeys(k for k in DOCTOR_BIASES + PATIENT_BIASES if k != "none")
    return [("none", "none")] + [(k if k in DOCTOR_BIASES else "none", k if k in PATIENT_BIASES else "none") for k in kinds]


class Script:
    """The same replies for both sides, by agent: numbered lines that name themselves, so a history can be traced; each
    holds a run of tabs and newlines that the loop must collapse as their GPT path does."""

    def __init__(self, plan: tuple[str, ...] | None, verdict: str = "Yes"):
        self.plan, self.verdict, self.n = plan, verdict, {"doctor": 0, "patient": 0, "measurement": 0}

    def reply(self, agent: str) -> str:
        if agent == "moderator":
            return self.verdict
        self.n[agent] += 1
        k = self.n[agent]
        if agent != "doctor":
            return f"RESULTS:\t\tmeasurement reply {k}" if agent == "measurement" else f"patient reply {k}:\n\n\tfine"
        kind = self.plan[k - 1] if self.plan and k <= len(self.plan) else ("test" if k % 3 == 0 else "question")
        return f"doctor line {k}:\t\n" + {"question": "where does it hurt?", "test": f"REQUEST TEST: test_{k}", "diagnosis": f"DIAGNOSIS READY: dx {k}"}[kind]


def fact_paths(value, path: str = "") -> list[tuple[str, str]]:
    """Every fact of a case as (its path, its text), e.g. ('Patient_Actor/History', '...')."""
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in fact_paths(v, f"{path}/{k}" if path else k)]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in fact_paths(v, f"{path}[{i}]")]
    return [(path, str(value))]


def holds(text: str, fact: str) -> bool:
    """Whether ``text`` holds ``fact`` as either side writes it (a Python dict printed, or JSON)."""
    return any(f in text for f in (fact, json.dumps(fact, ensure_ascii=False)[1:-1], repr(fact)[1:-1]))


def shape(agent: str, system: str, user: str, gen: tuple, osce: dict, side: dict) -> dict:
    """One request's slots as the comparison sees them (``side``: how that side words what it is matched by)."""
    budget = re.search(side["budget"], system, re.S)
    seen = TAG.findall(user)
    facts = sorted(p for p, v in fact_paths({k: v for k, v in osce.items() if k != "Correct_Diagnosis"}) if len(v) >= 8 and holds(system, v))
    out = {"agent": agent, "history": seen[:-1], "latest": seen[-1:], "system holds": facts,
           "correct diagnosis": osce["Correct_Diagnosis"] in user, "budget": budget.groups() if budget else None,
           "final notice": side["final"] in user, "bias": sorted(k for k, t in side["biases"].get(agent, {}).items() if t in system),
           "says": sorted(n for n, rx in side["says"].items() if re.search(rx, system + "\n" + user, re.S)),
           "raw whitespace": bool(re.search(r"\t|\n\n\t", user)), "temperature, max_tokens": list(gen)}
    if agent == "moderator":  # its two inputs, in the order it reads them
        at = {"correct diagnosis": user.find(osce["Correct_Diagnosis"]), "doctor's line": (m.start() if (m := TAG.search(user)) else -1)}
        out["inputs"] = sorted((n for n in at if at[n] >= 0), key=at.get)
    return out


# ------------------------------------------------------------------ theirs

def load_theirs(repo: Path):
    """The authors' agentclinic.py with its API libraries stubbed out (nothing of theirs is called but the loop)."""
    for name in ("openai", "anthropic", "replicate", "transformers"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["transformers"].pipeline = None
    spec = importlib.util.spec_from_file_location("agentclinic_authors", repo / "agentclinic.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.time = types.SimpleNamespace(sleep=lambda s: None)  # their pause between turns
    return module


def their_side(theirs) -> dict:
    """What their code says: sampling read from their query_model, bias texts from their agents' own generate_bias."""
    pairs = set(re.findall(r"temperature=([\d.]+),\s*max_tokens=(\d+)", inspect.getsource(theirs.query_model)))
    if len(pairs) != 1:
        raise SystemExit(f"their query_model sends {len(pairs)} different (temperature, max_tokens): {sorted(pairs)}")
    (t, m), = pairs
    agents = {"doctor": (theirs.DoctorAgent, DOCTOR_BIASES), "patient": (theirs.PatientAgent, PATIENT_BIASES)}
    return {**THEIRS, "sampling": (float(t), int(m)), "query_model": theirs.query_model,
            "biases": {a: {k: cls.generate_bias(types.SimpleNamespace(bias_present=k)).strip() for k in kinds if k != "none"}
                       for a, (cls, kinds) in agents.items()}}


def their_shapes(theirs, side: dict, line: str, osce: dict, script: Script, s: AgentClinicSettings, tmp: Path) -> list[dict]:
    """Their ``main`` on this one case (the agents' backends named after the agents, so the recorder knows who asks);
    the recorder returns each reply as their GPT path does (whitespace runs collapsed)."""
    log = []

    def query_model(model_str, prompt, system_prompt, **kw):
        log.append(shape(model_str, system_prompt, prompt, side["sampling"], osce, side))
        return re.sub(r"\s+", " ", script.reply(model_str))

    theirs.query_model = query_model
    (tmp / "agentclinic_medqa.jsonl").write_text(line + "\n", encoding="utf-8")
    here, said = os.getcwd(), io.StringIO()
    try:
        os.chdir(tmp)
        with contextlib.redirect_stdout(said):
            theirs.main(None, None, "llm", s.doctor_bias.replace("none", "None"), s.patient_bias.replace("none", "None"),
                        "doctor", "patient", "measurement", "moderator", None, "MedQA", False, s.inferences)
    finally:
        os.chdir(here)
        theirs.query_model = side["query_model"]
    verdict = re.search(r"The diagnosis was\s+(CORRECT|INCORRECT)", said.getvalue())
    return log + [{"agent": "verdict", "correct": bool(verdict) and verdict.group(1) == "CORRECT"}]


# ------------------------------------------------------------------ ours

class Ours:
    def __init__(self, script: Script):
        self.script = script

    async def chat(self, messages, role="default", gen=None):
        return ChatResult(texts=[self.script.reply(role)], prompt_tokens=1, completion_tokens=1)


def our_shapes(case: dict, script: Script, s: AgentClinicSettings) -> list[dict]:
    """Our loop on one case, then its scorers as the runner runs them (the moderator's request is the diagnosis scorer's)."""
    ctx = CaseContext(Ours(script), case["id"])
    study = named(AgentClinicStudy)()

    async def as_the_runner():
        return await score_record(study.scorers_for(s), ctx, await protocol.solve(ctx, case, s), s)

    r = asyncio.run(as_the_runner())
    log = [shape(c["role"], c["messages"][0]["content"], c["messages"][1]["content"], (c["gen"]["temperature"], c["gen"]["max_tokens"]),
                 case["osce"], OURS) for c in ctx.calls if [m["role"] for m in c["messages"]] == ["system", "user"]]
    return log + [{"agent": "verdict", "correct": grades(r)["diagnosis"].value == 1}]


def settings(inferences: int = 20, doctor_bias: str = "none", patient_bias: str = "none") -> AgentClinicSettings:
    return load_settings(AgentClinicSettings, CONFIG, {"inferences": inferences, "data": "-", "doctor_bias": doctor_bias,
                                                       "patient_bias": patient_bias})


def first_difference(mine: list[dict], their: list[dict]) -> str:
    for i, (a, b) in enumerate(zip(mine, their)):
        if a != b:
            slot = next(k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k))
            return f"request {i} ({a.get('agent')}), slot {slot!r}: ours {a.get(slot)!r}, theirs {b.get(slot)!r}"
    return f"{len(mine)} requests ours, {len(their)} theirs"


def compare(cases: list[dict], theirs_for: Callable[[int, dict, Script, AgentClinicSettings], list[dict]], inferences: int = 20,
            say: Callable[[str], None] = print) -> dict[str, int]:
    """Each case under every condition, ours against ``theirs_for(index, case, script, settings)``: differing cases
    per condition (a condition: 'DOCTOR, doctor bias B, patient bias P')."""
    out = {}
    for doctor, plan in DOCTORS.items():
        for db, pb in conditions():
            s, name, n = settings(inferences, db, pb), f"doctor that {doctor}, doctor bias {db}, patient bias {pb}", 0
            for i, case in enumerate(cases):
                verdict = VERDICTS[i % len(VERDICTS)]
                mine, their = our_shapes(case, Script(plan, verdict), s), theirs_for(i, case, Script(plan, verdict), s)
                if mine != their:
                    n += 1
                    say(f"{case['id']} ({name}): {first_difference(mine, their)}")
            out[name] = n
    return out


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or not (Path(argv[0]) / "agentclinic.py").is_file():
        print("usage: python -m experiments.studies.agentclinic.check_requests AGENTCLINIC_REPO CASES.jsonl [LIMIT]  (a clone with agentclinic.py)",
              file=sys.stderr)
        return 2
    theirs = load_theirs(Path(argv[0]))
    side = their_side(theirs)
    limit = int(argv[2]) if len(argv) == 3 else None
    lines = [line for line in Path(argv[1]).read_text(encoding="utf-8").splitlines() if line.strip()][:limit]
    cases = load_cases(argv[1])[:limit]
    with tempfile.TemporaryDirectory(prefix="agentclinic-theirs-") as tmp:
        counts = compare(cases, lambda i, case, script, s: their_shapes(theirs, side, lines[i], json.loads(lines[i])["OSCE_Examination"],
                                                                          script, s, Path(tmp)))
    for name, n in counts.items():
        print(f"{name}: {len(cases)} case(s) compared, {n} differ")
    total = sum(counts.values())
    print(f"all: {len(counts)} conditions x {len(cases)} cases, {total} differ; sampling read from their code: "
          f"temperature {side['sampling'][0]}, max_tokens {side['sampling'][1]}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
