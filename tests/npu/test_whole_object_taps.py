"""legal_taps' ``whole``: a too long loop is cut on object boundaries, since every runtime task moves whole objects.

Found by QA: a residual add over a 6001-token prompt of a 576-wide model streams one contiguous run of 3456576
elements; the plain cut (1023 rows of 1632 elements) ends inside a 64-element object, and the validator refused the
design (SHAPE_NOT_TILING).
"""

from __future__ import annotations

import math

import pytest

from tilepilot.npu.design import TensorAccessPattern
from tilepilot.npu.validate import legal_taps, tap_problems


def _same_elements(taps: list[TensorAccessPattern], sizes: list[int], strides: list[int], shape: tuple[int]) -> bool:
    """The patterns move the nest's elements in the nest's order."""
    nest = TensorAccessPattern(shape, 0, tuple(sizes), tuple(strides)).indices().tolist()
    return [i for t in taps for i in t.indices().tolist()] == nest


def test_plain_cut_splits_an_object_and_whole_cut_does_not():
    sizes, strides, shape = [1030, 2], [2, 1], (2060,)
    plain = legal_taps(shape, 0, sizes, strides)
    assert [t.n_elements for t in plain] == [2046, 14]  # 1023 rows of 2: not whole 4-element objects
    cut = legal_taps(shape, 0, sizes, strides, whole=4)
    assert [t.n_elements for t in cut] == [2044, 16]
    assert all(tap_problems(t) == [] for t in cut) and _same_elements(cut, sizes, strides, shape)


@pytest.mark.parametrize(
    ("n", "whole"),
    [
        (6001 * 576, 64),  # SmolLM2-135M's residual add at 6001 tokens on one tile
        (7777 * 576, 64),
        (513 * 4096, 4096),  # one tile streaming 513 objects of 4096: just past what one pattern holds
        (2 * 1024 * 1024, 4096),  # Llama-3.2-1B's residual add at 8192 tokens: one eighth per tile
        (257 * 4096, 4096),  # ... at 4112 tokens: rows of 1028 (4 x 257) cannot be cut into whole objects; 1024 can
    ],
)
def test_long_contiguous_runs_cut_into_whole_objects(n, whole):
    taps = legal_taps((n,), 0, [n], [1], whole=whole)
    assert all(tap_problems(t) == [] for t in taps)
    assert all(t.n_elements % whole == 0 for t in taps)
    assert sum(t.n_elements for t in taps) == n
    assert [t.offset for t in taps] == [sum(u.n_elements for u in taps[:i]) for i in range(len(taps))]


@pytest.mark.parametrize("n", [1023 * 2046, 5119 * 64, 8191 * 576, 4096 * 4096])
def test_cut_already_on_object_boundaries_is_the_plain_one(n):
    """Where the plain cut holds whole objects the patterns are the plain ones: a design legal before is unchanged."""
    plain = legal_taps((n,), 0, [n], [1])
    whole = math.gcd(*(t.n_elements for t in plain))
    assert legal_taps((n,), 0, [n], [1], whole=whole) == plain
