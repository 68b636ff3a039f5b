"""`tilepilot evaluate` in a fresh process, optionally with a sabotage planted through ``sitecustomize``, and the
forger's step every plan-editing sabotage shares.

The evaluator must judge a deployment it did not build; a sabotage that patches the runtime only reaches it the way
a real one would, from outside the process, so the evaluator and sabotage tests share this one launcher.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tilepilot.runtime.workspace import load_workspace
from tilepilot.skills import journal as J
from tilepilot.skills.context import plan_digest


def rewrite_plan_digests(ws: Path) -> None:
    """What a careful forger does after editing the plan: every gate claims the new plan."""
    digest = plan_digest(load_workspace(ws).plan)
    for p in (ws / J.GATES_DIR).glob("*.json"):
        g = json.loads(p.read_text())
        if "plan_digest" in g:
            g["plan_digest"] = digest
            p.write_text(json.dumps(g))


def evaluate_in_fresh_process(ws: Path, site: str | None, tmp_path: Path, seed: int) -> dict:
    """The evaluator's JSON; its exit code must say the same as its verdict (1 for FAIL, 0 otherwise)."""
    env = dict(os.environ)
    if site is not None:
        d = tmp_path / "site"
        d.mkdir()
        (d / "sitecustomize.py").write_text(textwrap.dedent(site))
        env["PYTHONPATH"] = os.pathsep.join([str(d), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "tilepilot", "evaluate", str(ws), "--json", "--seed", str(seed)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    out = json.loads(proc.stdout)
    assert proc.returncode == (0 if out["verdict"] != "FAIL" else 1), proc.stderr
    return out
