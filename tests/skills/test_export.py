"""Every skill exports as a valid Agent Skills folder; the repo's skills/ folder is that export, up to date."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import skills_ref

from tilepilot.cli import main
from tilepilot.skills import registry
from tilepilot.skills.export import SKILL_FILE, parse_frontmatter, render, validate_folder

REPO_SKILLS = Path(__file__).resolve().parents[2] / "skills"


def test_registry_names_unique_and_complete():
    names = [s.name for s in registry.all_skills()]
    assert len(names) == len(set(names))
    assert [p.phase for p in registry.phases()] == list(range(8))
    assert {s.kind for s in registry.all_skills()} == {"phase", "optimize", "debug"}


@pytest.mark.parametrize("folder", sorted(p.name for p in REPO_SKILLS.iterdir() if p.is_dir()))
def test_repo_skill_folder_is_valid(folder):
    """The Agent Skills reference validator (skills-ref, `agentskills validate`) judges the spec; our own check adds
    only the house sections (when to use, commands)."""
    assert skills_ref.validate(REPO_SKILLS / folder) == []
    assert validate_folder(REPO_SKILLS / folder) == []


def test_reference_validator_refuses_what_the_spec_forbids(tmp_path):
    bad = tmp_path / "merge-launches"
    bad.mkdir()
    (bad / SKILL_FILE).write_text("---\nname: Merge_Launches\ndescription: merges.\n---\n# x\n")
    problems = " ".join(skills_ref.validate(bad)).lower()
    assert "lowercase" in problems and "directory name" in problems


def test_repo_skills_folder_matches_the_code():
    """Regenerate with `tilepilot skills export skills` when a skill's text changes."""
    on_disk = {p.name for p in REPO_SKILLS.iterdir() if p.is_dir()}
    assert on_disk == {s.name for s in registry.all_skills()}
    for s in registry.all_skills():
        assert (REPO_SKILLS / s.name / SKILL_FILE).read_text() == render(s), f"skills/{s.name} is stale"


def test_validator_catches_bad_folders(tmp_path):
    bad = tmp_path / "merge-launches"
    bad.mkdir()
    (bad / SKILL_FILE).write_text("---\nname: Merge_Launches\ndescription: merges.\n---\n# x\n")
    problems = " ".join(validate_folder(bad))
    assert "lowercase" in problems and "differs from the folder name" in problems
    assert "when to use" in problems and "## Commands" in problems
    missing = tmp_path / "empty-skill"
    missing.mkdir()
    assert validate_folder(missing) == ["empty-skill: no SKILL.md"]


def test_frontmatter_round_trip_of_quotes():
    fm = parse_frontmatter('---\nname: a\ndescription: "say \\"hi\\". Use when x."\n---\n')
    assert fm == {"name": "a", "description": 'say "hi". Use when x.'}


def test_cli_export_and_list(tmp_path, capsys):
    assert main(["skills", "export", str(tmp_path / "out")]) == 0
    folders = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert folders == sorted(s.name for s in registry.all_skills())
    assert all(skills_ref.validate(tmp_path / "out" / f) == [] for f in folders)
    capsys.readouterr()
    assert main(["skills", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} == set(folders) and all(len(r["description"]) <= 1024 for r in rows)


def test_cli_run_refuses_debug_skills_and_unknown_names(tmp_path, capsys):
    (tmp_path / "deployment.json").write_text("{}")
    assert main(["skills", "run", "fix-nan-inf", str(tmp_path)]) == 2
    assert main(["skills", "run", "no-such-skill", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "chosen by failure signature" in err and "no skill is called" in err
