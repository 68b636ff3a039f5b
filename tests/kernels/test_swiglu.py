import pytest
import torch
from kernel_checks import bf16_ulps, kernel_gate, rand_bf16, zoo_specs

from tilepilot.kernels import swiglu as sw
from tilepilot.npu.execute import run_fast, run_tile
from tilepilot.npu.timing import time_design
from tilepilot.npu.validate import DesignError, validate


def inputs(shape: sw.Shape, seed: int = 0) -> dict[str, torch.Tensor]:
    return {
        "gate": rand_bf16(shape.rows, shape.width, seed=seed, scale=3.0),
        "up": rand_bf16(shape.rows, shape.width, seed=seed + 1),
    }


SMALL = [
    (sw.Shape(4, 512), None),
    (sw.Shape(3, 96), sw.Config(tiles=3, chunk=32)),
    (sw.Shape(1, 64), sw.Config(tiles=1, chunk=64, depth=1, variant="scalar")),
]


@pytest.mark.parametrize(("shape", "config"), SMALL)
def test_tile_path_equals_fast_path_and_passes_gate(shape, config):
    d = sw.make_design(shape, config)
    assert validate(d) == []
    ins = inputs(shape)
    tile = run_tile(d, ins)["y"]
    fast = run_fast(d, ins, exact=True)["y"]
    assert torch.equal(tile, fast)
    kernel_gate("swiglu", sw.reference(ins)["y"], fast, tile)


def test_production_path_within_one_bf16_ulp_of_exact():
    shape = sw.Shape(64, 1024)
    d = sw.make_design(shape)
    ins = inputs(shape, seed=9)
    exact = run_fast(d, ins, exact=True)["y"]
    prod = run_fast(d, ins, exact=False)["y"]
    ulps = bf16_ulps(exact, prod)
    assert int(ulps.max()) <= 1
    assert float((ulps > 0).float().mean()) < 0.01


def test_rounded_once_from_fp32():
    shape = sw.Shape(8, 256)
    ins = inputs(shape, seed=2)
    out = run_fast(sw.make_design(shape), ins, exact=True)["y"]
    ref = sw.reference(ins)["y"]
    assert int(bf16_ulps(out, ref.to(torch.bfloat16)).max()) <= 1


@pytest.mark.parametrize("spec", zoo_specs(), ids=lambda s: s.name)
def test_zoo_shapes_validate_and_pass_gate_on_fast_path(spec):
    for rows in (64, 1):
        shape = sw.Shape(rows, spec.intermediate)
        d = sw.make_design(shape)
        assert validate(d) == [], shape
        assert d.meta["config"]["tiles"] == 8
        ins = inputs(shape, seed=rows)
        kernel_gate("swiglu", sw.reference(ins)["y"], run_fast(d, ins, validate=False)["y"])


def test_authors_limits_show_as_validator_errors():
    # 3 buffers x ping-pong x 8192 bf16 overflow 64 KiB of L1; 4096 fits
    assert "L1_OVERFLOW" in {v.code for v in validate(sw.make_design(sw.Shape(64, 8192), sw.Config(8, 8192)))}
    assert validate(sw.make_design(sw.Shape(64, 8192), sw.Config(8, 4096))) == []
    # more than 8 tiles with 3 DDR streams each exhaust the shim DMA channels
    assert "DMA_CHANNELS" in {v.code for v in validate(sw.make_design(sw.Shape(64, 8192), sw.Config(16, 2048)))}


def test_shape_errors_and_timing():
    with pytest.raises(DesignError) as e:
        sw.make_design(sw.Shape(3, 100), sw.Config(tiles=1, chunk=64))
    assert e.value.codes == ["SHAPE_NOT_TILING"]
    prefill = time_design(sw.make_design(sw.Shape(2048, 8192)))
    assert prefill.seconds > 2048 * 8192 * 2 * 3 / 120e9  # cannot beat the theoretical DDR bandwidth
    sca = time_design(sw.make_design(sw.Shape(64, 1024), sw.Config(8, 1024, 2, "scalar")))
    vec = time_design(sw.make_design(sw.Shape(64, 1024), sw.Config(8, 1024, 2, "vector")))
    assert sca.seconds > vec.seconds


def test_narrow_stores_fp16_overflows_fp8_rounds_and_are_never_candidates():
    """``store`` rounds the product to the named type: fp16 gives Inf above 65504 (bf16 does not), fp8_e4m3 keeps
    three mantissa bits; both paths agree; only bf16 is a candidate, so no default changes."""
    shape = sw.Shape(2, 64)
    ins = {"gate": torch.full((2, 64), 300.0, dtype=torch.bfloat16), "up": torch.full((2, 64), 300.0).bfloat16()}
    ins["up"][1] = 1.0
    for store, big in (("bf16", 90112.0), ("fp16", float("inf")), ("fp8_e4m3", 448.0)):  # 9e4 in bf16: 90112
        d = sw.make_design(shape, sw.Config(tiles=2, chunk=64, store=store))
        y = run_fast(d, ins)["y"]
        assert torch.equal(y, run_tile(d, ins)["y"])
        assert y[0, 0].item() == big and y[1, 0].item() in (300.0, 288.0)  # 300 in bf16/fp16, 288 in fp8
    assert all(c.store == "bf16" for c in sw.candidate_configs(sw.Shape(24, 1024)))
