"""One-dispatch decode and the windowed KV readback (issue 14 item 3): the plan form, the dispatcher's single
dispatch per pass, the readback bytes in the model, the skills kept by the decode phase, and illegal variants
refused by their validator code."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from tilepilot.harness.model_gate import model_gate
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.npu.validate import DesignError
from tilepilot.plan.air_q4 import KV_WINDOW_STEP, fused_stage
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.plan.merge import merged_stage
from tilepilot.plan.plan import KV_TEMPLATE_ROWS, DeploymentPlan, KernelGroup, StagePlan, validate_plan
from tilepilot.runtime.dispatcher import KernelLibrary
from tilepilot.runtime.runner import NpuRunner
from tilepilot.runtime.timing import time_plan
from tilepilot.skills.optimize.common import Proposal, try_proposal
from tilepilot.skills.optimize.decode import OneDispatchDecode, WindowedKvReadback
from tilepilot.skills.optimize.placement import _to_npu


def test_kv_readback_is_the_smallest_window_holding_the_context():
    st = StagePlan([], [], one_dispatch=True, kv_windows=[512, 256, 1024])
    assert [st.kv_readback(n) for n in (1, 256, 257, 1000, 1024, 1025, 3000)] == [256, 256, 512, 1024, 1024, 2048, 3072]
    assert StagePlan([], []).kv_readback(777) == 777


def test_a_one_dispatch_stage_must_hold_only_npu_groups_and_round_trips_through_json(zoo_model):
    spec = load_checkpoint(zoo_model("llama-3.2-1b", layers=1)).spec
    plan = paper_like_plan(spec)
    bad = copy.deepcopy(plan)
    bad.decode.one_dispatch = True  # paper-like decode attention runs on the CPU
    assert any("one dispatch" in p and "cpu_attention" in p for p in validate_plan(bad))
    fused = fused_stage(plan)
    assert validate_plan(fused) == [] and fused.decode.one_dispatch
    assert fused.decode.kv_windows == [KV_TEMPLATE_ROWS]
    assert fused.dispatches_per_token("decode") == 1 and fused.dispatches_per_layer("decode") == 0
    back = DeploymentPlan.from_json(fused.to_json())
    assert back.decode.one_dispatch and back.decode.kv_windows == fused.decode.kv_windows
    loose = copy.deepcopy(plan)
    loose.decode.kv_windows = [256]
    assert any("not one dispatch" in p for p in validate_plan(loose))


def test_one_dispatch_computes_the_same_logits_in_a_single_dispatch_per_token(zoo_model):
    ck = load_checkpoint(zoo_model("llama-3.2-1b", layers=2))
    fused = fused_stage(paper_like_plan(ck.spec))
    per_group = copy.deepcopy(fused)
    per_group.decode.one_dispatch, per_group.decode.kv_windows = False, []
    ids = [3, 8, 13, 21]
    outs = []
    for plan in (per_group, fused):
        runner = NpuRunner(plan, ck)
        runner.prefill(ids)
        mark = len(runner.trace.events)
        outs.append(runner.decode(5).logits)
        dispatches = [e for e in runner.trace.events[mark:] if e.kind == "dispatch"]
        assert len(dispatches) == plan.dispatches_per_token("decode")
    assert torch.equal(outs[0], outs[1])  # fusing changes the modeled time only


def test_the_readback_bytes_are_in_the_model(zoo_model):
    spec = load_checkpoint(zoo_model("llama-3.2-1b", layers=1)).spec
    fused = fused_stage(paper_like_plan(spec))
    windowed = copy.deepcopy(fused)
    windowed.decode.kv_windows = list(range(KV_WINDOW_STEP, KV_TEMPLATE_ROWS + 1, KV_WINDOW_STEP))
    lib = KernelLibrary()

    def decode_bytes(plan, n):
        t = time_plan(plan, spec, prompt_len=n, library=lib)
        return t.decode_s_per_token, lib.dispatch_time("decode_one_dispatch", _last_keys(lib)).ddr_bytes

    short_f, bytes_f = decode_bytes(fused, 300)
    short_w, bytes_w = decode_bytes(windowed, 300)
    kv_row = 2 * spec.kv_dim * 2  # one cached position, K and V in bf16
    assert bytes_f - bytes_w >= spec.n_layers * (KV_TEMPLATE_ROWS - 2 * KV_WINDOW_STEP) * kv_row
    assert short_w < short_f
    # at the template's own length the two read the same blocks
    assert decode_bytes(fused, KV_TEMPLATE_ROWS)[0] == pytest.approx(decode_bytes(windowed, KV_TEMPLATE_ROWS)[0])


def _last_keys(lib):
    return next(k for (name, k, *_) in reversed(list(lib._groups)) if name == "decode_one_dispatch")


def test_a_pass_longer_than_the_watchdog_is_refused_by_its_code(fresh_ctx):
    """With a (hypothetical) design switch of 0.5 s, one dispatch for the whole pass would outlive the driver's
    watchdog: the proposal is rejected by DISPATCH_WATCHDOG and never timed, while per-group dispatches stay legal."""
    ctx = fresh_ctx(timing_prompt_len=64)
    slow = CALIBRATION.tuned(launch_in_group_s=0.5)
    ctx.library = KernelLibrary(cal=slow)
    fused = fused_stage(ctx.plan)
    with pytest.raises(DesignError) as e:
        time_plan(fused, library=ctx.library, prompt_len=64)
    assert e.value.codes == ["DISPATCH_WATCHDOG"]
    time_plan(ctx.plan, library=ctx.library, prompt_len=64)  # one launch per dispatch: legal
    row = try_proposal(ctx, OneDispatchDecode.name, "decode", Proposal(fused, "decode in one dispatch"))
    assert row["decision"].startswith("rejected: cannot be built") and "DISPATCH_WATCHDOG" in row["decision"]
    assert row["gate"] == "not run"


def _npu_decode_ctx(fresh_ctx, timing_prompt_len: int, fused: bool = False):
    """A workspace whose plan is the paper's grouping with decode attention and the final RMSNorm (the paper's CPU
    ops) moved to the NPU."""
    ctx = fresh_ctx(timing_prompt_len=timing_prompt_len, greedy_steps=6, proposal_greedy_steps=3)
    plan = paper_like_plan(ctx.plan.model_spec())
    plan, _ = _to_npu(plan, "decode", ("kv_write", "attention", "rmsnorm"))
    ctx.save_plan(fused_stage(plan) if fused else plan)
    ctx.opt_stage = "decode"
    return ctx


def _kept(ctx, skill) -> dict:
    result = skill().run(ctx)
    assert result.status == "applied", result.summary
    (row,) = result.evidence["applied"]
    assert row["decode_after"] < row["decode_before"] and row["gate"] == "passed"
    assert row["ttft_after"] <= row["ttft_before"]
    report, _ = model_gate(ctx, ctx.plan)  # the decode phase's own gate on the kept plan
    assert report.passed, report.failures
    traj = (ctx.root / "perf_opt_traj.md").read_text()
    assert skill.name in traj and "applied" in traj
    return row


def test_one_dispatch_decode_is_kept_when_faster_and_the_gate_passes(fresh_ctx):
    """At the template's length (context 2048) the padded readback reads what the context needs, so fusing saves
    the host round trips (each former dispatch's overhead becomes a design switch inside the one dispatch)."""
    ctx = _npu_decode_ctx(fresh_ctx, KV_TEMPLATE_ROWS)
    row = _kept(ctx, OneDispatchDecode)
    assert ctx.plan.decode.one_dispatch and row["dispatches_after"]["decode"] == 0
    # nothing left to fuse: a second run proposes nothing
    assert OneDispatchDecode().run(ctx).status == "skipped"


def test_windowed_kv_readback_is_kept_at_a_short_context(fresh_ctx):
    ctx = _npu_decode_ctx(fresh_ctx, 512, fused=True)
    _kept(ctx, WindowedKvReadback)
    assert ctx.plan.decode.kv_readback(512) == 512 and max(ctx.plan.decode.kv_windows) == KV_TEMPLATE_ROWS


def test_windowing_is_rejected_as_not_faster_at_the_templates_own_length(fresh_ctx):
    ctx = _npu_decode_ctx(fresh_ctx, KV_TEMPLATE_ROWS, fused=True)
    result = WindowedKvReadback().run(ctx)
    assert result.status == "rejected" and "not faster" in result.summary
    assert ctx.plan.decode.kv_windows == [KV_TEMPLATE_ROWS]


def test_one_dispatch_joins_the_groups_and_keeps_activations_on_the_device(zoo_model):
    """Inside one dispatch a group boundary is no launch boundary: ``fused_stage`` joins the paper's split O+FFN
    groups into one (so the merges see gate and up together), the pass times the same joined or split, and under
    the paper's host handoff no activation crosses the host between the pass's launches."""
    spec = load_checkpoint(zoo_model("qwen2.5-0.5b", layers=1)).spec
    plan = paper_like_plan(spec)
    assert plan.host.handoff == "host" and len(plan.decode.block) > 3  # the paper split this model's O+FFN
    fused = fused_stage(plan)
    (layer,) = fused.decode.block
    assert layer.ops == [o for g in plan.decode.block for o in g.ops]
    assert [g.name for g in fused.decode.head] == ["head"] and validate_plan(fused) == []
    split = copy.deepcopy(fused)
    calls = {c.op: c for g in split.decode.groups() for c in g.calls}
    split.decode.block = [KernelGroup(g.name, [calls[o] for o in g.ops]) for g in plan.decode.block]
    split.decode.head = [KernelGroup(g.name, [calls[o] for o in g.ops]) for g in plan.decode.head]
    device = copy.deepcopy(split)
    device.host = replace(device.host, handoff="device")
    lib = KernelLibrary()
    joined_t, split_t, device_t = (time_plan(p, spec, prompt_len=128, library=lib) for p in (fused, split, device))
    assert joined_t.decode_s_per_token == split_t.decode_s_per_token

    def in_pass_syncs(t):
        return sum(g.sync_s for g in t.stage_groups("decode") if g.part in ("block", "head"))

    assert in_pass_syncs(split_t) == in_pass_syncs(device_t)
    # nor is anything transposed or re-written by the host between them, whatever the host policy
    for policy in ({"layout": "host_transpose"}, {"skip_unchanged_writes": False}):
        other = copy.deepcopy(split)
        other.host = replace(other.host, **policy)
        assert in_pass_syncs(time_plan(other, spec, prompt_len=128, library=lib)) == in_pass_syncs(split_t)
    # per-group dispatches do hand over through the host: the same split groups pay for it there
    per_group = copy.deepcopy(split)
    per_group.decode.one_dispatch, per_group.decode.kv_windows = False, []
    per_group_device = copy.deepcopy(per_group)
    per_group_device.host = replace(per_group_device.host, handoff="device")
    host_t, dev_t = (time_plan(p, spec, prompt_len=128, library=lib) for p in (per_group, per_group_device))
    assert in_pass_syncs(host_t) > in_pass_syncs(dev_t)
    merged = merged_stage(fused)
    assert ["gate_proj", "up_proj"] in merged.decode.block[0].merged
    # a one-dispatch pass saved with the paper's groups (before they were joined) is joined when it next merges
    (old_layer,) = merged_stage(split).decode.block
    assert old_layer.merged == merged.decode.block[0].merged
