"""Specs of the four families, small and full size, built from config dicts (no checkpoint needed)."""

from __future__ import annotations

import pytest

from tilepilot.model.spec import ModelSpec, spec_from_config

LLAMA_1B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}


# SmolLM2-135M's published config (the trained model's shape; its GGUF is not needed for a plan).
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def tiny_config(arch: str) -> dict:
    cfg = {
        "architectures": [arch],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "max_position_embeddings": 512,
    }
    if arch == "Qwen3ForCausalLM":
        cfg["head_dim"] = 32
    return cfg


FAMILY_ARCHS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
}


@pytest.fixture(params=list(FAMILY_ARCHS))
def tiny_spec(request) -> ModelSpec:
    return spec_from_config(tiny_config(FAMILY_ARCHS[request.param]), name=f"tiny-{request.param}")


@pytest.fixture
def llama_1b() -> ModelSpec:
    return spec_from_config(LLAMA_1B, name="llama-3.2-1b")


@pytest.fixture
def smollm2_135m() -> ModelSpec:
    return spec_from_config(SMOLLM2_135M, name="smollm2-135m")
