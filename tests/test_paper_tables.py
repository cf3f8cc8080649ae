"""Paper tables: values, CIs, published values and differences, paired tests with Holm, footnotes — worked by hand
on tiny runs; and the declarations of every study load and name real rows."""

from __future__ import annotations

import math

import pytest

from experiments.common.grade import to_disk
from experiments.core import registry
from experiments.core.record import record
from experiments.studies.dera.scorers import GPTF1, gptf1_grades
from experiments.tables import build, render
from experiments.tables.build import dig, matches
from experiments.tables.declare import load_declaration
from experiments.tables.plots import figure_png
from experiments.tables.render import table_view
from tests.standalone import citations


def study_tables(runs):
    return build.study_tables(runs, registry.table_sources())


def paper_tables_markdown(runs):
    return render.paper_tables_markdown(runs, registry.table_sources())


def declarations():
    return build.declarations(registry.table_sources())


B = 10_000  # experiments.common.stats' bootstrap resamples


def _rec(case: str, marks: dict[str, int], trial: int = 0) -> dict:
    """A CRAFT-MD record: marks = {'vignette.mcq': 1, ...} (1 correct, 0 wrong)."""
    scores = {"{1}/{0}".format(*k.split(".")): {"value": v} for k, v in marks.items()}  # vignette.mcq -> mcq/vignette
    return {"id": f"{case}/t{trial}", "case_id": case, "trial": trial, "answers": {}, "scores": scores, "status": "ok"}


def _craft_run(path: str, name: str, rows: dict[str, list[int]], config: dict | None = None) -> dict:
    cases = [f"c{i}" for i in range(len(next(iter(rows.values()))))]
    records = [_rec(c, {k: v[i] for k, v in rows.items()}) for i, c in enumerate(cases)]
    records.append({"id": "c9/t0", "case_id": "c9", "status": "failed", "error": "HTTP 500"})  # never scored
    cfg = {"experiment": "craftmd", "name": name, "trials": 1, "concurrent_rule": "zero", "max_turns": 4, **(config or {})}
    return {"path": path, "config": cfg, "metrics": {}, "identity": {"experiment": "craftmd"}, "records": records}


HAND = {"vignette.mcq": [1, 1], "multiturn.mcq": [0, 0], "singleturn.mcq": [0, 0], "summarized.mcq": [1, 1],
        "vignette.frq": [0, 1]}


def test_craftmd_table_hand_worked():
    run = _craft_run("/x/gpt35", "gpt-3.5-local", HAND)
    [st] = study_tables([run])
    mcq = next(t for t in st.tables if t.id == "mcq")
    g = mcq.groups[0]
    assert g.label == "gpt-3.5-local" and g.kind == "run" and g.published_model == "GPT-3.5"
    v = g.cells["mcq/vignette"]
    # constant values: the bootstrap CI collapses onto the mean; the failed case is not counted
    assert (v.value, v.low, v.high, v.n) == (1.0, 1.0, 1.0, 2)
    assert v.published == 0.657 and v.diff == pytest.approx(1 - 0.657)
    assert g.cells["mcq/singleturn"].published is None and g.cells["mcq/singleturn"].diff is None
    # paired tests (b - a per case): multi-turn vs vignette = -1 on every case -> no resample reaches 0: p = 1/(B+1);
    # single-turn vs multi-turn = 0 on every case -> every resample is as extreme: p = 1; summarized vs multi-turn: p = 1/(B+1)
    t1, t2, t3 = (g.cells[k].test for k in ("mcq/multiturn", "mcq/singleturn", "mcq/summarized"))
    assert (t1["vs"], t1["diff"], t1["n"]) == ("mcq/vignette", -1.0, 2) and t1["p"] == pytest.approx(1 / (B + 1))
    assert t2["diff"] == 0.0 and t2["p"] == pytest.approx(1.0)
    assert t3["diff"] == 1.0 and t3["p"] == pytest.approx(1 / (B + 1))
    # Holm over the table's three tests: sorted p (a, a, 1) -> (3a, max(3a, 2a), max(.., 1)) in input order
    assert t1["p_holm"] == pytest.approx(3 / (B + 1)) and t3["p_holm"] == pytest.approx(3 / (B + 1)) and t2["p_holm"] == pytest.approx(1.0)
    # FRQ: values 0 and 1 -> resampled means 0, .5, 1 -> the 95% CI spans [0, 1]
    f = next(t for t in st.tables if t.id == "frq").groups[0].cells["frq/vignette"]
    assert (f.value, f.low, f.high, f.n) == (0.5, 0.0, 1.0, 2) and f.diff == pytest.approx(0.5 - 0.375)
    # the paper's other models: their published figures alone, only the rows the paper gives
    paper_only = [x for x in mcq.groups if x.kind == "paper"]
    assert [x.label for x in paper_only] == ["GPT-4", "Mistral-v2-7b", "LLaMA-2-7b"]
    view = table_view(mcq)
    gpt4 = next(x for x in view["groups"] if x["label"] == "GPT-4 (paper)")
    assert [r[0] for r in gpt4["rows"]] == ["vignette", "multi-turn"] and gpt4["rows"][0][3] == "0.820"
    # footnotes: where the setting differs from the paper's
    notes = " ".join(mcq.footnotes)
    assert "Turn cap 4 doctor turns" in notes and "1 trial(s) per case (paper: 5)" in notes and "Computed on 2 cases; the paper's figures are over all 2,000" in notes
    assert "concurrent-diagnosis" not in notes  # FRQ-only footnotes stay under the FRQ table
    assert g.notes == list(range(1, len(mcq.footnotes) + 1))
    frq_notes = " ".join(next(t for t in st.tables if t.id == "frq").footnotes)
    assert "concurrent-diagnosis rule `zero`" in frq_notes and "our local grader-AI" in frq_notes


def test_craftmd_markdown_and_published_run():
    mine = _craft_run("/x/mine", "embedded", HAND)
    pub = _craft_run("/x/pub", "llama2-7b-published", HAND, {"imported_from": "/data/llama2-7b", "grades": "published",
                                                               "concurrent_rule": "any", "max_turns": None})
    pub["config"].pop("max_turns")
    md = paper_tables_markdown([mine, pub])
    assert "## CRAFT-MD: as in the paper (Johri et al., Nat Med 2025)" in md
    assert "| **embedded**^1^2^3 | vignette | 1.000 [1.000, 1.000] | 2 | – | – |  |" in md
    assert "| **llama2-7b-published (published run) — paper column: LLaMA-2-7b**^2^3^4 | vignette | 1.000 [1.000, 1.000] | 2 | 0.395 | +0.605 |  |" in md
    assert "vs vignette: -1.000 [-1.000, -1.000], p < 0.001" in md
    assert "The authors' released run, re-scored here" in md
    assert "Johri et al. 2025 (Nat Med), Fig. 2" in md and not citations(md, markdown=True)
    assert md.count("| **LLaMA-2-7b (paper)**") == 0  # its published values sit beside the published run instead


def test_ci_from_metrics_is_used_when_the_study_wrote_it():
    run = _craft_run("/x/a", "gpt-4-local", HAND)
    run["metrics"] = {"scores": [{"score": "mcq/vignette", "metric": "mean", "value": 0.5, "low": 0.25, "high": 0.75, "n": 40}]}
    [st] = study_tables([run])
    c = st.tables[0].groups[0].cells["mcq/vignette"]
    assert (c.value, c.low, c.high, c.n, c.published) == (0.5, 0.25, 0.75, 40, 0.820)
    assert c.diff == pytest.approx(0.5 - 0.82)


def test_meditod_corpus_rows_and_paper_only_models():
    run = {"path": "/x/nlu", "config": {"experiment": "meditod-nlu", "task": "nlu", "mode": "supervised", "encoder": None},
           "identity": {"experiment": "meditod-nlu"}, "records": [{"id": "1", "case_id": "d1"}, {"id": "2", "case_id": "d1"}],
           "metrics": {"f1": 0.5, "medical_f1": 0.6, "non_medical_f1": 0.25, "scored_turns": 2, "turns": 2,
                       "settings": {"task": "nlu", "mode": "supervised", "model": "embedded", "lora": {"nlu": "/a"}}}}
    [st] = study_tables([run])
    assert [t.id for t in st.tables] == ["nlu"]
    t = st.tables[0]
    g = t.groups[0]
    assert g.label == "embedded + LoRA nlu (supervised)" and g.published_model == "Llama3-8B (supervised)"
    c = g.cells["f1"]
    assert (c.value, c.low, c.n, c.published) == (0.5, None, 2, 0.7139) and c.diff == pytest.approx(0.5 - 0.7139)
    assert [x.label for x in t.groups if x.kind == "paper"] == ["Flan-T5-base (supervised)", "GPT-4-Turbo (in-context)"]
    notes = " ".join(t.footnotes)
    assert "1 test dialogue(s) scored" in notes and "matched exactly" in notes


def test_dera_and_autoeval_tables():
    def rec(i, init, final):  # GPT-F1 of the initial and DERA summaries, as the gptf1 scorer grades them
        arms = {arm: {"sections": {"Pertinent Positives": {"f1": f1, "scored": True}}, "average": {"f1": f1}} for arm, f1 in (("initial", init), ("dera", final))}
        return {"id": str(i), "case_id": str(i), "scores": to_disk({f"gptf1/{n}": g for a, v in arms.items() for n, g in gptf1_grades(a, v, {"model": "embedded"}).items()})}
    dera = {"path": "/x/c", "identity": {"experiment": "dera-corrupt"}, "metrics": {}, "scorers": (GPTF1,),
            "config": {"experiment": "dera-corrupt", "task": "corrupt", "corruption_level": 5, "roles": {"decider": "embedded", "judge": "embedded"},
                       "gptf1": {"max_concepts": 40}},
            "records": [rec(1, 0.5, 0.75), rec(2, 0.5, 0.75)]}
    ae = {"path": "/x/ae", "identity": {"experiment": "autoeval"}, "metrics": {}, "config": {"experiment": "autoeval", "roles": {"judge": "embedded"}},
          "records": [record(f"{d}::{c}", d, inputs={"criterion": c}, metadata={"model": "m"}, scores={f"rubric/{c}": {"value": v}})
                      for d, c, v in (("a", "empathy", 4), ("b", "empathy", 2), ("b", "welfare", None))]}
    sts = {st.decl.study: st for st in study_tables([ae, dera])}
    assert list(sts) == ["dera", "autoeval"]  # the report's order, whatever the order given
    t = sts["dera"].tables[0]
    g = t.groups[0]
    assert t.id == "corrupt" and g.label == "embedded, level 5"
    avg = g.cells["gptf1/dera[f1]"]  # the score's figure: the one aggregation, resampled by case
    assert avg.value == 0.75 and avg.published == 0.9597 and avg.diff == pytest.approx(0.75 - 0.9597)
    assert avg.test["diff"] == pytest.approx(0.25) and avg.test["p"] == pytest.approx(1 / (B + 1))
    assert {x.label for x in t.groups if x.kind == "paper"} == {"GPT-4, level 3 (low)", "GPT-4, level 7 (high)"}
    r = sts["autoeval"].tables[0]
    emp = r.groups[0].cells["rubric/empathy"]
    assert r.groups[0].label == "m rated by embedded" and (emp.value, emp.n) == (3.0, 2)
    assert r.groups[0].cells["rubric/welfare"].n == 0  # an unparsed rating is left out, never 0
    assert table_view(r)["groups"][0]["rows"][0][:2] == ["Showing Empathy", "3.00 [2.00, 4.00]"]
    png = figure_png(r)
    assert png and png[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_declaration_loads_and_names_its_rows():
    decls = declarations()
    studies = [d.study for d in decls]  # in their paper_tables.yaml `order`; a study added later joins without editing this
    assert [s for s in studies if s in ("craftmd", "dera", "meditod", "autoeval")] == ["craftmd", "dera", "meditod", "autoeval"]
    assert len(studies) == len(set(studies)) and [d.order for d in decls] == sorted(d.order for d in decls)
    for d in decls:
        assert d.adapter is not None
        for p in d.published:
            rows = {r.id for t in d.tables for r in t.rows}
            assert set(p.values) <= rows, (d.study, p.model, set(p.values) - rows)


def test_bad_declaration_is_one_clear_error(tmp_path):
    from experiments.core.config import ConfigError

    p = tmp_path / "paper_tables.yaml"
    p.write_text("study: x\ntitle: X\npaper: P\nsource: S\nexperiments: [x]\nadapter: a:b\ntables:\n  - id: t\n    title: T\n"
                 "    rows: [{key: a, label: A}]\n    tests: [[a, nope]]\n")
    with pytest.raises(ConfigError, match=r"paper_tables.yaml: tables.0: .*nope"):
        load_declaration(p)


def test_helpers():
    assert dig({"p@inf": 1, "a": {"b.c": 2}}, "p@inf") == 1 and dig({"a": {"b.c": 2}}, "a.b.c") == 2 and dig({}, "x.y") is None
    attrs = {"mode": "icl", "k": 5, "x": None}
    assert matches({"mode": "icl"}, attrs) and matches({"mode": ["icl", "supervised"]}, attrs) and not matches({"mode": "supervised"}, attrs)
    assert matches({"x": {"present": False}}, attrs) and matches({"k": {"not_in": [4]}}, attrs) and not matches({"k": {"ne": 5}}, attrs)
    assert math.isclose(1 / (B + 1), 9.999e-05, rel_tol=1e-3)


def test_a_runs_summary_tables_come_from_the_run_in_memory(tmp_path):
    """The summary renders its tables from the run the runner computed (records, config, metrics in memory): its folder
    is not read, so a stale metrics.json, or no folder at all, changes nothing."""
    import json

    from experiments.core.results import Run
    from experiments.tables.render import run_paper_tables

    records = [{"id": i, "case_id": "d1", "status": "ok"} for i in "12"]
    metrics = {"f1": 0.5, "medical_f1": 0.6, "non_medical_f1": 0.25, "scored_turns": 2, "turns": 2,
               "settings": {"task": "nlu", "mode": "supervised", "model": "embedded"}}
    run = Run(tmp_path / "never-written", records, [], {"experiment": "meditod-nlu", "task": "nlu", "mode": "supervised"},
              metrics=metrics, identity={"experiment": "meditod-nlu"})
    study = registry.get("meditod-nlu").make()
    fresh = run_paper_tables(run, study)
    assert "0.500" in fresh and "0.600" in fresh and not (tmp_path / "never-written").exists()
    (tmp_path / "never-written").mkdir()
    (tmp_path / "never-written" / "metrics.json").write_text(json.dumps({**metrics, "f1": 0.125}))  # a stale file from an earlier run
    assert run_paper_tables(run, study) == fresh
    kind = registry.kinds()["calibrate-craftmd-grader"]  # a kind that declares no tables
    assert run_paper_tables(Run(tmp_path, records, [], {"experiment": "calibrate-craftmd-grader"}, metrics=metrics), kind()) == ""
