"""Phase 2, single-block-validation: decoder block 0 on the NPU, prefill and one decode step.

One block isolates the block's kernels and their wiring from depth effects: its input is the embedding
(identical on both sides), so any disagreement is the block's own. Both stages are checked because
prefill (GEMM, flash attention) and decode (GEMV, attention over the KV cache) use different kernels.
"""

from __future__ import annotations

from typing import Any

from tilepilot.gates import metrics as M
from tilepilot.gates import thresholds as T
from tilepilot.harness.model_gate import gate_prompts
from tilepilot.harness.probes import rope_probe
from tilepilot.skills.base import PhaseSkill
from tilepilot.skills.phases.common import WORKSPACE_INPUT, finish


def measure_block(ctx, plan) -> tuple[dict[str, Any], dict[str, Any]]:
    """Layer-0 output of the runner vs the oracle, for the prompt (prefill) and its last token (decode)."""

    ids, _ = gate_prompts(ctx)
    runner = ctx.runners.make_runner(plan)
    pre = runner.prefill(ids, capture_layers=True).layer_outputs[0]
    runner.prefill(ids[:-1])
    dec = runner.decode(ids[-1], capture_layers=True).layer_outputs[0]
    oracle = ctx.model.oracle
    ref_pre = oracle.prefill(ids, capture=["layer0.out"]).captures["layer0.out"]
    oracle.prefill(ids[:-1])
    ref_dec = oracle.decode(ids[-1], capture=["layer0.out"]).captures["layer0.out"]
    pre_m, dec_m = M.compare(ref_pre, pre), M.compare(ref_dec, dec)
    m = {
        T.COSINE: min(pre_m["cosine"], dec_m["cosine"]),
        T.MIN_POSITION_COSINE: min(pre_m["min_position_cosine"], dec_m["min_position_cosine"]),
        T.NONFINITE: pre_m["nonfinite"] + dec_m["nonfinite"],
        **M.prefixed("prefill", pre_m),
        **M.prefixed("decode", dec_m),
    }
    evidence = {
        "nonfinite": int(m[T.NONFINITE]),
        "position_cosine": M.per_position_cosine(ref_pre, pre).tolist(),
        "stage_cosine": {"prefill": pre_m["cosine"], "decode": dec_m["cosine"]},
    }
    return m, evidence


class SingleBlockValidation(PhaseSkill):
    name = "single-block-validation"
    phase = 2
    description = (
        "Runs decoder block 0 of the plan on the NPU (prefill of the gate prompt and one decode step over the KV "
        "cache) and compares its output with the FP32 oracle's block: cosine, per-position minimum cosine by "
        "head_dim, no NaN/Inf. Use after kernel-validation passes, before the full model."
    )
    purpose = "Localizes wiring faults (layouts, bindings, KV cache) to one block before depth blurs them."
    inputs = (WORKSPACE_INPUT,)
    commands = ("tilepilot skills run single-block-validation WORKSPACE --json",)
    gate_text = (
        "Block-0 output cosine >= 0.99 in prefill and decode; per-position minimum cosine >= 0.99 / 0.98 / 0.97 for "
        "head_dim <= 64 / <= 255 / larger; no NaN/Inf."
    )
    failure_modes = (
        "Late positions wrong (RoPE frequency scaling, KV cache offsets), RoPE layout mismatch, NaN/Inf: classified "
        "and repaired by the matching debug skill.",
    )

    def run(self, ctx):

        try:
            m, evidence = measure_block(ctx, ctx.workspace.plan)
        except Exception as e:
            codes = list(getattr(e, "codes", []) or [])
            if not codes:
                raise
            report = T.phase2_gate(ctx.model.spec.head_dim).evaluate({}, details={"error": str(e)})
            return finish(self, ctx, report, {"validator_codes": codes, "error": str(e)}, "block could not be built")
        report = T.phase2_gate(ctx.model.spec.head_dim).evaluate(m)
        if not report.passed:
            evidence["rope_position_cosine"] = rope_probe(ctx.workspace.plan, ctx.model.spec)
        summary = f"block 0 cosine {m[T.COSINE]:.5f}, min position cosine {m[T.MIN_POSITION_COSINE]:.5f}"
        return finish(self, ctx, report, evidence, summary)
