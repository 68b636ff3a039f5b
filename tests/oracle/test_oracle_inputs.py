"""Oracle API behaviour: capture selection, bad inputs and checkpoints, cache state after errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import build_tiny, prompt_ids

from tilepilot.errors import CheckpointError, InputError
from tilepilot.model.weights import StateDictWeights
from tilepilot.oracle import CAPTURE_POINTS, LAYER_POINTS, Oracle, all_capture_names, capture_name


@pytest.fixture(scope="module")
def qwen2():
    return build_tiny("qwen2")


def test_capture_names():
    assert capture_name(3, "q_rope") == "layer3.q_rope"
    assert CAPTURE_POINTS[-2:] == ("final_norm", "logits")
    assert len(all_capture_names(2)) == 2 * len(LAYER_POINTS) + 2
    assert all_capture_names(2, ["out"]) == ["layer0.out", "layer1.out"]
    with pytest.raises(InputError):
        capture_name(0, "logits")


def test_capture_subset_and_none(qwen2):
    oracle = Oracle(qwen2.weights)
    assert oracle.prefill(prompt_ids(4)).captures == {}
    step = oracle.prefill(prompt_ids(4), capture=["layer1.k_rope", "final_norm"])
    assert sorted(step.captures) == ["final_norm", "layer1.k_rope"]
    step = oracle.decode(5, capture=["layer0.attn"])
    assert list(step.captures) == ["layer0.attn"] and step.captures["layer0.attn"].shape == (1, qwen2.spec.q_dim)
    assert step.start == 4


@pytest.mark.parametrize("bad", [["layer2.out"], ["layer0.nope"], ["layer01.out"], ["logit"], "layer0.out"])
def test_unknown_capture_names_are_refused_before_running(qwen2, bad):
    oracle = Oracle(qwen2.weights)
    with pytest.raises(InputError):
        oracle.prefill(prompt_ids(4), capture=bad)
    assert oracle.position == 0


@pytest.mark.parametrize("ids", [[], [1, 512], [-1, 3], [1.5, 2.0], [[1, 2]]])
def test_bad_token_ids(qwen2, ids):
    with pytest.raises(InputError):
        Oracle(qwen2.weights).prefill(ids)


def test_decode_needs_a_prefill_and_errors_leave_the_cache_unchanged(qwen2):
    oracle = Oracle(qwen2.weights)
    with pytest.raises(InputError, match="prefill"):
        oracle.decode(3)
    first = oracle.prefill(prompt_ids(5)).logits
    with pytest.raises(InputError):
        oracle.extend([1, 9999])
    assert oracle.position == 5
    after = oracle.decode(7).logits
    fresh = Oracle(qwen2.weights)
    fresh.prefill(prompt_ids(5))
    assert torch.equal(after, fresh.decode(7).logits)
    assert torch.equal(first, fresh.prefill(prompt_ids(5)).logits)  # prefill starts a new sequence


def test_context_limit(qwen2):
    spec = dataclasses.replace(qwen2.spec, max_positions=8)
    oracle = Oracle(StateDictWeights(spec, qwen2.hf.state_dict()))
    oracle.prefill(prompt_ids(7))
    oracle.decode(1)
    with pytest.raises(InputError, match="8 positions"):
        oracle.decode(1)
    with pytest.raises(InputError):
        oracle.greedy(prompt_ids(4), 0)


def test_greedy_stops_at_stop_ids(qwen2):
    oracle = Oracle(qwen2.weights)
    full = oracle.greedy(prompt_ids(6), 12)
    stop = full.tokens[4]
    cut = oracle.greedy(prompt_ids(6), 12, stop_ids=[stop])
    first = full.tokens.index(stop)
    assert cut.tokens == full.tokens[: first + 1]
    assert cut.logits_per_step is None and cut.prompt == prompt_ids(6)


def test_weight_shape_mismatch_is_a_checkpoint_error(qwen2):
    state = dict(qwen2.hf.state_dict())
    state["model.layers.1.mlp.up_proj.weight"] = torch.zeros(10, qwen2.spec.hidden)
    with pytest.raises(CheckpointError, match="up_proj"):
        Oracle(StateDictWeights(qwen2.spec, state)).prefill([1, 2])
    state = dict(qwen2.hf.state_dict())
    del state["model.layers.0.self_attn.q_proj.bias"]
    with pytest.raises(CheckpointError, match="q_proj.bias"):
        Oracle(StateDictWeights(qwen2.spec, state)).prefill([1, 2])


def test_lm_head_chunks_give_the_same_logits(monkeypatch):
    """A bf16 head upcast chunk by chunk (full-size path) equals the head upcast at once."""
    import tilepilot.oracle.model as oracle_model

    tiny = build_tiny("llama3", dtype=torch.bfloat16)
    ids = prompt_ids(6)
    whole = Oracle(tiny.weights, cache_fp32=True).prefill(ids).logits
    monkeypatch.setattr(oracle_model, "LM_HEAD_CHUNK_ROWS", 100)  # 512 rows -> 6 chunks, last one short
    chunked = Oracle(tiny.weights, cache_fp32=False).prefill(ids).logits
    assert torch.allclose(whole, chunked, rtol=0, atol=1e-5)
