"""A resident one-dispatch decode (``StagePlan.resident``): the plan form, the fit that makes the pass's designs
pack into the array (``plan.resident.fit_resident``), the same logits as the switched pass at less modeled time,
and the ``resident-decode`` skill kept by the decode phase's rules."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.npu.validate import DesignError
from tilepilot.parallel import fork_map
from tilepilot.plan import air_q4
from tilepilot.plan.air_q4 import fused_stage
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.plan.merge import merged_stage, packing_alternatives, split_stage
from tilepilot.plan.plan import DeploymentPlan, validate_plan
from tilepilot.plan.resident import fit_resident
from tilepilot.runtime.dispatcher import KernelLibrary
from tilepilot.runtime.runner import NpuRunner
from tilepilot.runtime.timing import time_plan
from tilepilot.skills.optimize.decode import ResidentDecode
from tilepilot.skills.optimize.placement import _to_npu


def _fused(spec):
    plan, _ = _to_npu(paper_like_plan(spec), "decode", ("kv_write", "attention", "rmsnorm"))
    return fused_stage(plan)


def test_resident_is_a_form_of_one_dispatch_and_round_trips_through_json(tiny_model):
    spec = load_checkpoint(tiny_model("llama", 1)).spec
    fused = _fused(spec)
    loose = copy.deepcopy(paper_like_plan(spec))
    loose.decode.resident = True
    assert any("resident but not one dispatch" in p for p in validate_plan(loose))
    fitted, _ = fit_resident(fused, spec)
    assert validate_plan(fitted) == [] and fitted.decode.resident and not fused.decode.resident
    assert DeploymentPlan.from_json(fitted.to_json()).decode.resident
    with pytest.raises(DesignError, match="not one dispatch"):
        fit_resident(paper_like_plan(spec), spec)


def test_the_fitted_pass_packs_and_computes_the_switched_pass_logits_in_less_modeled_time(tiny_model):
    ck = load_checkpoint(tiny_model("llama", 2))
    fitted, _ = fit_resident(_fused(ck.spec), ck.spec)
    switched = copy.deepcopy(fitted)
    switched.decode.resident = False  # the same configs, a design switch per launch
    lib = KernelLibrary()
    t_res, t_sw = (time_plan(p, ck.spec, prompt_len=64, library=lib) for p in (fitted, switched))
    assert t_res.dispatches["decode"] == t_sw.dispatches["decode"] == 1
    assert t_res.ttft_s == t_sw.ttft_s
    # the pass's launches after the first no longer pay a design switch each
    launches = lib.timed_dispatches("decode_one_dispatch")[-1].launches
    saved = t_sw.decode_s_per_token - t_res.decode_s_per_token
    assert saved >= (launches - 1) * CALIBRATION.launch_in_group_s
    outs = []
    for plan in (switched, fitted):
        runner = NpuRunner(plan, ck)
        runner.prefill([3, 8, 13])
        outs.append(runner.decode(5).logits)
    assert torch.equal(outs[0], outs[1])  # resident changes the modeled time only


def test_a_pass_that_cannot_be_packed_is_refused_by_its_code(zoo_model, monkeypatch):
    """At Llama-3.2-1B's width the air-q4 plan's quantized GEMVs on AIR's 4 rows x 8 columns, each config sized to
    fill its tiles, are legal one by one; packed together they are not, and timing that plan as resident without
    the fit is an error naming the budget, never a number."""
    spec = load_checkpoint(zoo_model("llama-3.2-1b", layers=1)).spec
    monkeypatch.setattr(air_q4, "fit_resident", lambda plan, spec, **kw: (plan, []))
    raw = air_q4.air_q4_plan(paper_like_plan(spec), weight_channels=1, windowed=False)
    assert not raw.decode.resident
    time_plan(raw, spec, prompt_len=64)  # switched: legal
    raw.decode.resident = True
    with pytest.raises(DesignError) as e:
        time_plan(raw, spec, prompt_len=64)
    assert set(e.value.codes) & {"L1_OVERFLOW", "LOCK_LIMIT", "BD_LIMIT", "DMA_CHANNELS", "L2_OVERFLOW"}
    assert "resident pass decode_one_dispatch" in str(e.value)


def test_pack_of_the_fitted_pass_is_what_the_dispatcher_times(tiny_model):
    spec = load_checkpoint(tiny_model("qwen2", 1)).spec
    fitted, _ = fit_resident(_fused(spec), spec)
    lib = KernelLibrary()
    time_plan(fitted, spec, prompt_len=64, library=lib)
    gt = lib.timed_dispatches("decode_one_dispatch")[-1]
    # no design switch: what the pass pays beyond its launches is one configuration of the tiles it packs
    assert gt.launch_overhead_s < CALIBRATION.launch_in_group_s
    assert gt.seconds == pytest.approx(
        gt.dispatch_overhead_s + gt.launch_overhead_s + sum(d.seconds for d in gt.designs)
    )


def test_resident_decode_is_kept_when_faster_and_the_gate_passes(fresh_ctx):
    ctx = fresh_ctx(timing_prompt_len=256, greedy_steps=6, proposal_greedy_steps=3)
    ctx.save_plan(_fused(ctx.plan.model_spec()))
    ctx.opt_stage = "decode"
    before = ctx.timing(ctx.plan).decode_s_per_token
    result = ResidentDecode().run(ctx)
    assert result.status == "applied", result.summary
    (row,) = result.evidence["applied"]
    assert row["gate"] == "passed" and row["decode_after"] < row["decode_before"] == pytest.approx(before)
    assert ctx.plan.decode.resident
    assert "resident-decode" in (ctx.root / "perf_opt_traj.md").read_text()
    assert ResidentDecode().run(ctx).status == "skipped"  # already resident: nothing to propose


def test_a_decode_dispatched_per_group_is_proposed_as_one_resident_dispatch(fresh_ctx):
    ctx = fresh_ctx(timing_prompt_len=256, greedy_steps=6, proposal_greedy_steps=3)
    ctx.opt_stage = "decode"
    assert not ctx.plan.decode.one_dispatch
    result = ResidentDecode().run(ctx)
    rows = result.evidence["applied"] + result.evidence["rejected"]
    assert "from per-group dispatches" in rows[0]["change"]
    # and the joined pass with the merges and folds its groups kept apart (``plan.merge.every_fold``)
    assert len(rows) == 2 and "the merges and folds the joined pass allows" in rows[1]["change"]
    if result.status == "applied":
        assert ctx.plan.decode.one_dispatch and ctx.plan.decode.resident and len(ctx.plan.decode.kv_windows) > 1


def test_a_replacement_the_caller_refuses_is_never_made(tiny_model):
    """``allowed`` is how the skill keeps group bindings legal (``harness.probes.group_checks``, which the plan
    layer cannot run): a fit that may change nothing returns the plan's own configs, resident."""
    spec = load_checkpoint(tiny_model("llama", 1)).spec
    fused = _fused(spec)
    fitted, changes = fit_resident(fused, spec, allowed=lambda op, config: False)
    assert fitted.decode.resident
    before = [c.config for g in fused.decode.groups() for c in g.calls]
    assert [c.config for g in fitted.decode.groups() for c in g.calls] == before
    assert not [n for n in changes if not n.startswith("search from")]


def test_a_pass_with_a_merged_rope_is_also_fitted_with_it_split(fresh_ctx):
    """A merged RoPE launch holds all of Q's and K's heads on one tile, which can pack worse: the skill proposes the
    pass as it is and then with the RoPE launches split (``plan.merge.split_stage``), then with the multi-matrix
    GEMVs split, each kept only when faster than the plan of the moment (the keep-or-revert rule)."""
    ctx = fresh_ctx(timing_prompt_len=256, greedy_steps=6, proposal_greedy_steps=3)
    merged = merged_stage(_fused(ctx.plan.model_spec()))
    assert merged is not None and any(m[0] == "rope_q" for g in merged.decode.block for m in g.merged)
    split = split_stage(merged)
    assert split is not None and not any(m[0] == "rope_q" for g in split.decode.block for m in g.merged)
    assert any(m[0] == "q_proj" for g in split.decode.block for m in g.merged)  # only RoPE is split
    assert split_stage(split) is None
    ctx.save_plan(merged)
    ctx.opt_stage = "decode"
    props = list(ResidentDecode().proposals(ctx.plan, ctx, "decode"))
    assert len(props) == 3 and "RoPE as separate launches" in props[1].change
    assert any(m[0] == "rope_q" for g in props[0].plan.decode.block for m in g.merged)
    assert "multi-matrix GEMVs" in props[2].change  # then every multi-matrix GEMV split, the RoPE merge kept

    def runs(p):
        return [m for g in p.plan.decode.block for m in g.merged]

    # a split fit is proposed as fitted, or, where that runs faster, with the split runs merged again on its configs
    # (``plan.resident.as_it_will_run``), and says which
    for p, split_first in ((props[1], "rope_q"), (props[2], "q_proj")):
        again = "then merged again as before on the fitted configs" in p.change
        assert any(m[0] == split_first for m in runs(p)) == again
        assert again == (runs(p) == [m for g in merged.decode.block for m in g.merged])
    assert any(m[0] == "rope_q" for m in runs(props[2]))
    assert all(p.plan.decode.resident for p in props)


def test_the_fits_on_worker_processes_propose_what_one_process_proposes(fresh_ctx, monkeypatch):
    """The skill fits its packing alternatives and its walk's moves side by side (``Settings.jobs``,
    ``parallel.fork_map``; the walk forced here by a ``squeezed`` that names a stream): the proposals, their words
    and every config are those of fits in one process."""
    from tilepilot.plan import resident
    from tilepilot.skills.optimize import decode

    asked = []

    def spy(where):
        def run(fn, items, jobs=None):
            asked.append((where, jobs))
            return fork_map(fn, items, jobs)

        return run

    monkeypatch.setattr(decode, "fork_map", spy("alternatives"))
    monkeypatch.setattr(resident, "fork_map", spy("walk"))
    monkeypatch.setattr(decode, "squeezed", lambda plan: ["o_proj (compute)"])
    ctx = fresh_ctx(timing_prompt_len=256, greedy_steps=6, proposal_greedy_steps=3)
    ctx.save_plan(merged_stage(_fused(ctx.plan.model_spec())))
    got = []
    for jobs in (1, 2):
        ctx.settings = replace(ctx.settings, jobs=jobs)
        props = list(ResidentDecode().proposals(ctx.plan, ctx, "decode"))
        got.append([(p.change, p.plan.to_json()) for p in props])
    assert asked == [("alternatives", 1), ("walk", 1), ("alternatives", 2), ("walk", 2)]
    assert len(got[0]) == 3 and got[1] == got[0]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_fit_that_fails_with_a_bug_raises_after_the_proposals_before_it(fresh_ctx, monkeypatch, jobs):
    """A fit raising something other than DesignError is a bug: it is raised with its own traceback where a
    one-by-one search meets it, after the earlier alternatives' proposals, however many workers fitted them."""
    from tilepilot.skills.optimize import decode

    real = decode._fit_with_bindings

    def fit(alt, stage, prompt_len):
        if not any(m[0] == "rope_q" for g in alt.decode.block for m in g.merged):  # the RoPE-split alternative
            raise ZeroDivisionError("a bug in the fit")
        return real(alt, stage, prompt_len)

    monkeypatch.setattr(decode, "_fit_with_bindings", fit)
    ctx = fresh_ctx(timing_prompt_len=256, greedy_steps=6, proposal_greedy_steps=3)
    ctx.save_plan(merged_stage(_fused(ctx.plan.model_spec())))
    ctx.settings = replace(ctx.settings, jobs=jobs)
    props = ResidentDecode().proposals(ctx.plan, ctx, "decode")
    first = next(props)
    assert first.plan.decode.resident and "RoPE" not in first.change
    with pytest.raises(ZeroDivisionError, match="a bug in the fit"):
        next(props)


def test_a_pass_with_merged_rope_and_bias_is_also_fitted_with_each_and_both_split(tiny_model):
    """Qwen2's merged Q/K/V bias launch, like a merged RoPE launch, can pack worse (Qwen2.5-3B at q4_0: 26.41 vs
    27.74 tok/s modeled): ``packing_alternatives`` gives the pass as it is, then with RoPE, bias, and both split,
    every other merged run kept, then with every multi-matrix GEMV split; a Llama pass (no bias) gets the RoPE and
    the GEMV splits, not a repeat of either."""
    spec = load_checkpoint(tiny_model("qwen2", 1)).spec
    merged = merged_stage(_fused(spec))
    assert merged is not None

    def kinds(plan):
        return sorted(m[0] for g in plan.decode.block for m in g.merged)

    alts = packing_alternatives(merged)
    assert alts[0] == (merged, "")
    assert [kinds(p) for p, _ in alts] == [
        ["gate_proj", "q_bias", "q_proj", "rope_q"],
        ["gate_proj", "q_bias", "q_proj"],
        ["gate_proj", "q_proj", "rope_q"],
        ["gate_proj", "q_proj"],
        ["q_bias", "rope_q"],  # every multi-matrix GEMV split (and any fold into one)
    ]
    assert "bias adds as separate launches" in alts[2][1] and "RoPE" in alts[1][1] and "RoPE" in alts[3][1]
    assert "multi-matrix GEMVs" in alts[4][1]
    llama = merged_stage(_fused(load_checkpoint(tiny_model("llama", 1)).spec))
    assert [how for _, how in packing_alternatives(llama)] == [
        "",
        " with Q's and K's RoPE as separate launches",
        " with the multi-matrix GEMVs and every fold into a GEMV as separate launches",
    ]


def test_a_squeezed_packing_walks_the_structure_and_proposes_where_it_ends(fresh_ctx, monkeypatch):
    """When the fastest fit leaves a weight stream below the DDR rate (``plan.resident.squeezed``, said here of a
    tiny model whose streams are never squeezed), the skill walks the structure from that fit's unfitted pass and
    seconds, and proposes the walk's last resident fit; a walk that finds nothing faster proposes nothing more.
    (The walk itself: ``tests/plan/test_resident_search.py``.)"""
    from tilepilot.skills.optimize import decode

    ctx = fresh_ctx(timing_prompt_len=256, greedy_steps=6, proposal_greedy_steps=3)
    ctx.save_plan(merged_stage(_fused(ctx.plan.model_spec())))
    ctx.opt_stage = "decode"
    assert decode.squeezed(fit_resident(ctx.plan)[0]) == []
    calls = []
    real = decode.search_structures

    def walk(base, seconds, fit, timed, **kw):
        calls.append((base, seconds, real(base, seconds, fit, timed, **kw)))
        return calls[-1][2] or [(base, fit(base), seconds / 2, "a unit as separate launches")]

    monkeypatch.setattr(decode, "squeezed", lambda plan: ["o_proj (compute)"])
    monkeypatch.setattr(decode, "search_structures", walk)
    props = list(ResidentDecode().proposals(ctx.plan, ctx, "decode"))
    (base, seconds, steps) = calls[0]
    fits = [ctx.timing(p.plan).decode_s_per_token for p in props[:3]]
    best = props[fits.index(min(fits))].plan
    assert seconds == min(fits) and base.decode.block[0].merged == best.decode.block[0].merged
    assert steps == []  # the real walk: on this tiny model every merge and fold pays for itself
    assert len(props) == 4 and props[3].plan.decode.resident
    assert "with a unit as separate launches (o_proj (compute) squeezed before)" in props[3].change
    monkeypatch.setattr(decode, "search_structures", real)
    assert len(list(ResidentDecode().proposals(ctx.plan, ctx, "decode"))) == 3
