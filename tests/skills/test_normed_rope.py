"""Qwen3's per-head Q/K norms folded into the RoPE launch that reads them (``kernels.bind.NormedRope``, as AIR fused
Qwen3's per-head QK-norm into its attention-input ELF): the fused launch is the norm launches then RoPE bit for bit
on the tile path and the fast path; a decode pass with it matches the unfused pass's logits with two launches fewer
per layer; the plan refuses a fold a norm's other reader or its accumulator forbids; the ``qk-norm-into-rope`` skill
is kept only when faster and correct."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from folds import assert_same_logits_fewer_launches, bf16

from tilepilot.harness.model_gate import model_gate
from tilepilot.kernels import rmsnorm, rope
from tilepilot.kernels.bind import NormedRope, merged_launch
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.graph import block_graph
from tilepilot.model.quant import WeightFormat
from tilepilot.npu.execute import run_fast, run_tile
from tilepilot.npu.timing import time_design
from tilepilot.npu.validate import DesignError, validate
from tilepilot.plan.air_q4 import fused_stage
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.plan.merge import merged_stage, normed_rope_stage, packing_alternatives, split_stage
from tilepilot.plan.plan import validate_plan, with_weights
from tilepilot.skills.optimize.decode import QkNormIntoRope


# decode's one token, and prefill-sized launches: each object is its own task group (its BD chain), so a worker with
# many objects stays within the shim's buffer descriptors
@pytest.mark.parametrize(("rows", "norm_heads", "d"), [(1, (4, 2), 64), (3, (2, 1), 128), (64, (32, 8), 128)])
def test_the_fused_launch_is_the_per_head_norms_then_rope_bit_for_bit(rows, norm_heads, d):
    shape = rope.Shape(rows, sum(norm_heads), d, norm_heads=norm_heads, norm_eps=1e-6)
    design = rope.make_design(shape)
    assert validate(design) == []
    parts = [bf16(rows, h * d, seed=j, scale=20.0) for j, h in enumerate(norm_heads)]
    weights = [bf16(d, seed=10 + j) for j in range(len(norm_heads))]
    cs = rope.table(torch.arange(1, d // 2 + 1).float().reciprocal(), torch.arange(7, 7 + rows))
    ins = {"x": torch.cat(parts, dim=1), "cs": cs, "g": torch.stack(weights)}
    tile, exact, prod = run_tile(design, ins)["y"], run_fast(design, ins, exact=True)["y"], run_fast(design, ins)["y"]
    normed = []
    for x, w, h in zip(parts, weights, norm_heads, strict=True):
        norm = rmsnorm.make_design(rmsnorm.Shape(rows, d, heads=h, eps=1e-6))
        normed.append(run_fast(norm, {"x": x, "w": w})["y"])
    plain = rope.make_design(replace(shape, norm_heads=()))
    unfused = run_fast(plain, {"x": torch.cat(normed, dim=1), "cs": cs})["y"]
    assert torch.equal(tile, exact) and torch.equal(prod, exact) and torch.equal(exact, unfused)
    # every x object carries the norm weights (a tile's two input channels are taken), and the launch does the
    # norms' arithmetic on top of the rotation
    objects = rows // rope.default_config(shape).rows_per_call
    assert design.ddr_read_bytes() == plain.ddr_read_bytes() + objects * 2 * len(norm_heads) * d
    assert time_design(design).seconds > time_design(plain).seconds
    with pytest.raises(DesignError, match="norm heads"):
        rope.make_design(replace(shape, norm_heads=(1,)))


@pytest.mark.parametrize("fmt", ["bf16", "q4_0"])
def test_a_decode_pass_with_the_norms_in_rope_gives_the_same_logits_with_two_launches_fewer(tiny_model, fmt):
    ck = load_checkpoint(tiny_model("qwen3", layers=2))
    merged = merged_stage(fused_stage(with_weights(paper_like_plan(ck.spec), WeightFormat(fmt))))
    folded = normed_rope_stage(merged)
    assert folded is not None and validate_plan(folded) == [] and normed_rope_stage(folded) is None
    assert ["rope_q", "rope_k", "q_norm", "k_norm"] in [m for g in folded.decode.block for m in g.merged]
    back = split_stage(folded, kinds=("head_norm",))
    assert [m for g in back.decode.block for m in g.merged] == [m for g in merged.decode.block for m in g.merged]
    assert any("per-head norms in RoPE" in how for _, how in packing_alternatives(folded))
    # taking the RoPE ops out takes their norms out too: no run of norms alone is left behind
    no_rope = split_stage(folded, kinds=("rope",))
    assert not any("q_norm" in m for g in no_rope.decode.block for m in g.merged) and validate_plan(no_rope) == []
    assert_same_logits_fewer_launches(merged, folded, ck, 2 * ck.spec.n_layers)


def test_a_fold_another_reader_or_the_accumulator_forbids_is_refused(tiny_model):
    spec = load_checkpoint(tiny_model("qwen3", layers=1)).spec
    plan = normed_rope_stage(merged_stage(fused_stage(paper_like_plan(spec))))
    (layer,) = plan.decode.block
    graph = block_graph(spec)
    launch = merged_launch(tuple(graph.node(o) for o in ("rope_q", "rope_k", "q_norm", "k_norm")))
    assert isinstance(launch, NormedRope) and launch.reads == ("q_proj", "k_proj")
    assert [n.op for n in launch.writes] == ["rope_q", "rope_k"]
    layer.merged = [m if "q_norm" not in m else ["rope_q", "rope_k", "k_norm", "q_norm"] for m in layer.merged]
    assert any("rope_q must read k_norm alone" in p for p in validate_plan(plan))
    layer.merged = [m if "q_norm" not in m else ["rope_q", "rope_k", "q_norm", "k_norm"] for m in layer.merged]
    next(c for c in layer.calls if c.op == "k_norm").config = {"acc": "fp16"}
    assert any("fp32 accumulator" in p for p in validate_plan(plan))
    assert normed_rope_stage(merged_stage(fused_stage(paper_like_plan(spec)))) is not None
    fp16 = merged_stage(fused_stage(paper_like_plan(spec)))
    next(c for g in fp16.decode.block for c in g.calls if c.op == "q_norm").config = {"acc": "fp16"}
    folded = normed_rope_stage(fp16)
    assert folded is None or all("q_norm" not in m for g in folded.decode.block for m in g.merged)


def test_the_skill_is_kept_when_faster_and_the_gate_passes(fresh_ctx):
    ctx = fresh_ctx("qwen3", layers=1, timing_prompt_len=256, greedy_steps=6, proposal_greedy_steps=3)
    ctx.save_plan(merged_stage(fused_stage(with_weights(paper_like_plan(ctx.plan.model_spec()), WeightFormat("q4_1")))))
    ctx.opt_stage = "decode"
    result = QkNormIntoRope().run(ctx)
    assert result.status == "applied", result.summary
    (row,) = result.evidence["applied"]
    assert row["decode_after"] < row["decode_before"] and row["gate"] == "passed"
    assert any(m == ["rope_q", "rope_k", "q_norm", "k_norm"] for g in ctx.plan.decode.block for m in g.merged)
    report, _ = model_gate(ctx, ctx.plan)
    assert report.passed, report.failures
    assert QkNormIntoRope().run(ctx).status == "skipped"
