"""GGUF tensors -> Hugging Face tensors: names, dequantization, and the Q/K un-permute for Llama.

llama.cpp's converter reorders the rows of Llama's q_proj/k_proj (and their biases) from Hugging Face's
rotate-half RoPE layout into the interleaved-pairs layout its own RoPE kernel uses: within each head, rows
(i, i + d/2) become neighbours (2i, 2i + 1). Qwen2/Qwen3 are converted without it (llama.cpp runs them
with NeoX-style RoPE, which is rotate-half already). The inverse, as transformers' GGUF loader applies it:
view the rows as (heads, d/2, 2), swap the last two axes, and flatten again. K uses the KV head count.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from tilepilot.errors import CheckpointError, ScopeError
from tilepilot.model.gguf.reader import GGUFFile
from tilepilot.model.quant import GGUF_TYPES, from_gguf_blocks

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
# Tensors that are not weights of the Hugging Face model (read as metadata elsewhere, see rope.py).
NON_WEIGHTS = ("rope_freqs.weight",)


def hf_name(gguf_name: str) -> tuple[str, int | None]:
    """(Hugging Face name, layer index or None); ScopeError for a tensor the supported models do not have."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name], None
    m = _BLOCK.match(gguf_name)
    if m and m.group(2) in _LAYER:
        layer = int(m.group(1))
        return f"model.layers.{layer}.{_LAYER[m.group(2)]}", layer
    raise ScopeError(
        f"GGUF tensor {gguf_name} has no counterpart in the Llama/Qwen2/Qwen3 models tilepilot imports; "
        "the file holds a different architecture than it declares"
    )


def unpermute_rotary(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (rows of ``n_heads`` heads; weights 2-D, biases 1-D)."""
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantized(tensor: Any) -> np.ndarray:
    """float32 values of a GGUF tensor in Hugging Face (row-major, slowest dim first) shape."""
    from gguf.quants import dequantize

    values = dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    return np.asarray(values, dtype=np.float32).reshape(shape)


def selected(gguf: GGUFFile, layers: int) -> list[tuple[str, str]]:
    """(GGUF name, HF name) of every weight to write, in file order, dropping layers >= ``layers``."""
    out = []
    for name in gguf.tensors:
        if name in NON_WEIGHTS:
            continue
        hf, layer = hf_name(name)
        if layer is None or layer < layers:
            out.append((name, hf))
    return out


def check_against_spec(pairs: list[tuple[str, str]], gguf: GGUFFile, expected: dict[str, tuple[int, ...]]) -> None:
    """Every tensor the config implies is present with its shape, and nothing else is."""
    have = {hf: g for g, hf in pairs}
    for hf, shape in expected.items():
        if hf not in have:
            raise CheckpointError(
                f"{gguf.path.name} has no tensor for {hf}, which the model's metadata requires; the file is "
                "incomplete — re-convert it"
            )
        got = tuple(int(d) for d in reversed(gguf.tensors[have[hf]].shape.tolist()))
        if got != tuple(shape):
            raise CheckpointError(
                f"GGUF tensor {have[hf]} has shape {list(got)} but the metadata implies {list(shape)} for {hf}; "
                "re-convert the file"
            )
    extra = sorted(set(have) - set(expected))
    if extra:
        raise ScopeError(
            f"GGUF tensor {have[extra[0]]} ({extra[0]}) is not part of the model its metadata describes; "
            "tilepilot does not know how to use it"
        )


def hf_tensors(gguf: GGUFFile, pairs: list[tuple[str, str]], cfg: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, bf16 tensor) one at a time, so at most one dequantized tensor is alive at once."""
    permute = gguf.architecture == "llama"
    for gname, hf in pairs:
        values = dequantized(gguf.tensors[gname])
        if permute and ".self_attn.q_proj." in hf:
            values = unpermute_rotary(values, cfg["num_attention_heads"])
        elif permute and ".self_attn.k_proj." in hf:
            values = unpermute_rotary(values, cfg["num_key_value_heads"])
        yield hf, torch.from_numpy(np.require(values, dtype=np.float32, requirements=["C", "W"])).to(torch.bfloat16)


def packed(gguf: GGUFFile, pairs: list[tuple[str, str]], cfg: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Yield (HF name, QuantTensor) for every Q4_0 / Q4_1 / Q8_0 weight, its blocks as stored (no dequantization).

    Blocks run along a row, so Llama's Q/K un-permute moves whole packed rows. Tensors of other types are
    skipped (the importer's bf16 copies stand for them).
    """

    permute = gguf.architecture == "llama"
    for gname, hf in pairs:
        t = gguf.tensors[gname]
        if t.tensor_type.name not in GGUF_TYPES or len(t.shape) != 2:
            continue
        k, n = (int(d) for d in t.shape.tolist())
        qt = from_gguf_blocks(np.asarray(t.data), t.tensor_type.name, n, k)
        heads = None
        if permute and ".self_attn.q_proj." in hf:
            heads = cfg["num_attention_heads"]
        elif permute and ".self_attn.k_proj." in hf:
            heads = cfg["num_key_value_heads"]
        if heads:
            order = unpermute_rotary(np.arange(n), heads)
            qt = qt.rows(torch.from_numpy(np.ascontiguousarray(order)))
        yield hf, qt
