"""Move host (CPU) steps onto the NPU: decode attention, KV-cache writes and the LM head.

The paper moved its LM head from the CPU (258 ms) to an NPU GEMV (13.5 ms) but kept decode attention on
the CPU (reference/xdna2.md). Whether attention belongs on the array here is for the timing model and
the gate to decide: each move is a separate proposal, kept only if faster and still correct.
"""

from __future__ import annotations

from collections.abc import Iterator

from tilepilot.model.graph import block_graph
from tilepilot.plan.builtin import npu_family
from tilepilot.plan.plan import apply_kv_cache
from tilepilot.skills.base import SkillInput
from tilepilot.skills.optimize.common import PlanOptimization, Proposal, clone
from tilepilot.skills.optimize.host import _GATE

# Op kinds this skill moves, in the order tried: KV writes go with attention (the cache lives on the device);
# a CPU group is moved only if every op in it is of the move's kinds.
_MOVES = (("attention", ("kv_write", "attention")), ("LM head", ("lm_head", "final_norm")))


def _to_npu(plan, stage: str, kinds: tuple[str, ...]):
    """A copy of ``plan`` with every CPU group of ``stage`` whose ops are all of ``kinds`` moved to the NPU."""

    graph = block_graph(plan.model_spec())
    new = clone(plan)
    moved = []
    for g in new.stage(stage).groups():
        if g.where != "cpu" or not all(graph.node(c.op).kind in kinds for c in g.calls):
            continue
        g.where = "npu"
        for c in g.calls:
            c.family = npu_family(graph.node(c.op), stage)
            c.config = {}
        moved.append(g.name)
    return (apply_kv_cache(new), moved) if moved else (None, [])


class AttentionAndLmHeadOnNpu(PlanOptimization):
    name = "attention-and-lm-head-on-npu"
    description = (
        "Moves decode attention (with the KV-cache writes) and the LM head from the host CPU onto NPU kernels "
        "(decode attention over the device KV cache; vocab-partitioned LM-head GEMV). Use when the plan still runs "
        "attention, KV writes or the LM head on the CPU."
    )
    purpose = "Takes the remaining host compute off the critical path, which the paper could only do for the LM head."
    commands = ("tilepilot skills run attention-and-lm-head-on-npu WORKSPACE --json",)
    gate_text = _GATE
    inputs = (SkillInput("workspace", "a deployment workspace whose full-model gate passed (phase 3)"),)
    failure_modes = (
        "A wrong vocab partition of the LM head shows as one bad partition: `fix-lm-head-partition` repairs it.",
        "Decode attention reading a stale KV cache shows as correct prefill then wrong decode steps.",
    )

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        for label, kinds in _MOVES:
            new, moved = _to_npu(ctx.plan, stage, kinds)
            if new is not None:
                yield Proposal(new, f"{stage} {label} on the NPU (groups {', '.join(moved)})")
