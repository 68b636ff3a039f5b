"""The one list of skills: phases in chain order, optimizations in the order they are tried, debug skills.

The order of optimization skills is deliberate: structural changes that remove whole dispatches or host
work come first (merging, preloading, moving work onto the NPU), per-kernel tuning last, because tuning a
kernel that a later merge replaces would be wasted work. The registry is built by importing the modules
named here (no import-time side effects elsewhere, no mutable global registry).
"""

from __future__ import annotations

import importlib
from functools import cache

from tilepilot.skills.base import DebugSkill, OptimizeSkill, PhaseSkill, Skill

# module -> class names, in order.
_PHASES = (
    ("tilepilot.skills.phases.oracle", "BuildCpuOracle"),
    ("tilepilot.skills.phases.kernels", "KernelValidation"),
    ("tilepilot.skills.phases.block", "SingleBlockValidation"),
    ("tilepilot.skills.phases.model", "FullModelValidation"),
    ("tilepilot.skills.phases.optimization", "PrefillOptimization"),
    ("tilepilot.skills.phases.optimization", "DecodeOptimization"),
    ("tilepilot.skills.phases.finalize", "FinalizeAndLearn"),
    ("tilepilot.skills.phases.evaluate", "IndependentEvaluator"),
)
_OPTIMIZERS = (
    ("tilepilot.skills.optimize.host", "PreloadStaticWeights"),
    ("tilepilot.skills.optimize.host", "SkipRedundantWrites"),
    ("tilepilot.skills.optimize.host", "ReuseBuffers"),
    ("tilepilot.skills.optimize.host", "AlignLayouts"),
    ("tilepilot.skills.optimize.placement", "AttentionAndLmHeadOnNpu"),
    ("tilepilot.skills.optimize.fusion", "FuseBiasAndQkNorm"),
    ("tilepilot.skills.optimize.fusion", "MergeLaunches"),
    ("tilepilot.skills.optimize.decode", "OneDispatchDecode"),
    ("tilepilot.skills.optimize.decode", "WindowedKvReadback"),
    ("tilepilot.skills.optimize.decode", "MultiMatrixLaunches"),
    ("tilepilot.skills.optimize.decode", "RmsNormPrologue"),
    ("tilepilot.skills.optimize.decode", "ResidualEpilogue"),
    ("tilepilot.skills.optimize.decode", "SwigluEpilogue"),
    ("tilepilot.skills.optimize.decode", "QkNormIntoRope"),
    ("tilepilot.skills.optimize.decode", "RopeEpilogue"),
    ("tilepilot.skills.optimize.decode", "KvWriteIntoRope"),
    ("tilepilot.skills.optimize.weights", "DequantizedPrefill"),
    ("tilepilot.skills.optimize.kernels", "VectorizedVariants"),
    ("tilepilot.skills.optimize.kernels", "TileTuning"),
    ("tilepilot.skills.optimize.decode", "ResidentDecode"),
    ("tilepilot.skills.optimize.decode", "WeightPrefetch"),
)
_DEBUGGERS = (
    ("tilepilot.skills.debug.numerics", "FixNanInf"),
    ("tilepilot.skills.debug.numerics", "FixErrorGrowth"),
    ("tilepilot.skills.debug.numerics", "FixMassiveActivations"),
    ("tilepilot.skills.debug.positions", "FixLatePositions"),
    ("tilepilot.skills.debug.positions", "FixRopeLayout"),
    ("tilepilot.skills.debug.partitions", "FixPartition"),
    ("tilepilot.skills.debug.buffers", "FixStaleBuffer"),
    ("tilepilot.skills.debug.design", "FixTileMemoryOverflow"),
    ("tilepilot.skills.debug.design", "FixMergedLaunchArguments"),
)


def _load(entries: tuple[tuple[str, str], ...]) -> tuple[type[Skill], ...]:
    return tuple(getattr(importlib.import_module(mod), cls) for mod, cls in entries)


@cache
def phases() -> tuple[type[PhaseSkill], ...]:
    found = _load(_PHASES)
    assert [p.phase for p in found] == list(range(len(found))), "phases must be numbered 0..n-1 in order"
    return found  # type: ignore[return-value]


@cache
def optimizers() -> tuple[type[OptimizeSkill], ...]:
    return _load(_OPTIMIZERS)  # type: ignore[return-value]


@cache
def debuggers() -> tuple[type[DebugSkill], ...]:
    return _load(_DEBUGGERS)  # type: ignore[return-value]


def all_skills() -> tuple[type[Skill], ...]:
    return phases() + optimizers() + debuggers()


def get(name: str) -> type[Skill]:
    for s in all_skills():
        if s.name == name:
            return s
    raise KeyError(name)


def debugger_for(signature: str) -> type[DebugSkill] | None:
    for d in debuggers():
        if d.signature == signature:
            return d
    return None
