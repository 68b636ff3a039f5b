"""A quantized KV cache's write folded into the RoPE launch that rotates K (``kernels.bind.CachedRope``): a decode pass
with it computes the unfused pass's logits bit for bit with one launch fewer per layer (with and without Qwen3's
per-head norms in the same launch); the plan refuses a fold it cannot run and takes it apart for a bf16 cache; the
``kv-write-into-rope`` skill is kept only when faster and correct."""

from __future__ import annotations

import copy

import pytest
from folds import assert_same_logits_fewer_launches

from tilepilot.harness.model_gate import model_gate
from tilepilot.kernels.bind import CachedRope, merged_launch
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.graph import block_graph
from tilepilot.model.quant import WeightFormat
from tilepilot.plan.air_q4 import fused_stage
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.plan.merge import (
    cached_rope_stage,
    every_fold,
    merged_stage,
    normed_rope_stage,
    packing_alternatives,
    split_moves,
    split_stage,
)
from tilepilot.plan.plan import validate_plan, with_weights
from tilepilot.plan.resident import fit_resident
from tilepilot.skills.optimize.decode import KvWriteIntoRope, ResidentDecode
from tilepilot.skills.optimize.placement import _to_npu

QKV_ROPED = ["q_proj", "k_proj", "v_proj", "attn_norm", "rope_q", "rope_k"]


def _runs(plan) -> list[list[str]]:
    return [m for g in plan.decode.block for m in g.merged]


def _merged(spec, fmt: WeightFormat):
    return merged_stage(fused_stage(with_weights(paper_like_plan(spec), fmt)))


@pytest.mark.parametrize(
    ("family", "kv", "run"),
    [
        ("llama", "q4_0", ["rope_q", "rope_k", "kv_write"]),
        ("qwen3", "q8_0", ["rope_q", "rope_k", "q_norm", "k_norm", "kv_write"]),
    ],
)
def test_a_decode_pass_with_the_write_in_rope_gives_the_same_logits_with_a_launch_fewer(tiny_model, family, kv, run):
    ck = load_checkpoint(tiny_model(family, layers=2))
    merged = _merged(ck.spec, WeightFormat("q4_0", kv_cache=kv))
    if family == "qwen3":
        merged = normed_rope_stage(merged)
    folded = cached_rope_stage(merged)
    assert folded is not None and validate_plan(folded) == [] and cached_rope_stage(folded) is None
    assert run in _runs(folded)
    assert all(c.config["kv_format"] == kv for g in folded.decode.block for c in g.calls if c.op == "rope_q")
    # taking the write out gives the RoPE launch back; taking RoPE apart leaves no run of the write alone
    assert _runs(split_stage(folded, kinds=("kv_write",))) == _runs(merged)
    assert not any("kv_write" in m for m in _runs(split_stage(folded, kinds=("rope",))))
    assert any("KV-cache writes in RoPE" in how for _, how in packing_alternatives(folded))
    assert any(how == "kv_write out of rope_q's launch" for _, how in split_moves(folded))
    assert_same_logits_fewer_launches(merged, folded, ck, ck.spec.n_layers)


def test_k_alone_in_its_rope_launch_takes_the_write_too(tiny_model):
    ck = load_checkpoint(tiny_model("llama", layers=1))
    plain = fused_stage(with_weights(paper_like_plan(ck.spec), WeightFormat("q8_0", kv_cache="q8_0")))
    folded = cached_rope_stage(plain)
    assert folded is not None and validate_plan(folded) == [] and ["rope_k", "kv_write"] in _runs(folded)
    launch = merged_launch(tuple(block_graph(ck.spec).node(o) for o in ("rope_k", "kv_write")))
    assert isinstance(launch, CachedRope) and launch.reads == ("k_proj", "v_proj")
    assert [n.op for n in launch.writes] == ["kv_write"]  # K's rotated rows are stored, never written as rope_k
    assert_same_logits_fewer_launches(plain, folded, ck, ck.spec.n_layers)


def test_a_lone_k_launch_writing_the_cache_packs_beside_a_plain_rope_launch(tiny_model):
    """The resident fit copies one launch's candidate configs to the others of its family; a RoPE launch writing the
    cache never takes a plain one's (its cache format is data, ``plan.DATA_FIELDS``), nor the other way round."""
    spec = load_checkpoint(tiny_model("llama", layers=1)).spec
    plain = fused_stage(with_weights(paper_like_plan(spec), WeightFormat("q4_0", kv_cache="q8_0")))
    folded = cached_rope_stage(plain)
    assert ["rope_k", "kv_write"] in _runs(folded)
    resident, _ = fit_resident(folded, spec)
    configs = {c.op: c.config for g in resident.decode.block for c in g.calls}
    assert configs["rope_k"]["kv_format"] == "q8_0" and configs["rope_q"].get("kv_format", "bf16") == "bf16"
    assert validate_plan(resident) == []
    # the write taken out again: the plain RoPE launch keeps no cache format, so the fit may reconfigure it freely
    back = split_stage(folded, kinds=("kv_write",))
    assert all(
        c.config.get("kv_format", "bf16") == "bf16" for g in back.decode.block for c in g.calls if c.op == "rope_k"
    )


def test_the_per_head_norms_fold_into_a_rope_launch_that_already_writes_the_cache(tiny_model):
    spec = load_checkpoint(tiny_model("qwen3", layers=1)).spec
    cached = cached_rope_stage(_merged(spec, WeightFormat("q4_0", kv_cache="q8_0")))
    assert ["rope_q", "rope_k", "kv_write"] in _runs(cached)
    normed = normed_rope_stage(cached)
    assert normed is not None and validate_plan(normed) == []
    assert ["rope_q", "rope_k", "q_norm", "k_norm", "kv_write"] in _runs(normed)


def test_a_fold_the_plan_cannot_run_is_refused_and_a_bf16_cache_takes_it_apart(tiny_model):
    spec = load_checkpoint(tiny_model("llama", layers=1)).spec
    assert cached_rope_stage(_merged(spec, WeightFormat("q4_0"))) is None  # a bf16 cache: no write launch
    folded = cached_rope_stage(_merged(spec, WeightFormat("q4_0", kv_cache="q8_0")))
    (layer,) = folded.decode.block
    bad = copy.deepcopy(folded)
    bad.decode.block[0].merged = [m if "kv_write" not in m else ["rope_k", "rope_q", "kv_write"] for m in layer.merged]
    assert any("must store the last RoPE op's output, K's" in p for p in validate_plan(bad))
    bad = copy.deepcopy(folded)
    next(c for c in bad.decode.block[0].calls if c.op == "rope_q").config["kv_format"] = "q4_0"
    assert any("writes the KV cache as 'q4_0' but the plan's cache is q8_0" in p for p in validate_plan(bad))
    bf16_cache = with_weights(folded, WeightFormat("q4_0"))
    assert validate_plan(bf16_cache) == [] and ["rope_q", "rope_k"] in _runs(bf16_cache)
    assert not any("kv_write" in m for m in _runs(bf16_cache))
    q4_cache = with_weights(folded, WeightFormat("q4_0", kv_cache="q4_0"))  # another quantized format: rewritten
    assert validate_plan(q4_cache) == [] and ["rope_q", "rope_k", "kv_write"] in _runs(q4_cache)


def test_the_skill_is_kept_when_faster_and_the_gate_passes(fresh_ctx):
    ctx = fresh_ctx("llama", layers=1, timing_prompt_len=256, greedy_steps=6, proposal_greedy_steps=3)
    fmt = WeightFormat("q4_0", kv_cache="q8_0")
    ctx.save_plan(merged_stage(fused_stage(with_weights(paper_like_plan(ctx.plan.model_spec()), fmt))))
    ctx.opt_stage = "decode"
    result = KvWriteIntoRope().run(ctx)
    assert result.status == "applied", result.summary
    (row,) = result.evidence["applied"]
    assert row["decode_after"] < row["decode_before"] and row["gate"] == "passed"
    assert ["rope_q", "rope_k", "kv_write"] in _runs(ctx.plan)
    report, _ = model_gate(ctx, ctx.plan)
    assert report.passed, report.failures
    assert KvWriteIntoRope().run(ctx).status == "skipped"


def test_a_write_the_paper_groups_keep_apart_from_rope_folds_in_the_joined_resident_pass(fresh_ctx):
    """The paper's decode rotates in one ELF and writes the cache in the next: the fold finds nothing while the pass
    is dispatched per group, and ``resident-decode``, which joins the pass, also fits it with every merge and fold
    the joined groups allow (``plan.merge.every_fold``). There RoPE folds into the Q/K/V launch first
    (``rope-epilogue``), which leaves the write its own launch; with RoPE its own launch again, the write folds."""
    ctx = fresh_ctx("llama", layers=1, timing_prompt_len=256, greedy_steps=6, proposal_greedy_steps=3)
    fmt = WeightFormat("q4_0", kv_cache="q8_0")
    per_group, _ = _to_npu(
        with_weights(paper_like_plan(ctx.plan.model_spec()), fmt), "decode", ("kv_write", "attention")
    )
    per_group = merged_stage(per_group)
    assert not per_group.decode.one_dispatch and cached_rope_stage(per_group) is None
    joined = every_fold(fused_stage(per_group))
    assert joined is not None and validate_plan(joined) == [] and every_fold(joined) is None
    assert QKV_ROPED in _runs(joined) and not any("kv_write" in m for m in _runs(joined))
    rope_apart = split_stage(joined, kinds=("rope",))
    cached = cached_rope_stage(rope_apart)
    assert cached is not None and validate_plan(cached) == [] and ["rope_q", "rope_k", "kv_write"] in _runs(cached)
    ctx.save_plan(per_group)
    ctx.opt_stage = "decode"
    props = list(ResidentDecode().proposals(ctx.plan, ctx, "decode"))
    folded = [p for p in props if "the merges and folds the joined pass allows" in p.change]
    assert len(folded) == 1 and folded[0].plan.decode.resident
    assert QKV_ROPED in _runs(folded[0].plan)


def test_the_decode_phase_tries_the_folds_in_the_order_every_walker_of_them_uses():
    """``plan.merge.FOLDS`` is what ``every_fold`` and the quantized benchmark walk as the decode phase does: the
    phase's fold skills, in its registry order, are exactly those folds."""
    from tilepilot.plan.merge import FOLDS
    from tilepilot.skills.optimize.decode import _FoldIntoLaunch
    from tilepilot.skills.registry import optimizers

    folds = [cls.fold for cls in optimizers() if issubclass(cls, _FoldIntoLaunch) and "decode" in cls.stages]
    assert folds == list(FOLDS)
