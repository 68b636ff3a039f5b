"""Runner vs the FP32 oracle on reduced (2-layer) zoo checkpoints of the four families, all built-in plans.

Real widths, head layouts and vocabularies (Llama-3.2-1B with llama3 RoPE scaling, SmolLM2-1.7B, Qwen2.5-0.5B
with QKV bias, Qwen3-0.6B with per-head Q/K norm and head_dim 128) read from safetensors. To keep the suite
fast the oracle runs once per model and the greedy token-set check covers 8 steps here; the full 32-step
phase-3 gate runs on the small in-memory models of ``test_npu_runner.py``.
"""

from __future__ import annotations

import pytest
import torch

from tilepilot.gates import metrics as M
from tilepilot.gates import thresholds as T
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.npu.trace import Trace
from tilepilot.oracle.capture import capture_name
from tilepilot.oracle.model import Oracle
from tilepilot.plan.builtin import BUILTIN_PLANS, builtin_plan
from tilepilot.runtime.runner import NpuRunner

MODELS = ["llama-3.2-1b", "smollm2-1.7b", "qwen2.5-0.5b", "qwen3-0.6b"]
PROMPT = [15, 4021, 88, 923, 7, 311, 2650, 41, 1200, 9]
STEPS = 8


@pytest.fixture(scope="module", params=MODELS)
def model(request, zoo_model):
    """(weights, oracle reference) of one reduced zoo model; the oracle runs once for all plans."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see conftest.one_torch_thread
    try:
        weights = load_checkpoint(zoo_model(request.param, layers=2))
        oracle = Oracle(weights)
        names = [capture_name(i, "out") for i in range(weights.spec.n_layers)]
        ref = oracle.prefill(PROMPT, capture=names)
        greedy = oracle.greedy(PROMPT, STEPS)
    finally:
        torch.set_num_threads(threads)
    return weights, {"logits": ref.logits, "layers": [ref.captures[n] for n in names], "greedy": greedy}


# the bf16 built-in plans: the reference here is the bf16 model (air-q4 deploys a quantized one; its gate against the
# deployed model's oracle is in tests/runtime/test_npu_runner.py and tests/plan/test_air_q4.py)
BF16_PLANS = [n for n in BUILTIN_PLANS if n != "air-q4"]


@pytest.mark.parametrize("plan_name", BF16_PLANS)
def test_zoo_model_passes_phase3_measurements(model, plan_name):
    weights, ref = model
    plan = builtin_plan(plan_name, weights.spec)
    trace = Trace()
    runner = NpuRunner(plan, weights, trace=trace)
    first = runner.prefill(PROMPT, capture_layers=True)
    tokens, top5, last = [], [], first.logits[-1]
    for i in range(STEPS):
        top5.append(torch.topk(last, 5).indices.tolist())
        tokens.append(int(torch.argmax(last)))
        if i + 1 < STEPS:
            last = runner.decode(tokens[-1]).logits[-1]
    profile = M.layer_cosine_profile([M.cosine(r, t) for r, t in zip(ref["layers"], first.layer_outputs, strict=True)])
    g = ref["greedy"]
    check = M.greedy_token_set_check(g.tokens, tokens, g.top5_per_step, top5)
    m = {
        T.LOGITS_COSINE: M.cosine(ref["logits"], first.logits),
        T.LAYERS_MIN_COSINE: profile["min_cosine"],
        T.LAYERS_MAX_DROP: profile["max_drop"],
        T.GREEDY_TOKEN_SET: float(check.passed),
        T.NONFINITE: float(M.nonfinite_count(first.logits)),
    }
    report = T.phase3_gate().evaluate(m)
    assert report.passed, report.failures
    assert trace.count("dispatch", stage="prefill") == plan.dispatches_per_token("prefill")
    assert trace.count("dispatch", stage="decode") == (STEPS - 1) * plan.dispatches_per_token("decode")
