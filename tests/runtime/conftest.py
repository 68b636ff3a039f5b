"""Tiny random-weight models of the four families, built in memory (no checkpoint, no network).

Weights are scaled so that logits are confident (projections ~ 1/sqrt(fan_in), embeddings ~ 1, norms
near 1): with the default std-0.02 init the next-token distribution is nearly uniform and a greedy
comparison would mean nothing.
"""

from __future__ import annotations

import pytest
import torch

from tilepilot.model.spec import ModelSpec, spec_from_config
from tilepilot.model.weights import StateDictWeights

BASE = {
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 384,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
FAMILIES = {
    # Llama with llama3 rope scaling and a short original context, so the scaling matters
    "llama": {
        "architectures": ["LlamaForCausalLM"],
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        "tie_word_embeddings": True,
    },
    "smollm2": {"architectures": ["LlamaForCausalLM"], "num_key_value_heads": 4},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "tie_word_embeddings": True},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "head_dim": 32},
}


def tiny_spec(family: str) -> ModelSpec:
    return spec_from_config({**BASE, **FAMILIES[family]}, name=f"tiny-{family}")


def tiny_weights(family: str, seed: int = 0) -> StateDictWeights:
    spec = tiny_spec(family)
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in spec.tensor_shapes().items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("bias"):
            t = 0.2 * torch.randn(shape, generator=g)
        elif "embed" in name or name == "lm_head.weight":
            t = torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) * (1.2 / shape[1] ** 0.5)
        state[name] = t.to(torch.bfloat16)
    return StateDictWeights(spec, state)


@pytest.fixture(scope="session")
def weights_of():
    cache: dict[str, StateDictWeights] = {}

    def get(family: str) -> StateDictWeights:
        if family not in cache:
            cache[family] = tiny_weights(family)
        return cache[family]

    return get


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models are latency-bound: one thread avoids OpenMP wake-ups (slow on a loaded 2-core box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
