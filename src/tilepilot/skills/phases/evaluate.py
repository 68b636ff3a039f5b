"""Phase 7, independent-evaluator: ``tilepilot evaluate`` in a fresh process, its verdict becomes the gate.

A fresh interpreter shares nothing with the deployment run (no cached oracle, no patched module, no plan
in memory), which is the point: the evaluator sees the workspace as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tilepilot.gates.gate import Gate, Threshold
from tilepilot.skills.base import PhaseSkill
from tilepilot.skills.phases.common import WORKSPACE_INPUT, finish

SRC_EVAL = "DESIGN.md section 6: the independent evaluator's verdict (PASS or PASS-with-warnings)"
# A full-size model's evaluation prefills, decodes 32 tokens and runs the oracle: allow an hour before
# calling the evaluator hung (tests use tiny models and finish in seconds).
EVALUATOR_TIMEOUT_S = 3600


class IndependentEvaluator(PhaseSkill):
    name = "independent-evaluator"
    phase = 7
    repairable = False
    description = (
        "Runs `tilepilot evaluate` in a fresh process that reads only deployment.json and the checkpoint before "
        "measuring: audits the production runner (trace dispatch counts, no oracle calls), re-runs the model gate "
        "on new prompts and seeds, re-times the plan, checks the checkpoint digest, then compares with the journal's "
        "claims. Use last, after finalize-and-learn, or any time on a deployed workspace."
    )
    purpose = "Gives a verdict (PASS, PASS-with-warnings, FAIL) that does not depend on the deployment's own word."
    inputs = (WORKSPACE_INPUT,)
    commands = ("tilepilot evaluate WORKSPACE", "tilepilot evaluate WORKSPACE --json --seed 7")
    gate_text = (
        "FAIL if oracle code runs in the production path, traced dispatches differ from the plan's, the model gate "
        "fails on fresh prompts (incl. stale second-prompt outputs), recorded thresholds are looser than "
        "tilepilot's, claimed modeled TTFT/decode beat the re-timed ones by more than 5 %, final gates were "
        "measured on another plan, or the checkpoint digest changed. Warnings: oracle not cross-checked with "
        "transformers, claims slower than re-timed."
    )
    failure_modes = ("Any FAIL is final: the report names the reason; fix the deployment and re-run the chain.",)

    def run(self, ctx):

        proc = subprocess.run(
            [sys.executable, "-m", "tilepilot", "evaluate", str(ctx.root), "--json"],
            capture_output=True,
            text=True,
            timeout=EVALUATOR_TIMEOUT_S,
        )
        try:
            ev = json.loads(proc.stdout)
        except json.JSONDecodeError:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            ev = {"verdict": "FAIL", "reasons": [f"the evaluator process failed (exit {proc.returncode}): {tail[0]}"]}
        verdict = ev.get("verdict", "FAIL")
        passed = verdict in ("PASS", "PASS-with-warnings")
        gate = Gate("phase7-independent-evaluator", [Threshold("evaluation.passed", ">=", 1, SRC_EVAL)])
        report = gate.evaluate({"evaluation.passed": float(passed)})
        evidence = {
            "verdict": verdict,
            "reasons": ev.get("reasons", []),
            "warnings": ev.get("warnings", []),
            "seed": ev.get("seed"),
            "checks": ev.get("checks", []),
        }
        summary = f"evaluator verdict {verdict}" + (f": {'; '.join(ev.get('reasons', []))}" if not passed else "")
        return finish(self, ctx, report, evidence, summary, extra_files=[str(ctx.root / "evaluation_report.md")])
