"""Check that our requests have the structure of the authors' for the same cases and the same replies.

    python -m experiments.studies.agentclinic.check_requests AGENTCLINIC_REPO CASES.jsonl [LIMIT]

AGENTCLINIC_REPO is a clone of github.com/SamuelSchmidgall/AgentClinic: its ``agentclinic.py`` is loaded with the
libraries it imports for its API calls (openai, anthropic, replicate, transformers) replaced by empty stand-ins and
its ``query_model`` by a recorder answering from a script, so nothing is sent anywhere; its ``main`` then runs each
case alone. Our loop runs the same case with the same scripted replies. For every case and each scripted doctor
(:data:`DOCTORS`: one that asks, requests tests and diagnoses; one that never diagnoses, so the budget ends the case)
every request is reduced to its shape (:func:`shape`): the agent, the message roles, which earlier replies its user
message holds and in which order, which case facts its system prompt holds, the budget and count the doctor is told,
the final-request notice, temperature and max_tokens. The shape lists must be equal. Prints each differing case,
then the counts; exit 0 when none differ.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import io
import json
import os
import re
import sys
import tempfile
import types
from pathlib import Path

from experiments.studies.agentclinic.protocol import PROMPTS, solve
from experiments.studies.agentclinic.settings import AgentClinicSettings
from experiments.studies.agentclinic.study import AgentClinicStudy, load_cases
from experiments.core.config import config_dir, load_settings
from experiments.core.registry import named
from experiments.core.scorers import score_record
from experiments.core.study import CaseContext
from serving.client import ChatResult

CONFIG = config_dir(__file__) / "paper.yaml"
TAG = re.compile(r"doctor line \d+|patient reply \d+|measurement reply \d+")
# the scripted doctors: the kind of each of its replies in turn; past the list, a question (None: never a diagnosis)
DOCTORS = {"diagnoses": ("question", "test", "question", "test", "diagnosis"), "never diagnoses": None}
# how each side says the final-request notice and the doctor's budget (the authors' words, matched, never sent)
THEIRS = {"final": "This is the final question", "budget": r"allowed to ask (\d+) questions total.*?asked (\d+) questions so far",
          "sampling": (0.05, 200)}
OURS = {"final": PROMPTS.render("final_notice"), "budget": r"make (\d+) requests in all.*?made (\d+) so far"}


class Script:
    """The same replies for both sides, by agent: numbered lines that name themselves, so a history can be traced."""

    def __init__(self, plan: tuple[str, ...] | None):
        self.plan, self.n = plan, {"doctor": 0, "patient": 0, "measurement": 0}

    def reply(self, agent: str) -> str:
        if agent == "moderator":
            return "Yes"
        self.n[agent] += 1
        k = self.n[agent]
        if agent != "doctor":
            return f"RESULTS: measurement reply {k}" if agent == "measurement" else f"patient reply {k}"
        kind = self.plan[k - 1] if self.plan and k <= len(self.plan) else ("test" if k % 3 == 0 else "question")
        return f"doctor line {k}: " + {"question": "where does it hurt?", "test": f"REQUEST TEST: test_{k}", "diagnosis": f"DIAGNOSIS READY: dx {k}"}[kind]


def leaves(value) -> list[str]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in leaves(v)]
    return [str(value)] if not re.search(r"[\"'\\]", str(value)) else []


def shape(agent: str, system: str, user: str, gen: tuple, osce: dict, side: dict) -> dict:
    """One request as the comparison sees it (``side``: how that side words the final notice and the budget)."""
    budget = re.search(side["budget"], system, re.S)
    held = {"objective": osce["Objective_for_Doctor"], "patient facts": leaves(osce["Patient_Actor"])[0],
            "findings": (leaves(osce["Test_Results"]) or leaves(osce["Physical_Examination_Findings"]))[0]}
    return {"agent": agent, "sees": TAG.findall(user), "system holds": sorted(k for k, v in held.items() if v in system),
            "correct diagnosis": osce["Correct_Diagnosis"] in user, "final notice": side["final"] in user,
            "budget": budget.groups() if budget else None, "temperature, max_tokens": list(gen)}


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


def their_shapes(theirs, line: str, osce: dict, plan, inferences: int, tmp: Path) -> list[dict]:
    """Their ``main`` on this one case (the agents' backends named after the agents, so the recorder knows who asks)."""
    script, log = Script(plan), []

    def query_model(model_str, prompt, system_prompt, **kw):
        log.append(shape(model_str, system_prompt, prompt, THEIRS["sampling"], osce, THEIRS))
        return script.reply(model_str)

    theirs.query_model = query_model
    (tmp / "agentclinic_medqa.jsonl").write_text(line + "\n", encoding="utf-8")
    here = os.getcwd()
    try:
        os.chdir(tmp)
        with contextlib.redirect_stdout(io.StringIO()):
            theirs.main(None, None, "llm", "None", "None", "doctor", "patient", "measurement", "moderator", None, "MedQA", False, inferences)
    finally:
        os.chdir(here)
    return log


class Ours:
    def __init__(self, script: Script):
        self.script = script

    async def chat(self, messages, role="default", gen=None):
        return ChatResult(texts=[self.script.reply(role)], prompt_tokens=1, completion_tokens=1)


def our_shapes(case: dict, plan, s: AgentClinicSettings) -> list[dict]:
    ctx = CaseContext(Ours(Script(plan)), case["id"])
    study = named(AgentClinicStudy)()

    async def as_the_runner():  # the loop, then its scorers (the moderator's request is the diagnosis scorer's)
        await score_record(study.scorers_for(s), ctx, await solve(ctx, case, s), s)

    asyncio.run(as_the_runner())
    return [shape(c["role"], c["messages"][0]["content"], c["messages"][1]["content"], (c["gen"]["temperature"], c["gen"]["max_tokens"]),
                  case["osce"], OURS) for c in ctx.calls if [m["role"] for m in c["messages"]] == ["system", "user"]]


def settings(inferences: int = 20) -> AgentClinicSettings:
    return load_settings(AgentClinicSettings, CONFIG, {"inferences": inferences, "data": "-"})


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or not (Path(argv[0]) / "agentclinic.py").is_file():
        print("usage: python -m experiments.studies.agentclinic.check_requests AGENTCLINIC_REPO CASES.jsonl [LIMIT]  (a clone with agentclinic.py)",
              file=sys.stderr)
        return 2
    theirs = load_theirs(Path(argv[0]))
    lines = [line for line in Path(argv[1]).read_text(encoding="utf-8").splitlines() if line.strip()]
    limit = int(argv[2]) if len(argv) == 3 else None
    cases, lines, s = load_cases(argv[1])[:limit], lines[:limit], settings()
    differing = 0
    with tempfile.TemporaryDirectory(prefix="agentclinic-theirs-") as tmp:
        for doctor, plan in DOCTORS.items():
            n = 0
            for line, case in zip(lines, cases):
                mine, their = our_shapes(case, plan, s), their_shapes(theirs, line, json.loads(line)["OSCE_Examination"], plan, s.inferences, Path(tmp))
                if mine != their:
                    n += 1
                    first = next((i for i, (a, b) in enumerate(zip(mine, their)) if a != b), min(len(mine), len(their)))
                    print(f"{case['id']} ({doctor}): request {first} differs ({len(mine)} ours, {len(their)} theirs)")
            print(f"doctor that {doctor}: {len(cases)} case(s) compared, {n} differ")
            differing += n
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
