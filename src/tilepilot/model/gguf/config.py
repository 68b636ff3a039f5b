"""GGUF metadata -> Hugging Face ``config.json`` and ``generation_config.json``.

A GGUF carries no config file: its metadata is the config under llama.cpp's key names. We write every
shape field explicitly (never rely on a config class default, which is some other checkpoint's value)
and check the result with tilepilot's own scope check, so a file that imports is one tilepilot deploys.
"""

from __future__ import annotations

from typing import Any

from tilepilot.errors import CheckpointError, ScopeError
from tilepilot.model.gguf.reader import GGUFFile
from tilepilot.model.gguf.rope import llama3_from_divisors, rope_scaling_from_metadata
from tilepilot.model.spec import spec_from_config

# GGUF general.architecture -> (Hugging Face architecture, model_type)
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}


def check_architecture(gguf: GGUFFile) -> str:
    arch = gguf.architecture
    if arch not in ARCHITECTURES:
        raise ScopeError(
            f"GGUF architecture {arch!r} is not supported; tilepilot imports {', '.join(sorted(ARCHITECTURES))} "
            "(Llama/SmolLM2, Qwen2/2.5, Qwen3) models"
        )
    return arch


def _positive_int(gguf: GGUFFile, key: str) -> int:
    value = gguf.require(key)
    if isinstance(value, list):  # per-layer arrays (e.g. head_count_kv) are only fine when uniform
        if not value or len(set(value)) != 1:
            raise ScopeError(f"{gguf.architecture}.{key} differs between layers ({value}); tilepilot needs one value")
        value = value[0]
    if not isinstance(value, int) or value <= 0:
        raise CheckpointError(
            f"{gguf.architecture}.{key} must be a positive integer, got {value!r}; re-convert the file"
        )
    return value


def _vocab_rows(gguf: GGUFFile) -> int:
    embd = gguf.tensors.get("token_embd.weight")
    if embd is None:
        raise CheckpointError(
            f"{gguf.path.name} has no token_embd.weight tensor; the file is incomplete — re-convert it"
        )
    return int(embd.shape[-1])  # ggml dims are fastest first: (hidden, vocab)


def _rope(gguf: GGUFFile, theta: float, head_dim: int) -> dict[str, Any]:
    original = gguf.arch_key("rope.scaling.original_context_length")
    freqs = gguf.tensors.get("rope_freqs.weight")
    if freqs is not None:
        from gguf.quants import dequantize

        return llama3_from_divisors(dequantize(freqs.data, freqs.tensor_type), theta, head_dim, original)
    return rope_scaling_from_metadata(
        gguf.arch_key("rope.scaling.type"), gguf.arch_key("rope.scaling.factor"), original
    )


def eos_ids(gguf: GGUFFile) -> list[int]:
    """End-of-generation ids: EOS plus the end-of-turn/-message ids llama.cpp also stops on."""
    ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        v = gguf.metadata.get(key)
        if isinstance(v, int) and v not in ids:
            ids.append(v)
    return ids


def hf_config(gguf: GGUFFile, layers: int | None = None) -> dict[str, Any]:
    """The ``config.json`` dict for this GGUF (optionally cut to its first ``layers`` decoder layers)."""
    arch = check_architecture(gguf)
    hf_arch, model_type = ARCHITECTURES[arch]
    n_layers = _positive_int(gguf, "block_count")
    if layers is not None:
        if not 1 <= layers <= n_layers:
            raise ScopeError(f"cannot keep {layers} layers of a {n_layers}-layer model; pass 1..{n_layers}")
        n_layers = layers
    hidden = _positive_int(gguf, "embedding_length")
    heads = _positive_int(gguf, "attention.head_count")
    kv_heads = _positive_int(gguf, "attention.head_count_kv") if gguf.arch_key("attention.head_count_kv") else heads
    head_dim = gguf.arch_key("attention.key_length") or (
        gguf.arch_key("rope.dimension_count") if arch == "llama" else None
    )
    head_dim = int(head_dim) if head_dim else hidden // heads
    theta = float(gguf.arch_key("rope.freq_base", 10000.0))
    eos = eos_ids(gguf)
    cfg: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": n_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": _positive_int(gguf, "feed_forward_length"),
        "hidden_act": "silu",
        "rms_norm_eps": float(gguf.require("attention.layer_norm_rms_epsilon")),
        "rope_theta": theta,
        "rope_scaling": _rope(gguf, theta, head_dim) or None,
        "vocab_size": _vocab_rows(gguf),
        "max_position_embeddings": int(gguf.arch_key("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "bos_token_id": gguf.metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "pad_token_id": gguf.metadata.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "bfloat16",
        "_name_or_path": str(gguf.metadata.get("general.name") or gguf.path.stem),
    }
    if arch in ("llama", "qwen3"):
        cfg["attention_bias"] = "blk.0.attn_q.bias" in gguf.tensors
        cfg["mlp_bias"] = False
    if arch in ("qwen2", "qwen3"):
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = None
    spec_from_config(cfg)  # tilepilot's scope check: refuse now, before any tensor is converted
    return cfg


def generation_config(cfg: dict[str, Any], eos: list[int]) -> dict[str, Any]:
    gen: dict[str, Any] = {"bos_token_id": cfg.get("bos_token_id"), "eos_token_id": eos[0] if len(eos) == 1 else eos}
    if cfg.get("pad_token_id") is not None:
        gen["pad_token_id"] = cfg["pad_token_id"]
    gen["do_sample"] = False
    return gen
