"""The runner: prefill, decode, KV cache, sampling and text generation of a deployment plan.

Names are imported lazily: the runtime imports the runner's host ops, and the runner imports the
runtime, so an eager import here would be circular.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GenerationResult", "NpuRunner", "RunnerStep", "SamplingParams", "Sampler"]


def __getattr__(name: str) -> Any:
    if name in ("NpuRunner", "RunnerStep", "GenerationResult"):
        from tilepilot.runner import npu_runner

        return getattr(npu_runner, name)
    if name in ("SamplingParams", "Sampler"):
        from tilepilot.runner import sampling

        return getattr(sampling, name)
    raise AttributeError(name)
