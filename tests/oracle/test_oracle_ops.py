"""The pure reference ops against transformers' and torch's own implementations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from tilepilot.model.spec import RopeScaling
from tilepilot.oracle import ops
from tilepilot.oracle.kv_cache import KVCache
from tilepilot.oracle.rope import default_inv_freq, llama3_inv_freq

LLAMA32_SCALING = RopeScaling(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)


def _llama32_config(head_dim: int = 64) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=head_dim * 32,
        num_attention_heads=32,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        max_position_embeddings=131072,
    )


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_llama3_inv_freq_equals_transformers_bit_for_bit(head_dim):
    cfg = _llama32_config(head_dim)
    ref, scale = ROPE_INIT_FUNCTIONS["llama3"](cfg)
    got = llama3_inv_freq(head_dim, 500000.0, LLAMA32_SCALING)
    assert scale == 1.0
    assert torch.equal(got, ref)
    # all three bands are present, so the test covers the smooth interpolation too
    plain = default_inv_freq(head_dim, 500000.0)
    ratio = plain / got
    assert (ratio == 1).any() and (ratio == 32).any() and ((ratio > 1) & (ratio < 32)).any()


def test_rope_tables_and_apply_equal_transformers_at_long_positions():
    cfg = _llama32_config(64)
    rotary = LlamaRotaryEmbedding(cfg)
    pos = torch.tensor([0, 1, 7, 8191, 8192, 70000, 131071])
    x = torch.randn(1, 1, len(pos), 64)
    cos_ref, sin_ref = rotary(x, pos[None])
    cos, sin = ops.rope_tables(pos, llama3_inv_freq(64, 500000.0, LLAMA32_SCALING))
    assert torch.equal(cos, cos_ref[0]) and torch.equal(sin, sin_ref[0])
    q = torch.randn(len(pos), 4, 64)
    k = torch.randn(len(pos), 2, 64)
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos_ref, sin_ref)
    assert torch.allclose(ops.apply_rope(q, cos, sin), q_ref[0].transpose(0, 1), atol=1e-6)
    assert torch.allclose(ops.apply_rope(k, cos, sin), k_ref[0].transpose(0, 1), atol=1e-6)


def test_rotate_half_layout():
    x = torch.arange(6.0)
    assert ops.rotate_half(x).tolist() == [-3.0, -4.0, -5.0, 0.0, 1.0, 2.0]


def test_rmsnorm_equals_transformers():
    norm = LlamaRMSNorm(48, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48))
    x = torch.randn(5, 48) * 3
    assert torch.equal(ops.rmsnorm(x, norm.weight.detach(), 1e-5), norm(x).detach())
    # bf16 input is upcast: the result is FP32 and equals the FP32 computation on the bf16 values
    xb = x.to(torch.bfloat16)
    assert ops.rmsnorm(xb, norm.weight, 1e-5).dtype == torch.float32
    assert torch.equal(ops.rmsnorm(xb, norm.weight.detach(), 1e-5), ops.rmsnorm(xb.float(), norm.weight.detach(), 1e-5))


@pytest.mark.parametrize("n_heads, n_kv", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("block", [None, 3])
def test_attention_equals_sdpa_with_gqa_and_causal_mask(n_heads, n_kv, block):
    t, d = 11, 16
    q, k, v = torch.randn(t, n_heads, d), torch.randn(t, n_kv, d), torch.randn(t, n_kv, d)
    rep = n_heads // n_kv
    ref = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(rep, dim=1).transpose(0, 1),
        v.repeat_interleave(rep, dim=1).transpose(0, 1),
        is_causal=True,
    ).transpose(0, 1)
    got = ops.attention(q, k, v, block=block)
    assert torch.allclose(got, ref, atol=1e-6)
    # the last 4 queries against the full cache (what decode/extend does) equal the last 4 rows
    tail = ops.attention(q[-4:], k, v, q_start=t - 4, block=block)
    assert torch.allclose(tail, ref[-4:], atol=1e-6)


def test_attention_refuses_impossible_positions():
    q, k = torch.randn(3, 2, 8), torch.randn(4, 2, 8)
    with pytest.raises(ValueError):
        ops.attention(q, k, k, q_start=2)  # would need key 4
    with pytest.raises(ValueError):
        ops.attention(torch.randn(3, 3, 8), k, k)  # 3 heads over 2 KV heads


def test_swiglu():
    g, u = torch.tensor([0.0, 1.0, -2.0]), torch.tensor([2.0, 3.0, 1.0])
    expected = g * torch.sigmoid(g) * u
    assert torch.allclose(ops.swiglu(g, u), expected)


def test_kv_cache_grows_keeps_rows_and_commits_only_when_asked():
    kv = KVCache(n_layers=2, n_kv_heads=2, head_dim=4)
    rows = []
    for step in range(100):  # crosses the initial capacity and one doubling
        k = torch.full((1, 2, 4), float(step))
        for layer in range(2):
            k_all, v_all = kv.append(layer, k, -k)
            assert k_all.shape[0] == step + 1
        kv.commit(1)
        rows.append(step)
    assert kv.length == 100
    assert kv.keys(1)[:, 0, 0].tolist() == [float(r) for r in rows]
    assert torch.equal(kv.values(0), -kv.keys(0))
    kv.append(0, torch.zeros(3, 2, 4), torch.zeros(3, 2, 4))  # not committed
    assert kv.length == 100 and kv.keys(0).shape[0] == 100
    kv.reset()
    assert kv.length == 0 and kv.keys(0).shape[0] == 0
