"""A row's numbers do not depend on how its prompt is cut into passes, nor on the host's thread count.

The server keeps the K/V rows of the previous request and runs only the rest of a new prompt (``serve/engine.py``),
so the same question asked twice runs its last token as a one-row pass the second time. On an NPU every GEMM row is
computed the same way whatever M is; the emulation must match, or a prefix-cached answer differs from a cold one (it
did on AMX CPUs, whose bf16 kernels block K by M: ``numerics.matmul``'s ``row_invariant``). Unlike the pinned digests
of ``test_host_identity.py`` this holds on any CPU, so it is checked everywhere.
"""

from __future__ import annotations

import pytest
import torch

from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.tokenizer import Tokenizer
from tilepilot.plan.builtin import builtin_plan
from tilepilot.runtime.runner import NpuRunner

QUESTION = "Which city is the capital of France?"


@pytest.fixture(scope="module")
def trained(smollm2_dir):
    model = smollm2_dir(layers=2)
    weights = load_checkpoint(model)
    ids = Tokenizer.from_dir(model).encode_chat([{"role": "user", "content": QUESTION}], add_generation_prompt=True)
    return weights, list(ids)


def _last_logits(runner: NpuRunner, ids: list[int], cut: int) -> torch.Tensor:
    """The last position's logits with the prompt run as ``ids[:cut]`` then ``ids[cut:]`` (cut 0: one pass)."""
    runner.reset()
    if cut:
        runner.extend(ids[:cut], all_logits=False)
    return runner.extend(ids[cut:], all_logits=False).logits[-1].clone()


@pytest.mark.parametrize("plan_name", ["default", "paper-like"])
def test_a_prompt_cut_into_passes_gives_the_bits_of_one_pass(trained, plan_name):
    weights, ids = trained
    runner = NpuRunner(builtin_plan(plan_name, weights.spec), weights)
    whole = _last_logits(runner, ids, 0)
    for cut in (len(ids) - 1, len(ids) // 2, 1):
        assert torch.equal(_last_logits(runner, ids, cut), whole), f"cut after {cut} of {len(ids)} tokens"
    # and the decode steps after either start agree too (the cache rows are the same bits)
    runner.reset()
    runner.extend(ids, all_logits=False)
    a = runner.decode(int(whole.argmax())).logits[-1].clone()
    _last_logits(runner, ids, len(ids) - 1)
    b = runner.decode(int(whole.argmax())).logits[-1]
    assert torch.equal(a, b)


def test_one_thread_gives_the_bits_of_two(trained):
    weights, ids = trained
    runner = NpuRunner(builtin_plan("default", weights.spec), weights)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = _last_logits(runner, ids * 4, 0)  # 4x the prompt: a step large enough to keep two threads
        torch.set_num_threads(1)
        one = _last_logits(runner, ids * 4, 0)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
