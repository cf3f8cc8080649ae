"""Fine-tuning: recipe validation, the loss mask, data building, clear errors (no training here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments.core.config import ConfigError, parse_set
from finetune.data import IGNORE_INDEX, completion_positions, load_pairs, tokenize_pair
from finetune.recipe import CONFIG_DIR, load_recipe, merge_overrides, require_4bit_support, strip_none
from models.errors import DataError, MedstackError

FIX = Path(__file__).parent / "fixtures" / "finetune"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from models.registry import resolve_weights

    _, weights = resolve_weights("embedded")
    return AutoTokenizer.from_pretrained(str(weights))


# ------------------------------------------------------------------ recipes

@pytest.mark.parametrize("name", ["embedded-cpu.yaml", "llama3-8b-nlu.yaml", "openbiollm-8b-nlu.yaml"])
def test_shipped_configs_carry_the_paper_lora_settings(name):
    r = load_recipe(CONFIG_DIR / name)
    assert (r.lora.r, r.lora.alpha, r.training.learning_rate, r.training.batch_size) == (32, 32, 1e-4, 16)
    assert (r.training.lr_scheduler_type, r.training.warmup_ratio) == ("cosine", 0.1)
    assert set(r.lora.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    # batch 16 = per device x accumulation on one process
    assert r.training.per_device_train_batch_size * r.training.split(1)[1] == 16


def test_gpu_configs_use_bf16_and_gradient_checkpointing():
    for name in ("llama3-8b-nlu.yaml", "openbiollm-8b-nlu.yaml"):
        r = load_recipe(CONFIG_DIR / name)
        assert r.model.dtype == "bfloat16" and r.model.gradient_checkpointing
    assert load_recipe(CONFIG_DIR / "embedded-cpu.yaml").model.dtype == "float32"


def test_rank_zero_is_rejected_naming_the_key():
    with pytest.raises(ConfigError, match=r"lora\.r: .*greater than or equal to 1"):
        load_recipe(CONFIG_DIR / "embedded-cpu.yaml", {"lora": {"r": 0}})


def test_unknown_base_alias_lists_the_known_ones():
    with pytest.raises(ConfigError) as e:
        load_recipe(None, {"model": {"base": "gpt-17"}})
    assert "model.base" in str(e.value) and "unknown base model alias 'gpt-17'" in str(e.value) and "embedded" in str(e.value)


def test_unknown_key_and_bad_batch_are_rejected():
    with pytest.raises(ConfigError, match=r"lora\.rank: unknown setting .rank. in lora \(valid in lora: r, alpha"):
        load_recipe(None, {"lora": {"rank": 8}})
    with pytest.raises(ConfigError, match="not a multiple of per_device_train_batch_size"):
        load_recipe(None, {"training": {"batch_size": 16, "per_device_train_batch_size": 3}})
    with pytest.raises(ConfigError, match="cannot be split over 3 process"):
        load_recipe(None, {"training": {"batch_size": 16, "per_device_train_batch_size": 2}}).training.split(3)


def test_batch_size_is_the_global_batch_on_any_number_of_processes():
    t = load_recipe(CONFIG_DIR / "embedded-cpu.yaml").training  # batch 16, 2 per device
    assert [t.split(n) for n in (1, 2, 4, 8, 16)] == [(2, 8), (2, 4), (2, 2), (2, 1), (1, 1)]  # (per device, accumulation)
    t = load_recipe(CONFIG_DIR / "llama3-8b-nlu.yaml").training  # batch 16, 8 per device (the authors' config)
    assert [t.split(n) for n in (1, 2, 8)] == [(8, 2), (8, 1), (2, 1)]  # 2 GPUs: the authors' 8 x 2; 8 GPUs: 2 per device
    assert all(pd * acc * n == 16 for n in (1, 2, 4, 8, 16) for pd, acc in [t.split(n)])
    with pytest.raises(ConfigError, match="batch_size 16 .* cannot be split over 3 processes"):
        t.split(3)


def test_launch_command_and_its_checks(tmp_path):
    from finetune.launch import check_processes, launch_argv

    argv = launch_argv(Path("runs/x/recipe.yaml"), 2, port=8155)
    assert argv == ["accelerate", "launch", "--config_file", "finetune/accelerate_ddp.yaml", "--num_processes", "2",
                    "--main_process_port", "8155", "-m", "finetune.sft", "runs/x/recipe.yaml"]
    assert launch_argv(Path("r.yaml"), 4, fsdp=True, port=1)[3] == "finetune/accelerate_fsdp.yaml"
    r = load_recipe(FIX / "test-cpu.yaml", {"data": {"dialogs": str(FIX / "dialogs.json")}})  # batch 4
    check_processes(r, 2, fsdp=False, on_gpu=False, gpus=0)
    with pytest.raises(ConfigError, match="--fsdp needs GPUs"):
        check_processes(r, 2, fsdp=True, on_gpu=False, gpus=0)
    with pytest.raises(ConfigError, match="this machine has 2 GPU"):
        check_processes(r, 4, fsdp=False, on_gpu=True, gpus=2)
    with pytest.raises(ConfigError, match="cannot be split over 3 processes"):
        check_processes(r, 3, fsdp=False, on_gpu=False, gpus=0)
    with pytest.raises(ConfigError, match="load_in_4bit"):
        check_processes(load_recipe(CONFIG_DIR / "llama3-8b-nlu.yaml", {"data": {"dialogs": "d.json"}}), 2, fsdp=True, on_gpu=True, gpus=2)
    shutil.copy(FIX / "dialogs.json", tmp_path / "dialogs.json")
    shutil.copy(FIX / "train_ids.json", tmp_path / "train_ids.json")
    with pytest.raises(DataError, match=r"valid_ids\.json not found"):
        check_processes(load_recipe(FIX / "test-cpu.yaml", {"data": {"dialogs": str(tmp_path / "dialogs.json")}}), 2,
                        fsdp=False, on_gpu=False, gpus=0)


def test_accelerate_files_leave_precision_to_the_recipe():
    """mixed_precision bf16 in an accelerate file would turn on bf16 autocast even on the CPU (TrainingArguments
    reads ACCELERATE_MIXED_PRECISION); the recipe's model.dtype decides instead."""
    import yaml

    for name in ("accelerate_ddp.yaml", "accelerate_fsdp.yaml"):
        cfg = yaml.safe_load((CONFIG_DIR.parent / name).read_text())
        assert cfg["mixed_precision"] == "no" and cfg["num_machines"] == 1
    assert yaml.safe_load((CONFIG_DIR.parent / "accelerate_fsdp.yaml").read_text())["distributed_type"] == "FSDP"


def test_missing_config_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("lora: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_recipe(bad)


def test_overrides_parse_and_merge():
    assert parse_set(["training.max_steps=30", "lora.r=8", "data.valid_split=null"]) == {
        "training": {"max_steps": 30}, "lora": {"r": 8}, "data": {"valid_split": None}}
    with pytest.raises(ConfigError, match="expected SECTION.KEY=VALUE"):
        parse_set(["max_steps"])
    merged = merge_overrides({"lora": {"r": 32, "alpha": 32}}, strip_none({"lora": {"r": 8, "alpha": None}, "out": None}))
    assert merged == {"lora": {"r": 8, "alpha": 32}}
    r = load_recipe(CONFIG_DIR / "embedded-cpu.yaml", parse_set(["data.valid_split=null", "training.early_stopping_patience=null"]))
    assert r.data.valid_split is None and r.training.early_stopping_patience is None
    with pytest.raises(ConfigError, match="early_stopping_patience=null to train without validation"):
        load_recipe(CONFIG_DIR / "embedded-cpu.yaml", parse_set(["data.valid_split=null"]))


def test_4bit_without_bitsandbytes_or_gpu_fails_clearly():
    r = load_recipe(None, {"model": {"load_in_4bit": True}})
    with pytest.raises(MedstackError, match="needs a CUDA GPU"):
        require_4bit_support(r, on_gpu=False)
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:  # the CPU environment: bitsandbytes is not installed
        with pytest.raises(MedstackError, match="bitsandbytes is not installed"):
            require_4bit_support(r, on_gpu=True)
    require_4bit_support(load_recipe(None, {}), on_gpu=False)  # not requested: nothing to check


@pytest.mark.parametrize("name", ["llama3-8b-nlu.yaml", "openbiollm-8b-nlu.yaml"])
def test_paper_configs_carry_the_authors_recipe(name):
    """The MediTOD authors' released configs: 4-bit NF4 base without double
    quantization, bf16, 8-bit AdamW, 8 per device, evaluation and checkpoint every 512 steps, early stopping
    patience 5, last batch dropped, 1024 tokens, seed 42, history_size 4, the base's chat template."""
    r = load_recipe(CONFIG_DIR / name)
    assert r.training.epochs == 10 and r.training.max_steps == -1
    assert r.data.valid_split == "valid" and r.training.eval_steps == 512 and r.training.save_steps == 512
    assert r.training.early_stopping_patience == 5 and r.training.seed == 42 and r.training.save_total_limit == 2
    assert r.model.gradient_checkpointing and r.model.load_in_4bit and r.model.dtype == "bfloat16" and not r.model.double_quant
    assert r.training.optim == "adamw_bnb_8bit" and r.training.dataloader_drop_last
    assert r.training.per_device_train_batch_size == 8 and r.training.per_device_eval_batch_size == 4
    assert r.data.max_length == 1024 and r.data.history_size == 4 and r.data.prompt_format == "chat"
    text = (CONFIG_DIR / name).read_text()
    for key in ("optim:", "dataloader_drop_last:", "eval_steps:", "double_quant:", "attn_implementation:"):
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(key))
        assert "#" in line and "authors" in line.split("#", 1)[1], line   # where each non-paper value comes from


def test_cpu_config_stays_float32_without_4bit():
    r = load_recipe(CONFIG_DIR / "embedded-cpu.yaml")
    assert r.model.dtype == "float32" and not r.model.load_in_4bit
    assert r.training.epochs == 10 and r.training.early_stopping_patience == 5 and r.data.max_length == 1024
    assert r.data.prompt_format == "completion" and "COMPLETION FORMAT" in (CONFIG_DIR / "embedded-cpu.yaml").read_text()
    r = load_recipe(CONFIG_DIR / "embedded-cpu.yaml", {"training": {"max_steps": 3}})  # --max-steps: smoke runs
    assert r.training.max_steps == 3


def test_4bit_gpu_base_is_nf4_without_double_quantization(monkeypatch):
    """What load_base hands to from_pretrained on a GPU (checked without one): a BitsAndBytesConfig with
    NF4 4-bit weights, no double quantization (the authors'), bf16 compute, the model on the current CUDA device."""
    import torch
    from transformers import BitsAndBytesConfig

    from finetune import sft

    r = load_recipe(CONFIG_DIR / "llama3-8b-nlu.yaml")
    assert sft.bnb_4bit_kwargs(torch.bfloat16) == {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                                   "bnb_4bit_compute_dtype": torch.bfloat16, "bnb_4bit_use_double_quant": False}
    # no GPU here: the clear error first
    with pytest.raises(MedstackError, match="needs a CUDA GPU"):
        sft.from_pretrained_kwargs(r, on_gpu=False, dtype=torch.bfloat16)
    # pretend a GPU with bitsandbytes installed (the checks themselves: test_4bit_without_bitsandbytes_or_gpu_fails_clearly)
    checked = []
    monkeypatch.setattr(sft, "require_4bit_support", lambda rec, on_gpu: checked.append(on_gpu))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    kw = sft.from_pretrained_kwargs(r, on_gpu=True, dtype=torch.bfloat16)
    q = kw["quantization_config"]
    assert isinstance(q, BitsAndBytesConfig) and q.load_in_4bit and not q.load_in_8bit
    assert q.bnb_4bit_quant_type == "nf4" and not q.bnb_4bit_use_double_quant and q.bnb_4bit_compute_dtype == torch.bfloat16
    assert kw["device_map"] == {"": 0} and kw["dtype"] == torch.bfloat16 and kw["attn_implementation"] == "eager"
    assert checked == [True]
    # the CPU config: float32, no quantization
    kw = sft.from_pretrained_kwargs(load_recipe(CONFIG_DIR / "embedded-cpu.yaml"), on_gpu=False, dtype=torch.float32)
    assert "quantization_config" not in kw and kw["dtype"] == torch.float32


def test_early_stopping_needs_a_valid_split():
    with pytest.raises(ConfigError, match="early_stopping_patience needs data.valid_split"):
        load_recipe(None, {"data": {"valid_split": None}, "training": {"early_stopping_patience": 2}})


# ------------------------------------------------------------------ data and the loss mask

def test_pairs_are_the_meditod_supervised_messages():
    from experiments.studies.meditod.data import load_dialogs, load_split_ids
    from experiments.studies.meditod.prompts import sft_messages
    from experiments.studies.meditod.tasks import sft_samples

    pairs = load_pairs(str(FIX / "dialogs.json"), None, "train", "nlu")
    samples = sft_samples(load_dialogs(FIX / "dialogs.json"), load_split_ids(FIX, "train"), "nlu")
    assert len(pairs) == len(samples) and pairs[0]["split"] == "train"
    assert pairs[0]["messages"] == sft_messages("nlu", samples[0])
    answer = pairs[0]["messages"][-1]["content"]
    assert answer.startswith("[answer] ") and answer.endswith(" [done]")
    assert json.loads(answer[len("[answer] "):-len(" [done]")]) == [
        {"intent": "inform", "slots": {"positive_symptom": [{"value": "coughing", "onset": "last week"}]}}]


def test_missing_split_names_the_file(tmp_path):
    shutil.copy(FIX / "dialogs.json", tmp_path / "dialogs.json")
    shutil.copy(FIX / "train_ids.json", tmp_path / "train_ids.json")
    with pytest.raises(DataError, match=r"split 'valid': .*valid_ids\.json not found"):
        load_pairs(str(tmp_path / "dialogs.json"), None, "valid", "nlu")


def test_loss_mask_covers_only_the_completion(tokenizer):
    prompt, completion = "Task: say the answer.\nInput: two plus two\nOutput:\n", '{"answer":4}'
    row = tokenize_pair(tokenizer, prompt, completion, max_length=256)
    ids, labels = row["input_ids"], row["labels"]
    n_prompt = len(tokenizer(prompt)["input_ids"])
    assert ids[0] == tokenizer.bos_token_id and len(ids) == len(labels)
    assert labels[:n_prompt] == [IGNORE_INDEX] * n_prompt  # every prompt token is masked
    assert all(x != IGNORE_INDEX for x in labels[n_prompt:])  # every completion token is trained
    assert labels[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(labels[n_prompt:-1]) == completion
    assert ids[n_prompt:] == labels[n_prompt:]


def test_truncation_keeps_the_completion_and_the_bos(tokenizer):
    prompt = "Dialogue history:\n" + "Patient: I cough a lot.\n" * 60 + "Output:\n"
    row = tokenize_pair(tokenizer, prompt, '{"ok":1}', max_length=64)
    assert row["truncated"] and len(row["input_ids"]) == 64
    assert row["input_ids"][0] == tokenizer.bos_token_id
    completion = [t for t in row["labels"] if t != IGNORE_INDEX]
    assert tokenizer.decode(completion[:-1]) == '{"ok":1}' and completion[-1] == tokenizer.eos_token_id


def test_completion_positions_are_the_union_over_the_batch():
    import torch

    labels = torch.tensor([[-100, -100, 5, 6, -100], [-100, -100, -100, 7, 8]])
    # position p predicts token p+1: row 0 needs 1, 2; row 1 needs 2, 3
    assert completion_positions(labels).tolist() == [1, 2, 3]


# ------------------------------------------------------------------ command line: bad input exits 2

def test_cli_bad_base_rank_and_split_exit_2(cli, tmp_path):
    data = str(FIX / "dialogs.json")
    p = cli("finetune", "meditod-nlu", "--data", data, "--base", "gpt-17", "--out", str(tmp_path / "a"))
    assert p.returncode == 2 and "unknown base model alias 'gpt-17'" in p.stderr
    p = cli("finetune", "meditod-nlu", "--data", data, "--base", "embedded", "--set", "lora.r=0", "--out", str(tmp_path / "b"))
    assert p.returncode == 2 and "lora.r" in p.stderr
    p = cli("finetune", "meditod-pol", "--data", data, "--base", "embedded", "--set", "data.valid_split=dev", "--out", str(tmp_path / "c"))
    assert p.returncode == 2 and "dev_ids.json not found" in p.stderr
    p = cli("finetune", "meditod-nlu", "--data", data, "--base", "embedded", "--config", str(FIX / "test-cpu.yaml"), "--processes", "3",
            "--out", str(tmp_path / "d"))
    assert p.returncode == 2 and "training.batch_size 4 (the global batch) cannot be split over 3 processes" in p.stderr
    p = cli("finetune", "meditod-nlu", "--data", data, "--base", "embedded", "--processes", "2", "--fsdp", "--out", str(tmp_path / "e"))
    assert p.returncode == 2 and "--fsdp needs GPUs" in p.stderr and "Traceback" not in p.stderr
    p = cli("finetune", "meditod-nlg", "--data", str(tmp_path / "missing.json"), "--base", "embedded")
    assert p.returncode == 2 and "missing.json" in p.stderr and ("does not exist" in p.stderr or "no such file" in p.stderr)


def test_prompt_format_of_a_base_and_of_an_adapter(tmp_path):
    """The format MediTOD's supervised run asks in: the adapter's recipe.yaml, else the base's default recipe."""
    from models.prompt_format import DEFAULT_RECIPES, adapter_prompt_format, default_prompt_format, default_recipe

    for base in DEFAULT_RECIPES:  # read without validation: the same value the validated recipe holds
        assert default_prompt_format(base) == load_recipe(default_recipe(base)).data.prompt_format
    assert default_prompt_format("embedded") == "completion" and default_prompt_format("no-such-base") == "chat"
    (tmp_path / "adapter").mkdir()
    assert adapter_prompt_format(str(tmp_path / "adapter")) is None  # no recipe.yaml beside it
    (tmp_path / "recipe.yaml").write_text("data:\n  prompt_format: completion\n")
    assert adapter_prompt_format(str(tmp_path / "adapter")) == "completion"
    (tmp_path / "recipe.yaml").write_text("data: [unclosed\n")
    assert adapter_prompt_format(str(tmp_path / "adapter")) is None


# ------------------------------------------------------------------ the recipe's flags, generated from the recipe model

def test_recipe_flags_are_generated_from_the_recipe_model():
    from experiments.core.commands import flag_overrides
    from finetune.cli import recipe_flags

    flags = {p.flag.decls[0]: p for p in recipe_flags()}
    assert set(flags) == {"--epochs", "--max-steps", "--early-stopping-patience"}
    assert flags["--max-steps"].flag.targets == ("training.max_steps",) and flags["--epochs"].flag.type is float
    given = {flags["--max-steps"].key: 3, flags["--early-stopping-patience"].key: 2}
    assert flag_overrides(recipe_flags(), given) == {"training": {"max_steps": 3, "early_stopping_patience": 2}}


def test_recipe_flags_reach_the_recipe_and_set_wins(cli, tmp_path):
    data = str(FIX / "dialogs.json")
    p = cli("finetune", "meditod-nlu", "--data", data, "--base", "embedded", "--early-stopping-patience", "0", "--out", str(tmp_path / "a"))
    assert p.returncode == 2 and "training.early_stopping_patience" in p.stderr and "Traceback" not in p.stderr
    p = cli("finetune", "meditod-nlu", "--data", data, "--base", "embedded", "--max-steps", "3", "--set", "training.epochs=0",
            "--out", str(tmp_path / "b"))
    assert p.returncode == 2 and "training.epochs" in p.stderr
    p = cli("finetune", "meditod-nlu", "--help")
    assert "--max-steps" in p.stdout and "training.max_steps" in p.stdout and "every shipped recipe" in p.stdout
