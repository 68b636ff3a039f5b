"""What every phase does at the end: write ``gates/<name>.json`` with every number, return the result.

The gate file carries the report (measurements, thresholds with sources, failures), the evidence the
failure classifier reads, and fingerprints of what was measured (plan digest, checkpoint digest) so the
evaluator can tell a current claim from a stale one.
"""

from __future__ import annotations

import time
from typing import Any

from tilepilot.skills.base import PhaseSkill, SkillInput, SkillResult
from tilepilot.skills.context import DeployContext
from tilepilot.skills.workspace import plan_digest

WORKSPACE_INPUT = SkillInput("workspace", "the deployment workspace (deployment.json with the plan and model path)")


def finish(
    skill: PhaseSkill,
    ctx: DeployContext,
    report,
    evidence: dict[str, Any],
    summary: str,
    *,
    extra_files: list[str] | None = None,
) -> SkillResult:
    payload = report.to_dict()
    payload["phase"] = skill.phase
    payload["skill"] = skill.name
    payload["evidence"] = evidence
    payload["plan_digest"] = plan_digest(ctx.workspace.plan)
    payload["checkpoint_sha256"] = ctx.workspace.get_extra("checkpoint_sha256")
    payload["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    path = ctx.workspace.journal.write_gate(skill.name, payload)
    status = "passed" if report.passed else "failed"
    text = summary if report.passed else f"{summary}; " + "; ".join(report.failures)
    return skill.result(status, text, evidence=evidence, files=[str(path), *(extra_files or [])], gate=report.to_dict())
