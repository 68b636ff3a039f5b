"""eta_scale on cases that can be checked by hand."""

from __future__ import annotations

import math

import pytest

from tilepilot.model.spec import spec_from_config
from tilepilot.model.zoo import ZOO, get_zoo_model
from tilepilot.runtime.eta import (
    ETA_GOAL,
    REFERENCE_MODEL,
    EtaScale,
    attention_flops,
    decode_weight_bytes,
    eta_scale,
    matmul_params_per_layer,
    prefill_flops,
    sustained,
)


def _tiny(**over):
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 10,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 64,
        "tie_word_embeddings": True,
    }
    cfg.update(over)
    return spec_from_config(cfg, name=f"tiny-{len(over)}")


def test_tiny_prefill_flops_by_hand():
    s = _tiny()  # h=4, q=4, kv=2 (1 head of dim 2), f=8, vocab=10, 1 layer
    assert matmul_params_per_layer(s) == 4 * 4 + 2 * 4 * 2 + 4 * 4 + 3 * 4 * 8 == 144
    # T=3: projections 2*3*144 = 864; attention 2 heads * 4 * head_dim 2 * (1+2+3) = 96; LM head 2*4*10 = 80
    assert attention_flops(s, 3) == 96
    assert prefill_flops(s, 3) == 864 + 96 + 80


def test_gqa_does_not_change_attention_flops_but_changes_projections():
    mha, gqa = _tiny(num_key_value_heads=2), _tiny(num_key_value_heads=1)
    assert attention_flops(mha, 5) == attention_flops(gqa, 5)
    assert matmul_params_per_layer(mha) - matmul_params_per_layer(gqa) == 2 * 4 * 2


def test_decode_bytes_are_all_weights_once_plus_one_embedding_row():
    tied, untied = _tiny(), _tiny(tie_word_embeddings=False)
    # tied: the embedding matrix is the LM head, read once, plus the looked-up row
    assert decode_weight_bytes(tied) == 2 * (tied.n_params + tied.hidden)
    # untied: the embedding table is not read, only its row; the separate LM head is
    assert decode_weight_bytes(untied) == 2 * (untied.n_params - untied.vocab * untied.hidden + untied.hidden)


@pytest.mark.parametrize("name", list(ZOO))
def test_matmul_params_account_for_every_zoo_weight(name):
    """Matmul weights + norms + biases + embedding = the checkpoint's parameter count (no weight forgotten)."""
    s = get_zoo_model(name).spec()
    per_layer_small = sum(math.prod(v) for v in s.layer_tensor_shapes(0).values()) - matmul_params_per_layer(s)
    assert per_layer_small < 4 * s.hidden + 2 * s.head_dim + s.q_dim + 2 * s.kv_dim  # norms/biases only
    rest = s.vocab * s.hidden * (1 if s.tied_embeddings else 2) + s.hidden
    assert s.n_layers * (matmul_params_per_layer(s) + per_layer_small) + rest == s.n_params


def test_llama_1b_figures_match_published_sizes():
    s = get_zoo_model(REFERENCE_MODEL).spec()
    assert s.n_params == pytest.approx(1.236e9, rel=0.01)  # Meta's model card: 1.23B
    # 2 * 2048 * 0.973e9 matmul params = 3.986e12, causal attention 16*32*4*64*2048*2049/2 = 0.275e12
    assert prefill_flops(s) == pytest.approx(4.261e12, rel=1e-3)
    assert decode_weight_bytes(s) == pytest.approx(2.47e9, rel=0.01)


def test_reference_against_itself_is_exactly_one():
    s = get_zoo_model(REFERENCE_MODEL).spec()
    t = sustained(s, 1.21, 1 / 12.2)
    e = eta_scale(t, t)
    assert (e.prefill, e.decode, e.combined) == (1.0, 1.0, 1.0)
    assert e.reference == REFERENCE_MODEL and e.meets_goal


def test_twice_the_flops_at_same_ttft_is_prefill_ratio_two():
    ref = _tiny()
    big = _tiny(num_hidden_layers=2)
    f_ref, f_big = prefill_flops(ref, 3), prefill_flops(big, 3)
    # 2 layers double projections and attention but not the LM head: 2*(864+96)+80
    assert f_big == 2 * (864 + 96) + 80
    # choose TTFTs so the FLOP rate is exactly twice the reference's
    e = eta_scale(sustained(big, f_big / (2 * f_ref), 1.0, 3), sustained(ref, 1.0, 1.0, 3))
    assert e.prefill == pytest.approx(2.0)


def test_decode_ratio_and_geometric_mean():
    s = _tiny()
    ref = sustained(s, 1.0, 0.010, 3)
    slow = sustained(s, 0.5, 0.040, 3)  # prefill twice as fast, decode four times slower
    e = eta_scale(slow, ref)
    assert e.prefill == pytest.approx(2.0)
    assert e.decode == pytest.approx(0.25)
    assert e.combined == pytest.approx(math.sqrt(0.5))
    assert not e.meets_goal


def test_bigger_model_same_efficiency_scores_one():
    """A model 3x the work that takes 3x as long kept the NPU equally busy."""
    small, big = _tiny(), _tiny(num_hidden_layers=3, tie_word_embeddings=False)
    r = prefill_flops(big, 3) / prefill_flops(small, 3)
    d = decode_weight_bytes(big) / decode_weight_bytes(small)
    e = eta_scale(sustained(big, 0.2 * r, 0.01 * d, 3), sustained(small, 0.2, 0.01, 3))
    assert e.prefill == pytest.approx(1.0) and e.decode == pytest.approx(1.0)


def test_goal_boundary_and_serialization():
    on = EtaScale(prefill=ETA_GOAL, decode=ETA_GOAL)
    below = EtaScale(prefill=ETA_GOAL, decode=ETA_GOAL * 0.999)
    assert on.meets_goal and not below.meets_goal
    d = on.to_dict()
    assert d["combined"] == pytest.approx(ETA_GOAL) and d["goal"] == ETA_GOAL and d["meets_goal"] is True


@pytest.mark.parametrize("ttft,dec", [(0.0, 0.1), (-1.0, 0.1), (1.0, 0.0), (float("inf"), 0.1), (1.0, float("nan"))])
def test_rejects_non_positive_or_non_finite_times(ttft, dec):
    with pytest.raises(ValueError):
        sustained(_tiny(), ttft, dec, 3)


def test_rejects_empty_prefill():
    with pytest.raises(ValueError):
        prefill_flops(_tiny(), 0)
