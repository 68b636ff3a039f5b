"""Host-side optimization skills: what the host does around the dispatches, not the kernels themselves.

The paper's authors attribute a large share of their speed-up to exactly these (reference/xdna2.md:
preloading per-layer weights -240 ms, skipping redundant writes -150 ms, seq-first layout, no host
transposes). Each flips one ``HostPolicy`` field; whether it helps is for the timing model to say.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from tilepilot.skills.base import SkillInput
from tilepilot.skills.optimize.common import PlanOptimization, Proposal, clone

_WS = SkillInput("workspace", "a deployment workspace whose full-model gate passed (phase 3)")


def _cmd(name: str) -> tuple[str, ...]:
    return (f"tilepilot skills run {name} WORKSPACE --json", "tilepilot bench WORKSPACE --plan deployed --json")


_GATE = (
    "Kept only if the modeled time of the targeted stage is strictly lower, the other stage is not slower, and the "
    "full-model gate (final-logit cosine, per-layer cosine without a cliff, greedy 32-token check) still passes."
)


class _HostFlag(PlanOptimization):
    """Set one host-policy field to a value; subclasses name the field, the value and the sentence."""

    abstract = True
    field_name: ClassVar[str] = ""
    value: ClassVar[object] = None
    change_text: ClassVar[str] = ""
    gate_text = _GATE
    inputs = (_WS,)

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        if getattr(plan.host, self.field_name) == self.value:
            return
        new = clone(plan)
        setattr(new.host, self.field_name, self.value)
        yield Proposal(new, self.change_text)


class PreloadStaticWeights(_HostFlag):
    name = "preload-static-weights"
    description = (
        "Uploads every layer's weights to device buffers once at load time instead of syncing them before every "
        "call. Use when the plan's host policy still syncs weights per call (weights=per_call)."
    )
    purpose = "Removes the per-call weight upload, the largest host cost of an unoptimized plan."
    commands = _cmd("preload-static-weights")
    failure_modes = (
        "A buffer wrongly treated as static goes stale (correct first call, wrong later): the "
        "`fix-stale-buffer` debug skill catches it.",
    )
    field_name = "weights"
    value = "preloaded"
    change_text = "weights preloaded once instead of synced per call"


class SkipRedundantWrites(_HostFlag):
    name = "skip-redundant-writes"
    description = (
        "Turns on dirty tracking so inputs whose device copy is current are not rewritten and values produced and "
        "consumed on the device never round-trip through the host. Use when skip_unchanged_writes is off."
    )
    purpose = "Cuts host<->device syncs of activations and static inputs between dispatches."
    commands = _cmd("skip-redundant-writes")
    failure_modes = (
        "If a changed input were treated as unchanged the output would go stale; the gate's second-call "
        "check and `fix-stale-buffer` catch it.",
    )
    field_name = "skip_unchanged_writes"
    value = True
    change_text = "unchanged inputs and device-resident intermediates no longer re-synced"


class ReuseBuffers(PlanOptimization):
    name = "reuse-buffers"
    description = (
        "Allocates each device buffer once and reuses it across layers and calls, with host and device mapping the "
        "same pages (zero-copy). Use when the plan allocates per dispatch or copies on every sync."
    )
    purpose = "Removes per-dispatch buffer allocation and the copy part of every remaining sync."
    commands = _cmd("reuse-buffers")
    gate_text = _GATE
    inputs = (_WS,)
    failure_modes = ("None known on this target: both policies change modeled time only.",)

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        if not plan.host.reuse_buffers:
            new = clone(plan)
            new.host.reuse_buffers = True
            yield Proposal(new, "device buffers allocated once and reused")
        if not plan.host.zero_copy:
            new = clone(ctx.plan)
            new.host.zero_copy = True
            new.host.reuse_buffers = True
            yield Proposal(new, "zero-copy mapped buffers")


class AlignLayouts(PlanOptimization):
    name = "align-layouts"
    description = (
        "Keeps activations sequence-first end to end so no host transposes run around attention (the paper's "
        "seq-first layout). Padding to tile multiples needs no plan change here: family default configs already "
        "pad shapes that do not tile (GEMM, eltwise), and tuned configs are checked legal at every prompt length. "
        "Use when the plan's layout is host_transpose."
    )
    purpose = "Removes the host transposes around attention that an unaligned layout forces."
    commands = _cmd("align-layouts")
    gate_text = _GATE
    inputs = (_WS,)
    failure_modes = (
        "A kernel that still expects head-first data would read the wrong layout: the gate's per-position check "
        "shows it.",
    )

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        if plan.host.layout != "seq_first":
            new = clone(plan)
            new.host.layout = "seq_first"
            yield Proposal(new, "seq-first layout, no host transposes")
