"""Issue 11 item 7: the evaluator validates every design it times; an illegal tiling in the deployed plan is a FAIL
naming the validator code (never a re-timed number)."""

from __future__ import annotations

import sys
from pathlib import Path

from tilepilot.runtime.workspace import load_workspace, make_workspace
from tilepilot.skills.evaluator import evaluate

sys.path.insert(0, str(Path(__file__).parents[1] / "plan"))
from illegal import with_illegal_up_proj  # noqa: E402


def test_an_illegal_tiling_in_the_deployed_plan_fails_the_evaluator(tiny_model, tmp_path):
    ws = make_workspace(tiny_model("llama"), "paper-like", tmp_path / "ws").path
    w = load_workspace(ws)
    w.set_plan(with_illegal_up_proj(w.plan))
    ev = evaluate(ws, seed=3)
    assert ev.verdict == "FAIL"
    fails = [c for c in ev.checks if c.status == "fail"]
    assert [c.name for c in fails] == ["legal-designs"] and "L1_OVERFLOW" in fails[0].detail
    assert "L1_OVERFLOW" in (ws / "evaluation_report.md").read_text()
