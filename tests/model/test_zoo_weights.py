"""Zoo weights: the greedy path is confident, non-degenerate and survives bf16; the generation is reproducible.

The bounds here are the ones docs/zoo.md states; the measured values are printed there.
"""

import statistics
from contextlib import contextmanager

import pytest
import torch

from tilepilot.model.zoo import ZOO, get_zoo_model
from tilepilot.model.zoo_weights import (
    WeightScheme,
    generate_tensor,
    memory_neurons,
    successors,
)

MARGIN_MEDIAN_MIN = 3.0  # logits; measured medians are 6-7 on every zoo model
TOP1_MEDIAN_RANGE = (0.5, 0.99)  # confident, not one-hot (measured ~0.8)
PROMPTS = ["The river rises in the mountains", "Good writing is clear writing.", "12:30 on platform four"]
STEPS = 24


@contextmanager
def _one_thread():
    """Decode-sized ops on a shared 2-core machine run far faster on one thread (no OpenMP wake-ups)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@torch.no_grad()
def _greedy(model, ids, steps):
    tokens, margins, top1 = [], [], []
    out = model(torch.tensor([ids]), use_cache=True)
    for _ in range(steps):
        logits = out.logits[0, -1].float()
        top = logits.topk(2)
        tokens.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        top1.append(float(logits.softmax(-1).max()))
        out = model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens, margins, top1


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "smollm2-1.7b"])
def test_greedy_is_confident_varied_and_survives_bf16(zoo_model, name):
    transformers = pytest.importorskip("transformers")
    from tilepilot.model.tokenizer import Tokenizer

    d = zoo_model(name, layers=1)
    tok = Tokenizer.from_dir(d)
    fp32 = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    bf16 = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    margins, top1 = [], []
    with _one_thread():
        _check_prompts(tok, fp32, bf16, margins, top1)
    assert statistics.median(margins) > MARGIN_MEDIAN_MIN
    assert TOP1_MEDIAN_RANGE[0] < statistics.median(top1) < TOP1_MEDIAN_RANGE[1]


@torch.no_grad()
def _check_prompts(tok, fp32, bf16, margins, top1):
    for text in PROMPTS:
        ids = tok.encode(text)
        ref, m, p = _greedy(fp32, ids, STEPS)
        margins += m
        top1 += p
        assert len(set(ref)) == STEPS, "the greedy walk must not repeat within 24 steps"
        assert _greedy(bf16, ids, STEPS)[0] == ref, "bf16 weights and activations must give the FP32 greedy tokens"
        hidden = fp32(torch.tensor([ids + ref]), output_hidden_states=True).hidden_states
        assert max(float(h.abs().max()) for h in hidden[:-1]) < 20  # O(1) residual stream


def test_plain_random_weights_are_why_the_memory_exists():
    """Without the layer-0 memory the same scales give a model that only repeats its input token."""
    transformers = pytest.importorskip("transformers")
    zm = get_zoo_model("smollm2-1.7b")
    cfg = zm.hf_config(2)
    cfg.update(hidden_size=256, intermediate_size=1536, num_attention_heads=4, num_key_value_heads=2, vocab_size=4096)
    spec = zm.spec(2).from_config(cfg)
    hf_cfg = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    results = {}
    for bigram in (0.0, WeightScheme().bigram):
        scheme = WeightScheme(bigram=bigram)
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg).float().eval()
        live = zm.live_vocab(4096)
        state = {n: generate_tensor(spec, n, 0, scheme, live) for n in spec.tensor_shapes()}
        model.load_state_dict(state, strict=False)
        with _one_thread():
            tokens, _, _ = _greedy(model, [300, 301, 302], 12)
        results[bigram] = len(set(tokens))
    assert results[0.0] <= 2 and results[WeightScheme().bigram] == 12


def test_successors_form_one_long_cycle_over_ordinary_tokens():
    live = ZOO["llama-3.2-1b"].live_vocab()
    succ = successors(live, 0)
    assert set(succ) == set(live.all)
    assert all(succ[t] != t for t in live.ordinary)
    assert set(succ.values()) <= set(live.ordinary)  # never an end-of-sequence token
    t, seen = live.ordinary[0], set()
    while t not in seen:
        seen.add(t)
        t = succ[t]
    assert seen == set(live.ordinary)
    assert successors(live, 0) == succ and successors(live, 1) != succ


def test_memory_neuron_fires_only_for_its_token():
    zm = get_zoo_model("qwen2.5-0.5b")
    spec, live = zm.spec(1), zm.live_vocab()
    gate = generate_tensor(spec, "model.layers.0.mlp.gate_proj.weight", 0, live=live)
    embed_rows = generate_tensor(spec, "model.embed_tokens.weight", 0, live=live)[[5, 900]]
    normed = embed_rows * torch.rsqrt(embed_rows.pow(2).mean(-1, keepdim=True))
    pre = normed @ gate.T
    neurons = memory_neurons(spec, live, 0)
    assert pre[0, neurons[5]] > 3.5 and pre[1, neurons[900]] > 3.5
    assert abs(pre[0, neurons[900]]) < 0.5 and abs(pre[1, neurons[5]]) < 0.5


def test_tensors_do_not_depend_on_layer_count_except_output_scale():
    zm = get_zoo_model("qwen3-0.6b")
    small, full = zm.spec(2), zm.spec()
    name = "model.layers.1.self_attn.q_proj.weight"
    assert torch.equal(generate_tensor(small, name, 3), generate_tensor(full, name, 3))
    o = "model.layers.1.self_attn.o_proj.weight"
    ratio = generate_tensor(small, o, 3) / generate_tensor(full, o, 3)
    assert torch.allclose(ratio, torch.full_like(ratio, (full.n_layers / small.n_layers) ** 0.5))
