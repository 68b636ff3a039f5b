"""Small ops folded into the quantized GEMV launch next to them: RMSNorm as the prologue of the launch that reads it
the residual add as the epilogue of the launch whose output it adds, SwiGLU as the epilogue of the gate/up launch
(``kernels.bind.FoldedLinear``). Each fused launch computes what the separate launches computed, bit for bit, on
the tile path and the fast path; a decode pass with them matches the unfused pass's logits with one launch fewer per
folded op and less modeled time; the plan refuses a fold whose intermediate another op reads; the
``rmsnorm-prologue``, ``residual-epilogue`` and ``swiglu-epilogue`` skills are kept only when faster and correct."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from folds import assert_same_logits_fewer_launches, bf16

from tilepilot.harness.model_gate import model_gate
from tilepilot.kernels import eltwise, qgemv, rmsnorm, swiglu
from tilepilot.kernels.bind import FoldedLinear, merged_launch
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.graph import block_graph
from tilepilot.model.quant import WeightFormat, quantize
from tilepilot.npu.execute import run_fast, run_tile
from tilepilot.npu.timing import time_design
from tilepilot.npu.validate import DesignError, validate
from tilepilot.plan.air_q4 import fused_stage
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.plan.merge import (
    gated_stage,
    merged_stage,
    normed_stage,
    packing_alternatives,
    residual_stage,
    split_stage,
)
from tilepilot.plan.plan import validate_plan, with_weights
from tilepilot.skills.optimize.decode import ResidualEpilogue, RmsNormPrologue, SwigluEpilogue

CASES = [
    (qgemv.Shape(64, 128, 1, "q4_0", 32, norm_eps=1e-5), qgemv.Config(8, 4, 64, 2, 2, "q4_0", rows=1, x_rides=True)),
    (
        qgemv.Shape(128, 128, 2, "q4_1", 32, parts=(64, 64), norm_eps=1e-6),
        qgemv.Config(8, 2, 64, 1, 2, "q4_1", rows=4, x_rides=True),
    ),
    (qgemv.Shape(64, 256, 1, "q8_0", 32, norm_eps=1e-6), qgemv.Config(4, 4, 128, 2, 2, "q8_0", rows=2, x_rides=True)),
]


@pytest.mark.parametrize(("shape", "config"), CASES, ids=lambda v: str(v))
def test_the_fused_launch_is_the_norm_then_the_gemv_bit_for_bit(shape, config):
    design = qgemv.make_design(shape, config)
    assert validate(design) == []
    ins = {"x": bf16(shape.m, shape.k, seed=1, scale=30.0), "g": bf16(shape.k, seed=2)}
    for j, (w, _) in enumerate(qgemv.tensor_names(shape)):
        ins[w] = quantize(bf16(shape.matrices()[j], shape.k, seed=3 + j, scale=0.05), shape.fmt, shape.block).data
    tile, exact, prod = run_tile(design, ins), run_fast(design, ins, exact=True), run_fast(design, ins)
    norm = rmsnorm.make_design(rmsnorm.Shape(shape.m, shape.k, eps=shape.norm_eps))
    normed = run_fast(norm, {"x": ins["x"], "w": ins["g"]})["y"]
    plain = qgemv.make_design(replace(shape, norm_eps=None), config)
    unfused = run_fast(plain, {**{k: v for k, v in ins.items() if k != "g"}, "x": normed}, exact=True)
    for _, y in qgemv.tensor_names(shape):
        assert torch.equal(tile[y], exact[y]) and torch.equal(prod[y], exact[y])
        assert torch.equal(exact[y], unfused[y])
    # the norm weight rides in x's object: 2*k more bytes in; every worker's one-time norm lengthens the fill
    assert design.ddr_read_bytes() == plain.ddr_read_bytes() + 2 * shape.k
    t, t0 = time_design(design), time_design(plain)
    assert t.fill_cycles > t0.fill_cycles and t.seconds > t0.seconds


def test_a_prologue_needs_a_resident_x():
    shape = qgemv.Shape(64, 128, 1, "q4_0", 32, norm_eps=1e-5)
    with pytest.raises(DesignError, match="x_rides"):
        qgemv.make_design(shape, qgemv.Config(2, 8, 64, 2, 1, "q4_0"))
    assert all(c.x_rides for c in qgemv.candidate_configs(shape))
    assert qgemv.default_config(shape).x_rides


def test_a_norm_whose_output_another_op_reads_is_refused(tiny_model):
    spec = load_checkpoint(tiny_model("llama", layers=1)).spec
    plan = merged_stage(fused_stage(with_weights(paper_like_plan(spec), WeightFormat("q4_0"))))
    g = next(g for g in plan.decode.block if any(c.op == "attn_norm" for c in g.calls))
    g.merged = [m for m in g.merged if m[0] != "q_proj"] + [["q_proj", "k_proj", "attn_norm"]]
    problems = " | ".join(validate_plan(plan))
    assert "['v_proj'] also read attn_norm" in problems
    graph = block_graph(spec)
    launch = merged_launch(tuple(graph.node(o) for o in ("q_proj", "attn_norm")))
    assert isinstance(launch, FoldedLinear) and launch.reads == ("x",) and launch.writes == (graph.node("q_proj"),)


def test_an_object_gathered_from_several_fills_must_be_completed_in_its_task_group():
    """x's object holds x and the norm weight, filled by two tasks (a BD chain); without the second the object is
    never whole and its consumers would wait for ever: the validator says so, and moving the second fill to a later
    task group is refused too (a group boundary drains the channel)."""
    shape, config = CASES[0]
    design = qgemv.make_design(shape, config)
    g_fills = [t for t in design.runtime.tasks if t.tensor == "g"]
    assert len(g_fills) == 1 and g_fills[0].fifo == "x"
    without = copy.deepcopy(design)
    without.runtime.tasks = [t for t in design.runtime.tasks if t.tensor != "g"]
    assert any(v.code == "SHAPE_NOT_TILING" and "with the fills before it" in v.message for v in validate(without))
    later = copy.deepcopy(design)
    later.runtime.tasks = [replace(t, group=t.group + 1) if t.tensor == "g" else t for t in design.runtime.tasks]
    assert any(v.code == "SHAPE_NOT_TILING" for v in validate(later))


RES_CASES = [
    (qgemv.Shape(64, 128, 1, "q4_0", 32, residual=True), qgemv.Config(8, 4, 64, 2, 2, "q4_0", rows=1, x_rides=True)),
    (qgemv.Shape(128, 128, 2, "q4_1", 32, residual=True), qgemv.Config(8, 2, 64, 1, 2, "q4_1", rows=4, x_rides=True)),
    (
        qgemv.Shape(64, 256, 1, "q8_0", 32, norm_eps=1e-5, residual=True),
        qgemv.Config(4, 4, 128, 2, 2, "q8_0", rows=2, x_rides=True),
    ),
]


@pytest.mark.parametrize(("shape", "config"), RES_CASES, ids=lambda v: str(v))
def test_the_residual_epilogue_is_the_gemv_then_the_add_bit_for_bit(shape, config):
    """Every worker adds its own rows of the residual (a row shifted by one would show: residuals of scale 20)."""
    design = qgemv.make_design(shape, config)
    assert validate(design) == []
    ins = {"x": bf16(shape.m, shape.k, seed=1, scale=3.0), "r": bf16(shape.m, shape.n, seed=5, scale=20.0)}
    if shape.norm_eps is not None:
        ins["g"] = bf16(shape.k, seed=2)
    ins["w"] = quantize(bf16(shape.n, shape.k, seed=3, scale=0.05), shape.fmt, shape.block).data
    tile, exact = run_tile(design, ins)["y"], run_fast(design, ins, exact=True)["y"]
    plain = qgemv.make_design(replace(shape, residual=False), config)
    y = run_fast(plain, {k: v for k, v in ins.items() if k != "r"}, exact=True)["y"]
    add = eltwise.make_design(eltwise.Shape(n=shape.m * shape.n, op="add"))
    unfused = run_fast(add, {"a": ins["r"].reshape(-1), "b": y.reshape(-1)})["c"].reshape(shape.m, shape.n)
    assert torch.equal(tile, exact) and torch.equal(exact, unfused)
    assert design.ddr_read_bytes() == plain.ddr_read_bytes() + 2 * shape.m * shape.n


def test_a_residual_needs_a_resident_x_and_one_matrix():
    with pytest.raises(DesignError, match="x_rides"):
        qgemv.make_design(qgemv.Shape(64, 128, 1, residual=True), qgemv.Config(2, 8, 64, 2, 1, "q4_0"))
    with pytest.raises(DesignError, match="one matrix"):
        qgemv.make_design(qgemv.Shape(128, 128, 1, "q4_1", parts=(64, 64), residual=True), CASES[1][1])


@pytest.mark.parametrize(
    ("family", "fold", "kind", "runs"),
    [
        (
            fam,
            normed_stage,
            "rmsnorm",
            [["q_proj", "k_proj", "v_proj", "attn_norm"], ["gate_proj", "up_proj", "ffn_norm"]],
        )
        for fam in ("llama", "qwen2", "qwen3")
    ]
    + [(fam, residual_stage, "add", [["o_proj", "resid1"], ["down_proj", "resid2"]]) for fam in ("llama", "qwen3")],
)
def test_a_decode_pass_with_a_fold_gives_the_same_logits_with_fewer_launches(tiny_model, family, fold, kind, runs):
    """Each fold alone, on the plan the skills before it leave: two launches fewer per layer, the same logits, less
    modeled time; and splitting it again (what resident-decode also fits) gives back the plan it started from."""
    ck = load_checkpoint(tiny_model(family, layers=2))
    merged = merged_stage(fused_stage(with_weights(paper_like_plan(ck.spec), WeightFormat("q4_0"))))
    folded = fold(merged)
    assert folded is not None and validate_plan(folded) == [] and fold(folded) is None
    assert all(r in [m for g in folded.decode.block for m in g.merged] for r in runs)
    back = split_stage(folded, kinds=(kind,))
    assert [m for g in back.decode.block for m in g.merged] == [m for g in merged.decode.block for m in g.merged]
    assert_same_logits_fewer_launches(merged, folded, ck, 2 * ck.spec.n_layers)


def test_a_residual_fold_whose_output_another_op_reads_is_refused(tiny_model):
    spec = load_checkpoint(tiny_model("llama", layers=1)).spec
    plan = residual_stage(merged_stage(fused_stage(with_weights(paper_like_plan(spec), WeightFormat("q4_0")))))
    g = next(g for g in plan.decode.block if any(m == ["o_proj", "resid1"] for m in g.merged))
    g.merged = [m for m in g.merged if m != ["o_proj", "resid1"]] + [["o_proj", "resid2"]]
    assert any("the add of its one linear op's output" in p for p in validate_plan(plan))
    graph = block_graph(spec)
    launch = merged_launch((graph.node("down_proj"), graph.node("resid2")))
    assert isinstance(launch, FoldedLinear) and launch.reads == ("swiglu", "resid1")
    assert launch.writes == (graph.node("resid2"),)


GLU_CASES = [
    (
        qgemv.Shape(128, 128, 1, "q4_0", 32, parts=(64, 64), gated=True),
        qgemv.Config(8, 4, 64, 2, 2, "q4_0", rows=1, x_rides=True),
    ),
    (
        qgemv.Shape(256, 128, 2, "q4_1", 32, parts=(128, 128), gated=True, norm_eps=1e-5),
        qgemv.Config(8, 2, 64, 1, 2, "q4_1", rows=4, x_rides=True),
    ),
]


@pytest.mark.parametrize(("shape", "config"), GLU_CASES, ids=lambda v: str(v))
def test_the_swiglu_epilogue_is_the_gate_up_gemv_then_swiglu_bit_for_bit(shape, config):
    """Each worker gates its up rows with its own gate rows, kept from earlier blocks (a row paired with its
    neighbour's gate would show); only silu(gate) * up leaves the array."""
    design = qgemv.make_design(shape, config)
    assert validate(design) == [] and [t.name for t in design.outputs] == ["y"]
    ins = {"x": bf16(shape.m, shape.k, seed=1, scale=3.0)}
    if shape.norm_eps is not None:
        ins["g"] = bf16(shape.k, seed=2)
    for j in range(2):
        ins[f"w{j}"] = quantize(bf16(shape.parts[j], shape.k, seed=3 + j, scale=0.3), shape.fmt, shape.block).data
    tile, exact, prod = (run_tile(design, ins)["y"], run_fast(design, ins, exact=True)["y"], run_fast(design, ins)["y"])
    plain = qgemv.make_design(replace(shape, gated=False), config)
    gate_up = run_fast(plain, ins)
    sw = swiglu.make_design(swiglu.Shape(rows=shape.m, width=shape.parts[0]))
    assert torch.equal(tile, exact) and torch.equal(
        prod, run_fast(sw, {"gate": gate_up["y0"], "up": gate_up["y1"]})["y"]
    )
    assert design.ddr_write_bytes() * 2 == plain.ddr_write_bytes()
    with pytest.raises(DesignError, match="two equal matrices"):
        qgemv.make_design(replace(shape, parts=(shape.n // 4, 3 * shape.n // 4)), config)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_every_fold_together_gives_the_same_logits_with_four_launches_fewer_per_layer(tiny_model, family):
    ck = load_checkpoint(tiny_model(family, layers=2))
    merged = merged_stage(fused_stage(with_weights(paper_like_plan(ck.spec), WeightFormat("q4_1"))))
    folded = gated_stage(residual_stage(normed_stage(merged)))
    assert folded is not None and validate_plan(folded) == [] and gated_stage(folded) is None
    runs = [m for g in folded.decode.block for m in g.merged]
    assert ["gate_proj", "up_proj", "ffn_norm", "swiglu"] in runs
    assert_same_logits_fewer_launches(merged, folded, ck, 5 * ck.spec.n_layers)  # 2 norms, 2 adds, 1 SwiGLU
    alts = packing_alternatives(folded)
    unfolded = next(p for p, how in alts if "SwiGLU epilogues" in how)
    assert [m for g in unfolded.decode.block for m in g.merged] == [m for g in merged.decode.block for m in g.merged]


@pytest.mark.parametrize(
    ("skill", "family", "fmt", "run"),
    [
        (RmsNormPrologue, "llama", "q4_0", ["q_proj", "k_proj", "v_proj", "attn_norm"]),
        (ResidualEpilogue, "qwen2", "q4_1", ["down_proj", "resid2"]),
        (SwigluEpilogue, "smollm2", "q8_0", ["gate_proj", "up_proj", "swiglu"]),
        # the bf16 GEMV folds the same ops (tests/skills/test_fold_into_bf16_gemv.py has its kernel checks)
        (RmsNormPrologue, "llama", "bf16", ["q_proj", "k_proj", "v_proj", "attn_norm"]),
        (ResidualEpilogue, "qwen2", "bf16", ["down_proj", "resid2"]),
        (SwigluEpilogue, "smollm2", "bf16", ["gate_proj", "up_proj", "swiglu"]),
    ],
    ids=lambda v: getattr(v, "name", None) if isinstance(v, type) else None,
)
def test_each_skill_is_kept_when_faster_and_the_gate_passes(fresh_ctx, skill, family, fmt, run):
    ctx = fresh_ctx(family, layers=1, timing_prompt_len=256, greedy_steps=6, proposal_greedy_steps=3)
    ctx.save_plan(merged_stage(fused_stage(with_weights(paper_like_plan(ctx.plan.model_spec()), WeightFormat(fmt)))))
    ctx.opt_stage = "decode"
    result = skill().run(ctx)
    assert result.status == "applied", result.summary
    (row,) = result.evidence["applied"]
    assert row["decode_after"] < row["decode_before"] and row["gate"] == "passed"
    assert any(m == run for g in ctx.plan.decode.block for m in g.merged)
    launch = {c.family for g in ctx.plan.decode.block for c in g.calls if c.op == run[0]}
    assert launch == {"gemv" if fmt == "bf16" else "qgemv"}
    report, _ = model_gate(ctx, ctx.plan)
    assert report.passed, report.failures
    assert skill().run(ctx).status == "skipped"
