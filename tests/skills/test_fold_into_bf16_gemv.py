"""The bf16 GEMV folds the quantized GEMV's small ops the same way (``kernels/gemv.py``: one dataflow, the same fold
helpers): RMSNorm as the prologue of the launch that reads it, the residual add and SwiGLU as epilogues. Each fused
launch computes what the separate launches computed, bit for bit, on the tile path and both fast paths; a bf16 decode
pass with every fold gives the unfused pass's logits with five launches fewer per layer and less modeled time. That
each skill is kept on a bf16 plan only when faster and correct is tested beside the quantized cases
(``test_fold_into_gemv.test_each_skill_is_kept_when_faster_and_the_gate_passes``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from folds import assert_same_logits_fewer_launches, bf16

from tilepilot.kernels import eltwise, gemv, rmsnorm, swiglu
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.npu.execute import run_fast, run_tile
from tilepilot.npu.timing import time_design
from tilepilot.npu.validate import DesignError, validate
from tilepilot.plan.air_q4 import fused_stage
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.plan.merge import gated_stage, merged_stage, normed_stage, packing_alternatives, residual_stage
from tilepilot.plan.plan import validate_plan

RIDES = {"weight_channels": 2, "x_rides": True}
CASES = [
    # (shape, config): norm, residual and SwiGLU, alone and together, on one and several compute rows, bf16 and bfp16
    (gemv.Shape(64, 128, 1, norm_eps=1e-5), gemv.Config(8, 1, 4, 64, **RIDES)),
    (gemv.Shape(128, 128, 2, parts=(64, 64), norm_eps=1e-6), gemv.Config(8, 4, 2, 64, depth=1, **RIDES)),
    (gemv.Shape(64, 256, 1, residual=True), gemv.Config(4, 2, 4, 128, **RIDES)),
    (gemv.Shape(64, 128, 2, norm_eps=1e-5, residual=True), gemv.Config(8, 1, 4, 32, variant="bfp16", **RIDES)),
    (gemv.Shape(128, 128, 1, parts=(64, 64), gated=True), gemv.Config(8, 1, 4, 64, **RIDES)),
    (gemv.Shape(256, 128, 2, parts=(128, 128), gated=True, norm_eps=1e-5), gemv.Config(8, 4, 2, 64, **RIDES)),
]


def _inputs(shape: gemv.Shape) -> dict[str, torch.Tensor]:
    """Residuals of scale 20 and norm inputs of scale 30: a row paired with the wrong residual, gate or norm shows."""
    ins = {"x": bf16(shape.m, shape.k, seed=1, scale=30.0 if shape.norm_eps else 3.0)}
    if shape.norm_eps is not None:
        ins["g"] = bf16(shape.k, seed=2)
    if shape.residual:
        ins["r"] = bf16(shape.m, shape.n, seed=5, scale=20.0)
    for j, (w, _) in enumerate(gemv.tensor_names(shape)):
        ins[w] = bf16(shape.matrices()[j], shape.k, seed=3 + j, scale=0.1)
    return ins


def _unfused(shape: gemv.Shape, config: gemv.Config, ins: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The separate launches: RMSNorm, the plain GEMV, then the residual add or SwiGLU, each its own kernel."""
    x = ins["x"]
    if shape.norm_eps is not None:
        x = run_fast(rmsnorm.make_design(rmsnorm.Shape(shape.m, shape.k, eps=shape.norm_eps)), {"x": x, "w": ins["g"]})
        x = x["y"]
    plain = gemv.make_design(replace(shape, norm_eps=None, residual=False, gated=False), config)
    out = run_fast(plain, {"x": x, **{w: ins[w] for w, _ in gemv.tensor_names(shape)}}, exact=True)
    if shape.residual:
        add = eltwise.make_design(eltwise.Shape(n=shape.m * shape.n, op="add"))
        y = run_fast(add, {"a": ins["r"].reshape(-1), "b": out["y"].reshape(-1)})["c"]
        return {"y": y.reshape(shape.m, shape.n)}
    if shape.gated:
        sw = swiglu.make_design(swiglu.Shape(rows=shape.m, width=shape.parts[0]))
        return run_fast(sw, {"gate": out["y0"], "up": out["y1"]})
    return out


@pytest.mark.parametrize(("shape", "config"), CASES, ids=lambda v: str(v))
def test_the_fused_bf16_launch_is_the_separate_launches_bit_for_bit(shape, config):
    design = gemv.make_design(shape, config)
    assert validate(design) == []
    ins = _inputs(shape)
    tile, exact, prod = run_tile(design, ins), run_fast(design, ins, exact=True), run_fast(design, ins)
    unfused = _unfused(shape, config, ins)
    assert sorted(tile) == sorted(unfused)
    for y in unfused:
        assert torch.equal(tile[y], exact[y]) and torch.equal(exact[y], unfused[y])
        # production computes in one torch.linear: within a bf16 ulp of the exact path, as the plain GEMV's
        assert torch.allclose(prod[y].float(), exact[y].float(), rtol=2**-7, atol=1e-2)
    # the reference (FP32 throughout) is close to the deployed arithmetic
    ref = gemv.reference(ins, shape)
    for y in unfused:
        assert torch.allclose(ref[y], exact[y].float(), rtol=0.05, atol=0.5)
    plain = gemv.make_design(replace(shape, norm_eps=None, residual=False, gated=False), config)
    riding = 2 * shape.k * (shape.norm_eps is not None) + 2 * shape.m * shape.n * shape.residual
    assert design.ddr_read_bytes() == plain.ddr_read_bytes() + riding
    if shape.gated:
        assert design.ddr_write_bytes() * 2 == plain.ddr_write_bytes()
    if shape.norm_eps is not None:  # every worker's one-time norm lengthens the fill
        assert time_design(design).fill_cycles > time_design(plain).fill_cycles


def test_a_fold_needs_a_resident_x_and_an_fp32_accumulator():
    shape = gemv.Shape(64, 128, 1, norm_eps=1e-5)
    with pytest.raises(DesignError, match="x_rides"):
        gemv.make_design(shape, gemv.Config(2, 1, 8, 64))
    with pytest.raises(DesignError, match="fp32"):
        gemv.make_design(shape, gemv.Config(8, 1, 4, 64, acc="bf16", **RIDES))
    with pytest.raises(DesignError, match="one matrix"):
        gemv.make_design(gemv.Shape(128, 128, 1, parts=(64, 64), residual=True), gemv.Config(8, 1, 4, 64, **RIDES))
    with pytest.raises(DesignError, match="two equal matrices"):
        gemv.make_design(gemv.Shape(128, 128, 1, parts=(32, 96), gated=True), gemv.Config(4, 1, 4, 64, **RIDES))
    assert all(c.x_rides and c.weight_channels == 2 for c in gemv.candidate_configs(shape))
    assert gemv.default_config(shape).x_rides


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_every_fold_on_a_bf16_pass_gives_the_same_logits_with_five_launches_fewer_per_layer(tiny_model, family):
    ck = load_checkpoint(tiny_model(family, layers=2))
    merged = merged_stage(fused_stage(paper_like_plan(ck.spec)))
    assert {c.family for g in merged.decode.block for c in g.calls} >= {"gemv"}
    folded = gated_stage(residual_stage(normed_stage(merged)))
    assert folded is not None and validate_plan(folded) == [] and gated_stage(folded) is None
    runs = [m for g in folded.decode.block for m in g.merged]
    assert ["gate_proj", "up_proj", "ffn_norm", "swiglu"] in runs and ["o_proj", "resid1"] in runs
    assert_same_logits_fewer_launches(merged, folded, ck, 5 * ck.spec.n_layers)  # 2 norms, 2 adds, 1 SwiGLU
    unfolded = next(p for p, how in packing_alternatives(folded) if "SwiGLU epilogues" in how)
    assert [m for g in unfolded.decode.block for m in g.merged] == [m for g in merged.decode.block for m in g.merged]
