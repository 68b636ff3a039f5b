"""Quantized GEMM (prefill): packed bytes through shim/memory tile/compute tile, tile path == fast path, same numbers
as the bf16 GEMM over the deployed weights, packed buffers in the validator's L1/L2 accounting, and the binding."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import kernel_gate, rand_bf16

from tilepilot.kernels import gemm, qgemm
from tilepilot.model.quant import block_bytes, quantize
from tilepilot.npu.execute import run_fast, run_tile
from tilepilot.npu.resources import resource_use
from tilepilot.npu.timing import time_dispatch
from tilepilot.npu.validate import DesignError, validate

SMALL = [
    (qgemm.Shape(8, 64, 128, "q4_0", 32), qgemm.Config(2, 2, 4, 64, 16, fmt="q4_0")),
    (qgemm.Shape(6, 40, 96, "q4_1", 32), qgemm.Config(1, 2, 4, 32, 8, pad=True, fmt="q4_1")),
    (qgemm.Shape(8, 32, 128, "q8_0", 32), qgemm.Config(2, 2, 4, 64, 8, acc="bf16", fmt="q8_0")),
    (qgemm.Shape(4, 32, 256, "q4_0", 64), qgemm.Config(1, 2, 4, 128, 8, fmt="q4_0", block=64)),
]


@pytest.mark.parametrize(("shape", "config"), SMALL, ids=lambda v: str(v))
def test_small_designs_validate_and_both_paths_agree_bit_for_bit(shape, config):
    design = qgemm.make_design(shape, config)
    assert validate(design) == []
    qt = quantize(rand_bf16(shape.n, shape.k, seed=1, scale=0.05), shape.fmt, shape.block)
    a = rand_bf16(shape.m, shape.k, seed=2)
    ins = qgemm.prepare_inputs(design, a, qt.data)
    tile = run_tile(design, ins)["c"]
    exact = run_fast(design, ins, exact=True)["c"]
    assert torch.equal(tile, exact)
    # exactly the bf16 GEMM of the same tiling over the deployed (dequantized, bf16-rounded) weights
    g = gemm.make_design(gemm.Shape(shape.m, shape.n, shape.k), config.gemm())
    assert torch.equal(exact, run_fast(g, gemm.prepare_inputs(g, a, qt.deployed()), exact=True)["c"])
    out = qgemm.crop_outputs(design, {"c": exact})["c"]
    assert out.shape == (shape.m, shape.n)
    kernel_gate("gemm", qgemm.reference({"a": a, "w": qt.data}, shape)["c"], out)


def test_the_weight_stream_moves_packed_bytes_and_the_tiles_hold_packed_buffers():
    shape = qgemm.Shape(256, 2048, 2048, "q4_0", 32)
    q = qgemm.make_design(shape)
    assert validate(q) == []
    rb = 2048 // 32 * block_bytes("q4_0")
    assert q.tensor("w").shape == (2048, rb) and q.meta["weight_bytes"] == 2048 * rb
    cfg = qgemm.default_config(shape)
    g = gemm.make_design(gemm.Shape(256, 2048, 2048), cfg.gemm())
    w_bf16 = sum(t.tap.n_elements * 2 for t in g.runtime.tasks if t.tensor == "w")
    w_q = sum(t.tap.n_elements for t in q.runtime.tasks if t.tensor == "w")
    assert w_q * 2048 * 2 == w_bf16 * rb  # same weight traffic pattern, at the format's bytes
    assert q.meta["ddr_read_bytes"] < g.meta["ddr_read_bytes"]
    # L2: the memory tile's W buffers hold packed objects; L1: packed fifo + the decoded bf16 chunk
    use_q, use_g = resource_use(q), resource_use(g)
    mem = next(t for t in use_q if t.row == 1)
    packed_obj = cfg.tile_n * cfg.tile_k // 32 * block_bytes("q4_0")
    assert use_q[mem].memory < use_g[mem].memory
    assert use_g[mem].memory - use_q[mem].memory == cfg.depth * (2 * cfg.tile_n * cfg.tile_k - packed_obj)
    assert all(f.dtype == "uint8" for f in q.fifos if f.name.startswith("W"))
    assert time_dispatch(q).seconds > 0


def test_chunks_that_split_a_block_or_a_word_are_refused():
    with pytest.raises(DesignError) as e:  # 18-byte q4_0 blocks: a 32-value chunk is not whole words
        qgemm.make_design(qgemm.Shape(8, 64, 128, "q4_0"), qgemm.Config(2, 2, 4, 32, 16, fmt="q4_0"))
    assert e.value.codes == ["SHAPE_NOT_TILING"]
    with pytest.raises(DesignError):
        qgemm.make_design(qgemm.Shape(8, 64, 128, "q4_0", 64), qgemm.Config(2, 2, 4, 32, 16, fmt="q4_0", block=64))
    with pytest.raises(DesignError):
        qgemm.make_design(qgemm.Shape(8, 64, 128, "q4_0"), qgemm.Config(2, 2, 4, 64, 16, fmt="q4_1"))


def test_a_quantized_plan_runs_its_prefill_through_the_packed_gemm(zoo_model):
    from tilepilot.model.checkpoint import load_checkpoint
    from tilepilot.model.quant import WeightFormat, deployment_weights
    from tilepilot.oracle.model import Oracle
    from tilepilot.plan.builtin import paper_like_plan
    from tilepilot.plan.plan import with_weights
    from tilepilot.runtime.runner import NpuRunner

    ck = load_checkpoint(zoo_model("llama-3.2-1b", layers=1))
    plan = with_weights(paper_like_plan(ck.spec), WeightFormat("q4_1"))
    fams = {c.family for g in plan.prefill.block for c in g.calls}
    assert "qgemm" in fams and "gemm" not in fams
    runner = NpuRunner(plan, ck)
    ids = [1, 5, 9, 13, 17]
    got = runner.prefill(ids).logits
    assert any(d.meta.get("family") == "qgemm" for d in runner.library.designs())
    ref = Oracle(deployment_weights(ck, plan.weight_format())).prefill(ids).logits
    cos = torch.nn.functional.cosine_similarity(got.float(), ref.float(), dim=-1)
    assert float(cos.min()) > 0.999


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
def test_a_quantized_plans_merged_groups_build_with_their_quantized_launches(zoo_model, fmt):
    """The kernel probe checks every multi-call group of a plan as one fused dispatch: a quantized plan's groups
    must be built with its qgemm/qgemv launches (they were built with gemm/gemv and the quantized configs, an
    AttributeError that made merge-launches reject every quantized plan)."""
    from tilepilot.harness.probes import group_checks
    from tilepilot.model.checkpoint import load_checkpoint
    from tilepilot.model.quant import WeightFormat
    from tilepilot.plan.builtin import paper_like_plan
    from tilepilot.plan.plan import with_weights

    spec = load_checkpoint(zoo_model("llama-3.2-1b", layers=1)).spec
    plan = with_weights(paper_like_plan(spec), WeightFormat(fmt))
    checks = group_checks(plan, spec, prompt_len=24)
    assert checks and all(c.codes == [] for c in checks), [(c.group, c.codes) for c in checks if c.codes]
