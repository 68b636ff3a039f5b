"""RoPE with a KV-cache write epilogue (``kernels/rope.py``, ``Shape.kv_format``): the quantized cache's stored rows
of [rotated k | v] come out of the RoPE launch itself. Both executor paths agree bit for bit, and equal a RoPE launch
followed by the KV-write launch (``kernels/kvquant.py``); the fused launch moves V in and the stored rows out with
their true bytes, and refuses what it cannot write."""

import pytest
import torch
from kernel_checks import rand_bf16

from tilepilot.kernels import kvquant, rope
from tilepilot.model.quant import kv_unit, kv_values
from tilepilot.npu.execute import run_fast, run_tile
from tilepilot.npu.timing import time_design
from tilepilot.npu.validate import DesignError, validate
from tilepilot.oracle.rope import default_inv_freq

CASES = [  # (shape, config): Q and K heads with V riding; K alone; with a per-head norm prologue; several rows
    (rope.Shape(1, 6, 64, kv_format="q4_0", kv_heads=2), None),
    (rope.Shape(1, 2, 64, kv_format="q8_0", kv_heads=2), None),
    (rope.Shape(1, 6, 64, norm_heads=(4, 2), kv_format="q8_0", kv_heads=2), None),
    (rope.Shape(5, 6, 32, kv_format="q8_0", kv_heads=2), rope.Config(tiles=2, rows_per_call=1, kv_format="q8_0")),
]


def inputs(shape: rope.Shape, start: int = 7) -> dict[str, torch.Tensor]:
    cs = rope.table(default_inv_freq(shape.head_dim, 10000.0), torch.arange(start, start + shape.rows))
    ins = {"x": rand_bf16(shape.rows, rope.x_width(shape), seed=1), "cs": cs}
    if shape.norm_heads:
        ins["g"] = rand_bf16(len(shape.norm_heads), shape.head_dim, seed=2)
    return ins


def separate(shape: rope.Shape, ins: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """RoPE's launch, then the KV-write launch over its K rows and V's."""
    w = rope.width(shape)
    plain = rope.Shape(shape.rows, shape.heads, shape.head_dim, norm_heads=shape.norm_heads)
    y = run_fast(rope.make_design(plain), {**ins, "x": ins["x"][:, :w]}, exact=True)["y"]
    yw = rope.y_width(shape)
    rows = torch.cat((y[:, yw:], ins["x"][:, w:]), dim=1)
    kvq = kvquant.make_design(kvquant.Shape(shape.rows, rows.shape[1], shape.kv_format))
    out = {"kv": run_fast(kvq, {"x": rows}, exact=True)["kv"]}
    return out | ({"y": y[:, :yw]} if yw else {})


@pytest.mark.parametrize(("shape", "config"), CASES)
def test_tile_path_equals_fast_path_equals_rope_then_kv_write(shape, config):
    d = rope.make_design(shape, config)
    assert validate(d) == []
    ins = inputs(shape)
    tile, fast = run_tile(d, ins), run_fast(d, ins, exact=True)
    want = separate(shape, ins)
    assert set(tile) == set(fast) == set(want) == ({"y", "kv"} if rope.y_width(shape) else {"kv"})
    for name in want:
        assert torch.equal(tile[name], fast[name]) and torch.equal(fast[name], want[name]), name
    assert fast["kv"].dtype == torch.uint8 and fast["kv"].shape == (shape.rows, rope.kv_width(shape))
    # the FP32 reference rotates (and normalizes) in fp32, rounds to bf16 and stores by the same quantizer: without a
    # norm prologue the rotation's one rounding is the kernel's, so the bytes agree; with one they decode close
    ref = rope.reference(ins, shape)
    if not shape.norm_heads:
        assert torch.equal(ref["kv"], fast["kv"])
    got, want_ref = (kv_values(t, shape.kv_format).float() for t in (fast["kv"], ref["kv"]))
    assert (got - want_ref).abs().max() <= 0.05 * want_ref.abs().max()


def test_the_fused_launch_moves_v_in_and_the_stored_rows_out():
    shape = rope.Shape(1, 40, 64, kv_format="q4_0", kv_heads=8)
    fused = rope.make_design(shape)
    plain = rope.make_design(rope.Shape(1, 40, 64))
    kvw = kv_unit("q4_0", 2 * 8 * 64)[0]
    by_name = {t.name: t for t in (*fused.inputs, *fused.outputs)}
    assert by_name["x"].shape == (1, 48 * 64) and by_name["y"].shape == (1, 32 * 64)
    assert by_name["kv"].shape == (1, kvw) and by_name["kv"].dtype == "uint8"
    tf, tp = time_design(fused), time_design(plain)
    # V's rows more in; K's rotated rows out no more, the stored bytes out instead: the launch's DDR traffic says so
    v_bytes = 8 * 64 * 2
    assert tf.ddr_read_bytes - tp.ddr_read_bytes == v_bytes
    assert tf.ddr_write_bytes - tp.ddr_write_bytes == kvw - v_bytes
    # per call the kernel moves x in (with V), y out (without K), the stored row out, and quantizes 2 x 512 values
    assert fused.workers[0].kernel.bytes_per_call - plain.workers[0].kernel.bytes_per_call == kvw
    quantize = 1024 * kvquant.OPS_PER_VALUE + 1024 // 32 * kvquant.OPS_PER_BLOCK
    assert fused.workers[0].kernel.vector_ops_per_call - plain.workers[0].kernel.vector_ops_per_call == quantize
    kv_alone = time_design(kvquant.make_design(kvquant.Shape(1, 1024, "q4_0")))
    assert tp.seconds < tf.seconds < tp.seconds + kv_alone.seconds  # one fill and drain instead of two


def test_cache_write_refusals():
    with pytest.raises(DesignError, match="K heads"):
        rope.make_design(rope.Shape(1, 4, 64, kv_format="q4_0", kv_heads=5))
    with pytest.raises(DesignError, match="whole"):
        rope.make_design(rope.Shape(1, 4, 8, kv_format="q8_0", kv_heads=1))  # 16 values: not whole blocks
    with pytest.raises(DesignError, match="set kv_format"):
        rope.make_design(rope.Shape(1, 4, 64, kv_format="q4_0", kv_heads=1), rope.Config(tiles=1, kv_format="q8_0"))
    with pytest.raises(DesignError, match="KV-cache format"):
        rope.make_design(rope.Shape(1, 4, 64, kv_format="q5_0", kv_heads=1), rope.Config(tiles=1, kv_format="q5_0"))
    # every candidate of a cache-writing shape writes its format; a plain RoPE launch ignores the field
    assert {c.kv_format for c in rope.candidate_configs(rope.Shape(3, 4, 64, kv_format="q4_0", kv_heads=1))} == {"q4_0"}
    assert rope.make_design(rope.Shape(1, 4, 64), rope.Config(tiles=1, kv_format="q4_0")).outputs[0].name == "y"


def test_stored_rows_decode_to_the_rotated_k_and_v():
    shape = rope.Shape(2, 4, 64, kv_format="q8_0", kv_heads=2)
    ins = inputs(shape)
    out = run_fast(rope.make_design(shape), ins, exact=True)
    decoded = kv_values(out["kv"], "q8_0")
    k_rot = run_fast(rope.make_design(rope.Shape(2, 4, 64)), {**ins, "x": ins["x"][:, :256]}, exact=True)["y"][:, 128:]
    want = torch.cat((k_rot, ins["x"][:, 256:]), dim=1).float()
    assert decoded.shape == want.shape
    assert (decoded.float() - want).abs().max() <= want.abs().max() / 127  # within a q8_0 step of the row's values
