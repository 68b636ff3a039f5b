"""The skill contract enforces the Agent Skills naming rules at class definition."""

from __future__ import annotations

import pytest

from tilepilot.skills.base import (
    DESCRIPTION_MAX_CHARS,
    NAME_MAX_CHARS,
    PhaseSkill,
    SkillResult,
    description_problems,
    name_problems,
)

GOOD_DESC = "Checks things. Use when testing."


@pytest.mark.parametrize("name", ["a", "kernel-validation", "phase-0", "x" * NAME_MAX_CHARS])
def test_valid_names(name):
    assert name_problems(name) == []


@pytest.mark.parametrize(
    "name", ["", "Kernel", "kernel_validation", "-kernel", "kernel-", "kernel--validation", "a b", "x" * 65]
)
def test_invalid_names(name):
    assert name_problems(name)


def test_description_rules():
    assert description_problems(GOOD_DESC) == []
    assert description_problems("")
    assert description_problems("Does something useful.")  # never says when to use it
    assert description_problems("Use when x. " + "y" * DESCRIPTION_MAX_CHARS)


def _define(name: str, description: str = GOOD_DESC, commands=("tilepilot deploy M --out W",)):
    return type(
        "Probe",
        (PhaseSkill,),
        {"name": name, "description": description, "purpose": "p", "commands": commands, "phase": 0},
    )


def test_subclass_with_bad_name_is_refused():
    with pytest.raises(TypeError, match="breaks the skill contract"):
        _define("Bad_Name")


def test_subclass_without_command_is_refused():
    with pytest.raises(TypeError, match="no tilepilot command"):
        _define("probe-skill", commands=())


def test_good_subclass_and_result():
    cls = _define("probe-skill")
    r = cls().result("passed", "fine", evidence={"x": 1.0})
    assert r.skill == "probe-skill" and r.ok and r.to_dict()["evidence"] == {"x": 1.0}
    assert not SkillResult("s", "failed", "no").ok
    with pytest.raises(ValueError):
        SkillResult("s", "great", "no")
