"""Tiny transformers models of the four supported families, the independent reference for the oracle.

Weights are re-initialised with a larger scale than transformers' default (std 0.02), which gives
near-uniform next-token distributions on which greedy comparisons would hinge on float noise:
projections get std ``GAIN / sqrt(fan_in)``, embeddings (and an untied LM head) std 1, norm weights
``1 + 0.1 * N(0, 1)`` and biases std 0.1 (so norms and biases are not no-ops the test cannot see).
With this scale the top-1/top-2 logit gap over 32 greedy steps is well above the FP32 noise between
two implementations (~1e-5); ``test_greedy_margin_is_clear`` measures it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from tilepilot.model.spec import ModelSpec, spec_from_config
from tilepilot.model.weights import StateDictWeights

GAIN = 2.0
VOCAB = 512
FAMILIES = ("llama3", "smollm2", "qwen2", "qwen3")


def _config(family: str):
    common = dict(vocab_size=VOCAB, num_hidden_layers=2, rms_norm_eps=1e-6, max_position_embeddings=512)
    if family == "llama3":
        # original_max_position_embeddings=64 puts one frequency in each llama3 band for head_dim 16:
        # wavelengths 6.3 (kept), 32 (smoothed) and >= 166 (divided by the factor).
        return LlamaConfig(
            **common,
            hidden_size=64,
            intermediate_size=160,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            tie_word_embeddings=True,
            architectures=["LlamaForCausalLM"],
        )
    if family == "smollm2":
        return LlamaConfig(
            **common,
            hidden_size=96,
            intermediate_size=256,
            num_attention_heads=6,
            num_key_value_heads=6,
            rope_theta=130000.0,
            tie_word_embeddings=True,
            architectures=["LlamaForCausalLM"],
        )
    if family == "qwen2":
        return Qwen2Config(
            **common,
            hidden_size=64,
            intermediate_size=192,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_theta=1000000.0,
            tie_word_embeddings=False,
            architectures=["Qwen2ForCausalLM"],
        )
    if family == "qwen3":
        return Qwen3Config(
            **common,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            architectures=["Qwen3ForCausalLM"],
        )
    raise ValueError(family)


def _reinit(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name or name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (GAIN / math.sqrt(p.shape[1])))


@dataclass
class TinyModel:
    family: str
    hf: torch.nn.Module
    spec: ModelSpec
    weights: StateDictWeights


def build_tiny(family: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> TinyModel:
    """A 2-layer transformers model of ``family`` in eval mode, with our spec and weight source."""
    torch.manual_seed(seed)
    cfg = _config(family)
    cfg._attn_implementation = "eager"
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    _reinit(hf, seed)
    hf = hf.to(dtype)
    spec = spec_from_config(hf.config.to_dict(), name=f"tiny-{family}")
    return TinyModel(family, hf, spec, StateDictWeights(spec, hf.state_dict()))


def prompt_ids(n: int, seed: int = 1) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=gen).tolist()


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request) -> TinyModel:
    return build_tiny(request.param)
