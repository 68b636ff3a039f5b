"""Fixtures of the skill tests: tiny checkpoints per family (written once per session) and fresh workspaces."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny import write_tiny  # noqa: E402

from tilepilot.skills.context import DeployContext, Settings  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    made: dict[tuple[str, int], Path] = {}

    def make(family: str = "llama", layers: int = 2) -> Path:
        key = (family, layers)
        if key not in made:
            made[key] = write_tiny(family, tmp_path_factory.mktemp(f"tiny-{family}-{layers}"), layers=layers)
        return made[key]

    return make


@pytest.fixture
def fresh_ctx(tiny_model, tmp_path):
    """A new workspace (default plan) on a tiny model; short greedy runs keep debug tests fast."""

    def make(family: str = "llama", layers: int = 2, **settings) -> DeployContext:
        settings.setdefault("greedy_steps", 8)
        return DeployContext.create(
            tiny_model(family, layers), tmp_path / f"ws-{family}", settings=Settings(**settings)
        )

    return make
