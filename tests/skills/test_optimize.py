"""Optimization skills as plan edits, and the keep-or-revert rule (strictly faster and still correct)."""

from __future__ import annotations

from dataclasses import replace

from faults import set_op_config

from tilepilot.skills.optimize import common
from tilepilot.skills.optimize.common import Proposal, clone, try_proposal
from tilepilot.skills.optimize.fusion import FuseBiasAndQkNorm, MergeLaunches, merge_groups
from tilepilot.skills.optimize.kernels import VectorizedVariants
from tilepilot.skills.optimize.placement import _to_npu


def test_merge_groups_keeps_call_order(fresh_ctx):
    ctx = fresh_ctx()
    block = ctx.plan.prefill.block
    merged = merge_groups(block, 1, 3)
    assert len(merged) == len(block) - 2
    assert [c.op for g in merged for c in g.calls] == [c.op for g in block for c in g.calls]
    assert merged[1].name == "q_proj..v_proj"


def test_fuse_bias_and_qk_norm_only_where_the_model_has_them(fresh_ctx):
    for family, expect in (("qwen2", ["q_bias", "k_bias", "v_bias"]), ("qwen3", ["q_norm", "k_norm"]), ("llama", None)):
        ctx = fresh_ctx(family)
        props = list(FuseBiasAndQkNorm().proposals(ctx.plan, ctx, "prefill"))
        if expect is None:
            assert props == []
            continue
        (p,) = props
        group = next(g for g in p.plan.prefill.block if "q_proj" in g.ops)
        assert all(op in group.ops for op in ["q_proj", "k_proj", "v_proj", *expect])


def test_placement_moves_decode_attention_with_its_kv_writes(fresh_ctx):
    ctx = fresh_ctx()
    new, moved = _to_npu(ctx.plan, "decode", ("kv_write", "attention"))
    assert sorted(moved) == ["attention", "kv_write"]
    g = {x.name: x for x in new.decode.block}
    assert g["attention"].where == "npu" and g["attention"].calls[0].family == "attention"
    assert g["kv_write"].calls[0].family == "kv_cache"


def test_merge_launches_is_never_slower_than_the_paper_grouping(fresh_ctx):
    """Merging trades a dispatch's launch overhead for a per-launch cost inside the group (both calibrated), so
    whether merging pays depends on the calibration: whatever it is, a kept change is strictly faster, and the
    result is at least as fast as the paper's three-group split of the same calls."""
    from tilepilot.skills.optimize.fusion import restructure

    ctx = fresh_ctx()
    plan = clone(ctx.plan)
    plan.host.skip_unchanged_writes = True  # as after the host-policy skills
    ctx.save_plan(plan)
    paper = clone(ctx.plan)
    paper.prefill.block = restructure(paper.prefill.block, split_attention=True)
    assert [len(g.calls) > 1 for g in paper.prefill.block].count(True) == 2  # before | attention | after
    props = list(MergeLaunches().proposals(ctx.plan, ctx, "prefill"))
    best = props[0].plan if props else ctx.plan
    assert ctx.timing(best).ttft_s <= ctx.timing(paper).ttft_s
    for q in props:
        assert ctx.timing(q.plan).ttft_s < ctx.timing(ctx.plan).ttft_s


def test_vectorized_variants_and_opt_in_block_fp16(fresh_ctx):
    from tilepilot.harness.probes import call_shape, plan_calls
    from tilepilot.kernels.bind import family_module

    ctx = fresh_ctx()
    call = next(c for c in plan_calls(ctx.plan) if c.stage == "decode" and c.op == "down_proj")
    mod = family_module(call.family)
    cfg = mod.default_config(call_shape(ctx.spec, call, 1, ctx.settings.gate_prompt_len + 1))
    set_op_config(ctx, "decode", "down_proj", replace(cfg, variant="scalar"))
    props = list(VectorizedVariants().proposals(ctx.plan, ctx, "decode"))
    assert [p.change for p in props] == ["decode: vector variant for down_proj"]
    ctx2 = fresh_ctx("qwen2", try_bfp16=True)
    changes = [p.change for p in VectorizedVariants().proposals(ctx2.plan, ctx2, "decode")]
    assert changes and "block-FP16" in changes[0]


def test_keep_or_revert(fresh_ctx, monkeypatch):
    ctx = fresh_ctx()
    same = Proposal(clone(ctx.plan), "nothing really")
    row = try_proposal(ctx, "probe-skill", "prefill", same)
    assert row["decision"].startswith("rejected: not faster") and row["gate"] == "not run"
    faster = clone(ctx.plan)
    faster.host.weights = "preloaded"

    class Failing:
        passed = False
        failures = ["logits.cosine = 0.5 violates logits.cosine >= 0.99"]

    import tilepilot.skills.optimize.common as optimize_common

    asked: list[dict] = []
    monkeypatch.setattr(optimize_common, "model_gate", lambda ctx, plan, **kw: (asked.append(kw), (Failing(), {}))[1])
    row = try_proposal(ctx, "probe-skill", "prefill", Proposal(faster, "preload"))
    assert row["decision"].startswith("rejected: gate failed") and ctx.plan.host.weights == "per_call"
    s = ctx.settings  # proposals get the short greedy and the short KL
    assert asked == [{"greedy_steps": s.proposal_greedy_steps, "kl_steps": s.proposal_kl_steps}]
    monkeypatch.undo()
    row = try_proposal(ctx, "probe-skill", "prefill", Proposal(faster, "preload"))
    assert row["decision"] == "applied" and ctx.plan.host.weights == "preloaded"
    traj = (ctx.root / "perf_opt_traj.md").read_text()
    assert traj.count("| probe-skill |") == 3 and "| applied |" in traj
    assert common.SAME_TIME_RTOL < 1e-6


def test_a_prefill_head_config_must_be_legal_for_every_position_s_logits():
    """Found by the full-size Llama-3.2-3B deployment: its tuned prefill LM head (tile_k 768) was checked only at the
    last position (m=1), but a gate that asks for every position's logits runs the head over all prompt rows, a
    multi-token GEMV up to gemv.MAX_TOKENS rows that overflows L1 with that tiling; the evaluator's 12-28-token
    prompt found it after every phase had passed. legal_at now validates the all-positions head too."""
    from types import SimpleNamespace

    from tilepilot.harness.probes import plan_calls
    from tilepilot.kernels import gemv, lm_head
    from tilepilot.model.zoo import get_zoo_model
    from tilepilot.npu.validate import validate_group
    from tilepilot.plan.builtin import iron_like_plan
    from tilepilot.skills.optimize.kernels import legal_at, sizes_for
    from tilepilot.skills.settings import Settings

    bad = {"partition_rows": 32768, "cols": 8, "rows": 4, "tile_m": 8, "tile_k": 768, "variant": "vector", "depth": 2}
    cfg = lm_head.Config(**bad)
    codes = {m: {v.code for v in validate_group(lm_head.make_design(lm_head.Shape(128256, 3072, m), cfg))}
             for m in (1, gemv.MAX_TOKENS, gemv.MAX_TOKENS + 1)}  # fmt: skip
    assert codes[1] == set() and codes[gemv.MAX_TOKENS + 1] == set() and "L1_OVERFLOW" in codes[gemv.MAX_TOKENS]
    spec = get_zoo_model("llama-3.2-3b").spec(layers=1)
    head = next(c for c in plan_calls(iron_like_plan(spec)) if c.stage == "prefill" and c.family == "lm_head")
    sizes = sizes_for("prefill", SimpleNamespace(settings=Settings()))
    assert not legal_at(spec, head, bad, sizes)
    assert legal_at(spec, head, {**bad, "tile_k": 256}, sizes)


def test_legality_is_remembered_per_shape_and_config_and_gives_the_same_answer():
    """Tile tuning asks legal_at of every registry row at five sizes, for ops of one shape again and again; the
    answer is a function of (family, shape, config) and is remembered, never changed."""
    from types import SimpleNamespace

    from tilepilot.harness.probes import plan_calls
    from tilepilot.model.zoo import get_zoo_model
    from tilepilot.plan.builtin import iron_like_plan
    from tilepilot.skills.optimize import kernels
    from tilepilot.skills.settings import Settings

    spec = get_zoo_model("llama-3.2-1b").spec(layers=1)
    calls = [c for c in plan_calls(iron_like_plan(spec)) if c.stage == "prefill" and c.op in ("q_proj", "o_proj")]
    sizes = kernels.sizes_for("prefill", SimpleNamespace(settings=Settings()))
    good: dict = {}  # the family default at every size
    bad = {"tile_m": 512, "tile_n": 512, "tile_k": 512}  # 1.5 MiB of operands per tile: over every L1
    answers = [(kernels.legal_at(spec, c, good, sizes), kernels.legal_at(spec, c, bad, sizes)) for c in calls]
    hits = kernels._legal_shape.cache_info().hits
    again = [(kernels.legal_at(spec, c, good, sizes), kernels.legal_at(spec, c, bad, sizes)) for c in calls]
    assert answers == again == [(True, False)] * 2  # Q and O of Llama-3.2-1B are both 2048 x 2048
    assert kernels._legal_shape.cache_info().hits > hits


def test_a_remembered_legality_tells_an_int_config_from_an_equal_float_one_and_an_unknown_family_raises():
    """64 == 64.0, yet a float tile size does not build: the memo must not hand one's answer to the other."""
    from dataclasses import asdict, replace

    import pytest

    from tilepilot.errors import ConfigError
    from tilepilot.harness.probes import plan_calls
    from tilepilot.kernels.registry import family
    from tilepilot.model.zoo import get_zoo_model
    from tilepilot.plan.builtin import iron_like_plan
    from tilepilot.skills.optimize import kernels

    gemm = family("gemm")
    shape = gemm.Shape(m=2048, n=2048, k=2048)
    ints = asdict(gemm.default_config(shape))
    floats = {k: float(v) if type(v) is int else v for k, v in ints.items()}
    assert floats == ints  # equal as dicts, so only the types can tell them apart
    for first, second in ((floats, ints), (ints, floats)):
        kernels._legal_shape.cache_clear()
        answers = {id(first): kernels._legal("gemm", shape, first), id(second): kernels._legal("gemm", shape, second)}
        assert answers[id(ints)] is True and answers[id(floats)] is False
    spec = get_zoo_model("llama-3.2-1b").spec(layers=1)
    call = replace(plan_calls(iron_like_plan(spec))[0], family="no_such_family")
    with pytest.raises(ConfigError, match="no_such_family"):
        kernels.legal_at(spec, call, {}, [(1, 2)])
