"""Rotary-embedding frequencies, including the Llama-3 ("llama3") frequency scaling.

The values are computed in FP32 in exactly the order Hugging Face transformers computes them
(``_compute_default_rope_parameters`` / ``_compute_llama3_parameters`` in ``modeling_rope_utils``),
because at large positions a single-ulp difference in an inverse frequency becomes a visible
phase error, and the phase-0 gate holds the oracle to transformers within 1e-4.
"""

from __future__ import annotations

import math

import torch

from tilepilot.model.spec import ModelSpec, RopeScaling


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """Plain RoPE: ``1 / theta^(2i/d)`` for i in [0, d/2), FP32."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta**exponents)


def llama3_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Llama-3 scaling: low frequencies divided by ``factor``, high ones kept, a smooth ramp between.

    Wavelengths shorter than ``original_max / high_freq_factor`` are untouched, longer than
    ``original_max / low_freq_factor`` are stretched by ``factor``, and the band in between is
    interpolated linearly in ``original_max / wavelength``.
    """
    inv_freq = default_inv_freq(head_dim, theta)
    factor = scaling.factor
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    old_ctx = scaling.original_max_position_embeddings
    low_freq_wavelen = old_ctx / low
    high_freq_wavelen = old_ctx / high

    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def inv_freq_for(spec: ModelSpec) -> torch.Tensor:
    """The model's inverse frequencies, [head_dim / 2] FP32."""
    if spec.rope_scaling is None:
        return default_inv_freq(spec.head_dim, spec.rope_theta)
    return llama3_inv_freq(spec.head_dim, spec.rope_theta, spec.rope_scaling)
