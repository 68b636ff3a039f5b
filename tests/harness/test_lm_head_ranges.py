"""The gate's per-partition evidence reads the LM head's vocabulary partitions as the runner builds them."""

from __future__ import annotations

from tilepilot.harness.model_gate import lm_head_ranges
from tilepilot.model.spec import spec_from_config
from tilepilot.plan.builtin import paper_like_plan

QWEN_VOCAB = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 2,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
}


def test_a_partial_head_config_gives_the_partitions_it_names():
    """The paper-like plan names only the partition size (AIR's 8192 rows for a 151936-word vocabulary): the ranges
    cut the vocabulary there, in order, and cover it."""
    spec = spec_from_config(QWEN_VOCAB, name="qwen2.5-0.5b-2l")
    plan = paper_like_plan(spec)
    head = next(c for g in plan.prefill.head for c in g.calls if c.op == "lm_head")
    rows = head.config["partition_rows"]
    ranges = lm_head_ranges(plan, spec)
    assert len(ranges) == -(-spec.vocab // rows) > 1
    assert ranges[0] == (0, rows) and ranges[-1][1] == spec.vocab
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
