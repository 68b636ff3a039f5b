"""A quantized KV cache (q8_0, q4_0) at the kernel level: the stored format (``model.quant.pack_kv_rows``), the
runtime cache that holds it, the ``kvquant`` launch that writes it, and attention reading it
(``attention.Shape.kv_format``): designs validate, the tile path equals the fast path bit for bit, the cache rows
stream at 34 (18) bytes per 32 values against 64, and the block decode is timed at the quantized GEMV's efficiency."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tilepilot.errors import ConfigError, InputError
from tilepilot.kernels import attention, kvquant
from tilepilot.kernels.tuning import tune
from tilepilot.model.quant import kv_deployed, kv_values, pack_kv_rows
from tilepilot.npu.execute import run_fast, run_tile
from tilepilot.npu.timing import time_design
from tilepilot.npu.validate import DesignError, validate
from tilepilot.runtime.kv_cache import KVCache


def _rows(*shape: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).bfloat16()


def test_the_stored_rows_are_gguf_q8_0_blocks_and_decode_within_half_a_step():
    rows = _rows(5, 256, seed=0)
    stored = pack_kv_rows(rows, "q8_0")
    assert stored.dtype == torch.uint8 and stored.shape == (5, 256 // 32 * 34)
    back = kv_values(stored, "q8_0")
    step = rows.float().reshape(5, 8, 32).abs().amax(-1, keepdim=True) / 127  # one code step per block
    err = (back.float() - rows.float()).reshape(5, 8, 32).abs()
    assert (err <= 0.51 * step + 2**-8 * rows.float().abs().reshape(5, 8, 32)).all()
    assert not torch.equal(back, rows)  # really quantized
    assert torch.equal(kv_deployed(rows, "bf16"), rows) and torch.equal(kv_deployed(rows, "q8_0"), back)
    with pytest.raises(ConfigError, match="use one of"):
        pack_kv_rows(rows, "q4_1")


@pytest.mark.parametrize(("fmt", "block_bytes"), [("q8_0", 34), ("q4_0", 18)])
def test_the_runtime_cache_stores_its_blocks_in_fewer_bytes(fmt, block_bytes):
    bf, q8 = KVCache(2, 128, 64, fmt="bf16"), KVCache(2, 128, 64, fmt=fmt)
    k, v = _rows(3, 128, seed=1), _rows(3, 128, seed=2)
    for c in (bf, q8):
        c.write(1, k, v)
    q8.write_stored(0, pack_kv_rows(torch.cat((k, v), 1), fmt))  # what a kvquant launch hands over
    for c in (bf, q8):
        c.advance(3)
    assert q8.nbytes() * 64 == bf.nbytes() * block_bytes
    assert q8.packed(1, 3).dtype == torch.uint8 and torch.equal(
        q8.packed(1, 3), pack_kv_rows(torch.cat((k, v), 1), fmt)
    )
    assert torch.equal(q8.keys(1), kv_deployed(torch.cat((k, v), 1), fmt)[:, :128])
    assert torch.equal(q8.values(1), kv_deployed(torch.cat((k, v), 1), fmt)[:, 128:])
    assert torch.equal(q8.packed(0, 3), q8.packed(1, 3))
    with pytest.raises(ConfigError, match="multiple of 64"):
        KVCache(2, 96, 64, fmt="q8_0")  # heads of 32 values are 34 bytes: not whole 32-bit words
    with pytest.raises(ConfigError, match="use one of"):
        KVCache(2, 128, 64, fmt="fp8")


@pytest.mark.parametrize(
    "shape", [kvquant.Shape(1, 1024), kvquant.Shape(7, 256), kvquant.Shape(32, 512, "q4_0")], ids=str
)
def test_the_kvquant_launch_writes_the_stored_rows_bit_for_bit(shape):
    x = _rows(shape.rows, shape.width, seed=3)
    for config in kvquant.candidate_configs(shape)[:3]:
        design = kvquant.make_design(shape, config)
        assert validate(design) == []
        tile, fast = run_tile(design, {"x": x})["kv"], run_fast(design, {"x": x})["kv"]
        assert torch.equal(tile, fast) and torch.equal(fast, pack_kv_rows(x, shape.kv_format))
        assert design.ddr_write_bytes() == shape.rows * shape.width // 32 * (34 if shape.kv_format == "q8_0" else 18)
    with pytest.raises(DesignError, match="blocks"):
        kvquant.make_design(kvquant.Shape(1, 48))
    with pytest.raises(DesignError, match="32-bit words"):
        kvquant.make_design(kvquant.Shape(1, 32))


CASES = [
    # decode over a cache (one-pass and flash-decoding tilings), prefill, a GQA group spanning KV heads
    attention.Shape(1, 200, 8, 2, 64, kv_format="q8_0"),
    attention.Shape(16, 16, 4, 2, 64, kv_format="q8_0"),
    attention.Shape(8, 40, 4, 4, 128, kv_format="q8_0"),
    attention.Shape(1, 100, 8, 2, 64, kv_format="q4_0"),
]


@pytest.mark.parametrize("shape", CASES, ids=str)
def test_attention_over_a_q8_0_cache_is_bit_identical_on_both_paths(shape):
    cands = attention.candidate_configs(shape)
    assert cands and all(c.kv_format == shape.kv_format for c in cands)
    picked = cands[:2] + [c for c in cands if c.kv_stages > 1][:2]
    q, k, v = (
        _rows(shape.q_len, shape.q_dim, seed=4),
        _rows(shape.kv_len, shape.kv_dim, seed=5),
        _rows(shape.kv_len, shape.kv_dim, seed=6),
    )
    for config in picked:
        design = attention.make_design(shape, config)
        assert validate(design) == [], config
        ins = attention.prepare_inputs(design, q, k, v)
        assert ins["kv"].dtype == torch.uint8
        tile, exact, prod = (
            run_tile(design, ins)["o"],
            run_fast(design, ins, exact=True)["o"],
            run_fast(design, ins)["o"],
        )
        assert torch.equal(tile, exact)
        assert torch.allclose(prod.float(), exact.float(), rtol=2**-7, atol=1e-3)
        # the same attention over the decoded rows of a bf16 cache: a q8_0 cache changes only K and V (per-head
        # blocks: K and V quantize apart exactly as the joined row), the arithmetic after the decode is the same
        bf_config = replace(config, kv_format="bf16")
        kv = attention.pack_kv(kv_deployed(k, shape.kv_format), kv_deployed(v, shape.kv_format), design.meta["kv_rows"])
        bf_fast = attention._fast(replace(shape, kv_format="bf16"), bf_config)
        assert torch.equal(bf_fast({"q": ins["q"], "kv": kv}, exact=True)["o"], exact)
        # 34 (q8_0) or 18 (q4_0) bytes per 32 values, against 64 in bf16
        assert ins["kv"].numel() * 32 == kv.numel() * (34 if shape.kv_format == "q8_0" else 18)
    ref = attention.reference(ins, shape)["o"]
    assert torch.nn.functional.cosine_similarity(ref.flatten(), exact.float().flatten(), dim=0) > 0.99


def test_a_config_for_another_cache_format_and_heads_of_32_are_refused():
    shape = CASES[0]
    with pytest.raises(DesignError, match="kv_format"):
        attention.make_design(shape, replace(attention.default_config(shape), kv_format="bf16"))
    with pytest.raises(DesignError, match="multiple of 64"):
        attention.make_design(attention.Shape(1, 64, 4, 2, 32, kv_format="q8_0"))
    with pytest.raises(InputError):
        from tilepilot.model.zoo import get_zoo_model
        from tilepilot.skills.weights import check_format

        check_format(
            __import__("tilepilot.model.quant", fromlist=["WeightFormat"]).WeightFormat(kv_cache="q8_0"),
            replace(get_zoo_model("llama-3.2-1b").spec(), head_dim=32),
        )


def test_decode_attention_over_a_q8_0_cache_streams_half_the_bytes_and_is_faster():
    """Llama-3.2-1B's decode step at 1024 and 2048 positions: the tuned design of each cache format, both DDR-bound
    (modeled). The block decode is the quantized GEMV's inner loop, timed at its efficiency; timed at the softmax
    loop's instead it would make the kernel compute-bound and slower than bf16."""
    for ctx in (1024, 2048):
        t = {}
        for fmt in ("bf16", "q8_0", "q4_0"):
            shape = attention.Shape(1, ctx, 32, 8, 64, kv_format=fmt)
            design = attention.make_design(shape, tune("attention", shape).config)
            t[fmt] = (time_design(design), design.ddr_read_bytes())
        assert t["q4_0"][1] < 0.29 * t["bf16"][1] and t["q8_0"][1] < 0.54 * t["bf16"][1]
        assert t["q8_0"][0].bound == "ddr" and t["q8_0"][0].seconds < 0.8 * t["bf16"][0].seconds
        assert t["q4_0"][0].seconds < t["q8_0"][0].seconds
    design = attention.make_design(shape, tune("attention", shape).config)
    assert all(dict(w.kernel.borrowed_ops).get("qgemv", 0) > 0 for w in design.workers if w.kernel.macs_per_call)
