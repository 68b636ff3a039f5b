"""RoPE scaling as a GGUF states it, turned back into a Hugging Face ``rope_scaling`` dict.

llama.cpp keeps linear/YaRN scaling as metadata (``<arch>.rope.scaling.*``), but Llama-3 style scaling
only as its result: a ``rope_freqs.weight`` tensor of per-frequency divisors (1 for high frequencies,
``factor`` for low ones, a smooth blend between). The four numbers transformers wants are not stored,
so we find the published parameter set that reproduces the tensor exactly and refuse when none does,
rather than guess a scaling the model was not trained with.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from tilepilot.errors import ScopeError

# Values Llama-3.x checkpoints use; searched together with the file's own original context length.
_LOW_FREQ = (1.0, 2.0)
_HIGH_FREQ = (4.0, 8.0)
_ORIGINAL_CONTEXTS = (8192, 4096, 2048, 16384, 32768, 65536, 131072)


def llama3_rope_divisors(
    theta: float, head_dim: int, factor: float, low: float, high: float, original: int
) -> np.ndarray:
    """The ``rope_freqs`` tensor llama.cpp's converter writes for these llama3 parameters."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    wavelen = 2 * math.pi / freqs
    smooth = (original / wavelen - low) / (high - low)
    blend = 1.0 / ((1.0 - smooth) / factor + smooth)
    return np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, blend))


def llama3_from_divisors(
    divisors: np.ndarray, theta: float, head_dim: int, hint_original: int | None
) -> dict[str, Any]:
    """The llama3 ``rope_scaling`` whose divisors equal ``divisors`` (float32 precision); ScopeError if none."""
    divisors = np.asarray(divisors, dtype=np.float64).reshape(-1)
    if divisors.shape[0] != head_dim // 2:
        raise ScopeError(
            f"rope_freqs has {divisors.shape[0]} entries but head_dim {head_dim} needs {head_dim // 2}; "
            "tilepilot cannot tell which RoPE scaling the model uses"
        )
    factor = float(divisors.max())
    if np.allclose(divisors, 1.0):
        return {}
    originals = ((hint_original,) if hint_original else ()) + _ORIGINAL_CONTEXTS
    for original, low, high in itertools.product(originals, _LOW_FREQ, _HIGH_FREQ):
        expect = llama3_rope_divisors(theta, head_dim, factor, low, high, int(original))
        if np.allclose(expect, divisors, rtol=1e-5, atol=1e-6):
            return {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": int(original),
            }
    raise ScopeError(
        "the GGUF's rope_freqs tensor matches no Llama-3 RoPE scaling tilepilot knows; "
        "convert the model from its Hugging Face checkpoint instead"
    )


def rope_scaling_from_metadata(kind: str | None, factor: float | None, original: int | None) -> dict[str, Any]:
    """``rope_scaling`` for metadata-declared scaling (linear, YaRN...); {} for none."""
    if not kind or kind == "none":
        return {}
    out: dict[str, Any] = {"rope_type": str(kind), "factor": float(factor or 1.0)}
    if original:
        out["original_max_position_embeddings"] = int(original)
    return out
