"""Torch's intra-op threads for one step of the runner: a single thread for small steps.

A forward pass is a chain of a few hundred ops per token batch. When each op is small (a decode step's one-row
GEMVs, a short prompt's GEMMs on a small model) waking OpenMP workers costs more than the work, and on a loaded
host every parallel region also waits for a worker the scheduler has put aside. Measured on this 2-core machine at
load average ~11: a 1x576 by 576x1536 bf16 GEMV takes 0.07 ms on one thread and 16-20 ms on two; the trained
SmolLM2-135M's prefill of a 40-token prompt 0.2 s on one thread and 5-11 s on two. So a step of at most
``SMALL_STEP_ELEMENTS`` activation elements (rows x hidden: 113 rows of SmolLM2-135M, 32 of a 2048-wide model) runs
on one thread; larger steps keep torch's setting, where the work of each op is worth splitting.

The choice changes no number: the kernels the runner calls give the same bits on one thread or two
(``tests/runtime/test_host_identity.py`` pins the logits of the trained model to main's two-thread run).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

SMALL_STEP_ELEMENTS = 1 << 16  # rows x hidden of a step run on one thread


@contextmanager
def step_threads(rows: int, width: int) -> Iterator[None]:
    """One torch thread while a step of ``rows`` x ``width`` activations runs if it is small (nesting is free)."""
    before = torch.get_num_threads()
    if rows * width > SMALL_STEP_ELEMENTS or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
