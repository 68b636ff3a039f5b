"""The decoder's operations as pure FP32 functions: the reference every NPU kernel is checked against.

Each function takes tensors in token-major layout ([T, ...], no batch dimension, as the runner and
the kernels use them), upcasts its inputs to FP32 and returns FP32. The arithmetic follows Hugging
Face transformers step by step (RMSNorm variance in FP32 and ``weight * x``; RoPE in the
half-rotation layout; softmax in FP32), so that the same function is both the kernels' reference and
the oracle's building block.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

F32 = torch.float32


def f32(x: torch.Tensor) -> torch.Tensor:
    """``x`` as FP32 (no copy when it already is)."""
    return x.to(F32)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` with ``weight`` in Hugging Face orientation [out, in]."""
    return F.linear(f32(x), f32(weight), None if bias is None else f32(bias))


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension: ``weight * x / sqrt(mean(x^2) + eps)``, variance in FP32."""
    x = f32(x)
    variance = x.pow(2).mean(-1, keepdim=True)
    return f32(weight) * (x * torch.rsqrt(variance + eps))


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [T, head_dim] for absolute ``positions`` [T], half-rotation layout.

    Both halves of the head repeat the same frequencies (``cat(freqs, freqs)``), which is what
    ``rotate_half`` expects.
    """
    freqs = positions.to(F32)[:, None] * f32(inv_freq)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dimension (Hugging Face layout, not interleaved pairs)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [T, heads, head_dim] by the tables [T, head_dim] of its positions."""
    x = f32(x)
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    q_start: int | None = None,
    scale: float | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """Causal softmax attention with grouped KV heads.

    ``q`` is [T, n_heads, d] for the queries at absolute positions ``q_start .. q_start+T-1``
    (default: the last T of the S keys, i.e. prefill after the cache); ``k``/``v`` are
    [S, n_kv_heads, d] for positions ``0 .. S-1``. Query head ``h`` reads KV head
    ``h // (n_heads / n_kv_heads)``, as transformers' ``repeat_kv`` does. Queries are processed in
    blocks of ``block`` rows to bound the [heads, T, S] score matrix on long prompts. Returns
    [T, n_heads, d] FP32.
    """
    q, k, v = f32(q), f32(k), f32(v)
    t, n_heads, d = q.shape
    s, n_kv, _ = k.shape
    if n_heads % n_kv:
        raise ValueError(f"{n_heads} query heads cannot be grouped over {n_kv} KV heads")
    group = n_heads // n_kv
    start = s - t if q_start is None else q_start
    if start < 0 or start + t > s:
        raise ValueError(f"queries at positions {start}..{start + t - 1} need keys the cache ({s}) does not hold")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    step = t if not block else block

    kh = k.permute(1, 2, 0)  # [n_kv, d, S]
    vh = v.permute(1, 0, 2)  # [n_kv, S, d]
    key_pos = torch.arange(s)
    out = torch.empty(t, n_heads, d, dtype=F32)
    for lo in range(0, t, step):
        hi = min(t, lo + step)
        rows = hi - lo
        qh = q[lo:hi].reshape(rows, n_kv, group, d).permute(1, 2, 0, 3).reshape(n_kv, group * rows, d)
        scores = torch.matmul(qh, kh) * scale  # [n_kv, group*rows, S]
        q_pos = torch.arange(start + lo, start + hi).repeat(group)  # row order is (g, t)
        masked = key_pos[None, :] > q_pos[:, None]
        scores = scores.masked_fill(masked[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, vh)  # [n_kv, group*rows, d]
        out[lo:hi] = ctx.reshape(n_kv, group, rows, d).permute(2, 0, 1, 3).reshape(rows, n_heads, d)
    return out


def silu(x: torch.Tensor) -> torch.Tensor:
    x = f32(x)
    return F.silu(x)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, the gated activation between the FFN's up and down projections."""
    return silu(gate) * f32(up)


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Residual add in FP32."""
    return f32(a) + f32(b)
