"""The uncached (full-size) oracle path reuses FP32 staging buffers: results must not depend on it."""

from __future__ import annotations

import torch
from conftest import build_tiny, prompt_ids

from tilepilot.oracle.model import Oracle


def test_streamed_greedy_and_decode_equal_cached_with_reused_buffers(monkeypatch):
    """Every layer and step overwrites the same staging buffers; logits and tokens equal the cached oracle's."""
    import tilepilot.oracle.model as oracle_model

    monkeypatch.setattr(oracle_model, "LM_HEAD_CHUNK_ROWS", 100)  # several head chunks, last one short
    tiny = build_tiny("qwen2", dtype=torch.bfloat16)
    ids = prompt_ids(7)
    cached = Oracle(tiny.weights, cache_fp32=True)
    streamed = Oracle(tiny.weights, cache_fp32=False)
    a, b = cached.greedy(ids, 6, keep_logits=True), streamed.greedy(ids, 6, keep_logits=True)
    assert a.tokens == b.tokens
    assert torch.allclose(a.logits_per_step, b.logits_per_step, rtol=0, atol=1e-5)
    # one layer's worth of buffers (not one per layer) and one head chunk, reused across 6 steps
    layer_names = set(tiny.weights.layer(0).tensors())
    assert set(streamed._stage) == layer_names | {"lm_head"}
    assert streamed._layers == {} and streamed._head is None
