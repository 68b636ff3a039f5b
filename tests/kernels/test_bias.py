import pytest
import torch
from kernel_checks import kernel_gate, rand_bf16, zoo_specs

from tilepilot.kernels import bias
from tilepilot.npu.execute import run_fast, run_tile
from tilepilot.npu.timing import time_design
from tilepilot.npu.validate import DesignError, validate


def inputs(shape: bias.Shape, seed: int = 0) -> dict[str, torch.Tensor]:
    return {"x": rand_bf16(shape.rows, shape.width, seed=seed), "b": rand_bf16(shape.width, seed=seed + 1, scale=0.5)}


@pytest.mark.parametrize(
    ("shape", "config"),
    [(bias.Shape(8, 96), None), (bias.Shape(6, 32), bias.Config(3, 2, 1, "scalar")), (bias.Shape(1, 256), None)],
)
def test_tile_path_equals_fast_path_and_passes_gate(shape, config):
    d = bias.make_design(shape, config)
    assert validate(d) == []
    ins = inputs(shape)
    tile = run_tile(d, ins)["y"]
    fast = run_fast(d, ins, exact=True)["y"]
    assert torch.equal(tile, fast)
    ref = bias.reference(ins)["y"]
    assert torch.equal(fast, ref.to(torch.bfloat16))  # the fp32 sum, rounded once
    kernel_gate("bias", ref, fast, tile)


@pytest.mark.parametrize("spec", [s for s in zoo_specs() if s.qkv_bias], ids=lambda s: s.name)
def test_qkv_bias_shapes_of_qwen2_models(spec):
    for rows in (64, 1):
        for width in (spec.q_dim, spec.kv_dim):
            shape = bias.Shape(rows, width)
            d = bias.make_design(shape)
            assert validate(d) == [], shape
            ins = inputs(shape, seed=width)
            kernel_gate("bias", bias.reference(ins)["y"], run_fast(d, ins, validate=False)["y"])
            assert time_design(d).seconds > 0


def test_bias_is_read_once_not_per_row():
    d = bias.make_design(bias.Shape(64, 1024))
    x_bytes, b_bytes = 64 * 1024 * 2, 1024 * 2
    assert d.ddr_read_bytes() == x_bytes + b_bytes


def test_shape_errors():
    with pytest.raises(DesignError) as e:
        bias.make_design(bias.Shape(3, 64), bias.Config(tiles=1, rows_per_call=2))
    assert e.value.codes == ["SHAPE_NOT_TILING"]
    with pytest.raises(DesignError):
        bias.make_design(bias.Shape(3, 63))
