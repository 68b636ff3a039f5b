"""Elementwise add/mul: tile == fast bit for bit, one rounding, and the shim/L1 limits the paper's authors hit."""

from __future__ import annotations

import pytest
import torch

from tilepilot.kernels import eltwise
from tilepilot.npu.device import Tile, npu2
from tilepilot.npu.execute import run_fast, run_tile
from tilepilot.npu.validate import DesignError, validate


@pytest.mark.parametrize(
    ("shape", "config"),
    [
        (eltwise.Shape(512, "add"), eltwise.Config(tiles=4, chunk=32)),
        (eltwise.Shape(512, "mul"), eltwise.Config(tiles=8, chunk=64, depth=1)),
        (eltwise.Shape(1000, "add"), eltwise.Config(tiles=3, chunk=64, variant="scalar", pad=True)),
    ],
)
def test_tile_equals_fast_and_rounds_once(shape, config):
    d = eltwise.make_design(shape, config)
    assert validate(d) == []
    torch.manual_seed(0)
    a, b = torch.randn(shape.n).bfloat16(), torch.randn(shape.n).bfloat16()
    ins = eltwise.prepare_inputs(d, a, b)
    tile = run_tile(d, ins)["c"]
    assert torch.equal(tile, run_fast(d, ins, exact=True)["c"])
    assert torch.equal(tile, run_fast(d, ins)["c"])
    out = eltwise.crop_outputs(d, {"c": tile})["c"]
    ref = eltwise.reference({"a": a, "b": b}, shape)["c"]
    assert torch.equal(out, ref.bfloat16())  # exactly one RNE rounding of the fp32 result


def test_more_than_eight_tiles_exhaust_the_shim_channels():
    ok = eltwise.make_design(eltwise.Shape(8 * 256), eltwise.Config(tiles=8, chunk=256))
    assert validate(ok) == []
    assert [w.placement for w in ok.workers] == [Tile(c, 2) for c in range(8)]
    bad = eltwise.make_design(eltwise.Shape(9 * 256), eltwise.Config(tiles=9, chunk=256))
    vs = validate(bad)
    assert {v.code for v in vs} == {"DMA_CHANNELS"} and all(npu2().is_shim(v.tile) for v in vs)


def test_chunks_above_4096_overflow_l1():
    assert validate(eltwise.make_design(eltwise.Shape(8 * 4096), eltwise.Config(tiles=8, chunk=4096))) == []
    d = eltwise.make_design(eltwise.Shape(8 * 8192), eltwise.Config(tiles=8, chunk=8192))
    assert {v.code for v in validate(d)} == {"L1_OVERFLOW"}


def test_meta_shape_rules_and_defaults():
    d = eltwise.make_design(eltwise.Shape(2048 * 2048))
    assert validate(d) == []
    assert d.meta["ddr_read_bytes"] == 2 * 2 * 2048 * 2048 and d.meta["ddr_write_bytes"] == 2 * 2048 * 2048
    assert d.meta["family"] == "eltwise" and d.total_macs() == 0
    with pytest.raises(DesignError) as e:
        eltwise.make_design(eltwise.Shape(1000), eltwise.Config(tiles=4, chunk=64))
    assert e.value.codes == ["SHAPE_NOT_TILING"]
    with pytest.raises(DesignError):
        eltwise.make_design(eltwise.Shape(64, "div"), eltwise.Config(tiles=1, chunk=64))
    cands = eltwise.candidate_configs(eltwise.Shape(2048 * 896))
    assert cands[0] == eltwise.default_config(eltwise.Shape(2048 * 896)) and not cands[0].pad
    assert all(eltwise.l1_bytes(c) <= 65536 for c in cands)
