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
