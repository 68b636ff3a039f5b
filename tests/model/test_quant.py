"""Weight formats: round trips within their bounds, and our dequantizer bit-identical to gguf-py's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from tilepilot.errors import ConfigError
from tilepilot.model.quant import (
    QUANT_FORMATS,
    QuantTensor,
    as_numpy_blocks,
    bits_per_weight,
    block_bytes,
    error_bound,
    quantize,
)

GGML = {"q4_0": GGMLQuantizationType.Q4_0, "q4_1": GGMLQuantizationType.Q4_1, "q8_0": GGMLQuantizationType.Q8_0}


def _w(n=16, k=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)


@pytest.mark.parametrize("fmt", QUANT_FORMATS)
@pytest.mark.parametrize("block", [32, 64, 128])
def test_round_trip_within_bound(fmt, block):
    w = _w()
    qt = quantize(w, fmt, block)
    assert qt.nbytes == 16 * 128 // block * block_bytes(fmt, block)
    err = (qt.dequantize() - w.float()).abs().reshape(-1, block)
    assert (err <= error_bound(w, fmt, block)).all()
    # a 4-bit code uses its whole range; an 8-bit one is far closer than a 4-bit one
    if fmt == "q8_0":
        assert err.max() < (quantize(w, "q4_0", block).dequantize() - w.float()).abs().max() / 8


@pytest.mark.parametrize("fmt", QUANT_FORMATS)
def test_dequantize_is_bit_identical_to_gguf(fmt):
    w = _w(8, 256, seed=1)
    qt = quantize(w, fmt, 32)
    blocks = as_numpy_blocks(qt)
    theirs = np.asarray(gguf_dequantize(blocks, GGML[fmt]), dtype=np.float32).reshape(8, 256)
    assert torch.equal(qt.dequantize(), torch.from_numpy(theirs))


@pytest.mark.parametrize("fmt", QUANT_FORMATS)
def test_random_gguf_blocks_dequantize_bit_identically(fmt):
    """Arbitrary stored bytes (any codes, any finite fp16 scale/min), not only blocks we produced."""
    rng = np.random.default_rng(2)
    bb = block_bytes(fmt)
    raw = rng.integers(0, 256, size=(64, bb), dtype=np.uint8)
    hdr = 4 if fmt == "q4_1" else 2
    raw[:, :hdr] = rng.uniform(-2, 2, size=(64, hdr // 2)).astype(np.float16).view(np.uint8).reshape(64, hdr)
    qt = QuantTensor(fmt, 4, 16 * 32, 32, torch.from_numpy(raw.reshape(4, -1).copy()))
    theirs = np.asarray(gguf_dequantize(raw, GGML[fmt]), dtype=np.float32).reshape(4, -1)
    assert torch.equal(qt.dequantize(), torch.from_numpy(theirs))


def test_sizes_and_refusals():
    assert (block_bytes("q4_0"), block_bytes("q4_1"), block_bytes("q8_0")) == (18, 20, 34)
    assert bits_per_weight("q4_0") == 4.5 and bits_per_weight("bf16") == 16
    with pytest.raises(ConfigError):
        quantize(_w(4, 48), "q4_0", 32)
    with pytest.raises(ConfigError):
        quantize(_w(), "q5_0")


def test_gguf_blocks_used_as_stored(smollm2_gguf, smollm2_dir):
    """The trained Q4_1 model: packed blocks from the file dequantize to exactly the imported bf16 weights."""
    from tilepilot.model.checkpoint import load_checkpoint
    from tilepilot.model.gguf.importer import packed_gguf_weights

    packed = packed_gguf_weights(smollm2_gguf, layers=1)
    assert packed and {q.fmt for q in packed.values()} <= set(QUANT_FORMATS)
    ck = load_checkpoint(smollm2_dir(layers=1))
    lw = ck.layer(0)
    for field, hf in (("wq", "self_attn.q_proj"), ("wk", "self_attn.k_proj"), ("w_down", "mlp.down_proj")):
        qt = packed.get(f"model.layers.0.{hf}.weight")
        if qt is None:
            continue
        assert torch.equal(qt.deployed(), getattr(lw, field))


def test_deployed_weights_are_decoded_once_per_live_packed_tensor():
    """The fast paths' cache of decoded weights: the same bits as decoding, reused while the tensor lives and is
    unchanged, dropped when it goes, and nothing kept beyond its byte budget."""
    import gc

    from tilepilot.model import quant as q

    cache = q._DeployedCache(max_bytes=64 * 128 * 2)
    w = quantize(torch.randn(64, 128), "q4_1").data
    first = cache.get(w, "q4_1", 32)
    assert torch.equal(first, q.dequantize_packed(w, "q4_1", 32).to(torch.bfloat16))
    assert cache.get(w, "q4_1", 32) is first  # reused
    assert q.deployed_packed(w, "q4_1", 32) is q.deployed_packed(w, "q4_1", 32)  # the module's own cache
    w[0, 4] ^= 0xFF  # an in-place write: decoded again
    again = cache.get(w, "q4_1", 32)
    assert again is not first and torch.equal(again, q.dequantize_packed(w, "q4_1", 32).to(torch.bfloat16))
    other = quantize(torch.randn(64, 128), "q4_1").data
    assert cache.get(other, "q4_1", 32) is not cache.get(other, "q4_1", 32)  # over budget: decoded, not kept
    assert cache.bytes == 64 * 128 * 2
    del w, first, again
    gc.collect()
    assert cache.bytes == 0 and not cache._entries
