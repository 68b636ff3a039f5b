"""Whether a workspace holds a finished deployment that passed its gates, in one sentence when it does not.

A workspace is usable as soon as ``deployment.json`` holds a plan, so ``generate``, ``chat`` and ``serve`` can run
a deployment that stopped in phase 0 or that the independent evaluator failed; a user who is not told so takes
unvalidated output for the deployed model's. The phase gates (``gates/<phase>.json``, written by each phase when it
ends) are what says how far a deployment got.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tilepilot.skills.journal import Journal
from tilepilot.skills.registry import phases


def unfinished_reason(root: str | Path, *, before: int | None = None) -> str | None:
    """None when every phase's gate passed, the independent evaluator's last (only the phases numbered below
    ``before``, if given); otherwise what stands, in one clause: the first phase that has not passed and how it
    ended."""
    journal = Journal(root)
    for skill in phases():
        if before is not None and skill.phase >= before:
            break
        gate = journal.read_gate(skill.name)
        if gate is None:
            return f"its deployment is unfinished (phase {skill.phase} {skill.name} has not run to its gate)"
        if gate.get("passed") is not True:
            verdict = gate.get("verdict")
            how = f"ended {verdict}" if isinstance(verdict, str) else "did not pass"
            return f"its deployment did not pass (phase {skill.phase} {skill.name} {how})"
    return None


def warning(root: str | Path) -> str | None:
    """The one-line warning a command that runs the deployment prints, or None for a finished, passing one."""
    reason = unfinished_reason(root)
    if reason is None:
        return None
    return (
        f"tilepilot: warning: {root}: {reason}, so its output is not validated; finish it with `tilepilot deploy "
        f"MODEL --out {root} --resume` (see {Path(root) / 'TODO.md'})"
    )


def warn_if_unvalidated(root: str | Path) -> None:
    """Print ``warning(root)`` to stderr when there is one (the command still runs: the user may mean to)."""
    line = warning(root)
    if line is not None:
        print(line, file=sys.stderr)
