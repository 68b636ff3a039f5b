import pytest
import torch
from kernel_checks import kernel_gate, rand_bf16, zoo_specs

from tilepilot.kernels import rope
from tilepilot.model.zoo import ZOO
from tilepilot.npu.execute import run_fast, run_tile
from tilepilot.npu.timing import time_design
from tilepilot.npu.validate import DesignError, validate
from tilepilot.oracle import ops
from tilepilot.oracle.rope import default_inv_freq, inv_freq_for


def inputs(shape: rope.Shape, start: int = 0, theta: float = 10000.0, seed: int = 0) -> dict[str, torch.Tensor]:
    inv = default_inv_freq(shape.head_dim, theta)
    cs = rope.table(inv, torch.arange(start, start + shape.rows), shape.table_dtype)
    return {"x": rand_bf16(shape.rows, rope.width(shape), seed=seed), "cs": cs}


def true_rope(x: torch.Tensor, inv: torch.Tensor, positions: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The oracle's RoPE with fp32 tables (what the kernel must match)."""
    cos, sin = ops.rope_tables(positions, inv)
    return ops.apply_rope(x.reshape(x.shape[0], -1, head_dim), cos, sin).reshape(x.shape[0], -1)


SMALL = [
    (rope.Shape(16, 4, 32), None),
    (rope.Shape(16, 4, 32, "fp32"), rope.Config(tiles=3, rows_per_call=2)),
    (rope.Shape(1, 8, 64), None),
    (rope.Shape(6, 2, 16), rope.Config(tiles=2, rows_per_call=1, depth=1, variant="scalar")),
]


@pytest.mark.parametrize(("shape", "config"), SMALL)
def test_tile_path_equals_fast_path_and_passes_gate(shape, config):
    d = rope.make_design(shape, config)
    assert validate(d) == []
    ins = inputs(shape, start=5)
    tile = run_tile(d, ins)["y"]
    fast = run_fast(d, ins, exact=True)["y"]
    assert torch.equal(tile, fast)
    assert torch.equal(run_fast(d, ins, exact=False)["y"], fast)
    ref = true_rope(
        ins["x"], default_inv_freq(shape.head_dim, 10000.0), torch.arange(5, 5 + shape.rows), shape.head_dim
    )
    kernel_gate("rope", ref, fast, tile)


def test_half_rotation_layout_matches_transformers_rotate_half():
    shape = rope.Shape(3, 2, 8, "fp32")
    ins = inputs(shape, start=11, seed=4)
    out = run_fast(rope.make_design(shape), ins)["y"].float()
    x = ins["x"].float().reshape(3, 2, 8)
    cos, sin = ops.rope_tables(torch.arange(11, 14), default_inv_freq(8, 10000.0))
    # Hugging Face: q * cos + rotate_half(q) * sin with rotate_half([x1, x2]) = [-x2, x1]
    hf = x * cos[:, None] + torch.cat((-x[..., 4:], x[..., :4]), -1) * sin[:, None]
    torch.testing.assert_close(out, hf.reshape(3, 16), rtol=0.008, atol=1e-6)


def test_llama3_scaled_tables_and_decode_offset():
    spec = ZOO["llama-3.2-1b"].spec(layers=1)
    full = rope.table_for(spec, 0, 300, "fp32")
    cos, sin = ops.rope_tables(torch.arange(300), inv_freq_for(spec))
    assert torch.equal(full[:, :32], cos[:, :32]) and torch.equal(full[:, 32:], sin[:, :32])
    assert not torch.equal(inv_freq_for(spec), default_inv_freq(64, spec.rope_theta))  # scaling applied
    assert torch.equal(rope.table_for(spec, 257, 1, "fp32"), full[257:258])  # decode: the row of its position


def test_fp32_tables_are_more_accurate_than_bf16_tables():
    errs = {}
    for dt in ("bf16", "fp32"):
        shape = rope.Shape(64, 4, 64, dt)
        ins = inputs(shape, start=1000, seed=2)
        out = run_fast(rope.make_design(shape), ins)["y"].float()
        ref = true_rope(ins["x"], default_inv_freq(64, 10000.0), torch.arange(1000, 1064), 64)
        errs[dt] = (out - ref).abs().mean().item()
    assert errs["fp32"] < errs["bf16"]


@pytest.mark.parametrize("spec", zoo_specs(), ids=lambda s: s.name)
def test_zoo_shapes_validate_and_pass_gate_on_fast_path(spec):
    inv = inv_freq_for(spec)
    for rows, start in ((64, 0), (1, 4095)):
        for which in ("q", "k"):
            shape = rope.shape_for(spec, rows, which)
            d = rope.make_design(shape)
            assert validate(d) == [], shape
            x = rand_bf16(rows, rope.width(shape), seed=rows)
            out = run_fast(d, {"x": x, "cs": rope.table_for(spec, start, rows)}, validate=False)["y"]
            ref = true_rope(x, inv, torch.arange(start, start + rows), spec.head_dim)
            kernel_gate("rope", ref, out)


def test_more_than_eight_three_stream_tiles_exhaust_the_shims():
    d = rope.make_design(rope.Shape(64, 2, 64), rope.Config(tiles=16, rows_per_call=2))
    assert "DMA_CHANNELS" in {v.code for v in validate(d)}
    assert validate(rope.make_design(rope.Shape(64, 2, 64), rope.Config(tiles=8, rows_per_call=2))) == []


def test_tile_memory_overflow_and_shape_errors():
    d = rope.make_design(rope.Shape(64, 32, 128), rope.Config(tiles=8, rows_per_call=4))
    assert "L1_OVERFLOW" in {v.code for v in validate(d)}
    with pytest.raises(DesignError) as e:
        rope.make_design(rope.Shape(5, 2, 64), rope.Config(tiles=1, rows_per_call=2))
    assert e.value.codes == ["SHAPE_NOT_TILING"]
    with pytest.raises(DesignError):
        rope.make_design(rope.Shape(4, 2, 6))  # head_dim halves must be whole words


def test_timing_scales_with_rows_and_variant():
    small = time_design(rope.make_design(rope.Shape(256, 8, 64)))
    big = time_design(rope.make_design(rope.Shape(2048, 8, 64)))
    assert big.seconds > small.seconds
    vec = time_design(rope.make_design(rope.Shape(256, 8, 64), rope.Config(8, 2, 2, "vector")))
    sca = time_design(rope.make_design(rope.Shape(256, 8, 64), rope.Config(8, 2, 2, "scalar")))
    assert sca.seconds > vec.seconds


def test_interleaved_layout_rotates_adjacent_pairs_and_is_never_a_candidate():
    """``layout="interleaved"`` rotates (2i, 2i+1) by frequency i (GPT-J / GGUF); on the half-rotation reference it is
    right at position 0 (the identity) and wrong from position 1, and tile path == fast path still holds."""
    shape, inv = rope.Shape(4, 2, 16), default_inv_freq(16, 10000.0)
    ins = inputs(shape)
    d = rope.make_design(shape, rope.Config(tiles=2, layout="interleaved"))
    assert validate(d) == [] and d.workers[0].kernel.name.endswith("_interleaved")
    y = run_fast(d, ins)["y"]
    assert torch.equal(y, run_tile(d, ins)["y"])
    x = ins["x"].float().reshape(4, 2, 8, 2)
    cs = ins["cs"].float()
    c, s = cs[:, None, :8], cs[:, None, 8:]
    pairs = torch.stack((x[..., 0] * c - x[..., 1] * s, x[..., 1] * c + x[..., 0] * s), dim=-1)
    assert torch.equal(y, pairs.reshape(4, -1).to(torch.bfloat16))
    ref = true_rope(ins["x"].float(), inv, torch.arange(4), 16)
    rows = torch.nn.functional.cosine_similarity(ref, y.float(), dim=-1)
    assert rows[0] > 0.999 and rows[1] < 0.99
    assert all(c.layout == "half" for c in rope.candidate_configs(rope.Shape(64, 8, 64)))
    with pytest.raises(DesignError):
        rope.make_design(shape, rope.Config(layout="gptj"))


def test_bf16_angles_are_right_early_wrong_late_and_never_a_candidate():
    """Angles rounded to bf16 before cos/sin: exact-ish at small positions, off by ~a bf16 ulp of the angle later."""
    shape = rope.Shape(512, 4, 64, "fp32")
    inv, pos = default_inv_freq(64, 10000.0), torch.arange(512)
    x = rand_bf16(512, rope.width(shape), seed=3)
    truth = true_rope(x, inv, pos, 64)
    y = rope.rotate_rows(x, rope.table(inv, pos, "fp32", angles="bf16"), 64).float()
    cos = torch.nn.functional.cosine_similarity(truth, y, dim=-1)
    assert cos[:64].min() > 0.999 and cos[384:].min() < 0.97
    assert torch.equal(rope.table(inv, pos, "fp32"), rope.table(inv, pos, "fp32", angles="fp32"))
    assert rope.Config().angles == "fp32"
    assert all(c.angles == "fp32" for c in rope.candidate_configs(shape))
    with pytest.raises(Exception, match="angles"):
        rope.make_design(shape, rope.Config(angles="fp16"))
