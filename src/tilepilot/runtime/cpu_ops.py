"""The cpu ops: CPU implementations of the block ops, for the groups a plan places on the CPU (``where="cpu"``).

They follow the NPU's numerics contract at the group boundary (bf16 tensors in and out, fp32 inside
non-linear functions, one rounding at the end) so moving an op between CPU and NPU changes where it
runs, not what the rest of the model sees. These are production code, independent of the oracle.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

BF16 = torch.bfloat16


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(BF16)


def head_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, head_dim: int) -> torch.Tensor:
    """Per-head RMSNorm (Qwen3 Q/K norm) over rows of ``[T, heads * head_dim]``."""
    t = x.shape[0]
    return rmsnorm(x.reshape(t, -1, head_dim), weight, eps).reshape(t, -1)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """bf16 x bf16 with fp32 accumulation inside, rounded once (HF ``[out, in]`` weights, no transpose)."""
    return F.linear(x.to(BF16), weight)


def bias_add(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return (x.float() + bias.float()).to(BF16)


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float() + b.float()).to(BF16)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return (F.silu(gate.float()) * up.float()).to(BF16)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    """HF half-rotation RoPE on ``[T, heads * head_dim]`` with fp32 ``cos``/``sin`` of shape ``[T, head_dim/2]``."""
    t = x.shape[0]
    xf = x.float().reshape(t, -1, head_dim)
    half = head_dim // 2
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return out.reshape(t, -1).to(BF16)


ATTENTION_QUERY_BLOCK = 256  # query rows per score block: bounds the [kv_heads, group*rows, L] fp32 scores


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, n_heads: int, n_kv_heads: int, head_dim: int
) -> torch.Tensor:
    """Causal GQA attention of T queries at positions ``start..start+T-1`` over L cached keys, fp32 inside."""
    t, length = q.shape[0], k.shape[0]
    kh = k.float().reshape(length, n_kv_heads, head_dim).permute(1, 2, 0)
    vh = v.float().reshape(length, n_kv_heads, head_dim).transpose(0, 1)
    out = torch.empty(t, n_heads * head_dim, dtype=BF16)
    for lo in range(0, t, ATTENTION_QUERY_BLOCK):
        hi = min(t, lo + ATTENTION_QUERY_BLOCK)
        out[lo:hi] = _attention_block(q[lo:hi], kh, vh, start + lo, n_heads, n_kv_heads, head_dim)
    return out


def _attention_block(q, kh, vh, start: int, n_heads: int, n_kv_heads: int, head_dim: int) -> torch.Tensor:
    t, length = q.shape[0], kh.shape[-1]
    group = n_heads // n_kv_heads
    # queries grouped under their KV head: [kv_heads, group * T, d] (row order (g, t)); no repeat of K/V
    qh = q.float().reshape(t, n_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(n_kv_heads, group * t, head_dim)
    scores = torch.matmul(qh, kh) * (1.0 / math.sqrt(head_dim))
    if start + t < length or t > 1:
        qpos = torch.arange(start, start + t).repeat(group)
        scores = scores.masked_fill(torch.arange(length)[None, :] > qpos[:, None], float("-inf"))
    ctx = torch.matmul(torch.softmax(scores, dim=-1), vh)
    return ctx.reshape(n_kv_heads, group, t, head_dim).permute(2, 0, 1, 3).reshape(t, n_heads * head_dim).to(BF16)
