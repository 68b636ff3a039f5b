"""Fewer dispatches: fuse the projection group (with QKV bias and per-head Q/K norm) and merge launches.

Each dispatch costs a launch (reference/xdna2.md: ~45-60 us for a trivial XRT kernel, ~450 us per
single-shot host dispatch) that small per-layer kernels cannot amortise; the paper blamed exactly this,
and its inability to fuse QKV bias and Q/K norm, for its weak Qwen results. Merging is greedy over
adjacent NPU groups: a merge is kept in the proposal only if the merged group can still be built (the
validator accepts the multi-launch group) and the modeled time of the stage drops.
"""

from __future__ import annotations

from collections.abc import Iterator

from tilepilot.plan.plan import KernelGroup
from tilepilot.skills.base import SkillInput
from tilepilot.skills.optimize.common import STAGE_METRIC, PlanOptimization, Proposal, clone
from tilepilot.skills.optimize.host import _GATE

_WS = SkillInput("workspace", "a deployment workspace whose full-model gate passed (phase 3)")

# The ops of the projection group: Q/K/V projections plus the optional bias and per-head norm nodes.
PROJECTION_OPS = ("q_proj", "k_proj", "v_proj", "q_bias", "k_bias", "v_bias", "q_norm", "k_norm")
OPTIONAL_PROJECTION_OPS = ("q_bias", "k_bias", "v_bias", "q_norm", "k_norm")


def merge_groups(groups: list, lo: int, hi: int) -> list:
    """Groups ``lo..hi`` (inclusive, all on the NPU) replaced by one group holding their calls in order."""

    part = groups[lo : hi + 1]
    assert all(g.where == "npu" for g in part), "only NPU groups can share a dispatch"
    calls = [c for g in part for c in g.calls]
    name = part[0].name if len(part) == 1 else f"{calls[0].op}..{calls[-1].op}"
    return groups[:lo] + [KernelGroup(name=name, calls=calls, where="npu")] + groups[hi + 1 :]


def _unique_names(groups: list) -> None:
    seen: dict[str, int] = {}
    for g in groups:
        if g.name in seen:
            seen[g.name] += 1
            g.name = f"{g.name}#{seen[g.name]}"
        else:
            seen[g.name] = 0


class FuseBiasAndQkNorm(PlanOptimization):
    name = "fuse-bias-and-qk-norm"
    description = (
        "Puts the QKV bias adds and the per-head Q/K RMSNorm into the same dispatch as the Q/K/V projections, so "
        "Qwen2-style (bias) and Qwen3-style (Q/K norm) models get the fused projection group Llama gets. Use when "
        "the model has QKV bias or Q/K norm and those ops still run in separate dispatches."
    )
    purpose = (
        "Closes the gap the paper could not: its Qwen deployments lost speed because bias and Q/K norm forced extra "
        "dispatches or host work."
    )
    commands = ("tilepilot skills run fuse-bias-and-qk-norm WORKSPACE --json",)
    gate_text = _GATE
    inputs = (_WS,)
    failure_modes = (
        "Arguments wired in the wrong order inside the merged launch: the validator's GROUP_BINDING error, repaired "
        "by `fix-merged-launch-arguments`.",
    )

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        new = clone(ctx.plan)
        block = new.stage(stage).block
        present = [c.op for g in block for c in g.calls if c.op in OPTIONAL_PROJECTION_OPS]
        if not present:
            return  # Llama/SmolLM2: nothing to fuse
        idx = [i for i, g in enumerate(block) if any(c.op in PROJECTION_OPS for c in g.calls)]
        lo, hi = min(idx), max(idx)
        if lo == hi:
            return  # already one group
        if any(g.where != "npu" for g in block[lo : hi + 1]):
            return
        merged = merge_groups(block, lo, hi)
        _unique_names(merged)
        new.stage(stage).block[:] = merged
        yield Proposal(new, f"{stage}: projections + {', '.join(present)} in one dispatch")


class MergeLaunches(PlanOptimization):
    name = "merge-launches"
    description = (
        "Greedily merges adjacent NPU kernel groups of a block (and of the head) into multi-launch dispatches, "
        "keeping each merge only if the validator accepts the merged group and the modeled stage time drops. Use "
        "when a stage still has more than one NPU dispatch per layer."
    )
    purpose = "Cuts per-dispatch launch overhead, the dominant cost of small per-layer kernels on the NPU."
    commands = ("tilepilot skills run merge-launches WORKSPACE --json",)
    gate_text = _GATE
    inputs = (_WS,)
    failure_modes = (
        "A merged group whose bindings mismatch (argument order) fails validation with GROUP_BINDING: "
        "`fix-merged-launch-arguments` rebuilds it.",
        "A merged group that no longer fits tile memory fails with L1_OVERFLOW: `fix-tile-memory-overflow` re-tiles.",
    )

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        """The fastest of: greedy pairwise merging, and two known structures of every NPU run of the block (the
        paper's split around attention, one dispatch per run). Keeping the best of these means the result is
        never slower than the paper-like grouping of the same calls, whichever way the calibration leans."""
        metric = STAGE_METRIC[stage]
        start = clone(ctx.plan)
        try:
            base = float(getattr(ctx.timing(start), metric))
        except Exception:
            return
        found: list[tuple[float, str, object]] = []
        greedy, merges = self._greedy(ctx, start, stage, metric, base)
        if merges:
            found.append((self._time(ctx, greedy, metric), f"{merges} greedy merge(s)", greedy))
        for label, split_attention in (("paper-style split around attention", True), ("one dispatch per run", False)):
            cand = clone(start)
            cand.stage(stage).block = restructure(cand.stage(stage).block, split_attention)
            _unique_names(cand.stage(stage).block)
            if [g.ops for g in cand.stage(stage).block] != [g.ops for g in start.stage(stage).block]:
                found.append((self._time(ctx, cand, metric), label, cand))
        found = [f for f in found if f[0] < base]
        if found:
            t, label, best = min(found, key=lambda f: f[0])
            d = best.dispatches_per_layer(stage)
            yield Proposal(best, f"{stage}: {label}, {d} dispatch(es) per layer")

    @staticmethod
    def _time(ctx, plan, metric: str) -> float:
        try:
            return float(getattr(ctx.timing(plan), metric))
        except Exception:  # a merged group that cannot be built (validator) is never chosen
            return float("inf")

    def _greedy(self, ctx, cur, stage: str, metric: str, best: float):
        merges = 0
        for part in ("block", "head"):
            i = 0
            while True:
                groups = getattr(cur.stage(stage), part)
                if i + 1 >= len(groups):
                    break
                if groups[i].where != "npu" or groups[i + 1].where != "npu":
                    i += 1
                    continue
                cand = clone(cur)
                setattr(cand.stage(stage), part, merge_groups(getattr(cand.stage(stage), part), i, i + 1))
                _unique_names(getattr(cand.stage(stage), part))
                t = self._time(ctx, cand, metric)
                if t < best:
                    cur, best, merges = cand, t, merges + 1  # stay at i: try to absorb the next group too
                else:
                    i += 1
        return cur, merges


def restructure(block: list, split_attention: bool) -> list:
    """Regroup a block's calls: every maximal run of NPU groups becomes one group, or (``split_attention``)
    three groups around the attention call, as the paper's deployment does; CPU groups stay as they are."""

    out: list = []
    run: list = []

    def flush() -> None:
        if not run:
            return
        calls = [c for g in run for c in g.calls]
        pieces = [calls]
        if split_attention:
            at = next((k for k, c in enumerate(calls) if c.family == "attention"), None)
            if at is not None:
                pieces = [calls[:at], calls[at : at + 1], calls[at + 1 :]]
        for piece in pieces:
            if piece:
                name = piece[0].op if len(piece) == 1 else f"{piece[0].op}..{piece[-1].op}"
                out.append(KernelGroup(name=name, calls=list(piece), where="npu"))
        run.clear()

    for g in block:
        if g.where == "npu":
            run.append(g)
        else:
            flush()
            out.append(g)
    flush()
    return out
