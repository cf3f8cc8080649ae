"""Fine-tuning for real on the CPU: a few optimizer steps of the embedded model on the tiny fixture.

One training run through the `medstack finetune` command (module fixture) backs every test:
the loss falls, metrics/plot/checkpoints are written, the adapter reloads with peft, a merged
checkpoint equals base + adapter, a re-run resumes, and the real vLLM server serves the adapter.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

FIX = Path(__file__).parent / "fixtures" / "finetune"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cli):
    out = tmp_path_factory.mktemp("ft") / "nlu"
    p = cli("finetune", "meditod-nlu", "--data", str(FIX / "dialogs.json"), "--base", "embedded",
            "--config", str(FIX / "test-cpu.yaml"), "--out", str(out), "--merge", timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    return out, p


def test_a_few_steps_lower_the_training_loss(trained):
    out, proc = trained
    m = json.loads((out / "train_metrics.json").read_text())
    assert m["global_step"] == 6 and len(m["train"]) == 6
    assert m["last_loss"] < 0.8 * m["first_loss"], m["train"]
    assert m["best_valid_loss"] is not None and [p["step"] for p in m["valid"]] == [3, 6]
    assert m["train_tokens"] > 0 and m["train_tokens_per_s"] > 0 and m["wall_seconds"] > m["train_seconds"]
    assert all(p["tokens_per_s"] for p in m["train"])
    assert m["device"] == "cpu" and m["dtype"] == "float32"
    assert (out / "loss.png").stat().st_size > 1000
    assert "train loss" in proc.stdout and "training tokens/s" in proc.stdout
    assert any(out.glob("checkpoint-*"))


# ------------------------------------------------------------------ two CPU processes (accelerate launch, gloo)

@pytest.fixture(scope="module")
def trained_2proc(tmp_path_factory, cli):
    """The same recipe through `--processes 2`: 3 steps (the 1-process run's schedule is constant, so its first 3 steps compare)."""
    out = tmp_path_factory.mktemp("ft2") / "nlu"
    p = cli("finetune", "meditod-nlu", "--data", str(FIX / "dialogs.json"), "--base", "embedded", "--config", str(FIX / "test-cpu.yaml"),
            "--out", str(out), "--processes", "2", "--max-steps", "3", "--set", "training.eval_steps=3", timeout=1200)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return out, p


def test_two_cpu_processes_follow_the_one_process_loss_curve(trained, trained_2proc):
    (out1, _), (out2, proc) = trained, trained_2proc
    assert "CPU (gloo), 2 processes: accelerate launch --config_file finetune/accelerate_ddp.yaml --num_processes 2" in proc.stderr
    m1 = json.loads((out1 / "train_metrics.json").read_text())
    m2 = json.loads((out2 / "train_metrics.json").read_text())
    # the recipe's batch_size (4) is the global batch: 2 per device x 2 accumulation on one process, x 2 processes on two
    assert m2["distributed"] == {"type": "MULTI_CPU", "backend": "gloo", "processes": 2, "per_device_batch": 2, "accumulation": 1,
                                 "global_batch": 4}
    assert m1["distributed"]["global_batch"] == 4 and m1["distributed"]["accumulation"] == 2 and m2["world_size"] == 2
    # every optimizer step sees the same samples in the same micro-batches (seeded sampler, rank r = accumulation step r),
    # so only the order of floating-point sums differs (measured: < 2e-5 absolute); tolerance 1e-3 relative
    one = {p["step"]: p["loss"] for p in m1["train"]}
    two = {p["step"]: p["loss"] for p in m2["train"]}
    assert sorted(two) == [1, 2, 3] and two[3] < two[1]
    assert all(two[s] == pytest.approx(one[s], rel=1e-3) for s in two), (one, two)
    valid1 = {p["step"]: p["loss"] for p in m1["valid"]}
    assert [p["step"] for p in m2["valid"]] == [3] and m2["valid"][0]["loss"] == pytest.approx(valid1[3], rel=1e-3)
    # both processes' tokens counted: each step holds the global batch (4 samples); the fixture's 2 training samples
    # fill it twice (accelerate repeats samples to fill the last round), so a step is the whole data set twice
    data = m1["data"]["train"]
    assert m2["train_tokens"] == 3 * data["tokens"] * (4 // data["samples"])
    # one adapter, written by rank 0 (the only process that logs)
    assert (proc.stdout + proc.stderr).count("adapter saved to") == 1
    assert sorted(x.parent.name for x in out2.rglob("adapter_model.safetensors")) == ["adapter", "checkpoint-3"]


@pytest.mark.e2e
def test_two_process_adapter_is_served_and_scored(trained_2proc, cli, embedded_server, tmp_path):
    """The 2-process adapter is an adapter like any other: vLLM serves it, the MediTOD NLU supervised run scores it."""
    out, _ = trained_2proc
    name = f"ft2-nlu-{os.getpid()}"  # unique: a shared dev server keeps adapters loaded by earlier sessions
    run = tmp_path / "nlu-supervised"
    r = cli("run", "meditod-nlu", "--data", str(FIX / "dialogs.json"), "--split", "test", "--mode", "supervised",
            "--lora", f"{name}={out / 'adapter'}", "--model", f"embedded@{embedded_server['base_url']}", "--max-tokens", "48",
            "--out", str(run), "--no-cache")
    assert r.returncode == 0, r.stderr[-3000:]
    recs = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]
    assert recs and all(x["status"] == "ok" and x["metadata"]["lora"] == name and x["usage"]["total"]["completion_tokens"] > 0 for x in recs)
    m = json.loads((run / "metrics.json").read_text())
    assert m["case_status"]["failed"] == 0 and 0.0 <= m["f1"] <= 1.0


def test_adapter_reloads_with_peft_and_changes_the_model(trained):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from models.registry import resolve_weights

    out, _ = trained
    cfg = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert cfg["r"] == 8 and cfg["lora_alpha"] == 16 and set(cfg["target_modules"]) >= {"q_proj", "down_proj"}
    saved = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in saved.items())  # trained away from the zero init

    _, weights = resolve_weights("embedded")
    base = AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32)
    ids = torch.tensor([[2, 23391, 1902, 108]])
    with torch.no_grad():
        base_logits = base(ids).logits
        model = PeftModel.from_pretrained(base, str(out / "adapter"))
        tuned_logits = model(ids).logits
        assert not torch.allclose(base_logits, tuned_logits, atol=1e-4)
        merged = AutoModelForCausalLM.from_pretrained(str(out / "merged"), dtype=torch.float32)
        assert torch.allclose(merged(ids).logits, tuned_logits, atol=1e-3)  # --merge = base + adapter


def test_rerun_with_the_same_out_resumes(trained, cli):
    out, _ = trained
    p = cli("finetune", "meditod-nlu", "--data", str(FIX / "dialogs.json"), "--base", "embedded",
            "--config", str(FIX / "test-cpu.yaml"), "--out", str(out), "--max-steps", "7", "--set", "training.eval_steps=7")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resuming from" in p.stderr
    m = json.loads((out / "train_metrics.json").read_text())
    assert m["resumed_from"] and m["global_step"] == 7


@pytest.mark.e2e
def test_adapter_is_served_by_vllm_under_its_name(trained, embedded_server):
    import httpx

    from serving.launcher import load_adapter

    out, _ = trained
    name = f"ft-nlu-test-{os.getpid()}"  # unique: a shared dev server keeps adapters loaded by earlier sessions
    load_adapter(embedded_server, name, str(out / "adapter"))
    models = httpx.get(embedded_server["base_url"] + "/models", timeout=30).json()
    assert name in {m["id"] for m in models["data"]}
    prompt = "Task: extract the patient's intents and slots.\n\nDialogue history:\n(none)\nLast exchange:\nDoctor: Any fever?\nPatient: Yes.\nOutput:\n"
    r = httpx.post(embedded_server["base_url"] + "/completions", timeout=300,
                   json={"model": name, "prompt": prompt, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == name and body["usage"]["completion_tokens"] > 0
    assert isinstance(body["choices"][0]["text"], str)


# ------------------------------------------------------------------ early stopping on a tiny model

def _tiny_model(path: Path) -> Path:
    """A 1-layer random Llama with the local MiniLM (BERT) tokenizer: trains in a second on the CPU."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from experiments.common.text import default_encoder_path

    tok = AutoTokenizer.from_pretrained(default_encoder_path())
    tok.eos_token = "[SEP]"
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=512, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.cls_token_id, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def _conflicting_splits(tmp: Path) -> Path:
    """Train and valid dialogues with the same inputs but unrelated doctor utterances (NLG targets):
    the better the model fits the training targets, the worse its valid loss."""
    import copy

    base = json.loads((FIX / "dialogs.json").read_text())["t1"]

    def variant(text: str) -> dict:
        d = copy.deepcopy(base)
        for u in d["utterances"][1:]:
            if u["speaker"] == "doctor":
                u["text"] = text
        return d

    dialogs = {"a1": variant("Please tell me more about the cough."), "a2": variant("Please tell me more about the cough."),
               "b1": variant("Zebra quantum violin harbour glacier saxophone umbrella lantern orbit meadow velvet.")}
    (tmp / "dialogs.json").write_text(json.dumps(dialogs))
    (tmp / "train_ids.json").write_text(json.dumps(["a1", "a2"]))
    (tmp / "valid_ids.json").write_text(json.dumps(["b1"]))
    return tmp / "dialogs.json"


def test_early_stopping_on_rising_valid_loss_keeps_the_best_checkpoint(tmp_path):
    import torch
    from safetensors.torch import load_file

    from finetune.recipe import load_recipe
    from finetune.sft import train

    weights = _tiny_model(tmp_path / "tiny")
    dialogs = _conflicting_splits(tmp_path)
    out = tmp_path / "run"
    recipe = load_recipe(None, {
        "out": str(out),
        "model": {"base": "embedded", "dtype": "float32", "gradient_checkpointing": False},
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0},
        "data": {"task": "nlg", "dialogs": str(dialogs), "max_length": 256, "prompt_format": "completion"},  # base Gemma: no chat template
        "training": {"learning_rate": 3e-2, "lr_scheduler_type": "constant", "warmup_ratio": 0.0, "batch_size": 4,
                     "per_device_train_batch_size": 4, "per_device_eval_batch_size": 4, "max_steps": 40, "logging_steps": 1,
                     "eval_steps": 1, "save_total_limit": 1, "early_stopping_patience": 3, "seed": 0},
    })
    m = train(recipe, log=lambda *_: None, weights=weights)

    valid = [p["loss"] for p in m["valid"]]
    best = min(range(len(valid)), key=valid.__getitem__)
    # the valid loss rose: after the best evaluation came exactly `patience` worse ones, then training stopped
    assert m["stopped_early"] and m["global_step"] < 40 and m["planned_steps"] == 40, valid
    assert len(valid) == best + 1 + 3 and all(v > valid[best] for v in valid[best + 1:]), valid
    assert best > 0 and valid[best] < valid[0]  # it first fell (shared format), then rose as training fit its own targets
    # the training loss fell meanwhile
    assert m["last_loss"] < m["first_loss"]
    # the best checkpoint is kept (despite save_total_limit 1) and is what adapter/ holds
    assert m["best_step"] == m["valid"][best]["step"] and m["best_valid_loss"] == pytest.approx(valid[best])
    assert m["final_valid_loss"] == pytest.approx(valid[best])
    best_dir = Path(m["best_checkpoint"])
    assert best_dir.name == f"checkpoint-{m['best_step']}" and best_dir.exists()
    kept = load_file(str(best_dir / "adapter_model.safetensors"))
    saved = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert kept.keys() == saved.keys() and all(torch.equal(kept[k], saved[k]) for k in kept)
    last = out / f"checkpoint-{m['global_step']}"
    if last.exists() and last != best_dir:  # the last checkpoint differs from the one kept
        final = load_file(str(last / "adapter_model.safetensors"))
        assert any(not torch.equal(final[k], saved[k]) for k in saved)
