"""Sharing one GPU between vLLM servers (serving/gpu_memory.py): the arithmetic, from the registry's sizes, and how
a run asks for it (serving/launcher.plan_gpu_shares), with nvidia-smi played by a stub. No GPU, no server."""

from __future__ import annotations

import pytest

from models.registry import get_spec, load_registry
from serving import launcher
from serving.gpu_memory import GpuMemoryError, ModelSize, need, plan_lines, size_of, split_gpu

H100_GIB = 81559 / 1024  # what nvidia-smi reports for an 80 GB H100 (MiB)
# Llama-3-70B's config.json: 70,553,706,496 parameters, 80 layers, 8 KV heads, head dim 128; served at 8,192 tokens
LLAMA3_70B = ModelSize(params=70_553_706_496, dtype_bytes=2, layers=80, kv_heads=8, head_dim=128, context=8192)


def test_every_registry_model_has_a_size():
    for alias, spec in load_registry().items():
        assert spec.size is not None, alias
        assert size_of(spec, spec.dtype).weights_gib > 0


def test_two_8b_bf16_servers_share_an_80gb_gpu():
    llama = size_of(get_spec("llama3-8b-instruct"), "bfloat16")
    mistral = size_of(get_spec("mistral-7b-instruct-v0.2"), "bfloat16", context=8192)
    # by hand: 8,030,261,248 x 2 B = 14.96 GiB of weights; KV 2 x 32 x 8 x 128 x 2 B = 128 KiB per token x 8,192 = 1.00 GiB
    assert llama.weights_gib == pytest.approx(14.957, abs=1e-3) and llama.kv_gib == pytest.approx(1.0)
    needs = [need("llama3-8b-instruct", llama), need("mistral-7b-instruct-v0.2", mistral)]
    assert needs[0].total == pytest.approx(17.957, abs=1e-3)  # + 2 GiB runtime
    shares = split_gpu(needs, H100_GIB)
    print("\n" + "\n".join(plan_lines(shares, H100_GIB)))
    # 0.9 x 79.6 GiB = 71.7 GiB split 17.96 : 16.49 -> 0.469 and 0.430 of the GPU
    assert [s.fraction for s in shares] == [0.469, 0.430]
    assert sum(s.fraction for s in shares) <= 0.9
    assert all(s.gib >= s.need.total for s in shares)


def test_two_equal_8b_servers_get_equal_halves():
    size = size_of(get_spec("llama3-8b-instruct"), "bfloat16")
    shares = split_gpu([need("a", size), need("b", size)], H100_GIB)
    print("\n" + "\n".join(plan_lines(shares, H100_GIB)))
    assert [s.fraction for s in shares] == [0.45, 0.45]


def test_a_70b_does_not_fit_and_is_refused_with_numbers():
    with pytest.raises(GpuMemoryError) as e:
        split_gpu([need("llama3-70b", LLAMA3_70B), need("llama3-8b-instruct", size_of(get_spec("llama3-8b-instruct"), "bfloat16"))], H100_GIB)
    msg = str(e.value)
    print("\n" + msg)
    assert "need 153.9 GiB" in msg and "= 71.7 GiB are available" in msg
    assert "llama3-70b: 135.9 GiB (weights 131.4 + KV cache 2.5 + runtime 2.0)" in msg
    with pytest.raises(GpuMemoryError, match="need 135.9 GiB"):  # alone too
        split_gpu([need("llama3-70b", LLAMA3_70B)], H100_GIB)


def test_a_running_server_holds_its_part():
    size = size_of(get_spec("llama3-8b-instruct"), "bfloat16")
    # one server started alone took vLLM's default 0.9: 71.7 GiB in use, no room for a second 8B
    with pytest.raises(GpuMemoryError, match="less the 72.2 GiB other processes hold now"):
        split_gpu([need("b", size)], H100_GIB, free_gib=H100_GIB - 72.2)
    # one started with 0.45: the second gets what is left within 0.9
    (share,) = split_gpu([need("b", size)], H100_GIB, free_gib=H100_GIB - 0.45 * H100_GIB)
    assert share.fraction == 0.45


def test_plan_on_cpu_and_alone_changes_nothing(monkeypatch):
    monkeypatch.setattr(launcher, "has_nvidia_gpu", lambda: False)
    assert launcher.plan_gpu_shares(["llama3-8b-instruct", "mistral-7b-instruct-v0.2"]) == {}
    monkeypatch.setattr(launcher, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(launcher, "gpu_memory_gib", lambda device=None: (H100_GIB, H100_GIB - 0.5))
    assert launcher.plan_gpu_shares(["llama3-8b-instruct"]) == {}  # alone on an idle GPU: vLLM's own default


def test_plan_for_two_servers_a_run_starts(monkeypatch):
    monkeypatch.setattr(launcher, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(launcher, "gpu_memory_gib", lambda device=None: (H100_GIB, H100_GIB - 0.5))
    said = []
    shares = launcher.plan_gpu_shares(["llama3-8b-instruct", "openbiollm-8b"], log=said.append)
    assert shares == {"llama3-8b-instruct": 0.45, "openbiollm-8b": 0.45}
    assert said[0].startswith("GPU memory: llama3-8b-instruct: --gpu-memory-utilization 0.450")
    monkeypatch.setattr(launcher, "gpu_memory_gib", lambda device=None: (H100_GIB / 4, H100_GIB / 4 - 0.5))  # a 20 GB card
    with pytest.raises(GpuMemoryError, match="2 vLLM server"):
        launcher.plan_gpu_shares(["llama3-8b-instruct", "openbiollm-8b"])
