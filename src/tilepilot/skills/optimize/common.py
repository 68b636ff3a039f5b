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

from tilepilot.harness.model_gate import model_gate
from tilepilot.harness.probes import group_checks, plan_calls, probe, stage_rows
from tilepilot.plan.plan import validate_plan
from tilepilot.skills.base import OptimizeSkill, SkillResult
from tilepilot.skills.context import DeployContext, perf_figures

STAGE_METRIC = {"prefill": "ttft_s", "decode": "decode_s_per_token"}
# "The other stage is not slower" allows float summation noise between two dry runs of the same groups; the
# targeted stage must still drop strictly (no tolerance there).
SAME_TIME_RTOL = 1e-9
# A plan changed by an optimization skill is no longer the built-in plan it started from.
OPTIMIZED_PLAN_NAME = "optimized"


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


def new_instances_failing(ctx: DeployContext, before, after) -> list[str]:
    """Probe (phase-1 style) the kernel instances ``after`` uses that ``before`` did not; labels of failures."""

    old = {(c.stage, c.op, c.family, c.config) for c in plan_calls(before)}
    bad = []
    for call in plan_calls(after):
        if (call.stage, call.op, call.family, call.config) in old:
            continue
        rows, context = stage_rows(call.stage, ctx.settings.gate_prompt_len)
        p = probe(ctx.spec, call, rows, context, seed=ctx.settings.seed, tile=False)
        if not p.ok:
            bad.append(f"{call.label()}: {p.error or 'below its kernel gate'}")
    n = ctx.settings.gate_prompt_len
    failing_before = {(g.stage, tuple(g.ops)) for g in group_checks(before, ctx.spec, n) if not g.ok}
    for g in group_checks(after, ctx.spec, n):
        if not g.ok and (g.stage, tuple(g.ops)) not in failing_before:
            bad.append(f"{g.stage}/{g.group}: {', '.join(g.codes)}")
    return bad


def try_proposal(ctx: DeployContext, skill: str, stage: str, prop: Proposal) -> dict[str, Any]:
    """Time, gate and keep or reject one proposal; returns the perf-trajectory row (also journaled)."""

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
        b_s, a_s = _figure(before, stage), _figure(after, stage)
        b_o, a_o = _figure(before, other), _figure(after, other)
        if not a_s < b_s:
            row["decision"] = f"rejected: not faster ({stage} {b_s:.9g} -> {a_s:.9g} s, modeled)"
        elif a_o > b_o * (1 + SAME_TIME_RTOL):
            row["decision"] = f"rejected: {other} slower ({b_o:.9g} -> {a_o:.9g} s, modeled)"
        elif bad := new_instances_failing(ctx, before_plan, prop.plan):
            row["decision"] = "rejected: kernel probe failed (" + "; ".join(bad) + ")"
        else:
            s = ctx.settings
            if ctx.full_proposal_gate:
                report, _ = model_gate(ctx, prop.plan)
            else:
                report, _ = model_gate(
                    ctx, prop.plan, greedy_steps=s.proposal_greedy_steps, kl_steps=s.proposal_kl_steps
                )
            row["gate"] = "passed" if report.passed else "failed"
            if report.passed:
                prop.plan.name = OPTIMIZED_PLAN_NAME
                ctx.save_plan(prop.plan)
                row["decision"] = "applied"
            else:
                row["decision"] = "rejected: gate failed (" + "; ".join(report.failures) + ")"
    ctx.journal.perf_step(row)
    ctx.journal.progress(f"`{skill}` ({stage}): {prop.change}: {row['decision']}")
    return row
