from __future__ import annotations

import pytest
import torch

from tilepilot.errors import InputError
from tilepilot.runtime.kv_cache import KVCache


def test_write_advance_and_growth_keep_rows():
    c = KVCache(n_layers=2, kv_dim=4, max_positions=64, initial_capacity=2)
    rows = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    for layer in range(2):
        c.write(layer, rows, -rows)
    c.advance(3)
    assert c.capacity >= 3
    for step in range(5):
        one = torch.full((1, 4), float(100 + step), dtype=torch.bfloat16)
        for layer in range(2):
            c.write(layer, one, one)
        c.advance(1)
    assert c.length == 8
    assert torch.equal(c.keys(1)[:3], rows)
    assert torch.equal(c.values(0)[:3], -rows)
    assert torch.equal(c.keys(0)[7], torch.full((4,), 104.0, dtype=torch.bfloat16))
    c.reset()
    assert c.length == 0 and c.keys(0).shape[0] == 0


def test_overflowing_the_context_is_an_input_error():
    c = KVCache(n_layers=1, kv_dim=2, max_positions=4)
    c.write(0, torch.zeros(4, 2), torch.zeros(4, 2))
    c.advance(4)
    with pytest.raises(InputError, match="context is 4"):
        c.write(0, torch.zeros(1, 2), torch.zeros(1, 2))


def test_growth_keeps_rows_written_before_they_are_committed():
    c = KVCache(n_layers=2, kv_dim=2, max_positions=4, initial_capacity=4)
    c.write(0, torch.zeros(3, 2), torch.zeros(3, 2))
    c.advance(3)
    row = torch.full((1, 2), 5.0)
    c.write(0, row, -row)  # layer 0's new row, not yet committed
    c.packed(1, 8)  # layer 1's kernel pads its keys past the capacity: the cache grows mid-pass
    assert c.capacity >= 8
    assert torch.equal(c.keys(0, n_new=1)[3], row[0].to(torch.bfloat16))
    assert torch.equal(c.values(0, n_new=1)[3], -row[0].to(torch.bfloat16))
