"""The oracle against Hugging Face transformers FP32 on tiny models of all four families.

Relative error here is ``max|a - b| / max|b|`` with b the transformers value (the definition of
``gates.metrics.max_rel_err``); the mean relative error is ``mean|a - b| / mean|b|``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import build_tiny, prompt_ids
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from tilepilot.gates.metrics import max_rel_err, mean_rel_err
from tilepilot.oracle.capture import LAYER_POINTS, all_capture_names
from tilepilot.oracle.model import Oracle

PROMPT_LEN = 24
GREEDY_STEPS = 32
LOGITS_MAX_REL = 1e-4  # phase-0 gate (DESIGN.md section 6)
LOGITS_MEAN_REL = 1e-5
MIN_GREEDY_MARGIN = 0.01  # top-1 minus top-2 logit, >= 1000x the FP32 noise between implementations


def _hf_logits(tiny, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return tiny.hf(torch.tensor([ids])).logits[0].float()


def test_prefill_logits_match_transformers(tiny):
    ids = prompt_ids(PROMPT_LEN)
    ref = _hf_logits(tiny, ids)
    got = Oracle(tiny.weights).prefill(ids).logits
    assert got.shape == (PROMPT_LEN, tiny.spec.vocab) and got.dtype == torch.float32
    assert max_rel_err(ref, got) <= LOGITS_MAX_REL
    assert mean_rel_err(ref, got) <= LOGITS_MEAN_REL
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_decode_with_kv_cache_equals_full_recompute(tiny):
    ids = prompt_ids(PROMPT_LEN)
    full = Oracle(tiny.weights).prefill(ids).logits
    oracle = Oracle(tiny.weights)
    split = 10
    rows = [oracle.prefill(ids[:split]).logits]
    for pos, tok in enumerate(ids[split:], start=split):
        assert oracle.position == pos
        rows.append(oracle.decode(tok).logits)
    assert oracle.position == PROMPT_LEN
    stepped = torch.cat(rows)
    assert max_rel_err(full, stepped) <= 1e-5
    # Chunked prefill (extend) lands on the same values too.
    oracle.prefill(ids[:7])
    chunked = torch.cat([oracle.extend(ids[7:15]).logits, oracle.extend(ids[15:]).logits])
    assert max_rel_err(full[7:], chunked) <= 1e-5


def test_greedy_32_tokens_identical_to_transformers_generate(tiny):
    ids = prompt_ids(16)
    result = Oracle(tiny.weights).greedy(ids, GREEDY_STEPS, keep_logits=True)
    with torch.no_grad():
        gen = tiny.hf.generate(
            torch.tensor([ids]),
            do_sample=False,
            max_new_tokens=GREEDY_STEPS,
            min_new_tokens=GREEDY_STEPS,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert gen[0, len(ids) :].tolist() == result.tokens
    assert len(result.tokens) == GREEDY_STEPS
    assert len(result.top5_per_step) == GREEDY_STEPS and all(len(t) == 5 for t in result.top5_per_step)
    assert all(step[0] == tok for step, tok in zip(result.top5_per_step, result.tokens, strict=True))
    assert all(lp[0] >= lp[1] for lp in result.top5_logprobs)


def test_greedy_margin_is_clear(tiny):
    """The test models are not degenerate: clear top-1 margins and a varied continuation."""
    result = Oracle(tiny.weights).greedy(prompt_ids(16), GREEDY_STEPS, keep_logits=True)
    top2 = result.logits_per_step.topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) >= MIN_GREEDY_MARGIN
    assert len(set(result.tokens)) >= 8


def _hf_intermediates(tiny, ids: list[int]) -> dict[str, torch.Tensor]:
    """Every capture point read from transformers itself via forward hooks and its own RoPE."""
    got: dict[str, torch.Tensor] = {}
    handles = []
    model = tiny.hf.model

    def out_hook(name):
        def hook(_mod, _inp, out):
            got[name] = out[0].reshape(out.shape[1], -1).float()

        return hook

    def in_hook(name):
        def hook(_mod, inp):
            got[name] = inp[0][0].reshape(inp[0].shape[1], -1).float()

        return hook

    for i, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        p = f"layer{i}."
        q_mod = attn.q_norm if tiny.spec.qk_norm else attn.q_proj
        k_mod = attn.k_norm if tiny.spec.qk_norm else attn.k_proj
        for mod, name in [
            (layer.input_layernorm, "attn_norm"),
            (q_mod, "q"),
            (k_mod, "k"),
            (attn.v_proj, "v"),
            (attn.o_proj, "o_proj"),
            (layer.post_attention_layernorm, "ffn_norm"),
            (mlp.gate_proj, "gate"),
            (mlp.up_proj, "up"),
            (mlp.down_proj, "down"),
            (layer, "out"),
        ]:
            handles.append(mod.register_forward_hook(out_hook(p + name)))
        handles.append(attn.o_proj.register_forward_pre_hook(in_hook(p + "attn")))
        handles.append(mlp.down_proj.register_forward_pre_hook(in_hook(p + "act")))
    try:
        with torch.no_grad():
            out = tiny.hf(torch.tensor([ids]), output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()

    t, hd = len(ids), tiny.spec.head_dim
    with torch.no_grad():
        cos, sin = model.rotary_emb(out.hidden_states[0], torch.arange(t)[None])
    for i in range(tiny.spec.n_layers):
        p = f"layer{i}."
        layer_in = out.hidden_states[0][0] if i == 0 else got[f"layer{i - 1}.out"]
        got[p + "resid1"] = layer_in + got[p + "o_proj"]
        q = got[p + "q"].view(1, t, -1, hd).transpose(1, 2)
        k = got[p + "k"].view(1, t, -1, hd).transpose(1, 2)
        q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
        got[p + "q_rope"] = q_rot.transpose(1, 2).reshape(t, -1)
        got[p + "k_rope"] = k_rot.transpose(1, 2).reshape(t, -1)
    got["final_norm"] = out.hidden_states[-1][0].float()
    got["logits"] = out.logits[0].float()
    # transformers exposes every layer output but the last as hidden_states[i + 1].
    for i in range(tiny.spec.n_layers - 1):
        assert torch.allclose(out.hidden_states[i + 1][0], got[f"layer{i}.out"])
    return got


def test_every_capture_matches_transformers(tiny):
    ids = prompt_ids(12)
    ref = _hf_intermediates(tiny, ids)
    step = Oracle(tiny.weights).prefill(ids, capture=True)
    names = all_capture_names(tiny.spec.n_layers)
    assert sorted(step.captures) == sorted(names)
    for name in names:
        got = step.captures[name]
        assert got.shape == ref[name].shape, name
        assert got.shape[0] == len(ids)
        assert max_rel_err(ref[name], got) <= 1e-5, name


def test_capture_shapes(tiny):
    s = tiny.spec
    step = Oracle(tiny.weights).prefill(prompt_ids(5), capture=True)
    widths = {
        "q": s.q_dim,
        "k": s.kv_dim,
        "v": s.kv_dim,
        "q_rope": s.q_dim,
        "k_rope": s.kv_dim,
        "attn": s.q_dim,
        "gate": s.intermediate,
        "up": s.intermediate,
        "act": s.intermediate,
    }
    for point in LAYER_POINTS:
        assert step.captures[f"layer1.{point}"].shape == (5, widths.get(point, s.hidden)), point
    assert step.captures["logits"].shape == (5, s.vocab)


def test_wrong_rope_scaling_is_detected():
    """The comparison can fail: dropping the llama3 scaling moves the logits far beyond 1e-4."""
    tiny = build_tiny("llama3")
    ids = prompt_ids(PROMPT_LEN)
    ref = _hf_logits(tiny, ids)
    wrong = dataclasses.replace(tiny.spec, rope_scaling=None)
    tiny.weights.spec = wrong
    got = Oracle(tiny.weights).prefill(ids).logits
    assert max_rel_err(ref, got) > 1e-3


@pytest.mark.parametrize("family", ["qwen3"])
def test_bf16_checkpoint_upcast_per_layer(family):
    """bf16 weights give the same logits whether FP32 layers are cached or upcast on every use."""
    tiny = build_tiny(family, dtype=torch.bfloat16)
    ids = prompt_ids(9)
    cached = Oracle(tiny.weights, cache_fp32=True)
    streamed = Oracle(tiny.weights, cache_fp32=False)
    a, b = cached.prefill(ids).logits, streamed.prefill(ids).logits
    assert a.dtype == b.dtype == torch.float32
    assert torch.equal(a, b)
    assert streamed._layers == {} and streamed._head is None  # nothing FP32 kept between calls
    assert set(cached._layers) == set(range(tiny.spec.n_layers))
    # and equals the FP32 model whose weights are the bf16 values
    fp32 = {k: v.float() for k, v in tiny.hf.state_dict().items()}
    ref = Oracle(type(tiny.weights)(tiny.spec, fp32)).prefill(ids).logits
    assert max_rel_err(ref, a) <= 1e-6
