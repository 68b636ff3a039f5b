"""Fixtures of the skill tests: tiny checkpoints per family (written once per session) and fresh workspaces."""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny import write_tiny  # noqa: E402

from tilepilot.cli import main  # noqa: E402
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


@dataclass
class Deployed:
    """One tiny model deployed end to end through the CLI (``tilepilot deploy ... --json``)."""

    model: Path
    workspace: Path
    knowledge: Path
    exit_code: int
    summary: dict


@pytest.fixture(scope="session")
def deployment(tiny_model, tmp_path_factory):
    """``deployment(family)``: the family's tiny model deployed once per session (shared by many tests)."""
    done: dict[str, Deployed] = {}

    def get(family: str) -> Deployed:
        if family not in done:
            base = tmp_path_factory.mktemp(f"deploy-{family}")
            model, ws, know = tiny_model(family), base / "ws", base / "knowledge"
            buf = io.StringIO()
            with redirect_stdout(buf):
                code = main(
                    [
                        "deploy",
                        str(model),
                        "--out",
                        str(ws),
                        "--json",
                        "--knowledge",
                        str(know),
                        "--tune-candidates",
                        "4",
                    ]
                )
            done[family] = Deployed(model, ws, know, code, json.loads(buf.getvalue()))
        return done[family]

    return get
