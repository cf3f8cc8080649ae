"""Check that our requests have the structure of the authors' for the same cases and the same replies.

    python -m experiments.studies.craftmd.check_requests CRAFTMD_REPO CASES.csv [LIMIT]

CRAFTMD_REPO: a clone of github.com/rajpurkarlab/craft-md, its model calls replaced by a script (nothing is sent);
what is compared: the study README. Prints each differing case, then the counts; exit 0 when none differ.
"""

from __future__ import annotations

import asyncio
import copy
import csv
import json
import re
import sys
import tempfile
import types
from pathlib import Path

from experiments.core.config import config_dir, load_settings
from experiments.core.study import CaseContext
from experiments.studies.craftmd.data import load_csv
from experiments.studies.craftmd.protocol import solve
from experiments.studies.craftmd.settings import CraftSettings
from serving.client import ChatResult

CONFIG = config_dir(__file__) / "paper.yaml"


class Script:
    """The same replies for both sides: numbered patient replies; the doctor asks ``questions`` questions, then gives
    a final diagnosis (``None``: it never stops asking, so the turn cap ends the conversation)."""

    def __init__(self, questions: int | None = 1):
        self.patient = self.doctor = 0
        self.questions = questions

    def reply(self, agent: str, convo: list[dict]) -> str:
        if agent == "patient":
            self.patient += 1
            return f"patient reply {self.patient}"
        if agent == "summarizer":
            return "A patient reports symptoms."
        last = convo[-1]
        if len(convo) == 1 or last["role"] == "system" or "No more questions now." in last["content"] or "Stop asking" in last["content"]:
            return "Gout"  # an answer request
        self.doctor += 1
        if self.questions is None or self.doctor <= self.questions:
            return f"Question {self.doctor}: where is it?"
        self.doctor = 0  # the next trial's doctor starts again
        return "**Final Diagnosis:** X"


class Recorder:
    """What the authors' stubbed model calls answer (``script``) and the requests they received (``log``)."""

    script = Script()
    log: list = []

    @classmethod
    def reset(cls, questions: int | None = 1) -> None:
        cls.script, cls.log = Script(questions), []

    @classmethod
    def call(cls, agent: str, convo: list[dict], max_tokens: int) -> str:
        cls.log.append((agent, copy.deepcopy(convo), max_tokens))
        return cls.script.reply(agent, convo)


def load_theirs(repo: Path):
    """The authors' src/craftmd.py with src/models.py replaced by :class:`Recorder` (theirs pulls torch and OpenAI):
    GPT-4 plays the patient, GPT-3.5 the summarizer (max_tokens 500) or the doctor, the open model the doctor."""
    models = types.ModuleType("src.models")
    models.call_gpt4_api = lambda convo, max_tokens=150, depth_limit=0: Recorder.call("patient", convo, max_tokens)
    models.call_gpt3_api = lambda convo, max_tokens=150, depth_limit=0: Recorder.call("summarizer" if max_tokens == 500 else "clinical", convo, max_tokens)
    models.call_open_llm = lambda model, tokenizer, convo: Recorder.call("clinical", convo, 250)
    models.call_gpt4v_api = None
    sys.modules["src.models"] = models
    sys.path.insert(0, str(repo))
    from src import craftmd  # noqa: PLC0415 - the authors' module, importable only once the stand-in is in place

    return craftmd


class Ours:
    def __init__(self, script: Script):
        self.script = script

    async def chat(self, messages, role="default", gen=None):
        return ChatResult(texts=[self.script.reply(role, messages)], prompt_tokens=1, completion_tokens=1)


def shape(agent: str, convo: list[dict], case: dict) -> str:
    def where(pred) -> list[int]:
        return [i for i, m in enumerate(convo) if pred(re.sub(r"\s+", " ", m["content"]))]

    return json.dumps({"agent": agent, "roles": [m["role"] for m in convo], "question": where(lambda c: case["question"] in c),
                       "choices": where(lambda c: all(x.strip() in c for x in case["choices"])),
                       "specialty": where(lambda c: case["specialty"] != "Other" and case["specialty"] in c),
                       "patient_replies": where(lambda c: c.startswith("patient reply"))})


def differences(their_calls: list[tuple], ours: list[dict], case: dict, loop: str) -> list[str]:
    """What differs between their requests ((agent, messages, max_tokens) each) and ours (call-log entries, the
    grader's left out) for one case: the request shapes as multisets, max_tokens per role (open-model loop), stops."""
    diffs = []
    if sorted(shape(a, c, case) for a, c, _ in their_calls) != sorted(shape(c["role"], c["messages"], case) for c in ours):
        diffs.append("request structure")
    if loop == "opensource" and sorted((a, t) for a, _, t in their_calls) != sorted((c["role"], c["gen"]["max_tokens"]) for c in ours):
        diffs.append("max_tokens per role")
    if any(c["gen"]["stop"] for c in ours):
        diffs.append("stop sequences")
    return diffs


def compare_case(theirs, row: dict, case: dict, loop: str, out_dir: Path, questions: int | None = 1, client=None) -> list[str]:
    """What differs between the two sides' requests for one case (empty: the same structure). ``questions``: the
    scripted doctor's (:class:`Script`); ``client``: our side's client (default: the same script, in process)."""
    Recorder.reset(questions)
    for f in out_dir.glob("*.json"):
        f.unlink()  # their loop resumes from a file it finds
    choices = ", ".join(row[f"choice_{i}"] for i in range(1, 5))
    args = ((row["case_id"], row["case_vignette"], row["category"], choices), str(out_dir))
    if loop == "opensource":
        theirs.craftmd_opensource(*args, None, None, num_runs=2)  # their early return skips num_runs=1; trial 0 is the first half
    else:
        theirs.craftmd_gpt(*args, "gpt3_1106", num_runs=2)
    their_calls = Recorder.log[: len(Recorder.log) // 2]
    s = load_settings(CraftSettings, CONFIG, {"trials": 1, "loop": loop})
    ctx = CaseContext(client or Ours(Script(questions)), f"{case['case_id']}/t0")
    asyncio.run(solve(ctx, {"id": f"{case['case_id']}/t0", "case": case, "trial": 0}, s))
    ours = [c for c in ctx.calls if c["role"] != "grader"]  # their grader is a separate script (graderai_eval)
    return differences(their_calls, ours, case, loop)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or not (Path(argv[0]) / "src" / "craftmd.py").is_file():
        print("usage: python -m experiments.studies.craftmd.check_requests CRAFTMD_REPO CASES.csv [LIMIT]  (CRAFTMD_REPO: a clone with src/craftmd.py)",
              file=sys.stderr)
        return 2
    theirs = load_theirs(Path(argv[0]))
    with open(argv[1], newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))[: int(argv[2]) if len(argv) == 3 else None]
    cases = {c["case_id"]: c for c in load_csv(Path(argv[1]))}
    differing = 0
    with tempfile.TemporaryDirectory(prefix="craftmd-theirs-") as tmp:
        # the GPT loop has no turn cap: a doctor that never stops asking would never end there
        for loop, questions in (("opensource", 1), ("opensource", None), ("gpt", 1)):
            n = 0
            for row in rows:
                diffs = compare_case(theirs, row, cases[row["case_id"]], loop, Path(tmp), questions)
                if diffs:
                    n += 1
                    print(f"{loop} {row['case_id']}: {', '.join(diffs)} differ")
            doctor = "one question" if questions else "never stops asking (the turn cap ends it)"
            print(f"loop {loop}, doctor {doctor}: {len(rows)} case(s) compared, {n} differ")
            differing += n
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
