"""The npu2 device and its partitions carry the reference table's numbers."""

from __future__ import annotations

import pytest

from tilepilot.errors import ConfigError
from tilepilot.npu.device import Tile, npu2, partition


def test_npu2_geometry_and_budgets():
    d = npu2()
    assert (d.name, d.columns, d.rows, d.n_compute_tiles) == ("npu2", 8, 6, 32)
    assert d.compute.memory_bytes == 64 * 1024 and d.mem.memory_bytes == 512 * 1024
    assert (d.compute.s2mm_channels, d.compute.mm2s_channels, d.compute.locks, d.compute.bds) == (2, 2, 16, 16)
    assert (d.mem.s2mm_channels, d.mem.mm2s_channels, d.mem.locks, d.mem.bds) == (6, 6, 64, 48)
    assert (d.shim.s2mm_channels, d.shim.mm2s_channels) == (2, 2)
    assert d.stream_bytes_per_cycle == 8 and d.clock_hz == 1.8e9
    assert d.macs_per_cycle("bf16") == 256 and d.macs_per_cycle("bfp16") == 512 and d.macs_per_cycle("int8") == 512
    assert d.peak_flops("bf16") == pytest.approx(29.49e12, rel=1e-3)  # reference: ~29.5 TFLOP/s
    assert d.ddr_bytes_per_s_theoretical == 120e9


def test_tile_kinds_and_order():
    d = npu2()
    assert d.is_shim(Tile(3, 0)) and d.is_mem(Tile(3, 1)) and d.is_compute(Tile(3, 5))
    assert d.kind(Tile(8, 2)) == "off" and d.kind(Tile(0, 6)) == "off" and not d.is_compute(Tile(-1, 2))
    tiles = d.compute_tiles()
    assert tiles[:5] == [Tile(0, 2), Tile(0, 3), Tile(0, 4), Tile(0, 5), Tile(1, 2)]
    assert len(d.mem_tiles()) == len(d.shim_tiles()) == 8
    assert d.resources(Tile(0, 1)) == d.mem
    with pytest.raises(ConfigError):
        d.resources(Tile(9, 1))


def test_partitions():
    for k in range(1, 9):
        p = partition(k)
        assert p.columns == k and p.n_compute_tiles == 4 * k
        assert p.compute == npu2().compute
    assert partition(4).name == "npu2_4col" and partition(8).name == "npu2"
    assert npu2().partition(2) == partition(2)
    for bad in (0, 9, 2.5):
        with pytest.raises(ConfigError):
            partition(bad)
