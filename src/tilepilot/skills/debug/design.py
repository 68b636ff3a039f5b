"""Design-rule debug skills: tile memory overflow, and merged launches whose arguments do not bind."""

from __future__ import annotations

from tilepilot.harness.probes import Probe, group_checks
from tilepilot.plan.plan import DATA_FIELDS, KernelGroup
from tilepilot.skills.base import DebugSkill, SkillResult
from tilepilot.skills.classify import MERGED_LAUNCH_ARGUMENT_MISMATCH, TILE_MEMORY_OVERFLOW
from tilepilot.skills.debug.common import WS_INPUT, ReconfigureSkill, resume_commands
from tilepilot.skills.optimize.common import clone

MEMORY_CODES = ("L1_OVERFLOW", "L2_OVERFLOW")


class FixTileMemoryOverflow(ReconfigureSkill):
    name = "fix-tile-memory-overflow"
    signature = TILE_MEMORY_OVERFLOW
    description = (
        "Re-tiles every kernel instance the validator rejects for compute-tile (64 KiB) or memory-tile (512 KiB) "
        "overflow, taking the family default or the first candidate that validates and passes its probe at every "
        "size the deployment runs. Use when a phase fails with L1_OVERFLOW or L2_OVERFLOW."
    )
    purpose = "Brings buffers x depth + locals back under the tile memory the hardware has."
    commands = resume_commands("fix-tile-memory-overflow")
    gate_text = "The failed phase re-runs; the validator and the kernel gate decide."
    failure_modes = ("No candidate fits: the shape needs a different family or padding; needs a human.",)

    def culprits(self, ctx, probes: list[Probe]) -> list[Probe]:
        return [p for p in probes if any(c in MEMORY_CODES for c in p.codes)]


class FixMergedLaunchArguments(DebugSkill):
    name = "fix-merged-launch-arguments"
    signature = MERGED_LAUNCH_ARGUMENT_MISMATCH
    description = (
        "Rebuilds every merged (multi-launch) group whose tensor bindings do not match: first gives the calls the "
        "mismatch names their family default configs (which do not pad; the weight format kept), and if a binding "
        "still mismatches, splits the group before the launch it names. Use when a phase fails with GROUP_BINDING."
    )
    purpose = "Repairs the argument-order / shape mismatches the paper's authors hit when merging launches."
    inputs = (WS_INPUT,)
    commands = resume_commands("fix-merged-launch-arguments")
    gate_text = "The failed phase re-runs; the group binding check and the kernel gate decide."
    failure_modes = ("A single-launch group still fails to bind: not a merge problem; needs a human.",)

    def run(self, ctx) -> SkillResult:

        n = ctx.settings.gate_prompt_len
        bad = [g for g in group_checks(ctx.plan, ctx.spec, n) if not g.ok]
        if not bad:
            return self.result("unrepaired", "every merged group binds; the GROUP_BINDING came from elsewhere")
        plan = clone(ctx.plan)
        changes = []
        for g in bad:  # step 1: default configs for the calls the mismatch names (every call when it names none)
            for grp in plan.stage(g.stage).block:
                if grp.name == g.group:
                    for c in _named(grp, g.message) or grp.calls:
                        kept = {k: v for k, v in c.config.items() if k in DATA_FIELDS}
                        if c.config != kept:
                            changes.append(f"{g.stage}/{c.op}: config reset to the family default")
                            c.config = kept
        still = [x for x in group_checks(plan, ctx.spec, n) if not x.ok]
        for x in still:  # step 2: split what still does not bind before the launch it names, else into single ops
            st = plan.stage(x.stage)
            i = next(k for k, grp in enumerate(st.block) if grp.name == x.group)
            parts = _split_before(st.block[i], _named(st.block[i], x.message))
            st.block[i : i + 1] = parts
            changes.append(f"{x.stage}/{x.group}: split into {len(parts)} groups")
        remaining = [x for x in group_checks(plan, ctx.spec, n) if not x.ok]
        evidence = {"groups": [f"{g.stage}/{g.group}: {g.message}" for g in bad], "changes": changes}
        if remaining:
            return self.result("unrepaired", f"{len(remaining)} group(s) still do not bind", evidence=evidence)
        ctx.save_plan(plan)
        return self.result("repaired", "; ".join(changes), evidence=evidence)


def _named(grp: KernelGroup, message: str) -> list:
    """The group's calls a binding failure names (``op.tensor`` in its message)."""
    return [c for c in grp.calls if f"{c.op}." in message]


def _split_before(grp: KernelGroup, named: list) -> list[KernelGroup]:
    """``grp`` cut before the last call a failure names (its consumer), the merged runs wholly inside each part kept;
    single-op groups when it names none or the first call. A one-dispatch pass is joined into one group, so cutting
    the whole layer into single ops would lose every merge and fold that binds."""
    at = max((grp.calls.index(c) for c in named), default=0)
    if at == 0:
        return [KernelGroup(f"{grp.name}/{c.op}", [c], "npu") for c in grp.calls]
    out = []
    for suffix, calls in (("a", grp.calls[:at]), ("b", grp.calls[at:])):
        ops = {c.op for c in calls}
        out.append(KernelGroup(f"{grp.name}/{suffix}", calls, grp.where, [m for m in grp.merged if set(m) <= ops]))
    return out
