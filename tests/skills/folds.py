"""What the fold tests share (``test_fold_into_gemv``, ``test_normed_rope``): seeded bf16 inputs, and the check that a
decode pass with a fold computes the unfused pass's logits bit for bit with fewer launches and less modeled time."""

from __future__ import annotations

import torch

from tilepilot.runtime.dispatcher import KernelLibrary
from tilepilot.runtime.runner import NpuRunner, one_dispatch_name

IDS = [1, 5, 9, 13, 2]


def bf16(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).bfloat16()


def _logits(plan, ck, lib: KernelLibrary):
    runner = NpuRunner(plan, ck, library=lib)
    out = [runner.prefill(IDS).logits[-1]]
    for _ in range(2):
        out.append(runner.decode(int(out[-1].argmax())).logits[-1])
    return out, lib.timed_dispatches(one_dispatch_name("decode"))[-1]


def assert_same_logits_fewer_launches(unfused, folded, ck, fewer: int, faster: bool = True) -> None:
    """Prefill and two greedy decode steps of both plans give equal logits; the folded plan's one decode dispatch
    has ``fewer`` launches fewer and (``faster``) takes less modeled time."""
    lib = KernelLibrary()
    before, one_before = _logits(unfused, ck, lib)
    after, one_after = _logits(folded, ck, lib)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert one_before.launches - one_after.launches == fewer
    assert one_after.seconds < one_before.seconds or not faster
