"""`medstack run meditod-*` on the study runner, with a scripted backend behind the real client:
the failure policy (a failed request is a failed turn, never a format error), resume, parsing,
adjudication through the grader role, and bad input refused before any server starts."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from experiments.studies.meditod.prompts import icl_assistant, icl_user, sft_user
from experiments.core import registry
from experiments.studies.meditod.study import MeditodSettings, load_samples, with_exemplars
from experiments.core.runner import prepare_run, run_study
from models.errors import MedstackError
from tests.scripted import ScriptedLLM, down

FX = Path(__file__).parent / "fixtures" / "meditod"
DATA = FX / "dialogs.json"


@pytest.fixture(autouse=True)
def no_tokenizer(monkeypatch):
    """Count prompt tokens with the estimate (loading the model's tokenizer is slow and not under test here)."""
    from experiments.studies.meditod import study as run_mod
    from experiments.studies.meditod.prompts import estimate_message_tokens

    monkeypatch.setattr(run_mod, "token_counter", lambda alias: (lambda text: len(text) // 3 + 1))
    monkeypatch.setattr(run_mod, "message_counter", lambda alias: estimate_message_tokens)


def settings(tmp_path: Path, task: str, **kw) -> MeditodSettings:
    base = dict(task=task, data=str(DATA), out=str(tmp_path / f"{task}-icl"), k=0, bertscore=False, roles={"model": "embedded"})
    return MeditodSettings(**{**base, **kw})


def study_of(task: str):
    return registry.get(f"meditod-{task}").make()


def run(task: str, s: MeditodSettings, client):
    study = study_of(task)
    s, cases = prepare_run(study, s)
    return asyncio.run(run_study(study, s, cases, client=client, log=lambda m: None))


def test_input(content) -> str:
    """The test sample's own input: the last user message (in-context), or the user block of the
    supervised rendering (system line, user block, then "[answer]")."""
    if isinstance(content, list):
        return content[-1]["content"]
    return content.split("\n", 1)[1].rsplit("\n[answer]", 1)[0]


test_input.__test__ = False  # a helper, not a test


def gold_backend(task: str, fail_ids=(), junk_ids=(), sent=None, mode="icl"):
    """Answers every turn with its gold output; raises a dead-server error for ``fail_ids``."""
    user = icl_user if mode == "icl" else sft_user
    samples = {user(task, c["sample"]): c["sample"] for c in load_samples(MeditodSettings(task=task, mode=mode, data=str(DATA), k=0))}

    def respond(role, content, gen):
        sample = samples[test_input(content)]
        if sent is not None:
            sent.append(sample["id"])
        if sample["id"] in fail_ids:
            raise down()
        if sample["id"] in junk_ids:
            return "I am not sure."
        return icl_assistant(task, sample) if mode == "icl" else " " + icl_assistant(task, {"answer": sample["target"]}) + " "

    return respond


def scored(s: MeditodSettings) -> int:
    return sum(c["sample"]["scored"] for c in load_samples(s))


def records(out: str) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, (Path(out) / "records.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("task, key, perfect", [("nlu", "f1", 1.0), ("pol", "f1", 1.0), ("nlg", "bleu4", 100.0)])
def test_failed_request_is_a_failed_turn_then_resumed(tmp_path, task, key, perfect):
    s = settings(tmp_path, task)
    ids = [c["id"] for c in load_samples(s)]
    bad = ids[1]
    outcome = run(task, s, ScriptedLLM(gold_backend(task, fail_ids={bad}), roles=("model", "grader")))
    assert outcome.exit_code == 3 and outcome.failed == 1 and outcome.finished == len(ids) - 1
    recs = records(s.out)
    assert recs[bad]["status"] == "failed" and "gave up" in recs[bad]["error"]
    assert all(recs[i]["status"] == "ok" for i in ids if i != bad)
    m = json.loads((Path(s.out) / "metrics.json").read_text())
    assert m["turns"] == scored(s) - 1 and m[key] == pytest.approx(perfect)      # the failed turn is in no metric
    assert m.get("format_errors", 0) == 0                                        # ... and never a format error
    assert m["case_status"]["failed"] == 1
    summary = (Path(s.out) / "summary.md").read_text()
    assert "1 failed cases" in summary and bad in summary and f"# MediTOD {task.upper()}" in summary

    sent: list[str] = []
    again = run(task, s, ScriptedLLM(gold_backend(task, sent=sent), roles=("model", "grader")))
    assert again.exit_code == 0 and again.failed == 0 and sent == [bad]          # only the failed turn is asked again
    m = json.loads((Path(s.out) / "metrics.json").read_text())
    assert m["turns"] == scored(s) and m[key] == pytest.approx(perfect) and m["case_status"]["failed"] == 0
    assert m["requests_not_scored"] == (0 if task == "nlu" else 1)              # POL/NLG: utterance 0 is sent, not scored
    assert records(s.out)[bad]["status"] == "ok"


def test_record_shape_prompt_and_format_errors(tmp_path):
    s = settings(tmp_path, "pol")
    client = ScriptedLLM(gold_backend("pol", junk_ids={"301/4"}), roles=("model", "grader"))
    outcome = run("pol", s, client)
    assert outcome.exit_code == 0
    recs = records(s.out)
    r = recs["301/2"]
    meta = r["metadata"]
    assert r["scores"]["joint"]["value"] == 1 and meta["model"] == "embedded" and meta["prompt_hash"] and r["answer"] == r["target"]
    assert r["case_id"] == "301" and r["inputs"]["dialog_id"] == "301" and r["inputs"]["uttr_id"] == 2
    assert r["transcript"][0] == {"role": "doctor", "text": "Hello, what brings you here today?"}
    assert [c["step"] for c in r["calls"]] == ["predict"] and r["calls"][0]["gen"]["temperature"] == 0.0
    assert r["calls"][0]["kind"] == "chat" and r["calls"][0]["gen"]["stop"] is None
    msgs = r["inputs"]["messages"]
    assert msgs[0]["role"] == "system" and msgs[-1]["content"].startswith("[dialog state]\n```\n{")
    junk = recs["301/4"]   # unparseable output: a format error, scored as empty, never a failure
    assert junk["status"] == "ok" and junk["metadata"]["parse_error"] is True and junk["answer"] is None
    assert junk["scores"]["format"]["value"] == 1
    m = outcome.metrics
    assert m["format_errors"] == 1 and m["turns"] == 3 and m["settings"]["mode"] == "icl"


def test_icl_exemplars_and_side_by_side_summary(tmp_path, monkeypatch):
    from experiments.studies.meditod import study as run_mod

    monkeypatch.setattr(run_mod, "context_budget", lambda *a: None)   # no context limit: every exemplar is kept
    sent: list = []

    def respond(role, content, gen):
        sent.append(content)
        return gold_backend("pol")(role, content, gen)

    s = settings(tmp_path, "pol", k=2, out=str(tmp_path / "runs" / "pol-icl"))
    run("pol", s, ScriptedLLM(respond, roles=("model", "grader")))
    assert len(sent) == 4 and all([m["role"] for m in p].count("assistant") == 2 for p in sent)
    assert all(r["metadata"]["exemplars_kept"] == 2 and len(r["inputs"]["exemplar_ids"]) == 2 for r in records(s.out).values())
    s2 = s.model_copy(update={"mode": "supervised", "k": 0, "out": str(tmp_path / "runs" / "pol-supervised")})
    run("pol", s2, ScriptedLLM(gold_backend("pol", mode="supervised"), roles=("model", "grader")))
    summary = (Path(s2.out) / "summary.md").read_text()
    assert "| metric | supervised (embedded) | icl (embedded) |" in summary
    # the paper table of a run's first summary holds that run's own values (metrics.json is written before it)
    paper = summary.split("as in the paper", 1)[1]
    assert "| F1 (all) | 1.0000 |" in paper and "| P@1 | 1.0000 |" in paper
    rec = next(iter(records(s2.out).values()))
    assert rec["metadata"]["prompt_format"] == "completion" and rec["inputs"]["prompt"].endswith("[output]\n[answer]")
    assert rec["scores"]["prf"]["value"]["f1"] == 1.0


def test_nlg_summary_counts_gold_utterances_over_the_token_cap(tmp_path):
    # tokens by the estimate len // 3 + 1 (the fixture above): "Is it getting worse over time?" 30 chars -> 11,
    # "Okay. Any fever or chills?" 26 -> 9, "I see, so tell me more about it." 32 -> 11; cap 10 -> 2 of 3 over
    s = settings(tmp_path, "nlg", max_tokens=10)
    outcome = run("nlg", s, ScriptedLLM(gold_backend("nlg"), roles=("model", "grader")))
    gl = outcome.metrics["gold_length"]
    assert (gl["max_tokens"], gl["golds"], gl["golds_over_cap"], gl["gold_tokens_max"]) == (10, 3, 2, 11)
    assert "Gold utterances longer than max_tokens=10: 2 of 3." in (Path(s.out) / "summary.md").read_text()


PRED = [{"intent": "inform", "slots": {"positive_symptom": [{"value": "dyspnea", "onset": "2 weeks back"}]}}]


def adjudication_backend(fail_grader=False):
    def respond(role, prompt, gen):
        if role == "grader":
            if fail_grader:
                raise down()
            return "positive" if "Phrase 1: two weeks ago\nPhrase 2: 2 weeks back" in prompt else "negative"
        return json.dumps(PRED)

    return respond


def test_adjudication_through_the_grader_role(tmp_path):
    s = settings(tmp_path, "nlu", limit=1, adjudicate_model="judge")
    outcome = run("nlu", s, ScriptedLLM(adjudication_backend(), roles=("model", "grader")))
    m = outcome.metrics
    # gold: head dyspnea (canonical) + onset "two weeks ago" (non-canonical); exact: non-canonical TP 0 FP 1 FN 1
    assert m["medical_f1"] == 1.0 and m["non_medical_f1"] == 0.0 and m["f1"] == 0.5
    adj = m["adjudicated"]
    assert adj["pairs_judged"] == 1 and adj["unparsed_verdicts"] == 0 and adj["non_medical_f1"] == 1.0 and adj["f1"] == 1.0
    rec = records(s.out)["301/1"]
    assert [c["step"] for c in rec["calls"]] == ["predict", "adjudicate:0"] and rec["calls"][1]["role"] == "grader"
    line = json.loads((Path(s.out) / "adjudications.jsonl").read_text())
    assert line["gold"] == "two weeks ago" and line["same"] is True
    assert "icl + adjudication" in (Path(s.out) / "summary.md").read_text()


def test_failed_adjudication_fails_the_turn(tmp_path):
    s = settings(tmp_path, "nlu", limit=1, adjudicate_model="judge")
    outcome = run("nlu", s, ScriptedLLM(adjudication_backend(fail_grader=True), roles=("model", "grader")))
    assert outcome.exit_code == 3 and records(s.out)["301/1"]["status"] == "failed"
    assert outcome.metrics["adjudicated"]["pairs_judged"] == 0


def test_grader_role_is_the_model_without_adjudication(tmp_path):
    study = study_of("nlu")
    s, _ = prepare_run(study, settings(tmp_path, "nlu", limit=1, roles={"model": "embedded@http://127.0.0.1:9/v1"}))
    assert s.roles == {"model": "embedded@http://127.0.0.1:9/v1", "grader": "embedded@http://127.0.0.1:9/v1"}
    s, _ = prepare_run(study, settings(tmp_path, "nlu", limit=1, adjudicate_model="judge-model"))
    assert s.roles["grader"] == "judge-model"


@pytest.mark.parametrize("kw, message", [
    (dict(mode="icl", lora={"a": "/x"}), "--lora serves an adapter for --mode supervised"),
    (dict(data=None), "no data"),
    (dict(split="ood"), "ood_ids.json: file does not exist"),
    (dict(roles={"model": "embedded", "doctor": "x"}), "unknown role"),
])
def test_prepare_refuses(tmp_path, kw, message):
    with pytest.raises(MedstackError, match=message):
        prepare_run(study_of("nlu"), settings(tmp_path, "nlu", **kw))


# ------------------------------------------------------------------ bad input: exit 2, before any server starts

@pytest.mark.parametrize("extra, message", [
    (["--k", "-2"], "k: Input should be greater than or equal to 0"),
    (["--limit", "0"], "limit: Input should be greater than or equal to 1"),
    (["--mode", "bogus"], "--mode must be icl or supervised"),
    (["--max-tokens", "0"], "max_tokens"),
])
def test_cli_bad_options_exit_2_without_a_server(cli, tmp_path, extra, message):
    r = cli("run", "meditod-nlu", "--data", str(DATA), "--model", "embedded", "--out", str(tmp_path / "x"), *extra, timeout=120)
    assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]
    assert "starting vLLM" not in r.stderr and not (tmp_path / "x").exists()  # refused before any server


def test_cli_dialogs_not_json_exits_2_without_a_server(cli, tmp_path):
    bad = tmp_path / "dialogs.json"
    bad.write_text("{not json")
    r = cli("run", "meditod-pol", "--data", str(bad), "--model", "embedded", "--out", str(tmp_path / "x"), timeout=120)
    assert r.returncode == 2 and "dialogs.json:1:2: not valid JSON" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "starting vLLM" not in r.stderr
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00\x81binary")
    r = cli("run", "meditod-nlg", "--data", str(binary), "--model", "embedded", "--out", str(tmp_path / "x"), timeout=120)
    assert r.returncode == 2 and "not UTF-8" in r.stderr and "Traceback" not in r.stderr


def test_cli_help_lists_common_and_study_options(cli):
    for task in ("nlu", "pol", "nlg"):
        r = cli("run", f"meditod-{task}", "--help")
        for opt in ("--model", "--role", "--set", "--lora", "--limit", "--concurrency", "--api-key", "--k", "--adjudicate-model", "--split"):
            assert opt in r.stdout, (task, opt)
        assert "--lora-name" not in r.stdout


def test_input_too_long_for_the_served_context_fails_and_says_how_to_make_room(tmp_path, monkeypatch):
    """The budget follows the served context (the server's max_model_len); a turn whose input alone is over it
    is a failed turn (never scored) whose error names `--max-model-len`."""
    from experiments.studies.meditod import study as run_mod
    from serving.client import StatusError

    served = []

    async def context_of(self, role="default"):
        served.append(role)
        return 300  # as /v1/models would say for a server started with --max-model-len 300

    monkeypatch.setattr(ScriptedLLM, "served_context_length", context_of)

    def respond(role, content, gen):
        raise StatusError(400, "This model's maximum context length is 300 tokens. However, your prompt contains at least 301 input tokens")

    s = settings(tmp_path, "pol", k=0)
    outcome = run("pol", s, ScriptedLLM(respond, roles=("model",)))
    assert served == ["model"] and outcome.metrics["settings"]["context_budget"] == 300 - s.sampling.turn.max_tokens - s.context_margin
    recs = records(s.out)
    assert recs and all(r["status"] == "failed" and "medstack serve --max-model-len N" in r["error"] for r in recs.values())
    assert run_mod.context_budget("embedded", 256, 8) == 2048 - 264  # no server answer: the registry's length


def test_exemplars_left_out_to_fit_are_counted_and_said_everywhere(tmp_path, monkeypatch):
    """In-context requests that carry fewer than k exemplars are a protocol deviation: per request in
    the record, summed in metrics.json, a line in summary.md (the CLI prints it last), a paper-table footnote."""
    from experiments.core.deviations import protocol_lines
    from experiments.studies.meditod import study as run_mod
    from experiments.studies.meditod.prompts import estimate_message_tokens, icl_messages

    s = settings(tmp_path, "nlu", k=2)
    cases = with_exemplars(load_samples(s), s)
    with_one = [estimate_message_tokens(icl_messages("nlu", c["sample"], c["exemplars"][:1])) for c in cases]
    with_two = [estimate_message_tokens(icl_messages("nlu", c["sample"], c["exemplars"][:2])) for c in cases]
    budget = sorted(with_one)[len(with_one) // 2]  # about half the requests keep one exemplar, the others none
    assert budget < min(with_two)
    monkeypatch.setattr(run_mod, "context_budget", lambda *a: budget)
    s = settings(tmp_path, "nlu", k=2)
    run("nlu", s, ScriptedLLM(gold_backend("nlu"), roles=("model", "grader")))
    recs = list(records(s.out).values())
    kept = [r["metadata"]["exemplars_kept"] for r in recs]
    assert all(r["protocol"]["exemplars"]["asked"] == 2 and r["protocol"]["exemplars"]["sent_min"] == k for r, k in zip(recs, kept))
    m = json.loads((Path(s.out) / "metrics.json").read_text())["protocol"]["exemplars"]
    assert m["requests"] == len(recs) and m["requests_below"] == len(recs) == sum(k < 2 for k in kept)
    assert m["sent_min"] == min(kept) and m["sent_mean"] == round(sum(kept) / len(kept), 3)
    (line,) = protocol_lines({"exemplars": m})
    assert line.startswith(f"protocol deviation: {len(recs)} of {len(recs)} requests carried fewer in-context exemplars")
    summary = (Path(s.out) / "summary.md").read_text()
    head, _, tables = summary.partition("as in the paper")
    assert line[1:] in head and tables and line[1:] in tables   # under the title, and a footnote of the paper table
