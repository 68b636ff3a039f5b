"""Tiny checkpoints of each family for skill tests: the zoo's config and weight recipe at toy dimensions.

A full deployment runs the model gate (prefill + 32 greedy steps, twice) many times; at real hidden sizes
and 128k vocabularies that costs seconds per run, at these sizes milliseconds. Hidden 512 is the smallest
width at which the zoo's weight recipe keeps block-0 per-position cosine of a pure bf16 run (even an
all-CPU plan) above the phase-2 bound of 0.99 on every seed tried (0-2); at hidden 128-256 single positions
fell to 0.977-0.98, a property of the recipe at toy widths, not of any kernel. The family-specific
features that matter to the general block graph are kept: Llama-3 RoPE scaling (with a short original
context so it matters), SmolLM2 without scaling, Qwen2 QKV bias, Qwen3 per-head Q/K norm with head_dim
!= hidden / heads. No tokenizer is written (prompts are then seeded token ids).
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from tilepilot.model.spec import spec_from_config
from tilepilot.model.zoo import get_zoo_model
from tilepilot.model.zoo_weights import generate_tensor

# family -> (zoo model whose config is shrunk, overrides)
TINY = {
    "llama": (
        "llama-3.2-1b",
        {
            "hidden_size": 512,
            "intermediate_size": 1024,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "rope_scaling": {
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
                "rope_type": "llama3",
            },
        },
    ),
    "smollm2": (
        "smollm2-1.7b",
        {"hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 8},
    ),
    "qwen2": (
        "qwen2.5-0.5b",
        {"hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2},
    ),
    "qwen3": (
        "qwen3-0.6b",
        {
            "hidden_size": 512,
            "intermediate_size": 1024,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 128,
        },
    ),
}
# The zoo's weight recipe makes the first `intermediate` ids "live" (the rows a tokenizer would use) when there
# is no tokenizer, the rest near-zero reserved rows; prompts here are seeded ids over the whole vocabulary, so the
# vocabulary is exactly the live part.
TINY_VOCAB = 1024
TINY_SPECIAL = {"bos_token_id": 1, "eos_token_id": 2}


def write_tiny(family: str, out: Path, layers: int = 2, seed: int = 0, vocab: int = TINY_VOCAB) -> Path:
    name, overrides = TINY[family]
    cfg = get_zoo_model(name).hf_config(layers, "bfloat16")
    cfg.update(overrides)
    cfg.update(TINY_SPECIAL, vocab_size=vocab, max_position_embeddings=4096)
    if "max_window_layers" in cfg:
        cfg["max_window_layers"] = layers
    spec = spec_from_config(cfg, name=f"tiny-{family}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = {n: generate_tensor(spec, n, seed).to_dense().bfloat16() for n in spec.tensor_shapes()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
