"""RoPE cos/sin tables for the runner, computed once on the host and sliced per call.

The production path computes its own inverse frequencies (plain and Llama-3 scaled, in the order
Hugging Face computes them, fp32) rather than calling the oracle, so that the evaluator can prove no
oracle code runs in production; a test holds the two equal.
"""

from __future__ import annotations

import math

import torch

from tilepilot.model.spec import ModelSpec


def inv_freq(spec: ModelSpec) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2], fp32, with Llama-3 scaling when the spec has it."""
    d = spec.head_dim
    base = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(torch.float32) / d))
    rs = spec.rope_scaling
    if rs is None:
        return base
    low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
    high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
    wavelen = 2 * math.pi / base
    scaled = torch.where(wavelen > low_wavelen, base / rs.factor, base)
    smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
        rs.high_freq_factor - rs.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RopeTables:
    """``table(start, rows)`` -> fp32 ``[rows, head_dim]`` = ``cat(cos, sin)`` of the half-size angle tables.

    Angles are ``position * inv_freq`` in fp32 as Hugging Face computes them; the table grows by doubling.
    """

    def __init__(self, spec: ModelSpec, initial: int = 256):
        self.inv_freq = inv_freq(spec)
        self._table = torch.empty(0, spec.head_dim)
        self._grow(initial)

    def _grow(self, n: int) -> None:
        if n <= self._table.shape[0]:
            return
        n = max(n, 2 * self._table.shape[0])
        ang = torch.arange(n, dtype=torch.int64).to(torch.float32)[:, None] * self.inv_freq[None, :]
        self._table = torch.cat((ang.cos(), ang.sin()), dim=-1)

    def table(self, start: int, rows: int) -> torch.Tensor:
        self._grow(start + rows)
        return self._table[start : start + rows]
