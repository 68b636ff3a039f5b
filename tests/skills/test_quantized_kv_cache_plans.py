"""A q8_0 KV cache in a plan and a run (``WeightFormat.kv_cache``, ``deploy --kv-cache``): the plan's NPU cache
writes are ``kvquant`` launches and its attention launches read q8_0 rows, whatever moves ops onto the NPU later; a
plan that reads its cache in another format than it writes is refused by its validation; the runner computes what
the oracle of the deployed model (its own K and V through the same blocks) computes, in half the cache bytes, and
not what a bf16 cache computes; debug reconfigurations keep the cache format."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from tilepilot.harness.probes import CallRef
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.quant import KV_FORMATS, WeightFormat, deployment_weights
from tilepilot.oracle.model import Oracle
from tilepilot.plan.air_q4 import fused_stage
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.plan.merge import merged_stage
from tilepilot.plan.plan import apply_kv_cache, validate_plan, with_weights
from tilepilot.runtime.dispatcher import KernelLibrary
from tilepilot.runtime.runner import NpuRunner, one_dispatch_name
from tilepilot.skills.debug.common import candidates
from tilepilot.skills.optimize.placement import _to_npu

IDS = [1, 5, 9, 13, 2, 7, 3]


def _calls(plan, kind: str, stage: str = "decode"):
    return [c for g in plan.stage(stage).groups() if g.where == "npu" for c in g.calls if c.op == kind]


def test_the_plan_writes_and_reads_its_cache_in_its_format_whatever_moves_onto_the_npu(tiny_model):
    spec = load_checkpoint(tiny_model("llama", layers=1)).spec
    plan = with_weights(paper_like_plan(spec), WeightFormat("q4_0", kv_cache="q8_0"))
    assert validate_plan(plan) == [] and "KV cache q8_0" in plan.notes
    moved, groups = _to_npu(plan, "decode", ("kv_write", "attention", "rmsnorm"))  # paper-like decode attention: CPU
    assert groups and validate_plan(moved) == []
    assert [c.family for c in _calls(moved, "kv_write")] == ["kvquant"]
    assert [c.config for c in _calls(moved, "attention")] == [{"kv_format": "q8_0"}]
    fused = fused_stage(plan)  # the one-dispatch decode moves every CPU group too
    assert [c.family for c in _calls(fused, "kv_write")] == ["kvquant"]
    # a write or a read in another format is refused by the plan's own validation, and apply_kv_cache mends it
    bad = copy.deepcopy(moved)
    _calls(bad, "kv_write")[0].family = "kv_cache"
    _calls(bad, "attention")[0].config = {}
    problems = " | ".join(validate_plan(bad))
    assert "writes a q8_0 KV cache with family 'kv_cache'; use 'kvquant'" in problems
    assert "reads a bf16 KV cache but the plan's is q8_0" in problems
    assert validate_plan(apply_kv_cache(bad)) == []
    back = with_weights(moved, WeightFormat("q4_0"))  # and back to a bf16 cache: the producers' drains write it
    assert validate_plan(back) == [] and [c.family for c in _calls(back, "kv_write")] == ["kv_cache"]
    assert [c.config for c in _calls(back, "attention")] == [{}]


def test_a_debug_reconfiguration_keeps_the_cache_format(tiny_model):
    spec = load_checkpoint(tiny_model("llama", layers=1)).spec
    call = CallRef("decode", "block", "g", "attention", "attention", (("kv_format", "q8_0"),))
    cands = candidates(spec, call, 1, 64)
    assert cands and all(c["kv_format"] == "q8_0" for c in cands)


@pytest.mark.parametrize(("quantized", "block_bytes"), [("q8_0", 34), ("q4_0", 18)])
def test_the_runner_computes_the_deployed_models_logits_in_fewer_cache_bytes(tiny_model, quantized, block_bytes):
    ck = load_checkpoint(tiny_model("llama", layers=2))
    out = {}
    for kv in ("bf16", quantized):
        fmt = WeightFormat("q4_0", kv_cache=kv)
        plan, _ = _to_npu(with_weights(paper_like_plan(ck.spec), fmt), "decode", ("kv_write", "attention", "rmsnorm"))
        plan = merged_stage(fused_stage(plan))
        lib = KernelLibrary()
        weights = deployment_weights(ck, fmt)
        runner, oracle = NpuRunner(plan, weights, library=lib), Oracle(weights, kv_cache=kv)
        npu, ref = [runner.prefill(IDS).logits[-1]], [oracle.prefill(IDS).logits[-1]]
        for _ in range(3):
            t = int(ref[-1].argmax())
            npu.append(runner.decode(t).logits[-1])
            ref.append(oracle.decode(t).logits[-1])
        for a, b in zip(npu, ref, strict=True):  # the oracle of the deployed model: its K and V through the blocks
            assert torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=0) > 0.9999
        one = lib.timed_dispatches(one_dispatch_name("decode"))[-1]
        out[kv] = (npu, ref, runner.cache.nbytes(), [d.name.split("_")[0] for d in one.designs])
    assert out[quantized][2] * 64 == out["bf16"][2] * block_bytes
    assert out[quantized][3].count("kvquant") == ck.spec.n_layers and "kvquant" not in out["bf16"][3]
    # the cache really is quantized: the decode steps' logits move (prefill attends to its own rows in both)
    assert not torch.equal(out[quantized][1][-1], out["bf16"][1][-1])
    assert not torch.equal(out[quantized][0][-1], out["bf16"][0][-1])


def test_a_cpu_attention_reads_the_decoded_rows(tiny_model):
    """The paper-like plan keeps decode attention on the CPU: the host writes the q8_0 rows itself and reads them
    decoded, so the CPU path computes the same model."""
    ck = load_checkpoint(tiny_model("llama", layers=1))
    fmt = WeightFormat("bf16", kv_cache="q8_0")
    plan = with_weights(paper_like_plan(ck.spec), fmt)
    assert any(g.where == "cpu" for g in plan.decode.groups())
    runner, oracle = NpuRunner(plan, ck), Oracle(ck, kv_cache="q8_0")
    runner.prefill(IDS)
    oracle.prefill(IDS)
    a, b = runner.decode(4).logits[-1], oracle.decode(4).logits[-1]
    assert torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=0) > 0.9999
    assert runner.cache.packed(0, len(IDS) + 1).dtype == torch.uint8
    assert replace(fmt, kv_cache="fp8").problems() == [f"weights.kv_cache is 'fp8'; use one of {KV_FORMATS}"]


def test_the_resident_fit_packs_the_cache_write_launch(tiny_model):
    """A quantized cache's write is a launch of the resident pass: the fit packs it with the others (a bf16 cache's
    write is no launch and has no slot)."""
    from tilepilot.plan.resident import _slots, fit_resident

    spec = load_checkpoint(tiny_model("llama", layers=1)).spec
    for kv, launches in (("bf16", 0), ("q8_0", 1)):
        plan, _ = _to_npu(
            with_weights(paper_like_plan(spec), WeightFormat("q4_0", kv_cache=kv)), "decode", ("kv_write", "attention")
        )
        plan = merged_stage(fused_stage(plan))
        assert [s.call.family for s in _slots(plan, spec, 256)].count("kvquant") == launches
    fitted, _ = fit_resident(plan, spec)
    assert validate_plan(fitted) == [] and fitted.decode.resident
    (write,) = _calls(fitted, "kv_write")
    assert write.family == "kvquant" and write.config["kv_format"] == "q8_0"


def test_a_resume_that_names_another_cache_format_is_refused(tiny_model, tmp_path):
    from tilepilot.errors import WorkspaceError
    from tilepilot.skills.context import DeployContext, Settings

    model, out = tiny_model("llama", layers=1), tmp_path / "ws"
    ctx = DeployContext.create(model, out, settings=Settings(weights=WeightFormat(kv_cache="q8_0")))
    assert ctx.plan.weight_format().kv_cache == "q8_0" and [c.family for c in _calls(ctx.plan, "kv_write")] in (
        [],
        ["kvquant"],
    )
    with pytest.raises(WorkspaceError, match="KV cache q4_0"):
        DeployContext.create(model, out, resume=True, settings=Settings(weights=WeightFormat(kv_cache="q4_0")))
    again = DeployContext.create(model, out, resume=True, settings=Settings(weights=None))
    assert again.plan.weight_format().kv_cache == "q8_0"


def test_the_fused_group_checks_bind_a_quantized_cache_group(tiny_model):
    """A group holding attention beside other launches is built as one multi-launch group for its binding checks:
    its attention reads the cache format the call names (the fused shape's tiling left to the default)."""
    from tilepilot.harness.probes import group_checks

    spec = load_checkpoint(tiny_model("llama", layers=1)).spec
    for kv in ("q8_0", "q4_0"):
        plan = merged_stage(fused_stage(with_weights(paper_like_plan(spec), WeightFormat("q4_0", kv_cache=kv))))
        checks = group_checks(plan, spec, 24)
        assert checks and [c.message for c in checks if not c.ok] == []


def test_phase0_checks_the_oracle_code_on_the_original_under_a_quantized_cache(fresh_ctx):
    """bf16 weights with a q8_0 cache: transformers runs the checkpoint with a bf16 cache, so phase 0 checks the
    oracle's code on the bf16-cache oracle (the source), and the deployed model's reference is the q8_0 one."""
    from tilepilot.skills.phases.oracle import BuildCpuOracle

    ctx = fresh_ctx("llama", weights=WeightFormat(kv_cache="q8_0"))
    assert ctx.model.source_oracle is not ctx.model.oracle
    result = BuildCpuOracle().run(ctx)
    assert result.ok, result.summary


def test_a_resume_naming_only_the_cache_keeps_the_recorded_weights(tiny_model, tmp_path):
    import argparse

    from tilepilot.commands.deploy import weight_format
    from tilepilot.skills.context import DeployContext, Settings

    model, out = tiny_model("llama", layers=1), tmp_path / "ws"
    recorded = WeightFormat("q4_0", kv_cache="q8_0")
    DeployContext.create(model, out, settings=Settings(weights=recorded))
    args = argparse.Namespace(
        model_dir=str(model), out=out, resume=True, weights=None, block=None, keep_bf16="", kv_cache="q8_0"
    )
    assert weight_format(args, model) == recorded  # the recorded q4_0 weights, not a bf16 default
    args.kv_cache = None
    assert weight_format(args, model) is None  # nothing named: the recorded format


def test_host_attention_is_priced_on_the_caches_stored_bytes_and_decode(tiny_model):
    """The paper-like plan attends on the host: its modeled cost reads the cache as stored (fewer bytes for blocks)
    and decodes every value, so the modeled decode step differs from a bf16 cache's (it ignored the format before)."""
    from tilepilot.runtime.timing import time_plan

    spec = load_checkpoint(tiny_model("llama", layers=1)).spec
    t = {
        kv: time_plan(with_weights(paper_like_plan(spec), WeightFormat(kv_cache=kv)), spec, prompt_len=1024)
        for kv in ("bf16", "q8_0")
    }
    assert t["q8_0"].decode_s_per_token != t["bf16"].decode_s_per_token


def test_a_host_cache_write_is_priced_on_its_stored_rows_and_the_encode(tiny_model):
    """The paper-like prefill writes the cache on the host: a quantized cache's rows cost their stored bytes and the
    encode of every value (``KV_ENCODE_OPS``), not a bf16 copy."""
    from tilepilot.runtime.dispatcher import KV_ENCODE_OPS, CpuOpTimer
    from tilepilot.runtime.timing import time_plan

    spec = load_checkpoint(tiny_model("llama", layers=1)).spec
    rows = 256
    cost = {}
    for kv in ("bf16", "q8_0"):
        t = time_plan(with_weights(paper_like_plan(spec), WeightFormat(kv_cache=kv)), spec, prompt_len=rows)
        (g,) = [g for g in t.stage_groups("prefill") if g.name == "cpu_kv_cache"]
        cost[kv] = g.cpu_s
    width = 2 * spec.kv_dim
    stored = rows * (width // 32) * 34  # q8_0: 34 bytes per block of 32
    timer = CpuOpTimer()
    base = 2 * rows * (width + width)  # reads the K and V rows, writes bf16
    expect_bf16 = timer.seconds(base, 0)
    expect_q8 = timer.seconds(base - 2 * rows * width + stored, KV_ENCODE_OPS * rows * width)
    assert cost["bf16"] == pytest.approx(expect_bf16 * spec.n_layers)
    assert cost["q8_0"] == pytest.approx(expect_q8 * spec.n_layers)
