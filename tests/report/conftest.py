"""One tiny deployment per session (real `deploy`, ~35 s on 2 cores) and its report, shared by the tests."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "skills"))

from tiny import write_tiny  # noqa: E402


@dataclass
class Deployed:
    model: Path
    workspace: Path
    verdict: str


@pytest.fixture(scope="session")
def deployed(tmp_path_factory) -> Deployed:
    from tilepilot.skills.context import Settings
    from tilepilot.skills.orchestrator import deploy

    base = tmp_path_factory.mktemp("report-deploy")
    model = write_tiny("qwen2", base / "model", layers=2)
    settings = Settings(
        gate_prompt_len=12, greedy_steps=8, proposal_greedy_steps=4, knowledge_dir=None, tune_max_candidates=2
    )
    summary = deploy(model, base / "ws", settings=settings)
    return Deployed(model, base / "ws", summary.verdict)


@pytest.fixture(scope="session")
def calibration() -> dict:
    """A small `calibrate --json` report (two kernel tables), with one row given a cross-validated figure the
    way the coming cross-validation adds it, so both the in-sample and the held-out markers are drawn."""
    from tilepilot.calibrate import harness

    report = harness.run(tables=["eltwise_add", "rmsnorm"], end_to_end=False).to_dict()
    first = next(iter(report["kernels"].values()))["figures"][0]
    first["cv_modeled"] = first["modeled"] * 1.1
    return report


@pytest.fixture(scope="session")
def report(deployed, calibration, tmp_path_factory):
    from tilepilot.report import build_report

    path, data = build_report(deployed.workspace, calibration=calibration)
    return path, data
