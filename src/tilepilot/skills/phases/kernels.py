"""Phase 1, kernel-validation: every kernel instance the plan uses, alone, against its FP32 op.

An instance is a (family, shape, config) as the plan will run it at the gate prompt's length (prefill)
and context (decode). Each one must validate (no hardware-rule violation), reach the phase-1 Pearson
bound (0.999 for matrix kernels, 0.99 otherwise) with no NaN/Inf, and, when small enough for the exact
tile-level executor, agree with it bit for bit. Failing probes leave evidence for the classifier:
validator codes, NaN counts, per-row and per-partition agreement.
"""

from __future__ import annotations

from typing import Any

from tilepilot.gates.gate import Gate, Threshold
from tilepilot.harness.probes import group_checks, probe_plan
from tilepilot.skills.base import PhaseSkill
from tilepilot.skills.phases.common import WORKSPACE_INPUT, finish

SRC_ALL = "DESIGN.md section 6 phase 1: every kernel instance the plan uses passes its kernel gate"
SRC_GROUPS = "DESIGN.md section 4: a multi-launch group's bindings must match (validator GROUP_BINDING)"


def probe_evidence(probes) -> dict[str, Any]:
    """What the failure classifier reads from a set of probes (only failing probes contribute)."""
    bad = [p for p in probes if not p.ok]
    ev: dict[str, Any] = {
        "validator_codes": sorted({c for p in bad for c in p.codes}),
        "nonfinite": int(sum(p.measurements.get("nonfinite", 0) for p in bad)),
        "failing_calls": [p.call.label() for p in bad],
    }
    parts = [p.partition_pearson for p in bad if p.partition_pearson]
    if parts:
        ev["partition_cosine"] = parts[0]
    rope = [p.row_cosine for p in bad if p.call.family == "rope"]
    if rope:
        ev["rope_position_cosine"] = rope[0]
    rows = [p.row_cosine for p in bad if p.call.family != "rope" and len(p.row_cosine) > 1]
    if rows:
        ev["position_cosine"] = rows[0]
    return ev


class KernelValidation(PhaseSkill):
    name = "kernel-validation"
    phase = 1
    description = (
        "Validates every kernel instance the deployment plan uses (family, shape, config at the gate prompt's "
        "length and decode context): hardware-rule validation, the production fast path against the FP32 op "
        "(Pearson >= 0.999 for GEMM/GEMV/LM head, >= 0.99 otherwise, no NaN/Inf) and, on instances small enough, "
        "the tile-level executor equal to the fast path bit for bit. Use after build-cpu-oracle and after any "
        "change of kernel configs."
    )
    purpose = "Catches a wrong or illegal kernel before it is buried inside a block."
    inputs = (WORKSPACE_INPUT,)
    commands = ("tilepilot skills run kernel-validation WORKSPACE --json",)
    gate_text = (
        "Every instance: no validator violation, Pearson >= 0.999 (GEMM, GEMV, LM head; every LM-head partition on "
        "its own) or >= 0.99 (others), no NaN/Inf, tile path == fast path (max abs err 0) where the tile path runs "
        "(<= 4e6 MACs). Max abs and max rel errors are recorded."
    )
    failure_modes = (
        "Tile memory overflow (L1_OVERFLOW) or other validator codes: `fix-tile-memory-overflow` re-tiles.",
        "One LM-head partition wrong: `fix-lm-head-partition` re-partitions.",
        "RoPE rows wrong from position 1: `fix-rope-layout`.",
    )

    def run(self, ctx):

        probes = probe_plan(ctx.workspace.plan, ctx.model.spec, ctx.settings.gate_prompt_len, seed=ctx.settings.seed)
        groups = group_checks(ctx.workspace.plan, ctx.model.spec, ctx.settings.gate_prompt_len)
        failed = [p for p in probes if not p.ok]
        bad_groups = [g for g in groups if not g.ok]
        pearsons = [p.measurements["pearson"] for p in probes if "pearson" in p.measurements]
        m = {
            "instances": float(len(probes)),
            "instances_failed": float(len(failed)),
            "merged_groups": float(len(groups)),
            "merged_groups_failed": float(len(bad_groups)),
            "tile_checked": float(sum(p.tile_checked for p in probes)),
            "min_pearson": min(pearsons) if pearsons else float("nan"),
            "max_rel_err": max((p.measurements.get("max_rel_err", 0.0) for p in probes), default=0.0),
        }
        gate = Gate(
            "phase1-kernel-validation",
            [
                Threshold("instances_failed", "<=", 0, SRC_ALL),
                Threshold("merged_groups_failed", "<=", 0, SRC_GROUPS),
            ],
        )
        report = gate.evaluate(m, details={"instances": [p.to_dict() for p in probes]})
        evidence = probe_evidence(probes)
        evidence["validator_codes"] = sorted({*evidence["validator_codes"], *(c for g in bad_groups for c in g.codes)})
        evidence["failing_groups"] = [
            {"stage": g.stage, "group": g.group, "codes": g.codes, "message": g.message} for g in bad_groups
        ]
        evidence["instances"] = [
            {
                "call": p.call.label(),
                "shape": p.shape,
                "config": p.config,
                "ok": p.ok,
                "tile_checked": p.tile_checked,
                "error": p.error,
                **{k: p.measurements[k] for k in ("pearson", "max_abs_err", "max_rel_err") if k in p.measurements},
            }
            for p in probes
        ]
        summary = (
            f"{len(probes) - len(failed)}/{len(probes)} kernel instances pass (min Pearson {m['min_pearson']:.6f}, "
            f"{int(m['tile_checked'])} checked on the tile path)"
        )
        if groups:
            summary += f"; {len(groups) - len(bad_groups)}/{len(groups)} merged groups bind consistently"
        if failed:
            summary += "; failing: " + ", ".join(f"{p.call.label()}: {p.error or 'gate'}" for p in failed[:4])
        if bad_groups:
            summary += "; failing groups: " + ", ".join(f"{g.stage}/{g.group}: {g.codes}" for g in bad_groups)
        return finish(self, ctx, report, evidence, summary)
