"""Numerical debug skills: NaN/Inf from a kernel, a kernel wrong on massive activations, error growing with depth."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tilepilot.harness.probes import CallRef, Probe, probe, stage_rows
from tilepilot.skills.classify import ERROR_GROWS_WITH_DEPTH, GOOD_COSINE, MASSIVE_ACTIVATION_ROWS, NAN_INF
from tilepilot.skills.debug.activations import (
    ActivationProbe,
    capture_gate_prompt,
    passes_on_activations,
    probe_activations,
)
from tilepilot.skills.debug.common import REDUCED_NUMERICS, ReconfigureSkill, reduced_fields, resume_commands

# A call counts as less accurate than its family default when its probe's 1 - Pearson exceeds the default's by
# this factor plus a floor (both far above run-to-run identity: probes are seeded, so equal configs match exactly).
PRECISION_REGRESSION = 10.0
PRECISION_FLOOR = 1e-6


class FixNanInf(ReconfigureSkill):
    name = "fix-nan-inf"
    signature = NAN_INF
    description = (
        "Finds the kernel instance whose output contains NaN or Inf by probing each call of the plan alone, first on "
        "seeded inputs, then on the model's own activations (the oracle's captures of the gate prompt, layer by "
        "layer: large activations overflow a narrow store that unit-scale inputs never reach), and switches it to "
        "the smallest config change (one named option, e.g. store fp16 -> bf16), else the family default, whose "
        "probe is finite and passes its kernel gate on both. Use when a gate reports non-finite values."
    )
    purpose = "Localizes a NaN/Inf to one kernel call and replaces its configuration."
    commands = resume_commands("fix-nan-inf")
    gate_text = "The failed phase re-runs; its gate (which counts non-finite values) decides."
    failure_modes = (
        "No call produces NaN alone, not even on the model's activations (e.g. attention over the KV cache, which "
        "these probes skip): unrepaired, needs a human.",
    )

    def culprits(self, ctx, probes: list[Probe]) -> list[Probe]:
        bad = [p for p in probes if p.measurements.get("nonfinite", 0) > 0]
        if bad:
            return bad
        self._captures = capture_gate_prompt(ctx)
        hits = {(a.call.stage, a.call.op) for a in probe_activations(ctx, self._captures) if a.nonfinite}
        return [p for p in probes if (p.call.stage, p.call.op) in hits]

    def also(self, ctx) -> Callable[[CallRef, dict[str, Any]], bool] | None:
        caps = getattr(self, "_captures", None)
        if caps is None:
            return None
        return lambda call, cfg: passes_on_activations(ctx, caps, call, cfg)


def _massive_rows_good(ap: ActivationProbe) -> bool:
    """Every row carrying a massive activation agrees with the oracle (and the call is finite)."""
    return ap.nonfinite == 0 and all(ap.row_cosine[i] >= GOOD_COSINE for i in ap.massive if i < len(ap.row_cosine))


class FixMassiveActivations(ReconfigureSkill):
    name = "fix-massive-activations"
    signature = MASSIVE_ACTIVATION_ROWS
    description = (
        "Finds the kernel instances that, run alone on the model's own activations (the oracle's captures of the "
        "gate prompt, layer by layer), are wrong on the tokens carrying a massive activation (one channel 10-1000x "
        "the others, as trained models have at the first token) and right elsewhere, e.g. an RMSNorm whose sum of "
        "squares accumulates in fp16 and overflows there, and switches each to the smallest config change (one named "
        "option: acc fp16 -> fp32), else the family default, that is right on those rows too. Use when the "
        "classifier reports massive-activation-rows-wrong."
    )
    purpose = "Repairs kernels whose narrow internal types cannot hold a trained model's massive activations."
    commands = resume_commands("fix-massive-activations")
    gate_text = "The failed phase re-runs; its gate (logits cosine, KL, per-layer cosine) decides."
    failure_modes = (
        "No call is wrong on the massive rows alone (the error comes from attention over the KV cache, which these "
        "probes skip, or from the host): unrepaired, needs a human.",
    )

    def culprits(self, ctx, probes: list[Probe]) -> list[Probe]:
        """Calls wrong on a massive row of some layer (decode calls probed at those rows only: the rest is what the
        seeded probes already passed)."""
        self._captures = capture_gate_prompt(ctx)
        aps = probe_activations(ctx, self._captures, decode_rows="massive")
        hits = {(a.call.stage, a.call.op) for a in aps if not _massive_rows_good(a)}
        return [p for p in probes if (p.call.stage, p.call.op) in hits]

    def also(self, ctx) -> Callable[[CallRef, dict[str, Any]], bool] | None:
        caps = self._captures
        return lambda call, cfg: passes_on_activations(ctx, caps, call, cfg, check=_massive_rows_good)


def _reduced(config: dict[str, Any]) -> bool:
    return bool(reduced_fields(config))


class FixErrorGrowth(ReconfigureSkill):
    name = "fix-error-growth"
    signature = ERROR_GROWS_WITH_DEPTH
    description = (
        "Restores full-precision numerics on every call whose config computes in a narrower type (block-FP16 "
        "operands, bf16 partial sums, a residual or activation stored in fp8/fp16 instead of bf16, bf16 RoPE "
        "angles), changing only that option when it suffices, and re-configures any call whose probe misses its "
        "kernel gate or is measurably less accurate than its family default. Use when per-layer cosine (or, on a "
        "trained model whose massive activations dominate it, each layer's lowest token cosine) falls steadily with "
        "depth while the first layer is right."
    )
    purpose = "Stops small per-layer errors from compounding into a failing model."
    commands = resume_commands("fix-error-growth")
    gate_text = "The failed phase re-runs; per-layer cosine and final-logit cosine decide."
    failure_modes = ("Every kernel already at full precision and passing alone: unrepaired, needs a human.",)

    @staticmethod
    def prefer(candidate: dict[str, Any], current: dict[str, Any]) -> float:
        """The smallest change first: one precision option switched (e.g. store fp8 -> bf16), then the per-shape
        family default, then full numerics closest to the current tiling."""
        if not candidate:
            return 1
        diff = [k for k, v in current.items() if candidate.get(k) != v]
        if len(diff) == 1 and diff[0] in REDUCED_NUMERICS:
            return 0
        return 2 + (10 if _reduced(candidate) else 0) + len(diff)

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
