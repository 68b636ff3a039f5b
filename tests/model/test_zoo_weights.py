"""Zoo weights: the planted circuit works in transformers' own implementation, the greedy path is confident,
non-degenerate and survives bf16, and the generation is reproducible.

The bounds here are the ones docs/zoo.md states; the measured values are listed there.
"""

import statistics
from contextlib import contextmanager

import pytest
import torch

from tilepilot.model.zoo import ZOO, get_zoo_model
from tilepilot.model.zoo_weights import WeightScheme, generate_tensor, prev_heads, successors

MARGIN_MEDIAN_MIN = 4.0  # logits; docs/zoo.md lists measured medians of 5.5-7.5
MARGIN_MIN = 1.0  # smallest top1-top2 gap on any step (measured >= 2)
TOP1_MEDIAN_RANGE = (0.5, 0.995)  # confident, not one-hot (measured 0.7-0.95)
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
    succ = successors(get_zoo_model(name).live_vocab(), 0)
    fp32 = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    bf16 = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    margins, top1 = [], []
    with _one_thread():
        _check_prompts(tok, fp32, bf16, margins, top1, succ)
    assert statistics.median(margins) > MARGIN_MEDIAN_MIN
    assert TOP1_MEDIAN_RANGE[0] < statistics.median(top1) < TOP1_MEDIAN_RANGE[1]


@torch.no_grad()
def _check_prompts(tok, fp32, bf16, margins, top1, succ):
    for text in PROMPTS:
        ids = tok.encode(text)
        ref, m, p = _greedy(fp32, ids, STEPS)
        seq = ids + ref
        # the planted circuit, run by transformers: each greedy token is succ(token two positions back)
        assert all(seq[len(ids) + i] == succ[seq[len(ids) + i - 2]] for i in range(STEPS))
        margins += m
        top1 += p
        assert len(set(ref)) == STEPS, "the greedy walk must not repeat within 24 steps"
        assert _greedy(bf16, ids, STEPS)[0] == ref, "bf16 weights and activations must give the FP32 greedy tokens"
        hidden = fp32(torch.tensor([ids + ref]), output_hidden_states=True).hidden_states
        assert max(float(h.abs().max()) for h in hidden[:-1]) < 30  # O(1) residual stream
    assert min(margins) > MARGIN_MIN


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


def test_previous_token_heads_attend_to_the_previous_position(zoo_model):
    """Checked in transformers' eager attention, i.e. with Hugging Face's own RoPE, at a 200-token context."""
    transformers = pytest.importorskip("transformers")
    d = zoo_model("qwen2.5-0.5b", layers=1)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    live = get_zoo_model("qwen2.5-0.5b").live_vocab()
    ids = torch.tensor([[live.ordinary[(i * 37) % len(live.ordinary)] for i in range(200)]])
    with _one_thread(), torch.no_grad():
        attn = model(ids, output_attentions=True).attentions[0][0]  # [heads, T, T]
    q_heads, _ = prev_heads(model_spec := get_zoo_model("qwen2.5-0.5b").spec(1), WeightScheme())
    assert len(q_heads) == min(4, model_spec.n_kv_heads)
    for h in q_heads:
        to_prev = torch.stack([attn[h, t, t - 1] for t in range(1, 200)])
        assert float(to_prev.min()) > 0.98


def test_tensors_do_not_depend_on_layer_count_except_output_scale():
    zm = get_zoo_model("qwen3-0.6b")
    small, full = zm.spec(2), zm.spec()
    name = "model.layers.1.self_attn.q_proj.weight"
    assert torch.equal(generate_tensor(small, name, 3), generate_tensor(full, name, 3))
    o = "model.layers.1.self_attn.o_proj.weight"
    ratio = generate_tensor(small, o, 3) / generate_tensor(full, o, 3)
    assert torch.allclose(ratio, torch.full_like(ratio, (full.n_layers / small.n_layers) ** 0.5))
