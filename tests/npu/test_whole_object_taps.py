"""legal_taps' ``whole``: a too long loop is cut on object boundaries, since every runtime task moves whole objects,
and only where the plain cut would split an object (so every design legal before keeps its patterns).

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
    assert all(not tap_problems(t) for t in cut) and _same_elements(cut, sizes, strides, shape)


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
    assert any(t.n_elements % whole for t in legal_taps((n,), 0, [n], [1]))  # the plain cut splits an object
    taps = legal_taps((n,), 0, [n], [1], whole=whole)
    assert all(not tap_problems(t) for t in taps)
    assert all(t.n_elements % whole == 0 for t in taps)
    assert sum(t.n_elements for t in taps) == n
    assert [t.offset for t in taps] == [sum(u.n_elements for u in taps[:i]) for i in range(len(taps))]


@pytest.mark.parametrize("n", [1023 * 2046, 5119 * 64, 8191 * 576, 4096 * 4096, 1024 * 1024, 2048 * 2046])
def test_cut_already_on_object_boundaries_is_the_plain_one(n):
    """Where the plain patterns hold whole objects they are returned as they are, for any object size they hold:
    a design legal before is unchanged."""
    plain = legal_taps((n,), 0, [n], [1])
    whole = math.gcd(*(t.n_elements for t in plain))
    for w in {2, whole // 2 if whole % 4 == 0 else whole, whole}:
        assert legal_taps((n,), 0, [n], [1], whole=w) == plain


def test_a_run_no_whole_cut_fixes_keeps_its_plain_patterns():
    """The whole-object construction is taken only when it does hold whole objects; otherwise the plain patterns
    stay (and the validator names the split object, as before)."""
    n = 1023 * 2 * 5  # rows of 2046 elements; objects of 2046 x 1023 + 1 elements fit no cut of it
    plain = legal_taps((n,), 0, [n], [1])
    assert legal_taps((n,), 0, [n], [1], whole=n // 2 + 2) == plain
