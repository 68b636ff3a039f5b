"""Every debug skill: inject its fault into a deployment, show the failed gate is classified as its signature,
that the orchestrator runs the skill, and that the phase passes afterwards."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from faults import plan_option, scale_ffn, set_op_config, set_option

from tilepilot.gates import thresholds as T
from tilepilot.harness.probes import call_shape, plan_calls
from tilepilot.skills import classify as C
from tilepilot.skills.context import RUNTIME_KEY, DeployContext, Settings
from tilepilot.skills.debug.common import probes_now
from tilepilot.skills.optimize.placement import _to_npu
from tilepilot.skills.orchestrator import Orchestrator
from tilepilot.skills.phases.kernels import KernelValidation
from tilepilot.skills.phases.model import FullModelValidation


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread for these tests: on the shared 2-core machine a second one spins against other processes (a
    phase-3 gate of the four-layer trained model: 2.7 s with one thread, several times that with two under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _default(ctx, stage: str, op: str, rows: int | None = None):
    from tilepilot.kernels.bind import family_module

    call = next(c for c in plan_calls(ctx.plan) if c.stage == stage and c.op == op)
    n = rows or ctx.settings.gate_prompt_len
    rows_, context = (n, n) if stage == "prefill" else (1, n + 1)
    mod = family_module(call.family)
    return mod, mod.default_config(call_shape(ctx.spec, call, rows_, context))


def _plan_config(ctx, stage: str, op: str) -> dict:
    return next(c for c in plan_calls(ctx.plan) if c.stage == stage and c.op == op).config_dict


def _deploy_phases(ctx, phases, signature: str, skill: str):
    summary = Orchestrator(ctx, phases).run()
    failed_first = [p for p in summary.phases if p.attempts > 1]
    assert summary.verdict == "PASS", summary.review
    assert failed_first and any(r.startswith(f"{skill}: repaired") for r in failed_first[0].repairs), [
        p.repairs for p in summary.phases
    ]
    log = (ctx.root / "debug_log.md").read_text()
    assert f"signature {signature}" in log and skill in log
    assert skill in (ctx.root / "LESSONS.md").read_text()
    return summary


def test_tile_memory_overflow(fresh_ctx):
    ctx = fresh_ctx()
    mod, cfg = _default(ctx, "prefill", "up_proj")
    set_op_config(ctx, "prefill", "up_proj", replace(cfg, tile_m=64, tile_k=256, tile_n=256, pad=True))
    first = KernelValidation().run(ctx)
    assert not first.ok and "L1_OVERFLOW" in first.evidence["validator_codes"]
    assert C.classify(first.evidence).signature == C.TILE_MEMORY_OVERFLOW
    _deploy_phases(ctx, [KernelValidation, FullModelValidation], C.TILE_MEMORY_OVERFLOW, "fix-tile-memory-overflow")


def test_merged_launch_argument_mismatch(fresh_ctx):
    from tilepilot.plan.builtin import paper_like_plan

    ctx = fresh_ctx()
    ctx.save_plan(paper_like_plan(ctx.spec))
    mod, cfg = _default(ctx, "prefill", "q_proj")
    set_op_config(ctx, "prefill", "q_proj", replace(cfg, tile_m=32, pad=True))  # pads M: 24 rows -> 64 out
    first = KernelValidation().run(ctx)
    assert not first.ok and C.classify(first.evidence).signature == C.MERGED_LAUNCH_ARGUMENT_MISMATCH
    _deploy_phases(
        ctx, [KernelValidation, FullModelValidation], C.MERGED_LAUNCH_ARGUMENT_MISMATCH, "fix-merged-launch-arguments"
    )


def test_stale_static_buffer(fresh_ctx):
    ctx = fresh_ctx()
    ctx.set_extra(RUNTIME_KEY, {"static_buffers": ["prefill.x"]})  # the layer input is not static
    first = FullModelValidation().run(ctx)
    calls = first.evidence["call_cosine"]
    assert not first.ok and calls[0] > 0.99 > calls[1]
    assert C.classify(first.evidence).signature == C.STALE_AFTER_FIRST_CALL
    _deploy_phases(ctx, [FullModelValidation], C.STALE_AFTER_FIRST_CALL, "fix-stale-buffer")
    assert ctx.runtime_options()["static_buffers"] == []


def test_nan_inf_from_an_fp16_store_on_massive_activations(fresh_ctx, tiny_model, tmp_path):
    """SwiGLU stored in fp16 on a model whose FFN activations exceed 65504 (a zoo model scaled up): the seeded
    phase-1 probes pass, the model overflows to Inf; the skill finds the call on the model's own activations and
    switches its store back to bf16."""
    model = scale_ffn(tiny_model("llama"), tmp_path / "massive", 48.0)
    ctx = DeployContext.create(model, tmp_path / "ws-massive", settings=Settings(greedy_steps=8))
    set_option(ctx, ("swiglu",), store="fp16")
    assert KernelValidation().run(ctx).ok  # unit-scale probe inputs never reach 65504
    first = FullModelValidation().run(ctx)
    assert not first.ok and first.evidence["nonfinite"] > 0
    assert C.classify(first.evidence).signature == C.NAN_INF
    summary = _deploy_phases(ctx, [FullModelValidation], C.NAN_INF, "fix-nan-inf")
    assert {plan_option(ctx, stage, "swiglu", "store") for stage in ("prefill", "decode")} == {"bf16"}
    assert "'store'" in summary.phases[0].repairs[0]  # the repair names the option it changed


def test_one_partition_wrong_from_a_shifted_ragged_tail(fresh_ctx):
    """384-row partitions of a 1024-row vocabulary: the last one is ragged; shifted back to stay full-size and
    assembled unshifted, it returns the logits of the wrong rows. The repair sets tail back to pad, nothing else."""
    ctx = fresh_ctx()
    for stage in ("prefill", "decode"):
        plan, _ = _to_npu(ctx.plan, stage, ("lm_head", "final_norm"))
        ctx.save_plan(plan)
    set_option(ctx, ("lm_head",), partition_rows=384, tail="shift")
    first = KernelValidation().run(ctx)
    parts = first.evidence["partition_cosine"]
    assert not first.ok and len(parts) == 3 and [p < 0.99 for p in parts] == [False, False, True]
    assert C.classify(first.evidence).signature == C.ONE_PARTITION_WRONG
    _deploy_phases(ctx, [KernelValidation, FullModelValidation], C.ONE_PARTITION_WRONG, "fix-lm-head-partition")
    for stage in ("prefill", "decode"):
        assert plan_option(ctx, stage, "lm_head", "tail") == "pad"
        assert plan_option(ctx, stage, "lm_head", "partition_rows") == 384  # only the tail option changed


def test_rope_layout_mismatch_interleaved_on_half_rotation_weights(fresh_ctx):
    """RoPE run in the interleaved (GPT-J / GGUF) layout on a Hugging Face checkpoint: the skill finds that the half
    layout matches the oracle and changes the layout parameter, keeping the tiling."""
    ctx = fresh_ctx()
    set_option(ctx, ("rope_q", "rope_k"), layout="interleaved")
    before = {(s, op): _plan_config(ctx, s, op) for s in ("prefill", "decode") for op in ("rope_q", "rope_k")}
    first = KernelValidation().run(ctx)
    assert not first.ok and C.classify(first.evidence).signature == C.ROPE_LAYOUT_MISMATCH
    _deploy_phases(ctx, [KernelValidation, FullModelValidation], C.ROPE_LAYOUT_MISMATCH, "fix-rope-layout")
    for (stage, op), cfg in before.items():
        assert cfg["layout"] == "interleaved" and _plan_config(ctx, stage, op) == {**cfg, "layout": "half"}


def test_late_positions_from_rope_angles_computed_in_bf16(fresh_ctx):
    """RoPE tables whose angles (position x inverse frequency) are computed in bf16: right at early positions, off by
    up to half a bf16 ulp of the angle later (RoPE alone below 0.99 from position ~220 on). A 512-token gate prompt
    reaches those positions (phase 1 probes every kernel at the gate prompt's length); the skill switches exactly the
    angles option back to fp32 and phase 1 then passes."""
    ctx = fresh_ctx("smollm2", gate_prompt_len=512)
    set_option(ctx, ("rope_q", "rope_k"), angles="bf16")
    before = {(s, op): _plan_config(ctx, s, op) for s in ("prefill", "decode") for op in ("rope_q", "rope_k")}
    first = KernelValidation().run(ctx)
    assert not first.ok and C.classify(first.evidence).signature == C.LATE_POSITIONS_ONLY, first.evidence
    assert first.evidence["rope_position_cosine"][0] >= C.GOOD_COSINE
    _deploy_phases(ctx, [KernelValidation], C.LATE_POSITIONS_ONLY, "fix-late-positions")
    for (stage, op), cfg in before.items():
        assert cfg["angles"] == "bf16" and _plan_config(ctx, stage, op) == {**cfg, "angles": "fp32"}


@pytest.fixture
def trained_ctx(smollm2_dir, tmp_path):
    """A workspace on the trained SmolLM2-135M cut to four layers: real weights, so real massive activations (channel
    507 at the first token: |x| ~ 650 from layer 2 on against ~40 elsewhere) and sharp next-token distributions."""
    return DeployContext.create(smollm2_dir(layers=4), tmp_path / "ws-trained", settings=Settings(greedy_steps=8))


def test_error_growing_with_depth_from_an_fp8_residual_on_a_trained_model(trained_ctx):
    """Both residual adds store their sum in fp8 (e5m2: two mantissa bits) instead of bf16: each add alone passes its
    kernel gate, the error compounds layer by layer and the trained model's KL gate fails at four layers. The
    whole-output layer cosine stays above 0.99 (the massive activations dominate it); the per-layer lowest token
    cosine falls steadily, which the classifier reads. The repair switches exactly the store option back to bf16."""
    ctx = trained_ctx
    set_option(ctx, ("resid1", "resid2"), store="fp8_e5m2")
    before = {(s, op): _plan_config(ctx, s, op) for s in ("prefill", "decode") for op in ("resid1", "resid2")}
    assert all(p.ok for p in probes_now(ctx) if p.call.family == "eltwise")  # each add alone passes its gate
    first = FullModelValidation().run(ctx)
    assert not first.ok and first.gate["measurements"][T.KL_MEAN] > T.KL_MEAN_MAX
    assert min(first.evidence["layer_cosine"]) > C.GOOD_COSINE  # hidden by the massive activations
    tokens = first.evidence["layer_position_cosine"]
    assert tokens[0] >= C.GOOD_COSINE > tokens[-1] and tokens == sorted(tokens, reverse=True), tokens
    assert C.classify(first.evidence).signature == C.ERROR_GROWS_WITH_DEPTH
    _deploy_phases(ctx, [FullModelValidation], C.ERROR_GROWS_WITH_DEPTH, "fix-error-growth")
    for (stage, op), cfg in before.items():
        assert cfg["store"] == "fp8_e5m2" and _plan_config(ctx, stage, op) == {**cfg, "store": "bf16"}


def test_massive_activation_rows_from_an_fp16_rmsnorm_accumulator_on_a_trained_model(trained_ctx):
    """The block RMSNorms accumulate their sum of squares in fp16: the first token's massive channel (its square alone
    is 4.2e5) overflows from layer 3 on and that row is normalized to zeros; every other row, and every seeded probe,
    is right, so phases 1-2 pass and phase 3 fails on KL with no NaN. Run alone on the model's activations, the norm
    is wrong on exactly the massive rows; the repair switches exactly ``acc`` back to fp32."""
    ctx = trained_ctx
    set_option(ctx, ("attn_norm", "ffn_norm"), acc="fp16")
    before = {(s, op): _plan_config(ctx, s, op) for s in ("prefill", "decode") for op in ("attn_norm", "ffn_norm")}
    assert KernelValidation().run(ctx).ok  # unit-scale probes never reach 65504
    first = FullModelValidation().run(ctx)
    assert not first.ok and first.evidence["nonfinite"] == 0
    rows = [e for e in first.evidence["massive_row_cosine"] if "rmsnorm" in e["call"]]
    assert rows and 0 in rows[0]["rows"] and rows[0]["massive_min"] < C.GOOD_COSINE
    assert C.classify(first.evidence).signature == C.MASSIVE_ACTIVATION_ROWS
    _deploy_phases(ctx, [FullModelValidation], C.MASSIVE_ACTIVATION_ROWS, "fix-massive-activations")
    for (stage, op), cfg in before.items():
        assert cfg["acc"] == "fp16" and _plan_config(ctx, stage, op) == {**cfg, "acc": "fp32"}


def test_unmatched_failure_stops_for_human_review(fresh_ctx, monkeypatch):
    """A fault no signature describes (every kernel right alone, the embedding wrong) is handed to a person."""
    ctx = fresh_ctx()
    from tilepilot.runtime import runner as npu_runner

    original = npu_runner.NpuRunner._load

    def corrupt_load(self, weights):
        original(self, weights)
        self.embed = self.embed.flip(0)  # a host-side bug no kernel probe can see

    monkeypatch.setattr(npu_runner.NpuRunner, "_load", corrupt_load)
    summary = Orchestrator(ctx, [FullModelValidation]).run()
    assert summary.verdict == "needs-human-review"
    assert "Phase 3 (full-model-validation) failed" in summary.review and "Tried:" in summary.review
    assert "logits.cosine" in summary.review


@pytest.mark.parametrize("signature", C.SIGNATURES)
def test_every_signature_has_a_test_here(signature):
    names = {
        C.TILE_MEMORY_OVERFLOW: test_tile_memory_overflow,
        C.MERGED_LAUNCH_ARGUMENT_MISMATCH: test_merged_launch_argument_mismatch,
        C.STALE_AFTER_FIRST_CALL: test_stale_static_buffer,
        C.NAN_INF: test_nan_inf_from_an_fp16_store_on_massive_activations,
        C.ONE_PARTITION_WRONG: test_one_partition_wrong_from_a_shifted_ragged_tail,
        C.ROPE_LAYOUT_MISMATCH: test_rope_layout_mismatch_interleaved_on_half_rotation_weights,
        C.LATE_POSITIONS_ONLY: test_late_positions_from_rope_angles_computed_in_bf16,
        C.ERROR_GROWS_WITH_DEPTH: test_error_growing_with_depth_from_an_fp8_residual_on_a_trained_model,
        C.MASSIVE_ACTIVATION_ROWS: test_massive_activation_rows_from_an_fp16_rmsnorm_accumulator_on_a_trained_model,
    }
    assert callable(names[signature])


def test_a_mismatch_inside_a_joined_one_dispatch_layer_resets_only_the_call_it_names(fresh_ctx):
    """A one-dispatch decode is one group per layer: the repair resets the config of the launch the mismatch names
    (keeping a packed projection's weight format), not the whole layer's, and the layer keeps its merged launches."""
    from tilepilot.harness.probes import group_checks
    from tilepilot.model.quant import WeightFormat
    from tilepilot.plan.air_q4 import fused_stage
    from tilepilot.plan.builtin import paper_like_plan
    from tilepilot.plan.merge import merged_stage
    from tilepilot.plan.plan import with_weights
    from tilepilot.skills.debug.design import FixMergedLaunchArguments

    ctx = fresh_ctx()
    plan = merged_stage(fused_stage(with_weights(paper_like_plan(ctx.spec), WeightFormat("q4_1"))))
    (layer,) = plan.decode.block
    resid = next(c for c in layer.calls if c.op == "resid1")
    resid.config = {"tiles": 1, "chunk": 1024, "depth": 2, "variant": "vector", "pad": True, "store": "bf16"}
    ctx.save_plan(plan)
    (bad,) = [g for g in group_checks(ctx.plan, ctx.spec, ctx.settings.gate_prompt_len) if not g.ok]
    assert bad.group == "layer" and "resid1." in bad.message
    before = {c.op: dict(c.config) for c in ctx.plan.decode.block[0].calls}
    result = FixMergedLaunchArguments().run(ctx)
    assert result.status == "repaired", result.summary
    (after,) = ctx.plan.decode.block
    changed = {c.op for c in after.calls if c.config != before[c.op]}
    assert changed == {"resid1"} and after.merged == layer.merged
    assert next(c for c in after.calls if c.op == "q_proj").config["fmt"] == "q4_1"
