"""The report opens with the papers: one section per study in the papers' order (tables + figures), then
fine-tuning (loss curves, best checkpoint, recipe, adapter hash) and benchmark (plot, ratio table);
ratings as ratings; the generic metrics folded as "all metrics". Checked in the HTML and in headless Chromium."""

from __future__ import annotations

import json
import subprocess

import yaml

from test_report_chromium import CHROMIUM_FLAGS, _chart, chromium


def _write_run(d, config: dict, records: list[dict], metrics: dict | None = None, identity: dict | None = None):
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (d / "metrics.json").write_text(json.dumps(metrics or {}))
    (d / "identity.json").write_text(json.dumps(identity or {"experiment": config["experiment"]}))


def _craft(case: str, v: int, m: int) -> dict:
    return {"id": f"{case}/t0", "case_id": case, "trial": 0, "status": "ok", "correct": m,
            "transcript": [{"agent": "patient", "content": "my knee hurts", "turn": 0}],
            "answers": {"vignette": {"mcq": {"correct": v}, "frq": {"correct": v}}, "multiturn": {"mcq": {"correct": m}, "frq": {"correct": 0}}}}


def make_runs(root):
    _write_run(root / "autoeval", {"experiment": "autoeval", "roles": {"judge": "embedded"}},
               [{"id": "d1::empathy", "source_id": "d1", "criterion": "empathy", "criterion_name": "Showing Empathy", "rating": 4, "model": "embedded"},
                {"id": "d2::empathy", "source_id": "d2", "criterion": "empathy", "criterion_name": "Showing Empathy", "rating": 2, "model": "embedded"}])
    _write_run(root / "craftmd", {"experiment": "craftmd", "name": "gpt-3.5-mine", "trials": 1, "max_turns": 4, "concurrent_rule": "zero"},
               [_craft("c1", 1, 0), _craft("c2", 1, 1), _craft("c3", 0, 0)])
    _write_run(root / "meditod", {"experiment": "meditod-nlu", "task": "nlu", "mode": "icl", "k": 5},
               [{"id": "t1", "dialog_id": "d1", "prediction": [], "target": []}],
               {"f1": 0.41, "medical_f1": 0.5, "non_medical_f1": 0.2, "scored_turns": 1, "turns": 1, "settings": {"task": "nlu", "mode": "icl", "model": "embedded"}})
    ft = root / "finetune"
    (ft / "adapter").mkdir(parents=True)
    (ft / "adapter" / "adapter_model.safetensors").write_bytes(b"LORA-WEIGHTS")
    (ft / "recipe.yaml").write_text("lora: {r: 32, alpha: 32}\ntraining: {learning_rate: 0.0001}\n")
    (ft / "train_metrics.json").write_text(json.dumps({
        "task": "nlu", "base": "embedded", "train": [{"step": s, "loss": 3.0 - 0.2 * s} for s in range(1, 7)],
        "valid": [{"step": 2, "loss": 2.9}, {"step": 4, "loss": 2.5}, {"step": 6, "loss": 2.7}], "best_step": 4, "best_valid_loss": 2.5, "global_step": 6}))
    bench = root / "bench"
    bench.mkdir()
    (bench / "bench.json").write_text(json.dumps({
        "config": {"model": "embedded"}, "results": {"vllm": [], "hf": []},
        "ratios": [{"concurrency": 8, "baseline_batch": 8, "figures": {"output_tokens_per_s": 2.07, "ttft_ms_mean": 0.5}}],
        "headline": {"vllm_concurrency": 8, "vllm_output_tokens_per_s": 80.4, "best_hf_batch": 8, "best_hf_output_tokens_per_s": 38.8, "ratio": 2.07}}))
    _chart(bench / "bench.png")
    return root


def test_report_sections_in_the_papers_order(tmp_path, cli):
    from serving.session import adapter_hash

    runs = make_runs(tmp_path / "runs")
    html = tmp_path / "report.html"
    cli("report", str(runs), "--out", str(html), check=True)
    text = html.read_text()
    body = text.split("<body>", 1)[1]
    order = [body.index(f'id="section-{k}"') for k in ("craftmd", "meditod", "autoeval", "finetune", "bench")]
    assert order == sorted(order)
    # the first table of the page is a paper table: CRAFT-MD's MCQ accuracy by format, with the paper's GPT-3.5 values beside ours
    first = body.index("<table")
    assert body[first:first + 40].startswith('<table class="grid paper">') and first < body.index('id="index"')
    mcq = body[first:body.index("</table>", first)]
    assert "4-choice MCQ accuracy by format" in mcq and "gpt-3.5-mine" in mcq and "0.657" in mcq and "+0.010" in mcq  # 0.667 - 0.657
    assert "GPT-4 (paper)" in mcq and "0.820" in mcq and "vs vignette" in mcq
    assert "Turn cap 4 doctor turns" in body and "Saley et al." in body and "In-context exemplars retrieved with all-MiniLM-L6-v2" in body
    assert "GPT-4-Turbo (in-context)" in body and "0.6641" in body
    # ratings as ratings (the case's badge gives its typed score's value), with their axis names
    assert ">rated 4<" in body and "Showing Empathy" in body and "3.00 [2.00, 4.00]" in body
    # fine-tuning: loss curves, best checkpoint, adapter hash, recipe; bench: ratio table and headline
    assert "best checkpoint" in body and adapter_hash(str(runs / "finetune" / "adapter")) in body and "learning_rate" in body
    assert "vLLM / transformers ratios" in body and "2.07x" in body and "80.4 output tok/s" in body
    assert body.count("<summary>all metrics</summary>") == 2  # the generic view stays, folded (MediTOD, bench: the runs with metrics)

    # in a real browser: the sections render, figures load, the filters still work
    exe = chromium()
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run([exe, *CHROMIUM_FLAGS, *profile, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert 'data-ready="1"' in dom
    for k in ("craftmd", "meditod", "autoeval", "finetune", "bench"):
        assert f'id="section-{k}"' in dom
    # CRAFT-MD MCQ + FRQ, MediTOD NLU, autoeval ratings figures; the loss curves; bench.png
    assert dom.count('src="data:image/png;base64,') == 6
    shot = tmp_path / "shot.png"
    subprocess.run([exe, *CHROMIUM_FLAGS, *profile, "--window-size=1400,1000", f"--screenshot={shot}", html.as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 30_000
