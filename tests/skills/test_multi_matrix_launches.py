"""Multi-matrix launches (Q/K/V, gate/up as one quantized GEMV launch each, RoPE of Q and K and Qwen2's Q/K/V biases
as one launch each) and every
weight format on every family:
the quantized decode of each (format, family) matches the FP32 oracle of the dequantized weights within the phase-3
gate, and merging its launches changes no bit while removing a design switch per merged op; the
``multi-matrix-launches`` skill is kept by the decode phase only when faster and correct."""

from __future__ import annotations

import pytest
import torch

from tilepilot.errors import ConfigError
from tilepilot.gates.metrics import cosine, kl_divergence
from tilepilot.gates.thresholds import KL_MAX_MAX, PHASE3_LOGITS_COSINE
from tilepilot.harness.model_gate import model_gate
from tilepilot.kernels.bind import MergedBias, merged_launch
from tilepilot.kernels.registry import family
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.graph import block_graph
from tilepilot.model.quant import QUANT_FORMATS, WeightFormat, deployment_weights
from tilepilot.oracle.model import Oracle
from tilepilot.plan.air_q4 import fused_stage
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.plan.merge import merged_stage
from tilepilot.plan.plan import validate_plan, with_weights
from tilepilot.runtime.dispatcher import KernelLibrary
from tilepilot.runtime.runner import NpuRunner, one_dispatch_name
from tilepilot.skills.optimize.decode import MultiMatrixLaunches
from tilepilot.skills.optimize.kernels import TileTuning

FAMILIES = ("llama", "qwen2", "qwen3", "smollm2")
IDS = [1, 5, 9, 13, 2]


def _decode_logits(plan, ck, lib: KernelLibrary) -> tuple[list[torch.Tensor], int]:
    runner = NpuRunner(plan, ck, library=lib)
    out = [runner.prefill(IDS).logits[-1]]
    for _ in range(2):
        out.append(runner.decode(int(out[-1].argmax())).logits[-1])
    return out, lib.timed_dispatches(one_dispatch_name("decode"))[-1].launches


@pytest.mark.parametrize("fmt", QUANT_FORMATS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_format_on_every_family_decodes_like_its_oracle_and_merging_changes_no_bit(tiny_model, family, fmt):
    ck = load_checkpoint(tiny_model(family, layers=1))
    fused = fused_stage(with_weights(paper_like_plan(ck.spec), WeightFormat(fmt)))
    merged = merged_stage(fused)
    assert merged is not None and validate_plan(merged) == []
    runs = [m for g in merged.decode.block for m in g.merged]
    assert ["gate_proj", "up_proj"] in runs and ["q_proj", "k_proj", "v_proj"] in runs and ["rope_q", "rope_k"] in runs
    assert (["q_bias", "k_bias", "v_bias"] in runs) == ck.spec.qkv_bias
    lib = KernelLibrary()
    separate, launches_separate = _decode_logits(fused, ck, lib)
    together, launches_merged = _decode_logits(merged, ck, lib)
    # q/k/v: 3 -> 1, gate/up, rope q/k: 2 -> 1, and Qwen2's q/k/v biases: 3 -> 1
    assert launches_separate - launches_merged == (4 + 2 * ck.spec.qkv_bias) * ck.spec.n_layers
    oracle = Oracle(deployment_weights(ck, fused.weight_format()))
    ref = [oracle.prefill(IDS).logits[-1]]
    for step in separate[:-1]:
        ref.append(oracle.decode(int(step.argmax())).logits[-1])
    for a, b, r in zip(separate, together, ref, strict=True):
        assert torch.equal(a, b)  # one launch computes what the separate launches computed, bit for bit
        assert cosine(r, a) >= PHASE3_LOGITS_COSINE
        assert kl_divergence(r, a) <= KL_MAX_MAX


def test_merged_bias_adds_each_column_its_own_bias_bit_for_bit(tiny_model):
    """One bias launch over Q's, K's and V's columns gives each member exactly its separate launch's output, on
    values whose fp32 sums round differently per column (a column shifted by one would show)."""
    spec = load_checkpoint(tiny_model("qwen2", layers=1)).spec
    graph = block_graph(spec)
    members = tuple(graph.node(o) for o in ("q_bias", "k_bias", "v_bias"))
    launch = merged_launch(members)
    assert isinstance(launch, MergedBias)
    shape = launch.shape("bias", spec, 3, {})
    assert shape.width == spec.q_dim + 2 * spec.kv_dim
    g = torch.Generator().manual_seed(0)
    xs = [(torch.randn(3, n.width, generator=g) * 100).bfloat16() for n in members]
    bs = [torch.randn(n.width, generator=g).bfloat16() for n in members]
    bias = family("bias")
    outs = launch.run(bias.make_design(shape), xs, bs, {}, spec)
    for n, x, b, y in zip(members, xs, bs, outs, strict=True):
        alone = bias.make_design(bias.Shape(rows=3, width=n.width)).fast({"x": x, "b": b})["y"]
        assert torch.equal(y, alone)
    with pytest.raises(ConfigError, match="only bias merges"):
        launch.shape("rope", spec, 3, {})


def test_bf16_gemvs_merge_too_bit_for_bit(tiny_model):
    ck = load_checkpoint(tiny_model("llama", layers=1))
    fused = fused_stage(paper_like_plan(ck.spec))
    merged = merged_stage(fused)
    assert merged is not None and validate_plan(merged) == []
    assert {c.family for g in merged.decode.block if g.merged for c in g.calls if c.op in g.merged[0]} == {"gemv"}
    lib = KernelLibrary()
    separate, launches_separate = _decode_logits(fused, ck, lib)
    together, launches_merged = _decode_logits(merged, ck, lib)
    assert launches_separate - launches_merged == 4 * ck.spec.n_layers
    assert all(torch.equal(a, b) for a, b in zip(separate, together, strict=True))


def test_nothing_merges_twice_and_bad_merges_are_refused(tiny_model):
    ck = load_checkpoint(tiny_model("llama", layers=1))
    merged = merged_stage(fused_stage(with_weights(paper_like_plan(ck.spec), WeightFormat("q4_0"))))
    assert merged_stage(merged) is None
    bad = merged_stage(fused_stage(with_weights(paper_like_plan(ck.spec), WeightFormat("q4_0"))))
    (layer,) = bad.decode.block  # one dispatch: the block's groups are joined
    layer.merged.append(["k_proj", "v_proj"])
    layer.merged.append(["o_proj", "down_proj"])
    split = with_weights(paper_like_plan(ck.spec), WeightFormat("q4_0"))  # per-group dispatches
    next(g for g in split.decode.block if "q_proj" in g.ops).merged.append(["q_proj", "o_proj"])
    problems = " | ".join(validate_plan(bad) + validate_plan(split))
    assert "repeats ops" in problems and "different inputs" in problems and "outside this NPU group" in problems


def test_rope_merges_only_when_every_input_is_computed_before_its_launch(tiny_model):
    """The merged RoPE launch runs at the first RoPE op's place: with K projected after Q's RoPE, K's RoPE stays a
    launch of its own, and a plan that merges them anyway is refused with the reason."""
    ck = load_checkpoint(tiny_model("llama", layers=1))
    late = fused_stage(with_weights(paper_like_plan(ck.spec), WeightFormat("q4_0")))
    g = next(g for g in late.decode.block if any(c.op == "rope_q" for c in g.calls))
    calls = {c.op: c for c in g.calls}
    order = [o for o in g.ops if o not in ("k_proj", "rope_k")]
    order[order.index("rope_q") + 1 : order.index("rope_q") + 1] = ["k_proj", "rope_k"]
    g.calls = [calls[o] for o in order]
    assert validate_plan(late) == []
    merged = merged_stage(late)
    assert merged is not None
    assert not any("rope_q" in m for g in merged.decode.block for m in g.merged)
    g.merged.append(["rope_q", "rope_k"])
    assert any("computed at or after rope_q" in p for p in validate_plan(late))


def test_the_skill_is_kept_when_faster_and_the_gate_passes(fresh_ctx):
    ctx = fresh_ctx("qwen2", layers=1, timing_prompt_len=256, greedy_steps=6, proposal_greedy_steps=3)
    ctx.save_plan(fused_stage(with_weights(paper_like_plan(ctx.plan.model_spec()), WeightFormat("q4_1"))))
    ctx.opt_stage = "decode"
    result = MultiMatrixLaunches().run(ctx)
    assert result.status == "applied", result.summary
    (row,) = result.evidence["applied"]
    assert row["decode_after"] < row["decode_before"] and row["gate"] == "passed"
    assert row["ttft_after"] <= row["ttft_before"]
    assert any(g.merged for g in ctx.plan.decode.block)
    report, _ = model_gate(ctx, ctx.plan)
    assert report.passed, report.failures
    traj = (ctx.root / "perf_opt_traj.md").read_text()
    assert MultiMatrixLaunches.name in traj and "applied" in traj
    assert MultiMatrixLaunches().run(ctx).status == "skipped"  # nothing left to merge
    # each merged launch runs the tile tuner's config for its merged shape, and tile tuning leaves it alone
    merged = {
        (g.name, m[0]): c.config for g in ctx.plan.decode.block for m in g.merged for c in g.calls if c.op == m[0]
    }
    gemvs = {k: cfg for k, cfg in merged.items() if k[1].endswith("_proj")}
    assert ("layer", "q_bias") in merged  # Qwen2's biases merge too
    assert gemvs and all(cfg.get("tile_m") and cfg.get("tile_k") for cfg in gemvs.values())
    TileTuning().run(ctx)
    after = {(g.name, m[0]): c.config for g in ctx.plan.decode.block for m in g.merged for c in g.calls if c.op == m[0]}
    assert after == merged
