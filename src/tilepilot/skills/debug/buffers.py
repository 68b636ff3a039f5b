"""Buffer debug skill: a buffer wrongly kept static, so the first call is right and later ones are stale."""

from __future__ import annotations

from tilepilot.harness.model_gate import gate_prompts
from tilepilot.runtime.buffers import StaleBufferError
from tilepilot.skills.base import DebugSkill, SkillResult
from tilepilot.skills.classify import STALE_AFTER_FIRST_CALL
from tilepilot.skills.context import RUNTIME_KEY
from tilepilot.skills.debug.common import WS_INPUT, resume_commands
from tilepilot.skills.optimize.common import clone


class FixStaleBuffer(DebugSkill):
    name = "fix-stale-buffer"
    signature = STALE_AFTER_FIRST_CALL
    description = (
        "Re-runs the gate prompts with the runtime's static-buffer check on (a static buffer whose host copy "
        "changed raises StaleBufferError naming it), marks each such buffer dynamic again in the workspace's "
        "runtime options, and if none is named, turns dirty tracking off. Use when the first call matches the "
        "oracle and later calls do not."
    )
    purpose = "Repairs the stale/corrupted host buffer class of faults the paper's authors met."
    inputs = (WS_INPUT,)
    commands = resume_commands("fix-stale-buffer")
    gate_text = "The failed phase re-runs; its second-prompt check decides."
    failure_modes = ("Staleness that survives with every buffer synced: not a buffer fault; needs a human.",)

    def run(self, ctx) -> SkillResult:

        opts = ctx.runtime_options()
        static = list(opts.get("static_buffers", []))
        a, b = gate_prompts(ctx)
        named: list[str] = []
        for _ in range(len(static) + 1):
            runner = ctx.make_runner(ctx.plan, static_buffers=static)
            runner.pool.trust_static = False
            try:
                runner.prefill(a)
                runner.decode(a[-1])
                runner.prefill(b)
                runner.decode(b[-1])
                break
            except StaleBufferError as e:
                hit = next((s for s in static if s in str(e)), None)
                if hit is None:
                    break
                named.append(hit)
                static.remove(hit)
        if named:
            opts["static_buffers"] = static
            ctx.set_extra(RUNTIME_KEY, opts)
            return self.result(
                "repaired",
                f"buffers {named} changed after their upload; now synced on every change",
                evidence={"stale_buffers": named},
            )
        if ctx.plan.host.skip_unchanged_writes:
            plan = clone(ctx.plan)
            plan.host.skip_unchanged_writes = False
            ctx.save_plan(plan)
            return self.result(
                "repaired",
                "no static buffer named; dirty tracking turned off so every input is re-synced",
                evidence={"stale_buffers": []},
            )
        return self.result("unrepaired", "no buffer is static and every input is already synced on each call")
