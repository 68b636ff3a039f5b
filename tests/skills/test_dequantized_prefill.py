"""dequantized-prefill: a quantized prefill on packed or dequantized weights, whichever is modeled faster."""

from __future__ import annotations

import torch

from tilepilot.model.quant import WeightFormat
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.plan.plan import with_weights
from tilepilot.runtime.runner import NpuRunner
from tilepilot.skills.optimize.weights import DequantizedPrefill


def test_the_proposal_swaps_only_the_packed_prefill_gemms_and_keeps_the_numbers(fresh_ctx):
    ctx = fresh_ctx(timing_prompt_len=2048)
    plan = with_weights(paper_like_plan(ctx.plan.model_spec()), WeightFormat("q4_0"))
    ctx.save_plan(plan)
    (prop,) = DequantizedPrefill().proposals(ctx.plan, ctx, "prefill")
    fams = {c.family for g in prop.plan.prefill.groups() for c in g.calls}
    assert "qgemm" not in fams and "gemm" in fams
    assert [c.family for g in prop.plan.decode.groups() for c in g.calls] == [
        c.family for g in plan.decode.groups() for c in g.calls
    ]
    # compute-bound long prompts: decoding packed blocks in every call costs more than the bytes save (modeled)
    assert ctx.timing(prop.plan).ttft_s < ctx.timing(plan).ttft_s
    # short prompts are weight-bound: there the packed GEMM is the faster one, so the proposal would not be kept
    assert ctx.timing(prop.plan, 64).ttft_s > ctx.timing(plan, 64).ttft_s
    # both prefill kernels multiply the same deployed weights
    ids = [1, 4, 9, 16, 25]
    a = NpuRunner(plan, ctx.weights).prefill(ids).logits
    b = NpuRunner(prop.plan, ctx.weights).prefill(ids).logits
    assert torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1).min() > 0.9999


def test_nothing_to_propose_for_a_bf16_plan(fresh_ctx):
    ctx = fresh_ctx()
    assert list(DequantizedPrefill().proposals(ctx.plan, ctx, "prefill")) == []
