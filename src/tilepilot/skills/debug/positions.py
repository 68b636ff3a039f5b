"""Position debug skills: errors only at late positions, and a RoPE layout mismatch."""

from __future__ import annotations

from tilepilot.harness.probes import Probe, probe, stage_rows
from tilepilot.kernels import rope
from tilepilot.skills.base import SkillResult
from tilepilot.skills.classify import GOOD_COSINE, LATE_POSITIONS_ONLY, ROPE_LAYOUT_MISMATCH, late_positions_bad
from tilepilot.skills.debug.common import ReconfigureSkill, full_config, probes_now, reduced_fields, resume_commands
from tilepilot.skills.optimize.common import clone
from tilepilot.skills.optimize.kernels import legal_at, set_config, sizes_for


def _late_only(rows: list[float]) -> bool:
    return late_positions_bad(list(rows)) is not None


def _all_rows_good(p: Probe) -> bool:
    return p.ok and all(c >= GOOD_COSINE for c in p.row_cosine)


class FixLatePositions(ReconfigureSkill):
    name = "fix-late-positions"
    signature = LATE_POSITIONS_ONLY
    description = (
        "Finds the position-dependent kernel (attention over the KV cache, RoPE) whose output is right for early "
        "positions and wrong for later ones when probed alone (e.g. RoPE tables whose angles are computed in bf16), "
        "and re-configures it, one named option first (angles bf16 -> fp32), else its tiling (query/key tiles, rows "
        "per call), until every position passes. Use when only late prompt positions disagree with the oracle."
    )
    purpose = "Repairs position-dependent precision loss and tiling that drops or misplaces rows beyond a position."
    commands = resume_commands("fix-late-positions")
    gate_text = "The failed phase re-runs; per-position cosine decides."
    failure_modes = (
        "Every kernel is right at every position alone (e.g. wrong inverse frequencies in the host code): "
        "unrepaired, needs a human.",
    )

    def accept(self, p: Probe) -> bool:
        return _all_rows_good(p)

    def culprits(self, ctx, probes: list[Probe]) -> list[Probe]:
        """Attention and RoPE calls wrong only late or failing alone, and every RoPE call whose table angles are
        computed in reduced precision: a decode call rotates one row, right or wrong by chance at the one position
        its probe meets, and wrong at later ones."""
        return [
            p
            for p in probes
            if p.call.family in ("attention", "rope")
            and (_late_only(p.row_cosine) or not p.ok or (p.call.family == "rope" and reduced_fields(p.config)))
        ]


class FixRopeLayout(ReconfigureSkill):
    name = "fix-rope-layout"
    signature = ROPE_LAYOUT_MISMATCH
    description = (
        "Finds the RoPE kernel instances that rotate the wrong element pairs (right at position 0, where RoPE is "
        "the identity, wrong from position 1), identifies which pair layout (rope.LAYOUTS: half = rotate_half, "
        "interleaved = GPT-J / GGUF) makes each one match the oracle at every position, and sets that layout "
        "parameter, keeping the rest of the config. Use when q/k after RoPE disagree from position 1 on."
    )
    purpose = "Puts RoPE back on the layout the checkpoint was trained with (rotate_half)."
    commands = resume_commands("fix-rope-layout")
    gate_text = "The failed phase re-runs; the RoPE probe and the block/model gates decide."
    failure_modes = ("No RoPE config matches the reference layout: unrepaired, needs a human.",)

    def accept(self, p: Probe) -> bool:
        return _all_rows_good(p)

    def run(self, ctx) -> SkillResult:
        """Probe each culprit under every layout; the layout whose probe is right at every position is the
        checkpoint's. Calls no layout repairs fall back to the config search of ``ReconfigureSkill``."""
        bad = self.culprits(ctx, probes_now(ctx))
        if not bad:
            return self.result("unrepaired", "no RoPE instance of the plan shows a layout fault when probed alone")
        plan = clone(ctx.plan)
        changes, changed, layouts = [], {}, {}
        for p in {(q.call.stage, q.call.op): q for q in bad}.values():
            call = p.call
            rows, context = stage_rows(call.stage, ctx.settings.gate_prompt_len)
            try:
                current = full_config(ctx.spec, call, rows, context)
            except Exception:
                continue  # the config does not build: not a layout question
            for layout in (x for x in rope.LAYOUTS if x != current.get("layout")):
                cfg = {**current, "layout": layout}
                q = probe(ctx.spec, call, rows, context, config=cfg, seed=ctx.settings.seed, tile=False)
                if _all_rows_good(q) and legal_at(ctx.spec, call, cfg, sizes_for(call.stage, ctx)):
                    set_config(plan, call, cfg)
                    layouts[call.label()] = {"kernel": current.get("layout"), "checkpoint": layout}
                    changed[call.label()] = {"layout": [current.get("layout"), layout]}
                    changes.append(f"{call.label()}: layout {current.get('layout')} -> {layout}")
                    break
        labels = {p.call.label() for p in bad}
        if set(changed) != labels:
            return super().run(ctx)
        ctx.save_plan(plan)
        evidence = {"culprits": sorted(labels), "layouts": layouts, "changes": changes, "changed": changed}
        return self.result("repaired", "; ".join(changes), evidence=evidence)

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
