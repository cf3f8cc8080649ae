"""DERA on the scorers: solve writes the typed record and nothing scored, the declared scorers grade it after; every
table shows a score's one figure (summary.md's own table, its Scores section, the paper table, compare and the report:
the similarity normalised over the run everywhere); each model scorer is asked again by `rescore` and gives `review`
its items; and every older results folder reads, through the study's upgrade, as a run today writes it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shutil
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from experiments.common.grade import grades
from experiments.core import registry, runner
from experiments.core.config import ConfigError
from experiments.core.results import settings_of
from experiments.core.scorers import figure_cell, figures
from experiments.core.study import CaseContext
from experiments.studies.dera import qa_metrics
from experiments.studies.dera.prompts import PROMPTS
from experiments.studies.dera.scorers import QA
from experiments.studies.dera.study import SAMPLE_QA
from experiments.tools.compare.run import run_compare
from experiments.tools.report.build import build_report
from experiments.tools.review.judges import load_judge
from tests.conftest import FIXTURES
from tests.scripted import ScriptedLLM
from tests.test_dera_runner import DEAD, ROLES, SUMMARY_SECTIONS, dialogue_backend, no_bertscore, qa_backend, records, run, settings_for  # noqa: F401
from tests.test_old_runs import _same
from tests.test_rescore import app_with_rescore, rescore

PRF = ("precision", "recall", "f1")
OLD = FIXTURES / "old_runs"


# ------------------------------------------------------------------ a backend whose judge varies (as the older folders were made)

def h(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


async def varied_bertscore(pred, gold, model_path, num_layers=None):
    return round(0.2 + (h(pred + gold) % 70) / 100, 3)


@pytest.fixture
def varied_bert(monkeypatch):
    monkeypatch.setattr(qa_metrics, "bertscore", varied_bertscore)


def varied_qa(role, content, gen):
    """The judge says True / False / neither, and 0.8 / 0.3 / 7 (out of range) / no number, by the prompt's hash."""
    prompt = content[-1]["content"]
    k = h(prompt)
    if role == "judge":
        return ["True\nThe same.", "False\nDifferent.", "It depends."][k % 3] if "Answer 1" in prompt else ["0.8", "0.3", "7", "no number"][k % 4]
    if role == "researcher":
        return "Think about what the question says. STOP"
    if "Options:" in prompt:
        return f"Answer: {'ABCDE'[k % 5]}\nResponse: it fits."
    if "goitre" in prompt and "Here is a discussion" not in prompt:
        return ""  # no usable sample: that question's 1-shot arm has no answer (0 by rule, the judge not asked)
    return ["Answer: Bradykinin\nResponse: it fits.", "Answer: Histamine", "Scrotal ultrasound"][k % 3]


def varied_dialogue(role, content, gen):
    """Sections that differ by prompt; the judge lists 1-4 concepts (or none it can read) and finds some of them."""
    prompt = content[-1]["content"]
    k = h(prompt)
    if role == "researcher":
        return '[RESPONSE: "Pertinent Positives omit the fever."]' if "(no messages yet)" in prompt else "[STOP]"
    if role == "judge":
        if "List the medical concepts" in prompt:
            return "I cannot list them." if k % 7 == 0 else json.dumps([f"concept {(k >> i) % 6}" for i in range(1 + k % 4)])
        n = len(re.findall(r"^\d+\. ", prompt, re.M))
        return json.dumps(list(range(1, 1 + (k % (n + 1)))))
    if "Discussion so far" in prompt:
        return '[RESPONSE: "Agreed."] [SCRATCHPAD: "Pertinent Positives: add fever"]'
    return "\n".join(f"{s}: finding {k % 5} and finding {(k // 5) % 5} about {s.lower()}." for s in SUMMARY_SECTIONS)


# the older folders (tests/fixtures/old_runs, written by the code before typed records) and the same runs today
REF_ENCOUNTERS = FIXTURES / "dera" / "encounters_reference.jsonl"
RUNS = {"dera-qa-scores": ("dera-qa", {}, varied_qa, SAMPLE_QA), "dera-qa-mcq": ("dera-qa", {"mcq": True}, varied_qa, SAMPLE_QA),
        "dera-summarize": ("dera-summarize", {}, varied_dialogue, REF_ENCOUNTERS),
        "dera-corrupt": ("dera-corrupt", {"corruption_level": 5}, varied_dialogue, REF_ENCOUNTERS)}


def today(tmp_path: Path, fixture: str):
    name, options, backend, data = RUNS[fixture]
    study, s = settings_for(name, tmp_path / fixture, options=options, data=str(data))
    outcome, _ = run(study, s, backend)
    assert outcome.exit_code == 0
    return study, s, Path(s.out)


def figs(out: Path) -> dict[str, dict]:
    return {f["score"]: f for f in json.loads((out / "metrics.json").read_text())["scores"] if f["metric"] == "mean"}


# ------------------------------------------------------------------ solve, then the scorers

@pytest.mark.parametrize("mcq", [False, True], ids=["open", "mcq"])
def test_qa_record_is_typed_and_its_grades_are_the_scorers(tmp_path, no_bertscore, mcq):
    study, s = settings_for("dera-qa", tmp_path, options={"mcq": True} if mcq else {}, limit=2)
    assert run(study, s, qa_backend())[0].exit_code == 0
    for r in records(Path(s.out)).values():
        assert set(r["answer"]) == {"oneshot", "dera"} and [t["role"] for t in r["transcript"]][:2] == ["decider", "researcher"]
        assert r["inputs"]["question"] and ("choices" in r["inputs"]) is mcq and "correct" not in r and "scores" not in r["metadata"]
        if mcq:  # the options in letter order, the gold as its letter
            assert r["target"] == "B" and r["inputs"]["choices"][r["inputs"]["answer_index"]] == r["metadata"]["gold_text"]
        g = grades(r)
        steps = ("accuracy",) if mcq else ("llm-exact", "llm-similarity", "bertscore")
        assert set(g) == {f"{step}/{arm}" for step in steps for arm in ("oneshot", "dera")}
        for arm in ("oneshot", "dera"):
            assert all(g[f"{step}/{arm}"].answer == r["answer"][arm] for step in steps)
            if mcq:
                assert g[f"accuracy/{arm}"].value == int(r["answer"][arm] == r["target"]) and g[f"accuracy/{arm}"].judge == {"rule": "the voted letter is answer_idx"}
                continue
            assert g[f"llm-exact/{arm}"].judge == {"model": s.roles["judge"], "prompt_hash": PROMPTS.hash("judge_exact")}
            assert g[f"llm-similarity/{arm}"].judge["prompt_hash"] == PROMPTS.hash("judge_similarity")
            assert (g[f"llm-exact/{arm}"].value, g[f"llm-similarity/{arm}"].value) == (1, 0.8)  # qa_backend's judge replies
            assert g[f"llm-exact/{arm}"].explanation.startswith("True")
        # the judges ask after solve: their requests come last in the call log
        roles = [c["role"] for c in r["calls"]]
        assert mcq or roles[roles.index("judge"):] == ["judge"] * 4


@pytest.mark.parametrize("name,options", [("dera-summarize", {}), ("dera-corrupt", {"corruption_level": 3})])
def test_gptf1_grades_per_arm_and_section(tmp_path, name, options):
    study, s = settings_for(name, tmp_path, options=options, limit=2)
    assert run(study, s, dialogue_backend(SUMMARY_SECTIONS))[0].exit_code == 0
    arms = {"initial", "dera"} if name == "dera-corrupt" else {"dera_vs_initial"}
    for r in records(Path(s.out)).values():
        g = grades(r)
        assert {n.split("/")[1] for n in g} == arms and all(n.startswith("gptf1/") for n in g)
        assert set(r["answer"]) == {"initial", "dera"} and (r["target"] is not None) == (name == "dera-corrupt")
        for arm in arms:
            assert g[f"gptf1/{arm}"].judge["model"] == s.roles["judge"]
            sections = [g[f"gptf1/{arm}/{sec}"] for sec in s.score_sections]
            scored = [x.value["f1"] for x in sections if x.value is not None]
            assert g[f"gptf1/{arm}"].value["f1"] == (sum(scored) / len(scored) if scored else None)  # the average over the scored sections
            assert all(x.value is None or set(x.value) == set(PRF) for x in sections)
            assert sections[0].metadata["gt_concepts"] == ["fever", "cough"]  # what the judge listed: the evidence, in the grade


# ------------------------------------------------------------------ one figure everywhere

def test_one_figure_of_a_score_in_every_table_the_similarity_normalised(tmp_path, varied_bert):
    """DERA-QA with a judge that says 7 (out of range: 0 by the similarity's scale) and no number (unscored): summary.md's
    own table, its Scores section, its paper table, `compare` and the report show one figure of llm-similarity/dera,
    the normalised mean with its interval from resampling whole questions."""
    study, s, out = today(tmp_path, "dera-qa-scores")
    raw = [grades(r)["llm-similarity/dera"].value for r in records(out).values()]
    scored = [v for v in raw if v is not None]
    assert 7 in scored and None in raw  # the backend's out-of-range and unreadable replies are both there
    f = figs(out)["llm-similarity/dera"]
    assert f["value"] == pytest.approx(sum(v if 0 <= v <= 1 else 0 for v in scored) / len(scored)) and f["n"] == len(scored)
    assert f["unscored"] == raw.count(None) and next(sc for sc in QA if sc.name == "llm-similarity").unit == "case_id"
    cell = figure_cell(f)
    summary = (out / "summary.md").read_text()
    own, scores = summary.split("## Scores")
    assert re.search(rf"\| DERA \|[^\n]*\| {re.escape(cell)} \|\n", own)  # the study's table: the last column, similarity
    assert f"| llm-similarity/dera: the DERA answer | {cell} |" in scores
    assert f"| LLM similarity — DERA | {f['value']:.3f} [{f['low']:.3f}, {f['high']:.3f}] |" in own  # the paper table
    cmp = run_compare([str(out)], tmp_path / "cmp")
    assert next(x for x in cmp["scores"][0]["scores"] if x["score"] == "llm-similarity/dera" and x["metric"] == "mean") == f
    assert f"| llm-similarity/dera: the DERA answer | {cell} |" in (tmp_path / "cmp" / "summary.md").read_text()
    html = build_report([str(out)], tmp_path / "report.html").read_text()
    assert f"<td>llm-similarity/dera</td><td>mean</td><td>{cell}</td>" in re.sub(r">\s+<", "><", html)


def test_gptf1_tables_show_the_scores_figures(tmp_path):
    study, s, out = today(tmp_path, "dera-corrupt")
    f = figs(out)
    summary = (out / "summary.md").read_text()
    own, scores = summary.split("## Scores")
    avg = figure_cell(f["gptf1/dera[f1]"])
    assert "| 5 | **Average** |" in own and f"| {avg} |\n" in own and f"| gptf1/dera[f1] | {avg} |" in scores
    sec = figure_cell(f["gptf1/initial/Pertinent Positives[f1]"])
    assert f"| 5 | Pertinent Positives | {f['gptf1/initial/Pertinent Positives[precision]']['value']:.3f} |" in own and sec in own
    m = json.loads((out / "metrics.json").read_text())
    assert "gptf1" not in m and m["dera_minus_initial_f1"]["n"] == f["gptf1/dera[f1]"]["n"]


# ------------------------------------------------------------------ rescore and review

@pytest.fixture
def other_judge(monkeypatch):
    """`rescore`'s client: another judge (False, 0.25, a short concept list that is always found); ``sent`` its requests."""
    sent: list[str] = []

    def respond(role, content, gen):
        prompt = content[-1]["content"]
        sent.append(role)
        if "List the medical concepts" in prompt:
            return '["fever"]'
        return "[1]" if re.search(r"^\d+\. ", prompt, re.M) else "False\nA different drug." if "Answer 1" in prompt else "0.25"

    @asynccontextmanager
    async def scripted(roles, **kw):
        yield ScriptedLLM(respond, roles=tuple(roles)), {}

    monkeypatch.setattr(runner, "open_client", scripted)
    return sent


def test_each_model_scorer_is_asked_again_by_rescore(tmp_path, varied_bert, other_judge):
    app = app_with_rescore()
    _, _, qa = today(tmp_path, "dera-qa-scores")
    source = records(qa)
    for step, step_name, value in (("llm-exact", "exact", 0), ("llm-similarity", "similarity", 0.25)):
        other_judge.clear()
        res = rescore(app, qa, "--judge", step, "--judge-model", f"other={DEAD}", "--out", tmp_path / step)
        assert res.exit_code == 0, res.output
        asked = [(rid, arm) for rid, r in source.items() for arm in ("oneshot", "dera") if r["answer"][arm]]
        assert other_judge == ["judge"] * len(asked)  # the judge's requests only, one per answered arm
        for rid, r in records(tmp_path / step).items():
            assert r["scores"] | source[rid]["scores"] == r["scores"]  # the run's own grades kept
            assert all(r["scores"][f"{step}/{arm}@other"]["value"] == value for i, arm in asked if i == rid)
            assert {c["step"] for c in r["calls"]} <= {f"judge:{step_name}:oneshot", f"judge:{step_name}:dera"}
        m = json.loads((tmp_path / step / "metrics.json").read_text())["rescore"]
        both = [1 for rid, arm in asked if grades(source[rid])[f"{step}/{arm}"].scored]  # agreement: the items both judges scored
        assert m["judge"] == step and m["agreement"]["other"]["n"] == len(both) > 0
    _, _, summ = today(tmp_path, "dera-summarize")
    res = rescore(app, summ, "--judge", "gptf1", "--judge-model", f"other={DEAD}", "--out", tmp_path / "gptf1")
    assert res.exit_code == 0, res.output
    assert set(other_judge[-3:]) == {"judge"} and {c["role"] for r in records(tmp_path / "gptf1").values() for c in r["calls"]} == {"judge"}
    again = figs(tmp_path / "gptf1")
    assert again["gptf1/dera_vs_initial@other[f1]"]["value"] == 1.0  # ["fever"] found in the other every time
    assert "gptf1/dera_vs_initial@other[f1]" in (tmp_path / "gptf1" / "summary.md").read_text()
    res = rescore(app, qa, "--judge", "bertscore", "--judge-model", f"other={DEAD}", "--out", tmp_path / "bs")
    assert isinstance(res.exception, ConfigError) and "bertscore cannot be asked again" in str(res.exception)  # a rule: exit 2 in `medstack`
    assert str(res.exception).endswith("its judge steps: llm-exact, llm-similarity")


def test_review_items_show_what_each_judge_was_shown(tmp_path, varied_bert):
    _, _, qa = today(tmp_path, "dera-qa-scores")
    rec = records(qa)
    exact = load_judge(qa, "llm-exact")
    judged = {(rid, arm) for rid, r in rec.items() for arm in ("oneshot", "dera")
              if grades(r)[f"llm-exact/{arm}"].scored and grades(r)[f"llm-exact/{arm}"].judge.get("model")}
    assert {tuple(i["id"].split("|")) for i in exact["items"]} == judged and exact["scale"]["kind"] == "binary"
    rid, arm = exact["items"][0]["id"].split("|")
    assert exact["items"][0]["show"] == {"question": rec[rid]["inputs"]["question"], "gold answer": rec[rid]["target"],
                                         "prediction": rec[rid]["answer"][arm]}
    sim = load_judge(qa, "llm-similarity")["items"]
    assert {i["verdict"] for i in sim} <= {0.8, 0.3, 0.0} and 0.0 in {i["verdict"] for i in sim}  # 7 shown as the run counts it: 0
    _, _, summ = today(tmp_path, "dera-summarize")
    items = load_judge(summ, "gptf1")["items"]
    one = next(i for i in items if i["id"].startswith("enc-1|initial/"))
    rid, part = one["id"].split("|")
    section = part.split("/", 1)[1]
    r = records(summ)[rid]
    assert one["verdict"] == grades(r)[f"gptf1/{part}"].value["f1"]
    assert one["show"] == {"reference": r["target"][section], "prediction": r["answer"]["initial"][section]}
    assert not any(i["id"].endswith(("|initial", "|dera", "|dera_vs_initial")) for i in items)  # an average is no decision


def test_the_judges_ask_again_exactly_what_the_run_asked(tmp_path, no_bertscore):
    study, s = settings_for("dera-qa", tmp_path, limit=1)
    run(study, s, qa_backend())
    rec = next(iter(records(Path(s.out)).values()))
    sent = []

    def other(role, content, gen):  # another judge model: disagrees on both
        sent.append(role)
        return "False\nA different drug." if "Answer 1" in content[-1]["content"] else "0.25"

    s2 = s.model_copy(update={"roles": {**s.roles, "judge": "other-judge"}})
    for step, value, reply in (("llm-exact", 0, "False\nA different drug."), ("llm-similarity", 0.25, "0.25")):
        ctx = CaseContext(ScriptedLLM(other, roles=ROLES), rec["id"])
        g = asyncio.run(next(x for x in QA if x.name == step).run(ctx, rec, s2, "judge"))[f"{step}/dera"]
        assert (g.value, g.explanation, g.answer, g.judge["model"]) == (value, reply, rec["answer"]["dera"], "other-judge")
        for call in ctx.calls:  # each arm's request, word for word the run's own request of this judge
            first = next(c for c in rec["calls"] if c["step"] == call["step"])
            assert call["messages"] == first["messages"] and call["gen"] == first["gen"]
        assert [c["step"] for c in ctx.calls] == [f"judge:{step.removeprefix('llm-')}:{arm}" for arm in ("oneshot", "dera")]
    assert sent == ["judge"] * 4  # no decider or researcher request
    nothing = {**rec, "answer": {"oneshot": None, "dera": None}}  # no answer: nothing to ask, 0 by rule
    ctx = CaseContext(ScriptedLLM(other, roles=ROLES), rec["id"])
    assert asyncio.run(next(x for x in QA if x.name == "llm-exact").run(ctx, nothing, s2, "judge"))["llm-exact/dera"].value == 0 and not ctx.calls


# ------------------------------------------------------------------ older folders

@pytest.mark.parametrize("fixture", RUNS)
def test_an_older_folder_reads_as_the_same_run_today(tmp_path, varied_bert, fixture):
    """A folder the code before typed records wrote (typed scores beside the study's own fields; the same backend and
    settings), read through the one reader: the records a run today writes, with the same grades (a GPT-F1 section's
    concept lists kept in its grade) and the same figures, intervals included (one record per case: nothing to resample
    differently)."""
    study, s, out = today(tmp_path, fixture)
    new = records(out)
    old = registry.open_run(OLD / fixture)
    assert old.schema == 2 and {r["id"] for r in old.finished} == set(new)
    for r in old.finished:
        n = new[r["id"]]
        assert r["scores"] == n["scores"] and r["answer"] == n["answer"] and r["transcript"] == n["transcript"]
        if fixture == "dera-summarize":  # the encounter and its reference were not kept then
            assert r["inputs"] == {} and r["target"] is None and n["inputs"]["chat"] and (n["target"] is None) == ("gptf1/dera" not in n["scores"])
        else:
            assert r["target"] == n["target"] and (r["inputs"] == n["inputs"] or fixture == "dera-corrupt")
        # the judges' parses and templates were counted with the agents' then; now they are the scorers' own
        assert {k for k in n["metadata"] if r["metadata"].get(k) != n["metadata"][k]} <= {"parse_errors", "parse_attempts", "prompt_hashes"}
        assert set(r["metadata"]) == set(n["metadata"])
    assert [f.json() for f in figures(old.finished, study.scorers)] == json.loads((out / "metrics.json").read_text())["scores"]
    # the study's own metrics over the upgraded records: what that run wrote (the machine's encoder path aside)
    again = study.metrics(sorted(old.finished, key=lambda r: r["id"]), settings_of(old.config, study.settings_cls))
    written = json.loads((OLD / fixture / "metrics.json").read_text())
    assert again and all(_same(again[k], written.get(k)) for k in again), [k for k in again if not _same(again[k], written.get(k))]


def test_a_dialogue_folder_before_typed_scores_reads_the_same(tmp_path):
    """The corruption study as written before typed scores (its GPT-F1 only in the ``gptf1`` dict, with ``score`` and
    ``improved`` restating the DERA arm's average): the same grades as the folder written with them."""
    shutil.copytree(OLD / "dera-corrupt", tmp_path / "old")
    lines = []
    for r in map(json.loads, (tmp_path / "old" / "records.jsonl").read_text().splitlines()):
        r.pop("scores")
        i, d = r["gptf1"]["initial"]["average"]["f1"], r["gptf1"]["dera"]["average"]["f1"]
        lines.append(json.dumps({**r, "score": d, "improved": None if None in (i, d) else int(d > i)}))
    (tmp_path / "old" / "records.jsonl").write_text("\n".join(lines) + "\n")
    ident = json.loads((tmp_path / "old" / "identity.json").read_text())
    (tmp_path / "old" / "identity.json").write_text(json.dumps({k: v for k, v in ident.items() if k != "records_schema"}))
    before, typed = registry.open_run(tmp_path / "old"), registry.open_run(OLD / "dera-corrupt")
    assert before.schema == 1 and {r["id"]: r["scores"] for r in before.finished} == {r["id"]: r["scores"] for r in typed.finished}
    assert not any(k in r for r in before.finished for k in ("gptf1", "score", "improved"))


def test_an_older_demo_folder_with_the_samples_old_path_resumes(tmp_path, varied_bert):
    """`make demo`'s folder from before: config.yaml names the demo kind (dera-qa-demo) and the shipped sample at its
    older place (experiments/dera/data/); the same command today resumes it, its records read through the upgrade."""
    shutil.copytree(OLD / "dera-qa-scores", tmp_path / "demo")
    cfg = (tmp_path / "demo" / "config.yaml").read_text()
    old_path = str(SAMPLE_QA).replace("experiments/studies/dera/data/", "experiments/dera/data/")
    (tmp_path / "demo" / "config.yaml").write_text(cfg.replace("experiment: dera-qa\n", "experiment: dera-qa-demo\n")
                                                   .replace("data: experiments/studies/dera/data/sample_medqa_open.jsonl", f"data: {old_path}"))
    study, s = settings_for("dera-qa", tmp_path, out=str(tmp_path / "demo"))
    outcome, cases = run(study, s, varied_qa)
    assert outcome.exit_code == 0 and len(cases) == 5 and outcome.metrics["run"]["cases_resumed"] == 5
    assert figs(tmp_path / "demo")["llm-exact/oneshot"]["n"] == json.loads((OLD / "dera-qa-scores" / "metrics.json").read_text())["arms"]["oneshot"]["exact"]["n"]
