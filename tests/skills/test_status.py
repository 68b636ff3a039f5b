"""How far a deployment got, read from its phase gates: what `generate`, `chat`, `serve` warn with and `evaluate`
notes."""

from __future__ import annotations

from tilepilot.skills.journal import Journal
from tilepilot.skills.registry import phases
from tilepilot.skills.status import unfinished_reason, warning


def test_the_first_phase_without_a_passing_gate_is_named(tmp_path):
    journal = Journal(tmp_path)
    first = "its deployment is unfinished (phase 0 build-cpu-oracle has not run to its gate)"
    assert unfinished_reason(tmp_path) == first
    for skill in phases()[:3]:
        journal.write_gate(skill.name, {"passed": True, "verdict": "PASS"})
    journal.write_gate("full-model-validation", {"passed": False})
    assert unfinished_reason(tmp_path) == "its deployment did not pass (phase 3 full-model-validation did not pass)"
    assert unfinished_reason(tmp_path, before=3) is None  # phases 0-2 passed
    assert "--resume" in warning(tmp_path) and str(tmp_path / "TODO.md") in warning(tmp_path)


def test_a_deployment_whose_every_gate_passed_has_nothing_to_say(tmp_path):
    journal = Journal(tmp_path)
    for skill in phases():
        journal.write_gate(skill.name, {"passed": True, "verdict": "PASS"})
    assert unfinished_reason(tmp_path) is None and warning(tmp_path) is None
    journal.write_gate("independent-evaluator", {"passed": False, "verdict": "FAIL"})
    assert unfinished_reason(tmp_path) == "its deployment did not pass (phase 7 independent-evaluator ended FAIL)"
    assert unfinished_reason(tmp_path, before=7) is None  # what `evaluate` asks: the phases before itself
