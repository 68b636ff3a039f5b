"""The keep-or-revert loop every optimization skill shares.

A skill only proposes a changed plan (``propose``); this module decides. The change is kept only if the
modeled figure it targets is strictly lower, the other figure is not higher, and the full-model gate
still passes on the changed plan. Timing comes first because it is analytic and cheap; the gate runs
the model and is only paid for changes that would be worth keeping. Every attempt, kept or not, is a
row of ``perf_opt_traj.md``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from tilepilot.skills.base import OptimizeSkill, SkillResult
from tilepilot.skills.context import DeployContext, perf_figures

STAGE_METRIC = {"prefill": "ttft_s", "decode": "decode_s_per_token"}


@dataclass
class Proposal:
    """A candidate plan and one sentence saying what changed."""

    plan: Any
    change: str


def clone(plan):
    """A deep copy to edit: proposals never mutate the deployed plan."""
    return copy.deepcopy(plan)


def _figure(timing, stage: str) -> float:
    return float(getattr(timing, STAGE_METRIC[stage]))


class PlanOptimization(OptimizeSkill):
    """Base of the optimization skills: subclasses implement ``proposals(plan, ctx, stage)``."""

    abstract = True
    commands: ClassVar[tuple[str, ...]] = ()

    def proposals(self, plan, ctx: DeployContext, stage: str) -> Iterator[Proposal]:  # pragma: no cover
        raise NotImplementedError

    def run(self, ctx: DeployContext) -> SkillResult:
        stages = [ctx.opt_stage] if ctx.opt_stage else list(self.stages)
        stages = [s for s in stages if s in self.stages]
        applied: list[dict[str, Any]] = []
        rejected: list[dict[str, Any]] = []
        for stage in stages:
            for prop in self.proposals(ctx.plan, ctx, stage):
                row = try_proposal(ctx, self.name, stage, prop)
                (applied if row["decision"] == "applied" else rejected).append(row)
        evidence = {"applied": applied, "rejected": rejected}
        if applied:
            changes = "; ".join(r["change"] for r in applied)
            return self.result("applied", f"kept {len(applied)} change(s): {changes}", evidence=evidence)
        if rejected:
            why = "; ".join(f"{r['change']}: {r['decision']}" for r in rejected)
            return self.result("rejected", f"no change kept ({why})", evidence=evidence)
        return self.result("skipped", "nothing to change in this plan", evidence=evidence)


def try_proposal(ctx: DeployContext, skill: str, stage: str, prop: Proposal) -> dict[str, Any]:
    """Time, gate and keep or reject one proposal; returns the perf-trajectory row (also journaled)."""
    from tilepilot.plan.plan import validate_plan

    before_plan = ctx.plan
    before, after = ctx.timing(before_plan), None
    row: dict[str, Any] = {
        "skill": skill,
        "target": stage,
        "change": prop.change,
        "ttft_before": float(before.ttft_s),
        "decode_before": float(before.decode_s_per_token),
        "dispatches_before": perf_figures(before_plan, before)["dispatches_per_layer"],
        "gate": "not run",
    }
    problems = validate_plan(prop.plan)
    if problems:
        row["decision"] = "rejected: invalid plan (" + "; ".join(problems) + ")"
    else:
        try:
            after = ctx.timing(prop.plan)
        except Exception as e:  # a design the validator refuses cannot be timed: reject, never crash the phase
            row["decision"] = f"rejected: cannot be built ({type(e).__name__}: {e})"
    if after is not None:
        row.update(
            ttft_after=float(after.ttft_s),
            decode_after=float(after.decode_s_per_token),
            dispatches_after=perf_figures(prop.plan, after)["dispatches_per_layer"],
        )
        other = "decode" if stage == "prefill" else "prefill"
        if not _figure(after, stage) < _figure(before, stage):
            row["decision"] = (
                f"rejected: not faster ({stage} {_figure(before, stage):.6g} -> {_figure(after, stage):.6g})"
            )
        elif _figure(after, other) > _figure(before, other):
            row["decision"] = f"rejected: {other} slower ({_figure(before, other):.6g} -> {_figure(after, other):.6g})"
        else:
            from tilepilot.skills.phases.model import model_gate

            report, _ = model_gate(ctx, prop.plan)
            row["gate"] = "passed" if report.passed else "failed"
            if report.passed:
                ctx.save_plan(prop.plan)
                row["decision"] = "applied"
            else:
                row["decision"] = "rejected: gate failed (" + "; ".join(report.failures) + ")"
    ctx.journal.perf_step(row)
    ctx.journal.progress(f"`{skill}` ({stage}): {prop.change}: {row['decision']}")
    return row
