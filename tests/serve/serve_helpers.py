"""Helpers shared by the serve tests (a module of its own: conftest files are not importable by name)."""

from __future__ import annotations

import os
from pathlib import Path


def subprocess_env() -> dict[str, str]:
    """One torch thread per process: the test machine has 2 cores shared by the client and the server."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env
