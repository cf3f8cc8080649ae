"""``medstack calibrate craftmd-grader``: CRAFT-MD's grader against a dermatologist (``validation_graderai.csv``). A
judge grades every trial as a run of the chosen settings file grades (only the verdict step: the extraction is given);
its per-case count of correct trials is compared with the dermatologist's (the study README; docs/protocols.md).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import time
from collections import Counter
from pathlib import Path

from experiments.common.grade import Grade, count_scale, grades, to_disk
from experiments.common.markdown import md_table, num
from experiments.common.stats import count_agreement
from experiments.core.dryrun import RecordingClient, request_line, write_requests
from experiments.core.record import record
from experiments.core.results import RunDir, check_owner
from experiments.core.runlock import RunLock
from experiments.core.scorers import Scorer
from experiments.core.study import CaseContext, RequestFailed, Study
from experiments.studies.craftmd import grading
from experiments.studies.craftmd.scorers import COUNT_QUESTION, grade_answer
from experiments.studies.craftmd.settings import FORMATS, CraftSettings
from experiments.studies.craftmd.prompts import PROMPTS
from experiments.tables.plots import confusion_png
from models.errors import DataError, MedstackError, read_utf8
from serving.refs import ModelRef
from serving.session import open_client

N_TRIALS = 5


class CalibrationFailed(MedstackError):
    """Some grading requests failed: their cases were left out (exit 3)."""


# ------------------------------------------------------------------ the dermatologist set

def read_labels(path: str | Path) -> dict:
    """validation_graderai.csv -> {"cases": [...], "skipped_blank": [...]}: a header row ('', case_0 .. case_N) and rows
    trial_0 .. trial_4 (extracted diagnosis per trial), correct_ans, dermatologist_accuracy (0-5, blank for a few),
    found by their first cell; anything else (the instructions row) is ignored."""
    p = Path(path)
    if p.is_dir():  # the registered set craftmd-expert-labels is the authors' whole expert_annotations folder
        p = p / "validation_graderai.csv"
    rows = list(csv.reader(io.StringIO(read_utf8(p), newline="")))  # not UTF-8: one line naming the file, line and byte
    header_line, header = None, None
    named: dict[str, tuple[int, list[str]]] = {}
    for lineno, row in enumerate(rows, 1):
        if not row:
            continue
        if header is None and any(re.fullmatch(r"case_\d+", c.strip()) for c in row[1:]):
            header_line, header = lineno, [c.strip() for c in row]
            continue
        label = row[0].strip()
        if label:
            named[label] = (lineno, row)
    if header is None:
        raise DataError(f"{p}:1: no header row naming the cases (case_0, case_1, ...)")
    needed = [f"trial_{t}" for t in range(N_TRIALS)] + ["correct_ans", "dermatologist_accuracy"]
    missing = [n for n in needed if n not in named]
    if missing:
        raise DataError(f"{p}:{header_line}: missing row(s) {', '.join(missing)} (expected {', '.join(needed)})")
    cases, blank = [], []
    for col, name in enumerate(header):
        if col == 0 or not name:
            continue
        cell = lambda label: (named[label][1][col] if col < len(named[label][1]) else "").strip()
        gold = cell("correct_ans")
        trials = [cell(f"trial_{t}") for t in range(N_TRIALS)]
        line, _ = named["dermatologist_accuracy"]
        raw = cell("dermatologist_accuracy")
        if not raw:
            blank.append(name)
            continue
        try:
            derm = int(float(raw))
        except ValueError:
            raise DataError(f"{p}:{line}: {name}: dermatologist_accuracy {raw!r} is not a number 0-{N_TRIALS}") from None
        if not 0 <= derm <= N_TRIALS or derm != float(raw):
            raise DataError(f"{p}:{line}: {name}: dermatologist_accuracy {raw!r} is not a whole number 0-{N_TRIALS}")
        if not gold:
            raise DataError(f"{p}:{named['correct_ans'][0]}: {name}: empty correct_ans")
        cases.append({"id": name, "gold": gold, "trials": trials, "dermatologist": derm})
    return {"cases": cases, "skipped_blank": blank}


# ------------------------------------------------------------------ grading the trials, as a run grades

async def grade_trials(client, cases: list[dict], settings, *, log=print) -> dict[str, list[dict]]:
    """Case id -> per trial ``{"extracted", "status", "targets", "replies", "correct", "grade_source", "grader_reasks", "calls"}``:
    the run's own grading (:func:`experiments.studies.craftmd.protocol.grade_answer` with the release's extraction ``given``).
    A request that gets no answer makes the trial ``failed`` (correct None, error set)."""
    done = {"n": 0}

    async def one(case: dict, t: int, extracted: str) -> dict:
        ctx = CaseContext(client, f"{case['id']}|{t}", seed=settings.seed, answers=settings.answers)
        value, status = grading.classify_extracted(extracted)
        targets = grading.match_targets(value, status, case["gold"], settings.concurrent_rule)
        try:
            g = await grade_answer(ctx, "", case["gold"], settings, "vignette", given=extracted)
            out = {"correct": g["correct"], "grade_source": g["grade_source"], "grader_reasks": g["grader_reasks"],
                   "replies": g["grader_match_reply"] or {}}
        except RequestFailed as e:
            out = {"correct": None, "grade_source": "failed", "replies": {}, "error": str(e)}
        done["n"] += 1
        if done["n"] % 200 == 0:
            log(f"graded {done['n']} trials")
        return {"extracted": extracted, "status": status, "targets": targets, **out, "calls": ctx.calls}

    graded = await asyncio.gather(*(one(c, t, e) for c in cases for t, e in enumerate(c["trials"])))
    it = iter(graded)
    return {c["id"]: [next(it) for _ in c["trials"]] for c in cases}


# ------------------------------------------------------------------ the kind of results folder it writes

def count_items(step: str):
    """Review items of ``step`` (``grader``: the judge's; ``published``: the authors' grader's): per case of the
    dermatologist set, how many of its 5 extracted diagnoses it found correct."""

    def items(records: list[dict], cfg: dict):
        out = []
        for r in records:
            g = grades(r).get(step)
            if g is None or g.value is None:
                continue  # the cases the calibration scores: the judge's main row leaves out cases with an unreadable verdict
            out.append({"id": str(r["id"]), "verdict": int(g.value), "stratum": str(int(g.value)),
                        "show": {"correct diagnosis": r.get("target"), "diagnoses extracted in the 5 trials": [x or "" for x in r.get("answer") or []]}})
        return count_scale(N_TRIALS), out

    return items


class CalibrateGrader(Study):
    """The kind ``calibrate-craftmd-grader``: per case of the dermatologist set, the judge's count of correct trials
    (``grader``) and the authors' grader's (``published``, where the case was matched in their release)."""

    scorers = (Scorer("grader", count_scale(N_TRIALS), COUNT_QUESTION, role="grader", items=count_items("grader")),
               Scorer("published", count_scale(N_TRIALS), COUNT_QUESTION, items=count_items("published")))

    def report_run(self, run: dict) -> list[dict]:
        from experiments.studies.craftmd.report_views import grader_calibration_tables

        return grader_calibration_tables(run)


def case_record(c: dict, trials: list[dict], published: dict | None, judge: dict) -> dict:
    """One case of the dermatologist set as a typed record: the extracted diagnoses its answer, the gold its target,
    the judge's count (None with an unreadable verdict) and the authors' grader's its grades, the dermatologist's
    count the label (metadata)."""
    kept = [{k: t[k] for k in ("extracted", "status", "correct", "grade_source", "replies", "grader_reasks", "error") if k in t} for t in trials]
    unscored = sum(t["correct"] is None for t in trials)
    scores = {"grader": Grade(value=None if unscored else sum(t["correct"] == 1 for t in trials), answer=[t.get("extracted") for t in trials],
                              metadata={"unscored_trials": unscored} if unscored else {}, judge=judge)}
    if published is not None:
        scores["published"] = Grade(value=published.get("count"), judge={"model": "published"}, metadata=dict(published))
    rec = record(c["id"], inputs={"extractions": list(c["trials"])}, target=c["gold"], answer=list(c["trials"]), scores=to_disk(scores),
                 metadata={"dermatologist": c["dermatologist"], "trials": kept})
    if any(t["grade_source"] == "failed" for t in trials):
        rec["status"] = "failed"
        rec["scores"] = {k: v for k, v in rec["scores"].items() if k != "grader"}
    return rec


def count_of(r: dict, step: str, lenient: bool = False) -> int | None:
    """A case's count of correct trials by ``step`` (``lenient``: the judge's with unreadable verdicts as wrong)."""
    g = grades(r).get(step)
    if g is None:
        return None
    if g.value is None and lenient:
        return sum(t.get("correct") == 1 for t in (r.get("metadata") or {}).get("trials") or [])
    return g.value


# ------------------------------------------------------------------ the authors' grader decisions

TRIVIAL_KINDS = ("all_gold", "all_none_or_multiple")


def trivial_kind(trials: list[str], gold: str) -> str | None:
    """A case any grader scores alike: all five extractions equal the gold answer (after
    normalization) -> "all_gold"; all None/Multiple -> "all_none_or_multiple"; else None."""
    if all(grading.normalize(x) == grading.normalize(gold) for x in trials):
        return "all_gold"
    if all(grading.classify_extracted(x)[1] in ("none", "multiple") for x in trials):
        return "all_none_or_multiple"
    return None


def published_counts(release_dir: str | Path, cases: list[dict]) -> dict:
    """Each labelled case matched to the release by gold answer and the five extracted answers (vignette FRQ first; same
    order first, then as a multiset) -> {case id: {"count": correct trials by the authors' grader (-1 counts as wrong),
    "case_id", "format", "order", "candidates", "trivial": :func:`trivial_kind`}}."""
    src = Path(release_dir)
    files = sorted(src.rglob("*.json")) if src.is_dir() else []
    if not files:
        raise DataError(f"{src}: no per-case *.json files of a CRAFT-MD release")
    index: dict[tuple, list] = {}
    for f in files:
        try:
            d = json.loads(f.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataError(f"{f}:{e.lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(d, dict) or "correct_ans" not in d:
            continue
        gold = grading.normalize(d["correct_ans"])
        for fmt in FORMATS:
            ex, ev = [], []
            for t in range(N_TRIALS):
                tr = d.get(f"trial_{t}") or {}
                ex.append(grading.normalize(tr.get(f"extracted_ans_{fmt}_frq")))
                try:
                    ev.append(int(float(tr.get(f"evaluation_{fmt}_frq"))))
                except (TypeError, ValueError):
                    ev.append(None)
            if None in ev:
                continue
            entry = {"case_id": d.get("case_id", f.stem), "format": fmt, "count": sum(v == 1 for v in ev)}
            index.setdefault((gold, fmt, "ordered", tuple(ex)), []).append(entry)
            index.setdefault((gold, fmt, "multiset", tuple(sorted(ex))), []).append(entry)
    out = {}
    for c in cases:
        gold, ex = grading.normalize(c["gold"]), [grading.normalize(x) for x in c["trials"]]
        for fmt in FORMATS:
            hit = index.get((gold, fmt, "ordered", tuple(ex))) or index.get((gold, fmt, "multiset", tuple(sorted(ex))))
            if hit:
                out[c["id"]] = {**hit[0], "order": "ordered" if index.get((gold, fmt, "ordered", tuple(ex))) else "multiset", "candidates": len(hit),
                                "trivial": trivial_kind(c["trials"], c["gold"])}
                break
    return out


# ------------------------------------------------------------------ figures

def figures_table(rows: list[tuple[str, dict]]) -> list[str]:
    return md_table(["rater vs dermatologist", "n cases", "exact count agreement", "mean abs diff", "trial agreement bound", "weighted kappa (linear)",
                     "Spearman rho"], [[name, m["n"], *map(num, (m["exact_agreement"], m["mean_abs_diff"], m["trial_agreement_bound"],
                                                                  m["weighted_kappa_linear"], m["spearman"]["rho"]))] for name, m in rows])


# ------------------------------------------------------------------ the command

def study_settings(config: str | Path | None, roles: dict[str, str], *, concurrent_rule: str | None = None, completion: bool | None = None,
                   step: str = "grader") -> CraftSettings:
    """The settings a CRAFT-MD run of ``config`` (default paper.yaml) would use, with the calibrated ``roles``, so the
    calibration asks as that run asks. ``concurrent_rule`` / ``completion`` (for ``step``): None keeps the config's."""
    from experiments.core.config import load_settings
    from experiments.studies.craftmd.study import CONFIGS

    overrides: dict = {"roles": roles, "assess_conversations": True}  # the assessor's role and sampling filled as a run fills them
    if concurrent_rule is not None:
        overrides["concurrent_rule"] = grading.check_rule(concurrent_rule)
    s = load_settings(CraftSettings, Path(config) if config else CONFIGS / "paper.yaml", overrides)
    if completion is not None:
        steps = [x for x in s.completion_steps if x != step] + ([step] if completion else [])
        s = s.model_copy(update={"completion_steps": steps})
    return s


def settings_line(s: CraftSettings, step: str, config: str | Path | None) -> str:
    """How the calibrated instrument was asked, for the summary: the run's settings of ``step``."""
    g = s.sampling[step]
    how = "text completion" if step in s.completion_steps else f"chat ({'user' if s.lone_system_as_user else 'system'} message)"
    line = f"asked as a run of `{config or 'experiments/studies/craftmd/configs/paper.yaml'}` asks it: temperature {g.temperature}, top_p {g.top_p}, max_tokens {g.max_tokens}, {how}"
    if step == "grader":
        line += f"; re-asks up to {s.grader_reasks}; verdict rule `{s.verdict_rule}`; concurrent-diagnosis rule `{s.concurrent_rule}`"
    return line + f"; answers {s.answers}"


async def calibrate_grader(judge: str, labels: str, out: str | Path, *, config: str | Path | None = None, rule: str | None = None,
                           published: str | None = None, completion: bool | None = None, concurrency: int = 16, use_cache: bool = True,
                           allow_remote: bool = False, client=None, dry_run: bool = False, log=print) -> dict | None:
    """Run the calibration with the grader of ``config``'s run; write the results directory; return metrics. Not on the
    study runner: its items are the release's fixed answers, graded in one pass whose every request is cached, so a
    rerun replays what was answered (the runner's per-case resume would add nothing). ``client`` (tests) replaces
    open_client. ``dry_run``: every request recorded, none sent, ``OUT/dry-run.jsonl`` written, no results."""
    from experiments.core.registry import named

    kind = named(CalibrateGrader).name
    check_owner(out, kind)  # before a request is made: never another command's folder
    s = study_settings(config, {"grader": judge}, concurrent_rule=rule, completion=completion)
    data = read_labels(labels)
    cases = data["cases"]
    if not cases:
        raise DataError(f"{labels}: no case with a dermatologist count")
    alias = ModelRef.parse(judge, where="--judge-model").alias
    if dry_run:
        graded = await grade_trials(RecordingClient(), cases, s, log=log)
        rows = [request_line(f"{c['id']}|{t}", call) for c in cases for t, trial in enumerate(graded[c["id"]]) for call in trial["calls"]]
        path = write_requests(Path(out), rows)
        log(settings_line(s, "grader", config))
        log(f"dry run: {len(rows)} request(s) of {len(cases)} case(s) written to {path}; nothing was sent")
        return None
    t0 = time.perf_counter()
    if client is None:
        async with open_client({"grader": judge}, concurrency=concurrency, use_cache=use_cache, allow_remote=allow_remote, log=log) as (cl, identities):
            graded = await grade_trials(cl, cases, s, log=log)
            usage = {k: vars(v) for k, v in cl.usage.items()}
    else:
        identities = {"grader": {"alias": alias}}
        graded = await grade_trials(client, cases, s, log=log)
        usage = {}
    wall = time.perf_counter() - t0

    rule = s.concurrent_rule
    pub = published_counts(published, cases) if published else {}
    config_out = {"experiment": kind, "judge": judge, "labels": str(labels), "concurrent_rule": rule,
                  "published": str(published) if published else None, "mode": "completion" if "grader" in s.completion_steps else "chat",
                  "grader_prompt": "experiments/studies/craftmd/prompts/grader_match.txt", "prompt_hash": PROMPTS.hash("grader_match"),
                  "kappa_weights": "linear", "roles": {"grader": judge}, "study_config": str(config or "experiments/studies/craftmd/configs/paper.yaml"),
                  "sampling": {"grader": s.sampling["grader"].model_dump(mode="json")}, "grader_reasks": s.grader_reasks,
                  "verdict_rule": s.verdict_rule, "lone_system_as_user": s.lone_system_as_user, "answers": s.answers}
    lock = RunLock(out, kind).acquire()  # recomputed whole (answered requests come from the cache): the old result stays until commit()
    try:
        metrics, failed = _write_whole(RunDir(out, config_out, whole=True), cases, graded, pub, data, judge, alias, published, s, config,
                                       identities, usage, wall)
    finally:
        lock.release()
    if failed:
        raise CalibrationFailed(f"{metrics['trials_failed']} trial(s) got no grading answer; {len(failed)} case(s) left out: {', '.join(failed[:10])}"
                                f"{' ...' if len(failed) > 10 else ''} (results in {out})")
    return metrics


def _write_whole(rundir: RunDir, cases, graded, pub, data, judge, alias, published, s, config, identities, usage, wall) -> tuple[dict, list]:
    """The calibration's folder, written whole (records, identity, metrics, plots, summary) and put in place."""
    rule = s.concurrent_rule
    judge_who = {"model": judge, "prompt_hash": PROMPTS.hash("grader_match"), "rule": rule}
    records = [case_record(c, graded[c["id"]], pub.get(c["id"]), judge_who) for c in cases]
    rundir.append_many(records)
    failed = [r["id"] for r in records if r.get("status") == "failed"]
    unscored = [r["id"] for r in records if r.get("status") != "failed" and count_of(r, "grader") is None]
    rundir.write_identity(identities)
    trials_all = [t for ts in graded.values() for t in ts]
    pairs = {(t["extracted"], c["gold"]) for c in cases for t in graded[c["id"]]}

    derm = {r["id"]: r["metadata"]["dermatologist"] for r in records}  # the label each count is held to
    scored = [r for r in records if r.get("status") != "failed" and count_of(r, "grader") is not None]
    judge_m = count_agreement([derm[r["id"]] for r in scored], [count_of(r, "grader") for r in scored], N_TRIALS) if scored else None
    with_unscored = [r for r in records if r.get("status") != "failed"]
    judge_m_lenient = (count_agreement([derm[r["id"]] for r in with_unscored], [count_of(r, "grader", lenient=True) for r in with_unscored], N_TRIALS)
                       if with_unscored else None)
    pub_recs = [r for r in records if count_of(r, "published") is not None]
    pub_m = count_agreement([derm[r["id"]] for r in pub_recs], [count_of(r, "published") for r in pub_recs], N_TRIALS) if pub_recs else None
    pub_same = [r for r in pub_recs if r in scored]
    pair_sources = Counter(t["grade_source"] for t in trials_all)
    metrics = {
        "cases_labelled": len(cases) + len(data["skipped_blank"]), "cases_blank_skipped": len(data["skipped_blank"]), "blank_cases": data["skipped_blank"],
        "cases": len(cases), "trials": len(trials_all), "pairs": len(pairs), "trials_failed": pair_sources.get("failed", 0),
        "cases_failed": len(failed), "failed_cases": failed, "cases_unscored": len(unscored), "unscored_cases": unscored,
        "trial_grade_source": dict(pair_sources), "requests": sum(len(t["calls"]) for t in trials_all),
        "reasks": sum(t.get("grader_reasks") or 0 for t in trials_all),
        "concurrent_rule": rule, "kappa_weights": "linear", "judge": judge, "settings": settings_line(s, "grader", config),
        "judge_vs_dermatologist": judge_m,
        "judge_vs_dermatologist_unscored_as_wrong": judge_m_lenient,
        "published": {"release": str(published), "cases_matched": len(pub_recs), "matched_by_format": dict(Counter(pub[r["id"]]["format"] for r in pub_recs)),
                      "matched_trivial": {k: sum(pub[r["id"]]["trivial"] == k for r in pub_recs) for k in TRIVIAL_KINDS},
                      "vs_dermatologist": pub_m,
                      "judge_vs_dermatologist_same_cases": count_agreement([derm[r["id"]] for r in pub_same], [count_of(r, "grader") for r in pub_same], N_TRIALS) if pub_same else None,
                      } if published else None,
        "run": {"wall_seconds": round(wall, 2), "usage": usage},
    }
    if judge_m:
        confusion_png(judge_m["confusion"], rundir.path / "confusion_judge.png", f"judge {alias} (rule {rule}) vs dermatologist, n={judge_m['n']}",
                      "judge: correct trials of 5", "dermatologist: correct trials of 5")
    if pub_m:
        confusion_png(pub_m["confusion"], rundir.path / "confusion_published.png", f"authors' grader vs dermatologist, n={pub_m['n']}",
                      "authors' grader: correct trials of 5", "dermatologist: correct trials of 5")
    rundir.write_metrics(metrics)
    rundir.write_summary(grader_summary(metrics))
    rundir.commit()
    return metrics, failed


def grader_summary(m: dict) -> str:
    L = ["# CRAFT-MD grader calibration against a dermatologist (docs/protocols.md, Judge calibration)", "",
         f"judge: `{m['judge']}`; concurrent-diagnosis rule: `{m['concurrent_rule']}`; kappa weights: {m['kappa_weights']} over counts 0-5",
         f"{m['settings']}",
         f"cases: {m['cases_labelled']} labelled, {m['cases_blank_skipped']} with a blank dermatologist count skipped, {m['cases']} graded; "
         f"{m['trials']} trials ({m['pairs']} distinct (diagnosis, gold) pairs), {m['requests']} judge requests ({m['reasks']} re-asks); "
         f"trial grade sources: {m['trial_grade_source']}",
         f"failed: {m['trials_failed']} trial(s), {m['cases_failed']} case(s) left out; cases with an unreadable verdict (left out of the main row): {m['cases_unscored']}",
         f"wall time: {m['run']['wall_seconds']} s", ""]
    rows = []
    if m["judge_vs_dermatologist"]:
        rows.append((f"judge {m['judge']}", m["judge_vs_dermatologist"]))
    if m["judge_vs_dermatologist_unscored_as_wrong"] and m["cases_unscored"]:
        rows.append(("judge, unreadable verdicts as wrong", m["judge_vs_dermatologist_unscored_as_wrong"]))
    pub = m.get("published")
    if pub:
        if pub["vs_dermatologist"]:
            rows.append(("authors' grader (published)", pub["vs_dermatologist"]))
        if pub["judge_vs_dermatologist_same_cases"]:
            rows.append(("judge, on the same matched cases", pub["judge_vs_dermatologist_same_cases"]))
    L += figures_table(rows)
    if pub:
        triv = pub["matched_trivial"]
        L += ["", f"published release {pub['release']}: {pub['cases_matched']} of {m['cases']} cases matched by gold answer and the five extracted answers "
                  f"(by format: {pub['matched_by_format']}); {sum(triv.values())} of the matched cases are trivial "
                  f"(all five extractions equal gold: {triv['all_gold']}; all None/Multiple: {triv['all_none_or_multiple']})"]
    L += ["", "trial agreement bound = mean over cases of (5 − |judge − dermatologist|) / 5: the largest share of trials on which the two can agree given",
          "their counts (the paper reports 93.35 % for its GPT-4 grader). Confusion matrices: confusion_judge.png"
          + (", confusion_published.png" if pub and pub["vs_dermatologist"] else "") + " (rows: dermatologist)."]
    return "\n".join(L) + "\n"
