"""`import craftmd` on a hand-written folder in the published format, and `compare` on hand-made runs."""

from __future__ import annotations

import json

import typer
import yaml
from typer.testing import CliRunner

from experiments.core import commands, registry
from experiments.studies.craftmd.compare import compare, run_compare as study_compare
from experiments.studies.craftmd.importer import import_folder, parse_conversation
from experiments.studies.craftmd.metrics import grades
from experiments.common.stats import mcnemar_test, mean_ci, paired_bootstrap


def run_compare(paths, out):
    """The study's own comparison, as `medstack compare` calls it."""
    return study_compare(paths, out, registry.study_for("craftmd"))


def make_run(path, name, scores: dict, trials=1, specialty="Dermatology"):
    """scores: {(fmt, mode): {case_id: [correct per trial]}} -> a results directory (records of the oldest shape: the
    reader upgrades them, as every tool reads them)."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"experiment": "craftmd", "name": name}))
    recs = {}
    for (fmt, mode), per_case in scores.items():
        for cid, vals in per_case.items():
            for t, v in enumerate(vals):
                r = recs.setdefault((cid, t), {"id": f"{cid}/t{t}", "case_id": cid, "trial": t, "specialty": specialty, "answers": {}})
                r["answers"].setdefault(fmt, {})[mode] = {"correct": v}
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs.values()))
    return path


A_VIG, A_MT = [1, 1, 1, 0] * 3, [1, 0, 0, 0] * 3
B_VIG, B_MT = [0, 0, 1, 0] * 3, [0, 0, 0, 0] * 3
CASES = [f"c{i:02d}" for i in range(1, 13)]  # sorted as listed: the order a paired test takes the shared cases
G_VIG = [1] * 10  # gamma holds c01 .. c10 only


def _runs(tmp_path):
    a = make_run(tmp_path / "a", "alpha", {("vignette", "mcq"): {c: [v] for c, v in zip(CASES, A_VIG)}, ("multiturn", "mcq"): {c: [v] for c, v in zip(CASES, A_MT)}})
    b = make_run(tmp_path / "b", "beta", {("vignette", "mcq"): {c: [v] for c, v in zip(CASES, B_VIG)}, ("multiturn", "mcq"): {c: [v] for c, v in zip(CASES, B_MT)}})
    g = make_run(tmp_path / "g", "gamma", {("vignette", "mcq"): {c: [v] for c, v in zip(CASES, G_VIG)}}, specialty="Neurology")
    return a, b, g


def test_compare_values_on_hand_made_runs(tmp_path):
    a, b, g = _runs(tmp_path)
    res = run_compare([str(a), str(b), str(g)], tmp_path / "cmp")
    on_disk = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert on_disk["accuracy"] == json.loads(json.dumps(res["accuracy"]))
    acc = {(x["run"], x["format"], x["mode"]): x for x in on_disk["accuracy"]}
    assert acc[("alpha", "vignette", "mcq")]["value"] == 0.75 and acc[("alpha", "vignette", "mcq")]["n"] == 12
    assert acc[("beta", "multiturn", "mcq")]["value"] == 0.0
    assert acc[("gamma", "vignette", "mcq")]["n"] == 10
    ci = mean_ci(A_VIG)
    assert (acc[("alpha", "vignette", "mcq")]["low"], acc[("alpha", "vignette", "mcq")]["high"]) == (ci.low, ci.high)

    tests = {(t["table"], t["a"], t["b"]): t for t in on_disk["tests"]}
    ab = tests[("runs|vignette.mcq", "alpha", "beta")]
    assert ab["n_paired"] == 12 and ab["mean_diff"] == 0.5
    assert ab["p"] == paired_bootstrap(A_VIG, B_VIG).p_value
    # McNemar on the paired binary outcomes: alpha right/beta wrong 6 times, never the reverse -> exact p = 2 * 0.5**6
    assert ab["mcnemar_table"] == [[3, 6], [0, 3]] and abs(ab["mcnemar_p"] - 2 * 0.5 ** 6) < 1e-12
    # gamma is paired on the 10 shared case ids only
    ag = tests[("runs|vignette.mcq", "alpha", "gamma")]
    assert (ag["n_paired"], ag["only_a"], ag["only_b"]) == (10, 2, 0) and ag["p"] == paired_bootstrap(A_VIG[:10], G_VIG).p_value
    bg = tests[("runs|vignette.mcq", "beta", "gamma")]
    assert bg["p"] == paired_bootstrap(B_VIG[:10], G_VIG).p_value
    # Holm within the table of three comparisons, by hand: sort, multiply by (m - rank), running max, cap at 1
    ps = [ab["p"], ag["p"], bg["p"]]
    order = sorted(range(3), key=lambda i: ps[i])
    expected, running = [0.0] * 3, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, ps[i] * (3 - rank)))
        expected[i] = running
    assert [ab["p_holm"], ag["p_holm"], bg["p_holm"]] == expected
    # a one-comparison table: Holm leaves p alone; format contrast within a run
    vm = tests[("formats|alpha|mcq", "vignette", "multiturn")]
    assert vm["mean_diff"] == 0.5 and vm["p_holm"] == vm["p"] == paired_bootstrap(A_VIG, A_MT).p_value
    assert vm["mcnemar_p"] == mcnemar_test(A_VIG, A_MT)["p_value"]
    # per specialty and outputs
    assert on_disk["per_specialty"]["gamma"]["Neurology"]["vignette.mcq"]["value"] == 1.0
    png = (tmp_path / "cmp" / "accuracy.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    md = (tmp_path / "cmp" / "summary.md").read_text()
    assert "| alpha | 0.750" in md and "| vignette MCQ accuracy, between runs | alpha | gamma | 10 (only in a: 2; only in b: 0) |" in md
    assert "runs|" not in md and "formats|" not in md  # internal keys are no labels


def test_trials_are_averaged_per_case_and_mcnemar_needs_binary(tmp_path):
    a = make_run(tmp_path / "a", "a", {("vignette", "frq"): {"c1": [1, 0], "c2": [1, 1], "c3": [0, 0]}}, trials=2)
    b = make_run(tmp_path / "b", "b", {("vignette", "frq"): {"c1": [0, 0], "c2": [1, 0], "c3": [None, 0]}}, trials=2)
    res = compare([str(a), str(b)])
    acc = {x["run"]: x for x in res["accuracy"]}
    assert acc["a"]["value"] == (0.5 + 1 + 0) / 3
    assert acc["b"]["value"] == (0 + 0.5 + 0) / 3 and acc["b"]["unscored"] == 1  # None left out, counted
    t = res["tests"][0]
    ref = paired_bootstrap([0.5, 1, 0], [0, 0.5, 0])
    assert (t["mean_diff"], t["diff_ci"]) == (ref.mean_diff, [ref.low, ref.high]) and t["mcnemar_p"] is None
    assert t["p"] is None and t["too_few"]  # 3 shared cases: an interval, no p-value


def test_import_published_folder(fixtures_dir, tmp_path):
    src = fixtures_dir / "craftmd" / "published_demo"
    m = import_folder(src, "published-demo", tmp_path / "imp", str(fixtures_dir / "craftmd" / "cases.csv"))
    recs = {r["id"]: r for r in (json.loads(l) for l in (tmp_path / "imp" / "records.jsonl").read_text().splitlines())}
    assert sorted(recs) == ["case_a/t0", "case_a/t1", "case_b/t0", "case_b/t1"]
    a0, a1, b0, b1 = recs["case_a/t0"], recs["case_a/t1"], recs["case_b/t0"], recs["case_b/t1"]
    # conversations in both published shapes; the system message is dropped
    assert [t["role"] for t in a0["transcript"]] == ["patient", "doctor", "patient", "doctor"]
    stop = lambda r: r["metadata"]["stop_reason"]  # noqa: E731
    assert stop(a0) == "final_diagnosis" and stop(a1) == "no_question" and stop(b1) == "turn_cap"
    assert a1["transcript"][1] == {"role": "doctor", "text": "Do your nails look different?", "turn": 1}
    # MCQ free text -> choice, one rule: exact / letter / stated / contains / first / fuzzy / unparsed
    g = lambda r, f, m="mcq": grades(r)[(f, m)]
    assert (g(a0, "vignette").source, g(a0, "vignette").value) == ("letter", 1)
    assert (g(a0, "multiturn").source, g(a0, "multiturn").value) == ("stated", 1)  # "The answer is plaque psoriasis."
    assert (g(a0, "summarized").source, g(a0, "summarized").value) == ("unparsed", 0)
    assert (a1["inputs"]["choices"][g(a1, "multiturn").metadata["choice"]], g(a1, "multiturn").value) == ("Tinea corporis", 0)
    assert (g(b0, "summarized").source, g(b0, "summarized").value) == ("fuzzy", 1)  # 'infraction'
    assert isinstance(a0["answer"]["vignette"]["mcq"], str)  # what was said; the grade is in scores only
    assert b0["inputs"]["choices"][0] == "Myocardial infarction" and b0["inputs"]["specialty"] == "Cardiovascular System"  # from --cases
    # FRQ: published grades and extracted answers
    assert g(a0, "singleturn", "frq").metadata["extraction_status"] == "multiple" and g(a0, "singleturn", "frq").value == 0
    assert g(b0, "singleturn", "frq").metadata["extraction_status"] == "none"
    assert g(a1, "summarized", "frq").value == 0 and g(a1, "vignette", "frq").source == "published"
    assert g(a1, "vignette", "frq").judge == {"model": "published"}
    fig = {f["score"]: f for f in m["scores"] if f["metric"] == "mean"}
    assert fig["frq/vignette"]["value"] == 1.0 and fig["frq/singleturn"]["value"] == 0.0
    assert fig["mcq/multiturn"]["value"] == 0.25  # a0 right, a1/b0/b1 wrong -> case means 0.5, 0
    # re-import into the same folder adds nothing
    import_folder(src, "published-demo", tmp_path / "imp", str(fixtures_dir / "craftmd" / "cases.csv"))
    assert len((tmp_path / "imp" / "records.jsonl").read_text().splitlines()) == 4


def test_import_without_case_file_maps_against_answer_only(fixtures_dir, tmp_path):
    import_folder(fixtures_dir / "craftmd" / "published_demo", "p", tmp_path / "imp")
    recs = {json.loads(l)["id"]: json.loads(l) for l in (tmp_path / "imp" / "records.jsonl").read_text().splitlines()}
    assert grades(recs["case_b/t0"])[("vignette", "mcq")].metadata["mapping"] == "answer_only"
    assert grades(recs["case_b/t0"])[("vignette", "mcq")].value == 1
    assert grades(recs["case_b/t0"])[("multiturn", "mcq")].value == 0
    assert grades(recs["case_a/t0"])[("vignette", "mcq")].metadata["mapping"] == "choices"  # choices in 'question'


def test_parse_conversation_errors_name_the_file():
    import pytest
    from models.errors import DataError

    with pytest.raises(DataError, match=r"f.json \(trial_0\): conversation item 0 has unknown role 'nurse'"):
        parse_conversation([{"role": "nurse", "content": "x"}], "f.json (trial_0)")


def _app():
    """`medstack` with every command from the registry (CRAFT-MD's import and study commands, the tools' compare)."""
    apps = {name: typer.Typer() for name in ("run_app", "score_app", "import_app", "data_app", "finetune_app")}
    app = typer.Typer()
    for name, sub in apps.items():
        app.add_typer(sub, name=name.removesuffix("_app"))
    commands.register_all(app=app, **apps)
    return app


def test_cli_import_then_compare_with_a_local_shaped_run(fixtures_dir, tmp_path):
    runner = CliRunner()
    app = _app()
    r = runner.invoke(app, ["import", "craftmd", str(fixtures_dir / "craftmd" / "published_demo"), "--name", "published-demo",
                            "--out", str(tmp_path / "imp"), "--cases", str(fixtures_dir / "craftmd" / "cases.csv")])
    assert r.exit_code == 0, r.output
    local = make_run(tmp_path / "local", "embedded", {("vignette", "mcq"): {"case_a": [1], "case_b": [0]}, ("vignette", "frq"): {"case_a": [0], "case_b": [0]}})
    r = runner.invoke(app, ["compare", str(tmp_path / "imp"), str(local), "--out", str(tmp_path / "cmp")])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert {x["name"] for x in res["runs"]} == {"published-demo", "embedded"}
    t = next(t for t in res["tests"] if t["table"] == "runs|vignette.mcq")
    assert t["n_paired"] == 2 and t["mean_diff"] == 0.5 and t["p"] is None and t["mcnemar_p"] is None
    # two shared cases: the difference, no p-value (the minimum is 10), as `compare` prints it
    assert ("| vignette MCQ accuracy, between runs | published-demo | embedded | 2 (only in a: 0; only in b: 0) | 0.500 [0.000, 1.000] | "
            "– (fewer than 10 shared cases) | – | – |") in r.output
    for cmd in (["run", "craftmd", "--help"], ["import", "craftmd", "--help"], ["compare", "--help"], ["meld", "--help"]):
        assert runner.invoke(app, cmd).exit_code == 0


def test_import_counts_minus_one_as_wrong_and_lists_unmapped(tmp_path):
    src = tmp_path / "rel"
    src.mkdir()
    trial = lambda ev, mcq: {"vignette_mcq": mcq, "vignette_frq": "x", "extracted_ans_vignette_frq": "None" if ev == -1 else "gout",
                             "evaluation_vignette_frq": ev}
    for cid, evs, mcqs in (("c1", [1, -1], ["Gout", "The most likely diagnosis is gout."]), ("c2", [-1, 0], ["Pseudogout or gout", "Cellulitis"])):
        (src / f"{cid}.json").write_text(json.dumps({"case_id": cid, "case_vignette": "v", "question": "q?", "correct_ans": "gout",
                                                      "choices": ["Gout", "Pseudogout", "Septic arthritis", "Cellulitis"],
                                                      **{f"trial_{i}": trial(e, m) for i, (e, m) in enumerate(zip(evs, mcqs))}}))
    m = import_folder(src, "rel", tmp_path / "imp")
    # per case: c1 (1 + 0)/2, c2 (0 + 0)/2 -> 0.25; -1 is wrong, not averaged as -1
    fig = {f["score"]: f for f in m["scores"] if f["metric"] == "mean"}
    assert fig["frq/vignette"]["value"] == 0.25 and fig["frq/vignette"]["unscored"] == 0
    assert m["frq_published_minus_one"] == {"vignette": 2} and m["grades"] == "published" and m["concurrent_rule"] == "any"
    assert m["mcq_mapping"]["counts"] == {"exact": 2, "stated": 1, "unparsed": 1} and m["mcq_mapping"]["unmapped"] == 1
    assert m["mcq_unmapped"] == [{"id": "c2/t0", "format": "vignette", "answer": "Pseudogout or gout"}]
    assert fig["mcq/vignette"]["value"] == 0.5  # c1 both right, c2 unmapped (wrong) + wrong
    md = (tmp_path / "imp" / "summary.md").read_text()
    assert "concurrent-diagnosis rule: any" in md and "| c2/t0 | vignette | Pseudogout or gout |" in md and "| all | 2 | 1 | 1 |" in md
    cfg = yaml.safe_load((tmp_path / "imp" / "config.yaml").read_text())
    assert cfg["grades"] == "published" and cfg["concurrent_rule"] == "any"


def test_compare_names_rules_and_warns_on_mixed_grading(tmp_path, capsys):
    a = make_run(tmp_path / "a", "local", {("vignette", "frq"): {"c1": [1], "c2": [0]}})
    b = make_run(tmp_path / "b", "pub", {("vignette", "frq"): {"c1": [1], "c2": [1]}})
    cfg = yaml.safe_load((b / "config.yaml").read_text())
    (b / "config.yaml").write_text(yaml.safe_dump({**cfg, "grades": "published", "concurrent_rule": "any"}))
    res = run_compare([str(a), str(b)], tmp_path / "cmp")
    runs = {r["name"]: r for r in res["runs"]}
    assert (runs["local"]["grades"], runs["local"]["concurrent_rule"]) == ("local", "zero") and runs["pub"]["concurrent_rule"] == "any"
    assert {x["concurrent_rule"] for x in res["accuracy"]} == {"zero", "any"}
    assert len(res["warnings"]) == 2 and "different concurrent-diagnosis rules" in res["warnings"][0]
    md = (tmp_path / "cmp" / "summary.md").read_text()
    assert "**Warning:**" in md and "| local | local / zero |" in md and "| pub | published / any |" in md
    r = CliRunner().invoke(_app(), ["compare", str(a), str(b), "--out", str(tmp_path / "cmp2")])
    assert r.exit_code == 0 and "warning" in r.output.lower()
    same = run_compare([str(a), str(a)], tmp_path / "cmp3") if False else run_compare([str(a)], tmp_path / "cmp3")
    assert same["warnings"] == []


def test_one_quantity_has_one_interval_in_every_table_of_a_compare(fixtures_dir, tmp_path):
    """An imported release compared: the study's own table and the Scores table give vignette FRQ the same figure and
    interval, resampled by case (a case's five trials are one unit), as the import's own summary.md does."""
    runner = CliRunner()
    app = _app()
    r = runner.invoke(app, ["import", "craftmd", str(fixtures_dir / "craftmd" / "published_release"), "--name", "rel", "--out", str(tmp_path / "imp"),
                                 "--cases", str(fixtures_dir / "craftmd" / "cases.csv")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["compare", str(tmp_path / "imp"), "--out", str(tmp_path / "cmp")])
    assert r.exit_code == 0, r.output
    study_row = next(a for a in json.loads((tmp_path / "cmp" / "compare.json").read_text())["accuracy"] if (a["format"], a["mode"]) == ("vignette", "frq"))
    scores_row = next(f for t in json.loads((tmp_path / "cmp" / "scores.json").read_text()) for f in t["scores"]
                      if (f["score"], f["metric"]) == ("frq/vignette", "mean"))
    cell = f"{study_row['value']:.3f} [{study_row['low']:.3f}, {study_row['high']:.3f}]"
    assert (study_row["value"], study_row["low"], study_row["high"], study_row["n"]) == (scores_row["value"], scores_row["low"], scores_row["high"], scores_row["n"])
    assert study_row["n"] < study_row["values"]  # cases, not trials: the unit resampled
    md = (tmp_path / "cmp" / "summary.md").read_text()
    assert f"{cell} n={study_row['n']}" in md and f"| frq/vignette: format vignette | {cell} (n={study_row['n']}) |" in md
    assert f"{cell} (n={study_row['n']})" in (tmp_path / "imp" / "summary.md").read_text()
