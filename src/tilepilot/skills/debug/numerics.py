"""Numerical debug skills: NaN/Inf from a kernel, and error that grows with depth."""

from __future__ import annotations

from typing import Any

from tilepilot.harness.probes import Probe, probe, stage_rows
from tilepilot.skills.classify import ERROR_GROWS_WITH_DEPTH, NAN_INF
from tilepilot.skills.debug.common import ReconfigureSkill, resume_commands

# A call counts as less accurate than its family default when its probe's 1 - Pearson exceeds the default's by
# this factor plus a floor (both far above run-to-run identity: probes are seeded, so equal configs match exactly).
PRECISION_REGRESSION = 10.0
PRECISION_FLOOR = 1e-6
# Numerics a matrix kernel can lose accuracy to, as (config field, reduced value, full value).
REDUCED_NUMERICS = (("variant", "bfp16", "vector"), ("acc", "bf16", "fp32"))


class FixNanInf(ReconfigureSkill):
    name = "fix-nan-inf"
    signature = NAN_INF
    description = (
        "Finds the kernel instance whose output contains NaN or Inf by probing each call of the plan alone, and "
        "switches it to the family default or the first candidate config whose probe is finite and passes its "
        "kernel gate. Use when a gate reports non-finite values."
    )
    purpose = "Localizes a NaN/Inf to one kernel call and replaces its configuration."
    commands = resume_commands("fix-nan-inf")
    gate_text = "The failed phase re-runs; its gate (which counts non-finite values) decides."
    failure_modes = (
        "No call produces NaN alone (e.g. an overflow that needs the whole model): unrepaired, needs a human.",
    )

    def culprits(self, ctx, probes: list[Probe]) -> list[Probe]:
        return [p for p in probes if p.measurements.get("nonfinite", 0) > 0]


def _reduced(config: dict[str, Any]) -> bool:
    return any(config.get(k) == bad for k, bad, _ in REDUCED_NUMERICS)


class FixErrorGrowth(ReconfigureSkill):
    name = "fix-error-growth"
    signature = ERROR_GROWS_WITH_DEPTH
    description = (
        "Restores full-precision numerics (bf16 MMUL variant, fp32 accumulation) on matrix kernels that run "
        "block-FP16 or round partial sums to bf16, and re-configures any call whose probe misses its kernel gate or "
        "is measurably less accurate than its family default. Use when per-layer cosine falls steadily with depth "
        "while the first layer is right."
    )
    purpose = "Stops small per-layer errors from compounding into a failing model."
    commands = resume_commands("fix-error-growth")
    gate_text = "The failed phase re-runs; per-layer cosine and final-logit cosine decide."
    failure_modes = ("Every kernel already at full precision and passing alone: unrepaired, needs a human.",)

    @staticmethod
    def prefer(candidate: dict[str, Any], current: dict[str, Any]) -> int:
        """The per-shape family default first, then full numerics closest to the current tiling."""
        if not candidate:
            return -1
        return (10 if _reduced(candidate) else 0) + sum(candidate.get(k) != v for k, v in current.items())

    def accept(self, p: Probe) -> bool:
        return p.ok and not _reduced(p.config)

    def culprits(self, ctx, probes: list[Probe]) -> list[Probe]:
        """Calls on reduced numerics, calls below their kernel gate, and calls measurably less accurate than their
        family's default config on the same probe inputs: an error small enough to pass one kernel's gate still
        compounds over dozens of layers."""

        out = []
        for p in probes:
            if _reduced(p.config) or not p.ok:
                out.append(p)
                continue
            if not p.call.config:
                continue  # already the family default
            rows, context = stage_rows(p.call.stage, ctx.settings.gate_prompt_len)
            ref = probe(ctx.spec, p.call, rows, context, config={}, seed=ctx.settings.seed, tile=False)
            err, ref_err = 1.0 - p.measurements.get("pearson", 0.0), 1.0 - ref.measurements.get("pearson", 0.0)
            if err > PRECISION_REGRESSION * ref_err + PRECISION_FLOOR:
                out.append(p)
        return out
