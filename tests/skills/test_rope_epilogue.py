"""RoPE as the epilogue of the GEMV launch that computes Q and K (``rope-epilogue``, ``kernels.gemv.rope_blocks``):
every worker makes rows i and i + head_dim/2 of each head it owns, holds a head's blocks until its last, then rotates
them with the table riding in its resident x. The fused launch computes the GEMV then the RoPE kernel bit for bit on
the tile path and the fast path (a worker rotating a row with its neighbour's partner, or with another position's or
frequency's angle, would show); a tiling that cannot pair the rows is refused with the reason; a decode pass with it
gives the unfused pass's logits with one launch fewer per layer; RoPE that reads a bias or a per-head norm does not
fold; splitting it out again gives back Q's and K's one RoPE launch; the skill is kept when faster."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from folds import assert_same_logits_fewer_launches, bf16

from tilepilot.harness.model_gate import model_gate
from tilepilot.kernels import gemv, qgemv, rope
from tilepilot.kernels.bind import FoldedLinear, merged_launch
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.graph import block_graph
from tilepilot.model.quant import WeightFormat, quantize
from tilepilot.npu.execute import run_fast, run_tile
from tilepilot.npu.validate import DesignError, validate
from tilepilot.plan.air_q4 import fused_stage
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.plan.merge import (
    merged_stage,
    normed_stage,
    packing_alternatives,
    restructured,
    roped_stage,
    split_stage,
)
from tilepilot.plan.plan import validate_plan, with_weights
from tilepilot.plan.resident import as_it_will_run, fit_resident, prefetch_if_faster
from tilepilot.skills.optimize.decode import RopeEpilogue

QKV_RUN = ["q_proj", "k_proj", "v_proj", "attn_norm", "rope_q", "rope_k"]

CASES = [
    # a column's rows per call are half a head: each worker's pairs sit one block apart
    (
        qgemv.Shape(96, 128, 1, "q4_0", 32, parts=(32, 32, 32), norm_eps=1e-5, rope_dim=16, rope_parts=2),
        qgemv.Config(2, 4, 64, 2, 2, "q4_0", rows=2, x_rides=True),
    ),
    # a quarter of a head per call, two tokens (two positions), one rotated matrix of two
    (
        qgemv.Shape(192, 128, 2, "q8_0", 32, parts=(128, 64), rope_dim=32, rope_parts=1),
        qgemv.Config(2, 4, 64, 2, 2, "q8_0", rows=2, x_rides=True),
    ),
    # four compute rows, each channel's half of a block split over two of them in the memory tile
    (
        qgemv.Shape(128, 128, 1, "q4_1", 32, parts=(64, 32, 32), norm_eps=1e-5, rope_dim=16, rope_parts=2),
        qgemv.Config(2, 2, 64, 2, 2, "q4_1", rows=4, x_rides=True),
    ),
    # the bf16 GEMV, one compute row per column (the memory tile joins the two channels' halves)
    (
        gemv.Shape(96, 128, 1, parts=(64, 32), norm_eps=1e-5, rope_dim=16, rope_parts=2),
        gemv.Config(cols=2, rows=1, tile_m=8, tile_k=64, weight_channels=2, x_rides=True),
    ),
]


def _family(shape):
    return qgemv if isinstance(shape, qgemv.Shape) else gemv


def _inputs(shape, positions):
    mod = _family(shape)
    d = shape.rope_dim
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ins = {"x": bf16(shape.m, shape.k, seed=1, scale=3.0), "cs": rope.table(inv_freq, torch.tensor(positions))}
    if shape.norm_eps is not None:
        ins["g"] = bf16(shape.k, seed=2)
    for j, (w, _) in enumerate(mod.tensor_names(shape)):
        wb = bf16(shape.matrices()[j], shape.k, seed=3 + j, scale=0.05)
        ins[w] = quantize(wb, shape.fmt, shape.block).data if mod is qgemv else wb
    return ins


@pytest.mark.parametrize(("shape", "config"), CASES, ids=lambda v: str(v))
def test_the_rope_epilogue_is_the_gemv_then_the_rope_kernel_bit_for_bit(shape, config):
    mod = _family(shape)
    design = mod.make_design(shape, config)
    assert validate(design) == [] and design.name.endswith("_rope")
    ins = _inputs(shape, list(range(7, 7 + shape.m)))
    tile, exact, prod = run_tile(design, ins), run_fast(design, ins, exact=True), run_fast(design, ins)
    plain = mod.make_design(replace(shape, rope_dim=0, rope_parts=0), config)
    unfused = run_fast(plain, {k: v for k, v in ins.items() if k != "cs"}, exact=True)
    for j, (_, y) in enumerate(mod.tensor_names(shape)):
        assert torch.equal(tile[y], exact[y]) and torch.equal(prod[y], exact[y])
        want = unfused[y]
        if j < shape.rope_parts:  # the RoPE kernel's own launch on the GEMV's output
            heads = want.shape[1] // shape.rope_dim
            kernel = rope.make_design(rope.Shape(rows=shape.m, heads=heads, head_dim=shape.rope_dim))
            want = run_fast(kernel, {"x": want, "cs": ins["cs"]})["y"]
            assert not torch.equal(want, unfused[y])  # the rotation is not the identity here
        assert torch.equal(exact[y], want)
    # the table rides in x's object: m x head_dim bf16 more in, nothing more out
    assert design.ddr_read_bytes() == plain.ddr_read_bytes() + 2 * shape.m * shape.rope_dim
    assert design.ddr_write_bytes() == plain.ddr_write_bytes()


def test_a_tiling_that_cannot_pair_the_rows_is_refused_with_the_reason():
    shape, config = CASES[0]
    with pytest.raises(DesignError, match="divide half a head"):  # 16 rows per call, half a head is 8
        qgemv.make_design(shape, replace(config, tile_m=8))
    with pytest.raises(DesignError, match="whole heads"):  # 32 rows over 4 columns: half a head each
        qgemv.make_design(shape, replace(config, cols=4, tile_m=2))
    with pytest.raises(DesignError, match="x_rides"):
        qgemv.make_design(shape, replace(config, x_rides=False, weight_channels=1))
    with pytest.raises(DesignError, match="more than the 4 objects"):  # 2 x 2 rows per call: 8 blocks per head
        qgemv.make_design(replace(shape, rope_dim=32, parts=(64, 64, 64), n=192), replace(config, tile_m=1))
    with pytest.raises(DesignError, match="no other epilogue"):
        qgemv.make_design(replace(shape, parts=(), n=32, rope_parts=1, residual=True), config)
    legal = qgemv.candidate_configs(shape)  # the tuner's: every one pairs the rows
    assert legal and all((shape.rope_dim // 2) % (c.rows * c.tile_m) == 0 and not c.tile_m0 for c in legal)
    assert validate(qgemv.make_design(shape)) == []  # so does the default


def _merged(ck, fmt):
    return normed_stage(merged_stage(fused_stage(with_weights(paper_like_plan(ck.spec), WeightFormat(fmt)))))


@pytest.mark.parametrize("fmt", ["q4_0", "bf16"])
def test_a_decode_pass_with_the_rope_epilogue_gives_the_same_logits_with_one_launch_fewer(tiny_model, fmt):
    ck = load_checkpoint(tiny_model("llama", layers=2))
    merged = _merged(ck, fmt)
    folded = roped_stage(merged)
    assert folded is not None and validate_plan(folded) == [] and roped_stage(folded) is None
    runs = [m for g in folded.decode.block for m in g.merged]
    assert QKV_RUN in runs and ["rope_q", "rope_k"] not in runs
    launch = {c.family for g in folded.decode.block for c in g.calls if c.op == "q_proj"}
    assert launch == {"gemv" if fmt == "bf16" else "qgemv"}
    # at toy size the bf16 launch's whole heads per column (2 KV heads) leave it 2 columns: correct, not faster
    assert_same_logits_fewer_launches(merged, folded, ck, ck.spec.n_layers, faster=fmt != "bf16")
    # taken out again, Q's and K's RoPE are the one launch they were
    back = split_stage(folded, kinds=("rope",))
    assert [m for g in back.decode.block for m in g.merged] == [m for g in merged.decode.block for m in g.merged]
    unfolded = next(
        p for p, how in packing_alternatives(folded) if how == " with Q's and K's RoPE as separate launches"
    )
    assert ["rope_q", "rope_k"] in [m for g in unfolded.decode.block for m in g.merged]


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_rope_that_reads_a_bias_or_a_per_head_norm_does_not_fold(tiny_model, family):
    ck = load_checkpoint(tiny_model(family, layers=1))
    assert roped_stage(_merged(ck, "q4_0")) is None


def test_the_plan_refuses_a_rope_epilogue_that_does_not_rotate_its_own_linear_ops(tiny_model):
    ck = load_checkpoint(tiny_model("llama", layers=1))
    folded = roped_stage(_merged(ck, "q4_0"))
    g = next(g for g in folded.decode.block if QKV_RUN in g.merged)
    g.merged = [
        m if m != QKV_RUN else ["q_proj", "k_proj", "v_proj", "attn_norm", "rope_k", "rope_q"] for m in g.merged
    ]
    assert any("must rotate q_proj's output" in p for p in validate_plan(folded))
    g.merged = [m if m[0] != "q_proj" else QKV_RUN for m in g.merged]
    next(c for c in g.calls if c.op == "rope_q").config["layout"] = "interleaved"
    assert any("half layout to be an epilogue" in p for p in validate_plan(folded))
    graph = block_graph(ck.spec)
    launch = merged_launch(tuple(graph.node(o) for o in QKV_RUN))
    assert isinstance(launch, FoldedLinear) and launch.tables and launch.reads == ("x",)
    assert [n.op for n in launch.writes] == ["rope_q", "rope_k", "v_proj"]


def test_the_skill_is_kept_when_faster_and_the_gate_passes(fresh_ctx):
    ctx = fresh_ctx("llama", layers=1, timing_prompt_len=256, greedy_steps=6, proposal_greedy_steps=3)
    spec = ctx.plan.model_spec()
    ctx.save_plan(normed_stage(merged_stage(fused_stage(with_weights(paper_like_plan(spec), WeightFormat("q4_0"))))))
    ctx.opt_stage = "decode"
    result = RopeEpilogue().run(ctx)
    assert result.status == "applied", result.summary
    (row,) = result.evidence["applied"]
    assert row["decode_after"] < row["decode_before"] and row["gate"] == "passed"
    assert any(m == QKV_RUN for g in ctx.plan.decode.block for m in g.merged)
    report, _ = model_gate(ctx, ctx.plan)
    assert report.passed, report.failures
    assert RopeEpilogue().run(ctx).status == "skipped"


def test_a_fit_with_a_run_split_out_is_also_weighed_with_the_run_merged_again(tiny_model):
    """``resident-decode`` compares a fit of a packing alternative as it will run (``plan.resident.as_it_will_run``):
    with the runs the alternative split merged again on its fitted configs (``plan.merge.restructured``), and with
    its weights prefetched, each only when faster, packed and accepted."""
    ck = load_checkpoint(tiny_model("llama", layers=1))
    folded = roped_stage(_merged(ck, "q4_0"))
    fit = fit_resident(split_stage(folded, kinds=("rope",)), ck.spec)[0]
    remade = restructured(fit, folded)
    assert remade is not None and validate_plan(remade) == [] and restructured(remade, folded) is None
    assert [m for g in remade.decode.block for m in g.merged] == [m for g in folded.decode.block for m in g.merged]

    def configs(p):  # the cache format is the plan's (``apply_kv_cache`` names it where it is not bf16)
        return {c.op: {k: v for k, v in c.config.items() if k != "kv_format"} for g in p.decode.block for c in g.calls}

    kept, now = configs(fit), configs(remade)
    assert all(now[op] == kept[op] for op in kept if op != "q_proj")  # the fitted configs, but the merged launch's

    def faster_if(pred):
        return lambda p: 1.0 if pred(p) else 2.0

    roped = faster_if(lambda p: any(QKV_RUN in g.merged for g in p.decode.block))
    got, again = as_it_will_run(fit, roped, like=folded)
    assert again and roped(got) == 1.0
    assert as_it_will_run(fit, roped, like=folded, check=lambda p: False) == (fit, False)  # refused by the caller
    assert as_it_will_run(fit, faster_if(lambda p: p is fit), like=folded) == (fit, False)
    assert as_it_will_run(fit, roped) == (fit, False)  # no structure to go back to

    def unpackable(p):
        if any(QKV_RUN in g.merged for g in p.decode.block):
            raise DesignError([], "does not pack")
        return 1.0

    assert as_it_will_run(fit, unpackable, like=folded) == (fit, False)
    ahead = prefetch_if_faster(fit, faster_if(lambda p: p.decode.prefetch))
    assert ahead.decode.prefetch and not fit.decode.prefetch
    assert prefetch_if_faster(fit, faster_if(lambda p: not p.decode.prefetch)) is fit
    assert prefetch_if_faster(folded, faster_if(lambda p: p.decode.prefetch)) is folded  # not resident: no regions


def test_with_a_quantized_cache_the_packing_also_tries_rope_apart_with_the_cache_write_in_it(tiny_model):
    """RoPE folds into its GEMV before a quantized cache's write folds into RoPE, so a roped pass never tried the
    write's fold: ``packing_alternatives`` also offers RoPE as one launch again with the write in it."""
    ck = load_checkpoint(tiny_model("llama", layers=1))
    fmt = WeightFormat("q4_0", kv_cache="q8_0")
    folded = roped_stage(normed_stage(merged_stage(fused_stage(with_weights(paper_like_plan(ck.spec), fmt)))))
    assert folded is not None and not any("kv_write" in m for g in folded.decode.block for m in g.merged)
    alts = dict((how, p) for p, how in packing_alternatives(folded))
    cached = alts[" with Q's and K's RoPE as one launch again and the KV-cache writes in it"]
    assert validate_plan(cached) == [] and ["rope_q", "rope_k", "kv_write"] in [
        m for g in cached.decode.block for m in g.merged
    ]
    bf16_cache = roped_stage(_merged(ck, "q4_0"))  # no write to fold: nothing more to try
    assert not any("KV-cache writes in it" in how for _, how in packing_alternatives(bf16_cache))
