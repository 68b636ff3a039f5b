"""Host ops (production CPU path) agree with the FP32 oracle ops up to one bf16 rounding."""

from __future__ import annotations

import torch

from tilepilot.oracle import ops
from tilepilot.runtime import cpu_ops

G = torch.Generator().manual_seed(0)


def bf(*shape):
    return torch.randn(*shape, generator=G).to(torch.bfloat16)


def close(a, b, rtol=1e-2):
    assert (a.float() - b.float()).abs().max() <= rtol * b.float().abs().max() + 1e-6


def test_norms_linear_swiglu_add():
    x, w = bf(5, 32), bf(32)
    close(cpu_ops.rmsnorm(x, w, 1e-6), ops.rmsnorm(x, w, 1e-6))
    close(cpu_ops.head_norm(x, w[:8], 1e-6, 8), ops.rmsnorm(x.reshape(5, 4, 8), w[:8], 1e-6).reshape(5, 32))
    W = bf(16, 32)
    close(cpu_ops.linear(x, W), ops.linear(x, W))
    close(cpu_ops.swiglu(x, x), ops.swiglu(x, x))
    close(cpu_ops.add(x, x), ops.add(x, x))


def test_rope_matches_oracle():
    head_dim, t = 16, 6
    x = bf(t, 2 * head_dim)
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    cos, sin = ops.rope_tables(torch.arange(3, 3 + t), inv)
    ref = ops.apply_rope(x.reshape(t, 2, head_dim), cos, sin).reshape(t, -1)
    close(cpu_ops.rope(x, cos[:, : head_dim // 2], sin[:, : head_dim // 2], head_dim), ref)


def test_attention_matches_oracle_prefill_and_decode():
    t, length, h, kvh, d = 4, 9, 4, 2, 8
    q, k, v = bf(t, h * d), bf(length, kvh * d), bf(length, kvh * d)
    start = length - t
    ref = ops.attention(q.reshape(t, h, d), k.reshape(length, kvh, d), v.reshape(length, kvh, d), q_start=start)
    close(cpu_ops.attention(q, k, v, start, h, kvh, d), ref.reshape(t, -1))
    one = ops.attention(q[:1].reshape(1, h, d), k.reshape(length, kvh, d), v.reshape(length, kvh, d), q_start=8)
    close(cpu_ops.attention(q[:1], k, v, 8, h, kvh, d), one.reshape(1, -1))


def test_long_prefill_attention_is_blocked_and_equal():
    from tilepilot.runtime.cpu_ops import ATTENTION_QUERY_BLOCK

    t, h, kvh, d = ATTENTION_QUERY_BLOCK + 37, 4, 2, 8
    q, k, v = bf(t, h * d), bf(t, kvh * d), bf(t, kvh * d)
    ref = ops.attention(q.reshape(t, h, d), k.reshape(t, kvh, d), v.reshape(t, kvh, d), q_start=0)
    close(cpu_ops.attention(q, k, v, 0, h, kvh, d), ref.reshape(t, -1))
