"""The study runner's policies on a scripted backend behind the real client: failed requests are
never scored, a dead endpoint stops dispatch, killed runs resume mid-conversation from the cache,
resume checks settings and prompt files, roles are checked."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from experiments.core.config import ConfigError, RunSettings, Sampling
from experiments.core.prompts import PromptSet
from experiments.core.results import ResultsError
from experiments.core.runner import prepare_run, resolve_roles, run_study
from experiments.core.study import CaseContext, Study
from serving.cache import ResponseCache
from tests.scripted import ScriptedLLM, down


class ToySettings(RunSettings):
    turns: int = 3
    sampling: Sampling = Sampling(temperature=0.7, max_tokens=8)
    roles: dict[str, str] = {"asker": "embedded", "answerer": "embedded"}


class ToyStudy(Study):
    """Cases are little conversations: turn i's prompt holds every earlier reply (so order matters)."""

    name = "toy"
    settings_cls = ToySettings
    roles = ("asker", "answerer")
    primary_role = "asker"

    def __init__(self, n=4, prompts=None):
        self.n = n
        if prompts is not None:
            self.prompts = prompts

    def load_cases(self, s):
        return [{"id": f"c{i}"} for i in range(self.n)][: s.limit]

    async def solve(self, ctx: CaseContext, case, s):
        said = []
        for t in range(s.turns):
            role = "asker" if t % 2 == 0 else "answerer"
            r = await ctx.chat([{"role": "user", "content": f"{case['id']} turn {t}: " + " | ".join(said)}], role=role, gen=s.sampling.gen(), step=f"turn_{t}")
            said.append(r.text)
        return {"said": said, "correct": int(said[-1].endswith("0"))}

    def metrics(self, records, s):
        return {"n": len(records), "accuracy": sum(r["correct"] for r in records) / len(records) if records else None}

    def summary(self, m, s, run):
        return f"# toy\n\nn={m['n']} accuracy={m['accuracy']}\n"


def counter_backend(fail_when=lambda role, content: False, word="reply"):
    """Each answer is a fresh number (so a repeated answer can only come from the cache)."""
    state = {"n": 0}

    def respond(role, content, gen):
        if fail_when(role, content):
            raise down()
        state["n"] += 1
        return f"{word} {state['n']}"

    return respond, state


def run(study, settings, client, **kw):
    settings, cases = prepare_run(study, settings)
    return asyncio.run(run_study(study, settings, cases, client=client, log=lambda m: None, **kw))


def records(out: Path) -> dict[str, dict]:
    return {r["id"]: r for r in (json.loads(x) for x in (out / "records.jsonl").read_text().splitlines())}


def test_failed_case_is_recorded_failed_never_scored_and_retried(tmp_path):
    s = ToySettings(out=str(tmp_path / "run"))
    respond, _ = counter_backend(fail_when=lambda role, content: content[0]["content"].startswith("c1 turn 1"))
    o = run(ToyStudy(), s, ScriptedLLM(respond, roles=ToyStudy.roles), resume_command="medstack run toy --out X")
    assert (o.finished, o.failed, o.exit_code) == (3, 1, 3)
    recs = records(tmp_path / "run")
    assert recs["c1"]["status"] == "failed" and "gave up after" in recs["c1"]["error"] and "said" not in recs["c1"]
    assert len(recs["c1"]["calls"]) == 2 and recs["c1"]["calls"][1]["error"]  # the answered call and the failed one are logged
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["n"] == 3 and m["case_status"] == {"total": 4, "finished": 3, "failed": 1, "not_started": 0}
    summary = (tmp_path / "run" / "summary.md").read_text()
    assert "1 failed cases" in summary and "medstack run toy --out X" in summary and "c1:" in summary
    # the endpoint is back: only the failed case runs again; the last line per id wins
    respond, _ = counter_backend()
    o = run(ToyStudy(), s, ScriptedLLM(respond, roles=ToyStudy.roles))
    assert (o.finished, o.failed, o.exit_code) == (4, 0, 0)
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["n"] == 4 and m["run"]["cases_run"] == 1 and m["run"]["cases_resumed"] == 3
    assert records(tmp_path / "run")["c1"]["status"] == "ok"
    # every record names which model played which role (what a sweep's fixed roles are read back from)
    roles = prepare_run(ToyStudy(), s)[0].roles
    assert roles and all(r["roles"] == dict(roles) for r in records(tmp_path / "run").values() if r["status"] == "ok")


def test_dead_endpoint_stops_dispatching(tmp_path):
    s = ToySettings(out=str(tmp_path / "run"), concurrency=1, max_consecutive_failures=3)
    respond, _ = counter_backend(fail_when=lambda role, content: True)
    o = run(ToyStudy(n=10), s, ScriptedLLM(respond, roles=ToyStudy.roles))
    assert (o.finished, o.failed, o.not_started, o.exit_code) == (0, 3, 7, 3)
    assert "7 cases not started" in o.summary


def test_rejected_requests_fail_their_cases_without_stopping_the_run(tmp_path):
    """A 4xx (error kind "status": this request is wrong) is not the endpoint going down: every case is tried."""
    from serving.client import StatusError

    def respond(role, content, gen):
        raise StatusError(400, "This model's maximum context length is 2048 tokens.")

    s = ToySettings(out=str(tmp_path / "run"), concurrency=1, max_consecutive_failures=3)
    o = run(ToyStudy(n=6), s, ScriptedLLM(respond, roles=ToyStudy.roles))
    assert (o.finished, o.failed, o.not_started, o.exit_code) == (0, 6, 0, 3)
    assert o.metrics["run"]["stopped_early"] is False


def test_a_bug_in_one_case_fails_that_case_only(tmp_path):
    class Buggy(ToyStudy):
        async def solve(self, ctx, case, s):
            if case["id"] == "c2":
                raise ZeroDivisionError("oops")
            return await super().solve(ctx, case, s)

    respond, _ = counter_backend()
    o = run(Buggy(), ToySettings(out=str(tmp_path / "run")), ScriptedLLM(respond, roles=ToyStudy.roles))
    assert (o.finished, o.failed) == (3, 1)
    assert "ZeroDivisionError" in records(tmp_path / "run")["c2"]["error"]


def test_killed_run_replays_answered_calls_from_the_cache_and_continues(tmp_path):
    cache = ResponseCache(tmp_path / "cache.sqlite")
    s = ToySettings(out=str(tmp_path / "run"), concurrency=2, turns=5)
    answered: list[str] = []

    class Killed(BaseException):
        pass

    def dying(role, content, gen):
        if len(answered) == 7:  # the process dies in the middle of two conversations
            raise Killed()
        answered.append(content[0]["content"])
        return f"reply {len(answered)}"

    with pytest.raises(Killed):
        run(ToyStudy(n=3), s, ScriptedLLM(dying, roles=ToyStudy.roles, cache=cache))
    finished = records(tmp_path / "run") if (tmp_path / "run" / "records.jsonl").exists() else {}
    calls_in_finished = sum(len(r["calls"]) for r in finished.values())
    respond, state = counter_backend(word="again")
    client = ScriptedLLM(respond, roles=ToyStudy.roles, cache=cache)
    o = run(ToyStudy(n=3), s, client)
    hits = client.usage_summary()["total"]["cache_hits"]
    assert o.finished == 3 and hits == 7 - calls_in_finished > 0
    recs = records(tmp_path / "run")
    replayed = [t for r in recs.values() if r["id"] not in finished for t in r["said"] if t.startswith("reply")]
    assert len(replayed) == hits  # the answers given before the kill are the ones the conversation continues from
    for r in recs.values():
        assert all(c["gen"]["seed"] is not None for c in r["calls"])  # sampled calls carry their per-call seed


def test_seeds_are_per_case_and_step():
    from experiments.core.study import call_seed

    assert call_seed(0, "c1", "turn_0#0") == call_seed(0, "c1", "turn_0#0")
    assert len({call_seed(0, c, k) for c in ("c1", "c2") for k in ("turn_0#0", "turn_0#1", "turn_1#0")}) == 6


def _run_with_prompt_folder(tmp_path):
    """A finished toy run whose prompt folder holds ask.txt: (the folder, the settings, a backend)."""
    folder = tmp_path / "prompts"
    folder.mkdir()
    (folder / "ask.txt").write_text("Ask $x\n")
    s = ToySettings(out=str(tmp_path / "run"))
    respond, _ = counter_backend()
    run(ToyStudy(prompts=PromptSet(folder)), s, ScriptedLLM(respond, roles=ToyStudy.roles))
    return folder, s, respond


def test_edited_prompt_refuses_resume_naming_the_file(tmp_path):
    folder, s, respond = _run_with_prompt_folder(tmp_path)
    (folder / "ask.txt").write_text("Ask politely $x\n")
    with pytest.raises(ResultsError, match="ask.txt changed"):
        run(ToyStudy(prompts=PromptSet(folder)), s, ScriptedLLM(respond, roles=ToyStudy.roles))
    (folder / "ask.txt").write_text("Ask $x\n")
    with pytest.raises(ResultsError, match=r"different settings \(turns\)"):
        run(ToyStudy(prompts=PromptSet(folder)), ToySettings(out=str(tmp_path / "run"), turns=2), ScriptedLLM(respond, roles=ToyStudy.roles))


def test_a_prompt_file_added_since_is_no_edit(tmp_path):
    """A new step's template (e.g. CRAFT-MD's assessor prompts) does not stop earlier runs from resuming; a removed
    prompt the run used does."""
    folder, s, respond = _run_with_prompt_folder(tmp_path)
    (folder / "new_step.txt").write_text("Check $x\n")
    assert run(ToyStudy(prompts=PromptSet(folder)), s, ScriptedLLM(respond, roles=ToyStudy.roles)).finished >= 0
    (folder / "ask.txt").unlink()
    with pytest.raises(ResultsError, match="ask.txt changed"):
        run(ToyStudy(prompts=PromptSet(folder)), s, ScriptedLLM(respond, roles=ToyStudy.roles))


def test_a_craftmd_folder_from_before_the_new_settings_resumes_as_it_ran(tmp_path):
    """A CRAFT-MD config.yaml written before verdict_rule / empty_turn / the conversation checks existed: the run read
    verdicts by first word and sent "..." for an empty turn, so it resumes under those values and no others."""
    import yaml

    from experiments.core.results import RunDir
    from experiments.studies.craftmd.settings import CraftSettings

    new = CraftSettings(out=str(tmp_path / "r"), verdict_rule="first_word", empty_turn="...", copy_span_words=12,
                        patient_prompt="cautious").model_dump(mode="json")
    old = {k: v for k, v in new.items()
           if k not in ("verdict_rule", "empty_turn", "assess_conversations", "patient_checks", "copy_span_words", "patient_prompt")}
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.yaml").write_text(yaml.safe_dump(old))
    (tmp_path / "r" / "records.jsonl").write_text('{"id": "c1"}\n')
    RunDir(tmp_path / "r", new, settings_cls=CraftSettings)  # resumes by CRAFT-MD's resume rules (CraftSettings.added_settings)
    (tmp_path / "r" / "config.yaml").write_text(yaml.safe_dump(old))
    with pytest.raises(ResultsError, match=r"different settings \(copy_span_words, empty_turn, patient_prompt, verdict_rule\)"):
        RunDir(tmp_path / "r", CraftSettings(out=str(tmp_path / "r")).model_dump(mode="json"), settings_cls=CraftSettings)


def test_roles_are_checked_and_default_fills_the_rest():
    s = ToySettings(roles={"default": "llama3-8b-instruct", "answerer": "embedded@http://127.0.0.1:8001/v1"})
    assert resolve_roles(ToyStudy(), s) == {"asker": "llama3-8b-instruct", "answerer": "embedded@http://127.0.0.1:8001/v1"}
    with pytest.raises(ConfigError, match="unknown role.*graderr.*valid roles: asker, answerer"):
        resolve_roles(ToyStudy(), ToySettings(roles={"graderr": "embedded"}))
    with pytest.raises(Exception, match="not a model reference|base URL"):
        resolve_roles(ToyStudy(), ToySettings(roles={"asker": "embedded@localhost:8000"}))
