"""Running a MediTOD baseline: samples -> (exemplars) -> prompt -> greedy decode -> parse -> score.

Steps: load + validate data -> build test (and training) samples -> retrieve k exemplars per
test sample (in-context mode) -> open the client (LoRA adapter served under a name in supervised
mode) -> one completion per sample, records appended as they finish (resumable) -> score all
records with ``metrics.score`` -> optional LLM adjudication of non-canonical matches ->
metrics.json + summary.md (side by side with the other mode's run when one exists).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from string import Template
from typing import Literal

from experiments.config import RunSettings
from experiments.meditod import metrics as M
from experiments.meditod.data import load_dialogs, load_split_ids
from experiments.meditod.prompts import (STOP, fit_icl_prompt, fit_supervised_prompt, make_token_counter, prompt_hash, template,
                                         templates_used)
from experiments.meditod.tasks import build_samples
from experiments.parsing import extract_json
from experiments.results import RunDir
from experiments.runner import run_cases
from serving.client import GenConfig

TASK_LABEL = {"nlu": "NLU", "pol": "POL", "nlg": "NLG"}


class MeditodSettings(RunSettings):
    task: Literal["nlu", "pol", "nlg"] = "nlu"
    splits_dir: str | None = None  # default: the folder of --data
    split: str = "test"
    train_split: str = "train"  # where in-context exemplars come from
    mode: Literal["icl", "supervised"] = "icl"
    k: int = 5
    encoder: str | None = None  # sentence-transformers dir; default all-MiniLM-L6-v2
    history_turns: int = 8
    temperature: float = 0.0
    max_tokens: int = 256
    context_margin: int = 8  # tokens kept free besides max_tokens
    lora: str | None = None
    lora_name: str = "meditod-lora"
    adjudicate_model: str | None = None
    adjudicate_max_tokens: int = 4
    bertscore: bool = True
    compare: str | None = None
    concurrency: int = 8


def context_budget(alias: str, max_tokens: int, margin: int) -> int | None:
    from models.registry import get_spec

    try:
        return get_spec(alias).context_length - max_tokens - margin
    except Exception:  # noqa: BLE001 - unknown alias: no budget known
        return None


def parse_prediction(task: str, text: str):
    """NLU/POL: the first JSON value (list, or an object wrapped in a list); None = format error."""
    if task == "nlg":
        lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
        return lines[0] if lines else ""
    value = extract_json(text)
    if isinstance(value, dict):
        value = [value]
    return value if isinstance(value, list) else None


def transcript(sample: dict) -> list[dict]:
    turns = sample["context"] + sample.get("last", [])
    return [{"agent": t["speaker"], "content": t["text"], "turn": i} for i, t in enumerate(turns)]


def prepare(s: MeditodSettings, log=print) -> tuple[list[dict], dict[str, list[dict]]]:
    """Test samples and, in in-context mode, their exemplars by sample id."""
    data_path = Path(s.data)
    dialogs = load_dialogs(data_path)
    splits_dir = Path(s.splits_dir) if s.splits_dir else data_path.parent
    test_ids = load_split_ids(splits_dir, s.split, dialogs=dialogs)
    samples = build_samples(dialogs, test_ids, s.task, history_turns=s.history_turns)
    if s.limit is not None:
        samples = samples[: s.limit]
    exemplars: dict[str, list[dict]] = {}
    if s.mode == "icl" and s.k > 0:
        from experiments.meditod.retrieval import load_encoder, retrieve_exemplars

        train_ids = load_split_ids(splits_dir, s.train_split, dialogs=dialogs)
        train = build_samples(dialogs, train_ids, s.task, history_turns=s.history_turns)
        t0 = time.perf_counter()
        found = retrieve_exemplars(samples, train, s.k, load_encoder(s.encoder))
        log(f"retrieved {s.k} exemplars for {len(samples)} samples from {len(train)} {s.train_split} samples in {time.perf_counter() - t0:.1f} s")
        exemplars = {smp["id"]: ex for smp, ex in zip(samples, found)}
    return samples, exemplars


async def run(s: MeditodSettings, log=print) -> dict:
    from serving.session import open_client

    samples, exemplars = prepare(s, log)
    out = Path(s.out)
    rundir = RunDir(out, s.model_dump())
    model_spec = s.roles["default"]
    alias = model_spec.partition("@")[0]
    roles = {"default": model_spec}
    if s.adjudicate_model:
        roles["grader"] = s.adjudicate_model
    lora = None
    if s.mode == "supervised" and s.lora:
        lora = {"default": {s.lora_name: str(Path(s.lora).resolve())}}
    gen = GenConfig(temperature=s.temperature, max_tokens=s.max_tokens, seed=s.seed, stop=STOP)
    budget = context_budget(alias, s.max_tokens, s.context_margin)
    count_tokens = make_token_counter(alias)
    names = templates_used(s.task, s.mode)
    p_hash = prompt_hash(*names)

    async with open_client(roles, lora=lora, concurrency=s.concurrency, timeout=s.timeout, retries=s.retries,
                           use_cache=s.use_cache, allow_remote=s.allow_remote, log=log) as (client, identities):
        rundir.write_identity(identities)

        async def solve(sample: dict) -> dict:
            ex = exemplars.get(sample["id"], [])
            if s.mode == "supervised":
                prompt, hist = fit_supervised_prompt(s.task, sample, budget_tokens=budget, count_tokens=count_tokens)
                kept = 0
            else:
                prompt, kept, hist = fit_icl_prompt(s.task, sample, ex, budget_tokens=budget, count_tokens=count_tokens)
            res = await client.complete(prompt, gen=gen)
            pred = parse_prediction(s.task, res.text) if res.ok else None
            rec = {
                "id": sample["id"], "dialog_id": sample["dialog_id"], "uttr_id": sample["uttr_id"], "task": s.task,
                "mode": s.mode, "model": alias, "prompt_hash": p_hash, "prompt": prompt,
                "exemplar_ids": [e["id"] for e in ex[:kept]], "exemplars_retrieved": len(ex), "exemplars_kept": kept,
                "history_turns_kept": hist, "transcript": transcript(sample),
                "output": res.text, "prediction": pred, "target": sample["target"],
                "parse_error": pred is None and s.task != "nlg", "request_error": res.error,
                "prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
                "latency": round(res.latency, 3), "cached": res.cached, "finish_reasons": res.finish_reasons,
            }
            if s.task != "nlg":
                one = M.score(s.task, [sample["target"]], [pred])
                rec["correct"] = int(one["joint_accuracy"] == 1.0) if one["scored_turns"] else None
                rec["f1"] = one["f1"] if one["scored_turns"] else None
            return rec

        _retry_failed_requests(rundir)
        stats = await run_cases(samples, solve, rundir, client, concurrency=s.concurrency, description=f"meditod-{s.task} {s.mode}")
        records = _ordered_records(rundir, samples)
        result = score_records(s, records)
        if s.adjudicate_model and s.task != "nlg":
            result["adjudicated"] = await adjudicate(s, records, client, rundir)
    result["run"] = stats
    result["settings"] = {"task": s.task, "mode": s.mode, "split": s.split, "k": s.k, "model": alias, "lora": s.lora,
                          "prompt_hash": p_hash, "context_budget": budget}
    rundir.write_metrics(result)
    rundir.write_summary(summary_markdown(s, result, _other_mode_metrics(s, out)))
    return result


def _retry_failed_requests(rundir: RunDir) -> None:
    """On resume, ask again the turns whose last record is a failed request (server down, timeout)."""
    last = {str(r["id"]): r for r in rundir.records()}
    ok = {i for i, r in last.items() if not r.get("request_error") and not r.get("error")}
    rundir.done_ids = lambda: ok


def _ordered_records(rundir: RunDir, samples: list[dict]) -> list[dict]:
    by_id = {r["id"]: r for r in rundir.records()}  # the latest record of a turn wins (retries append)
    return [by_id[smp["id"]] for smp in samples if smp["id"] in by_id]


def score_records(s: MeditodSettings, records: list[dict]) -> dict:
    golds = [r["target"] for r in records]
    preds = [r.get("prediction") for r in records]
    if s.task == "nlg":
        preds = [p if isinstance(p, str) else "" for p in preds]
    m = M.score(s.task, golds, preds, dialog_ids=[r["dialog_id"] for r in records], encoder=s.encoder, bertscore=s.bertscore)
    m["request_errors"] = sum(1 for r in records if r.get("request_error") or r.get("error"))
    m["mean_exemplars_kept"] = (sum(r.get("exemplars_kept", 0) for r in records) / len(records)) if records else 0.0
    return m


async def adjudicate(s: MeditodSettings, records: list[dict], client, rundir: RunDir) -> dict:
    """Ask the grader whether each non-canonical (gold, predicted) value pair means the same; rescore."""
    golds = [r["target"] for r in records]
    preds = [r.get("prediction") for r in records]
    pairs = M.adjudication_pairs(s.task, golds, preds)
    tmpl = Template(template("adjudicate.txt"))
    gen = GenConfig(temperature=0.0, max_tokens=s.adjudicate_max_tokens)
    judgments: dict = {}
    unparsed = 0
    path = rundir.path / "adjudications.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for a, b in pairs:
            prompt = tmpl.substitute(a=a.lower(), b=b.lower())
            res = await client.complete(prompt, role="grader", gen=gen)
            reply = res.text.strip().lower()
            verdict = "positive" in reply
            if not verdict and "negative" not in reply:
                unparsed += 1
            judgments[(a, b)] = verdict
            f.write(json.dumps({"gold": a, "pred": b, "reply": res.text, "same": verdict, "prompt_hash": prompt_hash("adjudicate.txt")}) + "\n")
    out = M.score(s.task, golds, preds, dialog_ids=[r["dialog_id"] for r in records], judgments=judgments)
    out["pairs_judged"] = len(pairs)
    out["unparsed_verdicts"] = unparsed
    return out


def _other_mode_metrics(s: MeditodSettings, out: Path) -> tuple[str, dict] | None:
    """Metrics of the other mode's run: --compare DIR, else the sibling folder <task>-<other mode>."""
    other = "supervised" if s.mode == "icl" else "icl"
    cand = Path(s.compare) if s.compare else out.parent / f"{s.task}-{other}"
    f = cand / "metrics.json"
    if cand.resolve() == out.resolve() or not f.exists():
        return None
    m = json.loads(f.read_text())
    return m.get("settings", {}).get("mode", other), m


ROWS = {
    "nlu": [("precision", "P (all)"), ("recall", "R (all)"), ("f1", "F1 (all)"), ("medical_f1", "F1 medical (canonical)"),
            ("non_medical_f1", "F1 non-medical"), ("joint_accuracy", "Joint accuracy"), ("format_error_rate", "Format-error rate")],
    "nlg": [("bleu2", "BLEU-2"), ("bleu4", "BLEU-4"), ("rouge1", "ROUGE-1"), ("rougeL", "ROUGE-L"), ("bertscore_f1", "BERTScore F1")],
}
ROWS["pol"] = ROWS["nlu"] + [("p@1", "P@1"), ("p@4", "P@4"), ("p@8", "P@8"), ("p@inf", "P@inf")]


def metrics_table(task: str, columns: list[tuple[str, dict]]) -> str:
    head = "| metric | " + " | ".join(name for name, _ in columns) + " |\n|---|" + "---|" * len(columns) + "\n"
    body = ""
    for key, label in ROWS[task]:
        cells = []
        for _, m in columns:
            v = m.get(key)
            cells.append("-" if v is None else (f"{v:.2f}" if task == "nlg" and key.startswith("bleu") else f"{v:.4f}"))
        body += f"| {label} | " + " | ".join(cells) + " |\n"
    return head + body


def summary_markdown(s: MeditodSettings, m: dict, other: tuple[str, dict] | None) -> str:
    cols = [(f"{s.mode} ({m['settings']['model']})", m)]
    if "adjudicated" in m:
        cols.append((f"{s.mode} + adjudication", m["adjudicated"]))
    if other:
        cols.append((f"{other[0]} ({other[1].get('settings', {}).get('model', '?')})", other[1]))
    r = m.get("run", {})
    return (
        f"# MediTOD {TASK_LABEL[s.task]} — {s.mode}, split {s.split}\n\n"
        f"{m['turns']} turns ({m.get('scored_turns', m['turns'])} scored), k={s.k if s.mode == 'icl' else '-'}, "
        f"mean exemplars kept {m.get('mean_exemplars_kept', 0):.2f}, request errors {m.get('request_errors', 0)}\n\n"
        + metrics_table(s.task, cols)
        + f"\nRun: {r.get('wall_seconds')} s wall, {r.get('completion_tokens')} output tokens, "
        f"{r.get('output_tokens_per_s')} output tokens/s sustained, {r.get('cache_hits')} cache hits.\n"
    )
