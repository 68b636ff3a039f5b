"""Shared fixtures for every test package.

``zoo_model(name, layers=2, seed=0)`` writes a reduced zoo checkpoint (the published config with fewer
decoder layers, the zoo tokenizer, random weights) the first time it is asked for and returns the same
directory afterwards, so a session writes each distinct checkpoint once. Prefer small-hidden models
(qwen2.5-0.5b, qwen3-0.6b, smollm2-1.7b) and 1-2 layers: a reduced model keeps its full vocabulary, so
its embedding alone is 0.2-0.8 GB.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tilepilot.model.zoo import get_zoo_model, write_zoo_model


@pytest.fixture(scope="session")
def zoo_model(tmp_path_factory) -> Callable[..., Path]:
    made: dict[tuple, Path] = {}

    def make(name: str, layers: int | None = 2, seed: int = 0, dtype: str = "bfloat16", **kwargs) -> Path:
        canonical = get_zoo_model(name).name
        key = (canonical, layers, seed, dtype, tuple(sorted(kwargs.items())))
        if key not in made:
            root = tmp_path_factory.mktemp(f"zoo-{canonical}-l{layers}-s{seed}-{dtype}")
            made[key] = write_zoo_model(canonical, root / canonical, layers=layers, seed=seed, dtype=dtype, **kwargs)
        return made[key]

    return make
