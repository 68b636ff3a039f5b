"""``weight-prefetch`` on a resident decode (``StagePlan.prefetch``): the plan form and its validation, the same
logits as the resident pass in less modeled time (the designs do not change, only the schedule), and the skill
proposing it only for a resident pass that does not prefetch yet."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.plan.air_q4 import fused_stage
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.plan.plan import DeploymentPlan, validate_plan
from tilepilot.plan.resident import fit_resident
from tilepilot.runtime.dispatcher import KernelLibrary
from tilepilot.runtime.runner import NpuRunner, one_dispatch_name
from tilepilot.runtime.timing import time_plan
from tilepilot.skills.optimize.decode import WeightPrefetch
from tilepilot.skills.optimize.placement import _to_npu


def _resident(spec):
    plan, _ = _to_npu(paper_like_plan(spec), "decode", ("kv_write", "attention", "rmsnorm"))
    return fit_resident(fused_stage(plan), spec)[0]


def test_prefetch_is_a_form_of_a_resident_pass_and_round_trips_through_json(tiny_model):
    spec = load_checkpoint(tiny_model("llama", 1)).spec
    loose = copy.deepcopy(fused_stage(_to_npu(paper_like_plan(spec), "decode", ("kv_write", "attention"))[0]))
    loose.decode.prefetch = True
    assert any("prefetches weights but is not resident" in p for p in validate_plan(loose))
    plan = _resident(spec)
    plan.decode.prefetch = True
    assert validate_plan(plan) == []
    assert DeploymentPlan.from_json(plan.to_json()).decode.prefetch


def test_a_prefetching_pass_computes_the_same_logits_in_no_more_modeled_time(tiny_model):
    ck = load_checkpoint(tiny_model("llama", 2))
    plain = _resident(ck.spec)
    fetched = copy.deepcopy(plain)
    fetched.decode.prefetch = True
    lib = KernelLibrary()
    t_plain, t_fetched = (time_plan(p, ck.spec, prompt_len=64, library=lib) for p in (plain, fetched))
    one = lib.timed_dispatches(one_dispatch_name("decode"))[-1]
    assert t_fetched.ttft_s == t_plain.ttft_s  # prefill is not touched
    saved = sum(p.saved_s for p in one.prefetched)
    assert saved > 0 and t_fetched.decode_s_per_token == pytest.approx(t_plain.decode_s_per_token - saved)
    outs = []
    for plan in (plain, fetched):
        runner = NpuRunner(plan, ck)
        runner.prefill([3, 8, 13])
        outs.append(runner.decode(5).logits)
    assert torch.equal(outs[0], outs[1])  # the schedule changes the modeled time only


def test_the_skill_proposes_prefetch_only_for_a_resident_pass_that_does_not_prefetch(tiny_model):
    spec = load_checkpoint(tiny_model("llama", 1)).spec
    switched = fused_stage(_to_npu(paper_like_plan(spec), "decode", ("kv_write", "attention", "rmsnorm"))[0])
    assert list(WeightPrefetch().proposals(switched, SimpleNamespace(plan=switched), "decode")) == []
    resident = _resident(spec)
    (p,) = WeightPrefetch().proposals(resident, SimpleNamespace(plan=resident), "decode")
    assert p.plan.decode.prefetch and not resident.decode.prefetch
    assert list(WeightPrefetch().proposals(p.plan, SimpleNamespace(plan=p.plan), "decode")) == []
