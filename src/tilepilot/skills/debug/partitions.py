"""Partition debug skill: one vocabulary partition of the LM head computes the wrong rows."""

from __future__ import annotations

from tilepilot.harness.probes import Probe
from tilepilot.skills.classify import ONE_PARTITION_WRONG
from tilepilot.skills.debug.common import ReconfigureSkill, resume_commands


class FixPartition(ReconfigureSkill):
    name = "fix-lm-head-partition"
    signature = ONE_PARTITION_WRONG
    description = (
        "Checks every vocabulary partition of the LM head on its own (Pearson per partition, as amd/IRON #83's "
        "0.748 partition showed, the whole-tensor number hides it) and re-partitions the head with a config whose "
        "partitions all pass. Use when one slice of the logits disagrees with the oracle and the rest agree."
    )
    purpose = "Repairs a wrongly offset or stale LM-head partition by changing the partitioning."
    commands = resume_commands("fix-lm-head-partition")
    gate_text = "The failed phase re-runs; per-partition agreement and the final-logit cosine decide."
    failure_modes = ("Every partitioning shows a bad slice: unrepaired (likely wrong head weights), needs a human.",)

    def accept(self, p: Probe) -> bool:
        return p.ok and bool(p.partition_pearson)

    def culprits(self, ctx, probes: list[Probe]) -> list[Probe]:
        return [p for p in probes if p.call.family == "lm_head" and not p.ok]
