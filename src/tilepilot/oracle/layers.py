"""One decoder layer in FP32, written as the sequence of ops the NPU plan also runs.

Llama, SmolLM2, Qwen2 and Qwen3 differ only in optional pieces here: QKV (and O) bias, per-head
RMSNorm on q and k before RoPE (Qwen3), and the rope frequencies (Llama-3 scaling, handled by the
tables passed in). Every intermediate the gates compare is handed to ``record`` under its capture
point name, so the capture vocabulary and the computation cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tilepilot.model.spec import ModelSpec
from tilepilot.model.weights import LayerWeights
from tilepilot.oracle import ops
from tilepilot.oracle.kv_cache import KVCache

Recorder = Callable[[str, torch.Tensor], None]

# Query rows per attention block; bounds the score matrix to heads x 512 x S floats on long prompts.
ATTENTION_BLOCK = 512


def _no_record(_point: str, _value: torch.Tensor) -> None:
    return None


def decoder_layer(
    x: torch.Tensor,
    w: LayerWeights,
    spec: ModelSpec,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv: KVCache,
    layer: int,
    record: Recorder | None = None,
) -> torch.Tensor:
    """Run layer ``layer`` on ``x`` [T, hidden] (FP32) whose rows sit after the ``kv.length`` cached ones.

    ``cos``/``sin`` are the RoPE tables [T, head_dim] of these rows' positions. Appends this call's
    rotated K and V to ``kv`` (uncommitted) and returns the layer output [T, hidden].
    """
    rec = record or _no_record
    t = x.shape[0]
    hd = spec.head_dim

    h = ops.rmsnorm(x, w.attn_norm, spec.rms_eps)
    rec("attn_norm", h)

    q = ops.linear(h, w.wq, w.bq).view(t, spec.n_heads, hd)
    k = ops.linear(h, w.wk, w.bk).view(t, spec.n_kv_heads, hd)
    v = ops.linear(h, w.wv, w.bv).view(t, spec.n_kv_heads, hd)
    if spec.qk_norm:
        q = ops.rmsnorm(q, w.q_norm, spec.rms_eps)
        k = ops.rmsnorm(k, w.k_norm, spec.rms_eps)
    rec("q", q.reshape(t, -1))
    rec("k", k.reshape(t, -1))
    rec("v", v.reshape(t, -1))

    q = ops.apply_rope(q, cos, sin)
    k = ops.apply_rope(k, cos, sin)
    rec("q_rope", q.reshape(t, -1))
    rec("k_rope", k.reshape(t, -1))

    k_all, v_all = kv.append(layer, k, v)
    attn = ops.attention(q, k_all, v_all, q_start=kv.length, block=ATTENTION_BLOCK).reshape(t, spec.q_dim)
    rec("attn", attn)

    o = ops.linear(attn, w.wo, w.bo)
    rec("o_proj", o)
    resid1 = ops.add(x, o)
    rec("resid1", resid1)

    h2 = ops.rmsnorm(resid1, w.ffn_norm, spec.rms_eps)
    rec("ffn_norm", h2)
    gate = ops.linear(h2, w.w_gate)
    rec("gate", gate)
    up = ops.linear(h2, w.w_up)
    rec("up", up)
    act = ops.swiglu(gate, up)
    rec("act", act)
    down = ops.linear(act, w.w_down)
    rec("down", down)
    out = ops.add(resid1, down)
    rec("out", out)
    return out
