"""Failure-signature classifier: turns a failed gate or a validator error into the name of a debug skill.

Debug skills are chosen by what the numbers look like, never by which model or phase failed, so the same
repair applies to any family. The classifier reads only the ``evidence`` a phase records next to its
gate (lists of cosines per layer, per position, per vocab partition, per call, per capture point, and
validator error codes); it is a pure function, so it is tested on synthetic evidence without running a
model. Rules are checked from the most specific cause to the most general one: a hard validator error
explains everything after it, a NaN explains any cosine, a stale buffer explains a later wrong call, etc.

Evidence keys (all optional; a missing key simply rules its signatures out):
  validator_codes: list[str]           stable codes from ``npu.validate`` (e.g. "L1_OVERFLOW")
  nonfinite: int                       NaN/Inf values seen in any NPU output
  layer_cosine: list[float]            per-layer output cosine vs the oracle, layer 0 first
  position_cosine: list[float]         per-position cosine of the last layer's output (prompt order)
  partition_cosine: list[float]        final-logit cosine per LM-head vocab partition
  call_cosine: list[float]             final-logit cosine of consecutive runner calls on different inputs
  rope_position_cosine: list[float]    per-position cosine of the plan's RoPE kernel, run alone on a probe
                                       input, vs the oracle's RoPE (same x, the oracle's fp32 table)
  layer_position_cosine: list[float]   per layer, the lowest per-token cosine of the output vs the oracle (a trained
                                       model's massive activations dominate ``layer_cosine``, not this)
  massive_row_cosine: list[dict]       per prefill call run alone on the oracle's captured inputs, wherever rows carry
                                       a massive activation: {call, rows, massive_min, others_min} (lowest per-row
                                       cosine on those rows and on the others)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Classification bounds. "Good" reuses the phase-2 block gate (cosine >= 0.99, DESIGN.md section 6 /
# xdna2.md "Numerical gates"): a part at or above it is taken as correct, a part below it as wrong. (The
# phase-3 per-layer floor of 0.85 is too lenient to localize a fault in a single capture.)
GOOD_COSINE = 0.99
# Error growing with depth: the first layer is good and cosine falls by at least this much from the
# first to the last layer, monotonically within noise (a drop of 0.002 between layers is tolerated).
DEPTH_DROP_MIN = 0.01
DEPTH_NOISE = 0.002
# Late positions only: this fraction of the prompt at the start is good, and at least this fraction of the rest
# (and two positions) is bad.
EARLY_FRACTION = 0.25
LATE_BAD_FRACTION = 0.25

# Signature names; each is the ``signature`` of exactly one debug skill.
NAN_INF = "nan-inf"
TILE_MEMORY_OVERFLOW = "tile-memory-overflow"
MERGED_LAUNCH_ARGUMENT_MISMATCH = "merged-launch-argument-mismatch"
STALE_AFTER_FIRST_CALL = "stale-after-first-call"
ONE_PARTITION_WRONG = "one-partition-wrong"
ROPE_LAYOUT_MISMATCH = "rope-layout-mismatch"
LATE_POSITIONS_ONLY = "late-positions-only"
ERROR_GROWS_WITH_DEPTH = "error-grows-with-depth"
MASSIVE_ACTIVATION_ROWS = "massive-activation-rows-wrong"

SIGNATURES = (
    TILE_MEMORY_OVERFLOW,
    MERGED_LAUNCH_ARGUMENT_MISMATCH,
    NAN_INF,
    STALE_AFTER_FIRST_CALL,
    ONE_PARTITION_WRONG,
    ROPE_LAYOUT_MISMATCH,
    MASSIVE_ACTIVATION_ROWS,
    LATE_POSITIONS_ONLY,
    ERROR_GROWS_WITH_DEPTH,
)

_MEMORY_CODES = ("L1_OVERFLOW", "L2_OVERFLOW")
_BINDING_CODES = ("GROUP_BINDING",)


@dataclass(frozen=True)
class Diagnosis:
    """The signature found and the numbers that made the classifier pick it."""

    signature: str | None
    reasons: list[str] = field(default_factory=list)

    @property
    def matched(self) -> bool:
        return self.signature is not None


def _good(x: float) -> bool:
    return x == x and x >= GOOD_COSINE  # NaN compares false: never good


def _check_validator(ev: dict[str, Any]) -> Diagnosis | None:
    codes = [str(c) for c in ev.get("validator_codes") or []]
    mem = [c for c in codes if c in _MEMORY_CODES]
    if mem:
        return Diagnosis(TILE_MEMORY_OVERFLOW, [f"validator reported {', '.join(sorted(set(mem)))}"])
    bind = [c for c in codes if c in _BINDING_CODES]
    if bind:
        return Diagnosis(MERGED_LAUNCH_ARGUMENT_MISMATCH, ["validator reported GROUP_BINDING in a merged launch"])
    return None


def _check_nonfinite(ev: dict[str, Any]) -> Diagnosis | None:
    n = int(ev.get("nonfinite") or 0)
    if n > 0:
        return Diagnosis(NAN_INF, [f"{n} NaN/Inf values in NPU outputs"])
    return None


def _check_stale(ev: dict[str, Any]) -> Diagnosis | None:
    calls = list(ev.get("call_cosine") or [])
    if len(calls) >= 2 and _good(calls[0]) and not all(_good(c) for c in calls[1:]):
        return Diagnosis(
            STALE_AFTER_FIRST_CALL,
            [f"first call cosine {calls[0]:.4f} is good, later calls {[round(c, 4) for c in calls[1:]]} are not"],
        )
    return None


def _check_partition(ev: dict[str, Any]) -> Diagnosis | None:
    parts = list(ev.get("partition_cosine") or [])
    if len(parts) < 2:
        return None
    bad = [i for i, c in enumerate(parts) if not _good(c)]
    if len(bad) == 1:
        i = bad[0]
        return Diagnosis(
            ONE_PARTITION_WRONG,
            [f"LM-head partition {i} of {len(parts)} has cosine {parts[i]:.4f}; the others are >= {GOOD_COSINE}"],
        )
    return None


def _check_rope_layout(ev: dict[str, Any]) -> Diagnosis | None:
    pos = list(ev.get("rope_position_cosine") or [])
    if len(pos) < 2:
        return None
    # RoPE at position 0 is the identity, so a layout mismatch (pairs rotated in the wrong arrangement)
    # leaves position 0 right and breaks position 1 at once; a frequency error instead grows slowly.
    if _good(pos[0]) and not _good(pos[1]):
        return Diagnosis(
            ROPE_LAYOUT_MISMATCH,
            [f"RoPE kernel alone: position 0 good ({pos[0]:.4f}), position 1 already wrong ({pos[1]:.4f})"],
        )
    return None


def _check_massive_rows(ev: dict[str, Any]) -> Diagnosis | None:
    """A kernel that, run alone on the model's own activations, is wrong on exactly the rows carrying a massive
    activation and right on every other row (a narrow accumulator overflowing on one huge channel)."""
    for entry in ev.get("massive_row_cosine") or []:
        lo, rest = float(entry.get("massive_min", 1.0)), float(entry.get("others_min", 0.0))
        if not _good(lo) and _good(rest):
            return Diagnosis(
                MASSIVE_ACTIVATION_ROWS,
                [
                    f"{entry.get('call')} alone on the model's activations: rows {entry.get('rows')} (massive "
                    f"activations) cosine {lo:.4f}, every other row >= {rest:.4f}"
                ],
            )
    return None


def late_positions_bad(cosines: list[float]) -> int | None:
    """The first bad position when ``cosines`` (one per position) show the late-positions pattern, else None.

    The first ``EARLY_FRACTION`` of positions must all be good and at least ``LATE_BAD_FRACTION`` of the rest
    (and two positions) bad: a fault that depends on position spoils a run of positions; one outlier is not that
    signature. Shared by the classifier (whole-model evidence) and the debug skill (one kernel probed alone).
    """
    if len(cosines) < 4:
        return None
    n_early = max(1, int(len(cosines) * EARLY_FRACTION))
    early, late = cosines[:n_early], cosines[n_early:]
    n_bad = sum(not _good(c) for c in late)
    if not (all(_good(c) for c in early) and n_bad >= max(2, int(len(late) * LATE_BAD_FRACTION))):
        return None
    return n_early + next(i for i, c in enumerate(late) if not _good(c))


def _check_late_positions(ev: dict[str, Any]) -> Diagnosis | None:
    """Late positions wrong in the last layer's output, or in the RoPE kernel alone (a table whose angles lose
    precision as positions grow: right early, wrong late; the layout rule above has already ruled out position 1)."""
    for key, what in (("position_cosine", "positions"), ("rope_position_cosine", "RoPE kernel alone: positions")):
        pos = list(ev.get(key) or [])
        first_bad = late_positions_bad(pos)
        if first_bad is None:
            continue
        n_early = max(1, int(len(pos) * EARLY_FRACTION))
        return Diagnosis(
            LATE_POSITIONS_ONLY,
            [f"{what} 0..{n_early - 1} good, first bad position {first_bad} (cosine {pos[first_bad]:.4f})"],
        )
    return None


def _check_depth(ev: dict[str, Any]) -> Diagnosis | None:
    """Whole-output layer cosine, else the per-layer lowest token cosine (which a trained model's massive
    activations do not dominate), good at layer 0 and falling steadily to a bad last layer."""
    for key, what in (("layer_cosine", "layer cosine"), ("layer_position_cosine", "lowest token cosine per layer")):
        layers = list(ev.get(key) or [])
        if len(layers) < 2 or any(c != c for c in layers):
            continue
        drop = layers[0] - layers[-1]
        steady = all(b <= a + DEPTH_NOISE for a, b in zip(layers[:-1], layers[1:], strict=True))
        if _good(layers[0]) and drop >= DEPTH_DROP_MIN and steady and not _good(layers[-1]):
            return Diagnosis(
                ERROR_GROWS_WITH_DEPTH,
                [f"{what} falls from {layers[0]:.4f} (layer 0) to {layers[-1]:.4f} (layer {len(layers) - 1})"],
            )
    return None


_RULES = (
    _check_validator,
    _check_nonfinite,
    _check_stale,
    _check_partition,
    _check_rope_layout,
    _check_massive_rows,
    _check_late_positions,
    _check_depth,
)


def classify(evidence: dict[str, Any]) -> Diagnosis:
    """The first matching signature, most specific first; ``Diagnosis(None)`` when nothing matches."""
    for rule in _RULES:
        d = rule(evidence)
        if d is not None:
            return d
    return Diagnosis(None, ["no known failure signature matches the recorded evidence"])
