"""Position debug skills: errors only at late positions, and a RoPE layout mismatch."""

from __future__ import annotations

from tilepilot.harness.probes import Probe
from tilepilot.skills.classify import GOOD_COSINE, LATE_POSITIONS_ONLY, ROPE_LAYOUT_MISMATCH, late_positions_bad
from tilepilot.skills.debug.common import ReconfigureSkill, resume_commands


def _late_only(rows: list[float]) -> bool:
    return late_positions_bad(list(rows)) is not None


def _all_rows_good(p: Probe) -> bool:
    return p.ok and all(c >= GOOD_COSINE for c in p.row_cosine)


class FixLatePositions(ReconfigureSkill):
    name = "fix-late-positions"
    signature = LATE_POSITIONS_ONLY
    description = (
        "Finds the position-dependent kernel (attention over the KV cache, RoPE) whose output is right for early "
        "positions and wrong for later ones when probed alone, and re-configures it (query/key tiles, rows per "
        "call) until every position passes. Use when only late prompt positions disagree with the oracle."
    )
    purpose = "Repairs tiling that drops or misplaces keys or rows beyond a position."
    commands = resume_commands("fix-late-positions")
    gate_text = "The failed phase re-runs; per-position cosine decides."
    failure_modes = (
        "Every kernel is right at every position alone (e.g. a RoPE frequency table error in the host code): "
        "unrepaired, needs a human.",
    )

    def accept(self, p: Probe) -> bool:
        return _all_rows_good(p)

    def culprits(self, ctx, probes: list[Probe]) -> list[Probe]:
        return [p for p in probes if p.call.family in ("attention", "rope") and (_late_only(p.row_cosine) or not p.ok)]


class FixRopeLayout(ReconfigureSkill):
    name = "fix-rope-layout"
    signature = ROPE_LAYOUT_MISMATCH
    description = (
        "Finds the RoPE kernel instance that rotates the wrong element pairs (right at position 0, where RoPE is "
        "the identity, wrong from position 1) and switches it to a config whose probe matches the Hugging Face "
        "half-rotation layout at every position. Use when q/k after RoPE disagree from position 1 on."
    )
    purpose = "Puts RoPE back on the layout the checkpoint was trained with (rotate_half)."
    commands = resume_commands("fix-rope-layout")
    gate_text = "The failed phase re-runs; the RoPE probe and the block/model gates decide."
    failure_modes = ("No RoPE config matches the reference layout: unrepaired, needs a human.",)

    def accept(self, p: Probe) -> bool:
        return _all_rows_good(p)

    def culprits(self, ctx, probes: list[Probe]) -> list[Probe]:
        """RoPE instances showing the layout signature, and every other failing RoPE instance of the plan (a
        decode call rotates one row at a late position, so the position-0/1 pattern cannot show there)."""
        out = []
        for p in probes:
            r = p.row_cosine
            layout = len(r) > 1 and r[0] >= GOOD_COSINE and not r[1] >= GOOD_COSINE
            if p.call.family == "rope" and (layout or not p.ok):
                out.append(p)
        return out
