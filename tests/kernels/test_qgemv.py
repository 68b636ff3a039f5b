"""Quantized GEMV: packed weights with true byte counts, tile path == fast path, the gate, the weight feed choice."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kernel_checks import kernel_gate, rand_bf16

from tilepilot.kernels import gemv, qgemv
from tilepilot.kernels.tuning import tune
from tilepilot.model.quant import quantize
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.npu.device import npu2
from tilepilot.npu.execute import ExecutionError, run_fast, run_tile
from tilepilot.npu.timing import compute_cycles_per_call, time_dispatch
from tilepilot.npu.trace import launch_layout
from tilepilot.npu.validate import DesignError, validate

SMALL = [
    (qgemv.Shape(64, 64, 1, "q4_0", 32), qgemv.Config(cols=2, tile_m=8, tile_k=64, fmt="q4_0", block=32)),
    (qgemv.Shape(64, 128, 2, "q4_1", 32), qgemv.Config(cols=2, tile_m=4, tile_k=64, depth=1, fmt="q4_1", block=32)),
    (qgemv.Shape(32, 128, 1, "q8_0", 32), qgemv.Config(cols=2, tile_m=4, tile_k=64, fmt="q8_0", block=32)),
    (qgemv.Shape(64, 128, 1, "q4_0", 64), qgemv.Config(cols=4, tile_m=8, tile_k=128, fmt="q4_0", block=64)),
    (qgemv.Shape(64, 64, 1, "q4_1", 32), qgemv.Config(2, 8, 64, 2, weight_channels=2, fmt="q4_1", block=32)),
    (qgemv.Shape(64, 64, 1, "q4_0", 32), qgemv.Config(2, 8, 64, rows=2)),
    (qgemv.Shape(128, 128, 1, "q4_1", 32), qgemv.Config(2, 4, 64, 2, 2, "q4_1", rows=4)),
    (qgemv.Shape(64, 128, 2, "q8_0", 32), qgemv.Config(2, 8, 64, 1, 2, "q8_0", rows=2)),
    (qgemv.Shape(64, 128, 1, "q4_0", 32), qgemv.Config(8, 4, 64, 2, 2, "q4_0", rows=1, x_rides=True)),
    (qgemv.Shape(128, 128, 2, "q4_1", 32), qgemv.Config(8, 2, 64, 1, 2, "q4_1", rows=4, x_rides=True)),
]


def _inputs(shape, seed=0):
    w = rand_bf16(shape.n, shape.k, seed=seed + 1, scale=0.05)
    qt = quantize(w, shape.fmt, shape.block)
    return {"x": rand_bf16(shape.m, shape.k, seed=seed), "w": qt.data}, qt


@pytest.mark.parametrize(("shape", "config"), SMALL, ids=lambda v: str(v))
def test_small_designs_validate_and_both_paths_agree_bit_for_bit(shape, config):
    design = qgemv.make_design(shape, config)
    assert validate(design) == []
    ins, qt = _inputs(shape)
    tile = run_tile(design, ins)["y"]
    exact = run_fast(design, ins, exact=True)["y"]
    assert torch.equal(tile, exact)
    # the same numbers as a bf16 GEMV over the dequantized weights: the deployed model
    ref = gemv.make_design(gemv.Shape(shape.n, shape.k, shape.m), gemv.Config(2, 1, 4, config.tile_k))
    assert torch.equal(exact, run_fast(ref, {"x": ins["x"], "w": qt.deployed()}, exact=True)["y"])
    kernel_gate("gemv", qgemv.reference(ins, shape)["y"], exact, tile=tile)


def test_packed_bytes_are_what_the_dmas_move():
    shape = qgemv.Shape(2048, 2048, 1, "q4_0", 32)
    d = qgemv.make_design(shape)
    assert validate(d) == []
    assert d.meta["weight_bytes"] == 2048 * 2048 // 32 * 18
    assert d.meta["ddr_read_bytes"] >= d.meta["weight_bytes"]
    bf = gemv.make_design(gemv.Shape(2048, 2048, 1))
    assert d.meta["ddr_read_bytes"] < 0.35 * bf.meta["ddr_read_bytes"]
    # a weight-bound GEMV at ~3.5x fewer bytes is modeled faster
    assert time_dispatch(d).seconds < time_dispatch(bf).seconds


def test_weight_channels_is_a_tuner_choice_and_refused_where_illegal():
    shape = qgemv.Shape(2048, 2048, 1, "q4_1", 32)
    cands = qgemv.candidate_configs(shape)
    assert {c.weight_channels for c in cands} == {1, 2}
    with pytest.raises(DesignError):
        qgemv.make_design(shape, qgemv.Config(cols=8, tile_m=8, tile_k=512, weight_channels=2, fmt="q4_1"))
    two = qgemv.make_design(shape, qgemv.Config(cols=4, tile_m=8, tile_k=512, weight_channels=2, fmt="q4_1"))
    assert validate(two) == []


def test_format_mismatch_and_untileable_shapes_are_refused():
    with pytest.raises(DesignError):
        qgemv.make_design(qgemv.Shape(64, 64, 1, "q4_0"), qgemv.Config(2, 8, 64, fmt="q8_0"))
    with pytest.raises(DesignError):
        qgemv.make_design(qgemv.Shape(64, 48, 1, "q4_0"), qgemv.Config(2, 8, 48, fmt="q4_0"))


def test_several_compute_rows_share_a_columns_stream_and_relieve_the_decode_bound():
    """Dequantization is the kernel's bottleneck (vector ops per weight): splitting each column's block over compute
    rows in the memory tile divides it, until the shim channels bound the stream."""
    shape = qgemv.Shape(8192, 2048, 1, "q4_0", 32)
    one = qgemv.make_design(shape, qgemv.Config(4, 8, 1024, 2, 2, rows=1))
    four = qgemv.make_design(shape, qgemv.Config(4, 8, 1024, 2, 2, rows=4))
    assert validate(four) == [] and len(four.workers) == 16
    assert four.meta["weight_bytes"] == one.meta["weight_bytes"]  # same weight bytes, four times the decoders
    assert four.meta["ddr_read_bytes"] < one.meta["ddr_read_bytes"]  # and x re-sent for fewer output blocks
    assert time_dispatch(four).seconds < 0.5 * time_dispatch(one).seconds
    assert {c.rows for c in qgemv.candidate_configs(shape)} == {1, 2, 4}
    with pytest.raises(DesignError):  # 3 rows cannot share 2 channels evenly
        qgemv.make_design(shape, qgemv.Config(4, 8, 1024, 2, 2, rows=3))


MERGED = [
    (qgemv.Shape(128, 128, 1, "q4_0", 32, (64, 32, 32)), qgemv.Config(2, 4, 64, fmt="q4_0", rows=2)),
    (qgemv.Shape(96, 64, 2, "q4_1", 32, (64, 32)), qgemv.Config(2, 8, 64, 2, 2, "q4_1", rows=2)),
    (qgemv.Shape(64, 128, 1, "q8_0", 32, (32, 32)), qgemv.Config(2, 4, 64, 1, 1, "q8_0")),
]


@pytest.mark.parametrize(("shape", "config"), MERGED, ids=lambda v: str(v))
def test_a_multi_matrix_launch_is_the_separate_launches_bit_for_bit(shape, config):
    """Q/K/V (or gate/up) as one launch: one x stream, each matrix's rows drained to its own output; the tile path,
    the fast path and the separate one-matrix launches give the same bits, and it is one legal design."""
    design = qgemv.make_design(shape, config)
    assert validate(design) == []
    x = rand_bf16(shape.m, shape.k, seed=3)
    ins, singles = {"x": x}, {}
    for j, nj in enumerate(shape.parts):
        qt = quantize(rand_bf16(nj, shape.k, seed=10 + j, scale=0.05), shape.fmt, shape.block)
        ins[f"w{j}"] = qt.data
        one = qgemv.make_design(qgemv.Shape(nj, shape.k, shape.m, shape.fmt, shape.block), config)
        singles[f"y{j}"] = run_fast(one, {"x": x, "w": qt.data}, exact=True)["y"]
    tile = run_tile(design, ins)
    exact = run_fast(design, ins, exact=True)
    assert set(tile) == set(singles) == set(exact)
    for name, y in singles.items():
        assert torch.equal(tile[name], y) and torch.equal(exact[name], y)
    assert design.meta["weight_bytes"] == sum(ins[f"w{j}"].numel() for j in range(len(shape.parts)))


def test_a_multi_matrix_launch_is_refused_when_a_matrix_does_not_tile():
    with pytest.raises(DesignError, match="N=40"):
        qgemv.make_design(qgemv.Shape(104, 64, 1, "q4_0", 32, (64, 40)), qgemv.Config(2, 8, 64, fmt="q4_0"))
    with pytest.raises(DesignError, match="parts"):
        qgemv.make_design(qgemv.Shape(100, 64, 1, "q4_0", 32, (64, 32)), qgemv.Config(2, 8, 64, fmt="q4_0"))


UNEVEN = [
    (qgemv.Shape(40, 64, 1, "q4_0", 32), qgemv.Config(3, 4, 64, 2, 2, "q4_0", rows=2, tile_m0=2)),
    (qgemv.Shape(60, 128, 2, "q4_1", 32, (40, 20)), qgemv.Config(3, 4, 64, 2, 2, "q4_1", rows=2, tile_m0=2)),
    (qgemv.Shape(48, 64, 1, "q8_0", 32), qgemv.Config(2, 4, 64, 1, 2, "q8_0", rows=1, tile_m0=4)),
    (qgemv.Shape(112, 64, 1, "q4_0", 32), qgemv.Config(3, 4, 64, 2, 2, "q4_0", rows=4, tile_m0=6)),
]


@pytest.mark.parametrize(("shape", "config"), UNEVEN, ids=lambda v: str(v))
def test_an_uneven_split_is_legal_and_the_same_numbers(shape, config):
    """Column 0 feeds weights on one channel (x on its other), the others on both, rows in proportion: a legal
    design whose tile path, fast path and even-split GEMV agree bit for bit."""
    design = qgemv.make_design(shape, config)
    assert validate(design) == []
    x = rand_bf16(shape.m, shape.k, seed=7)
    ins = {"x": x}
    names = [("w", "y")] if not shape.parts else [(f"w{j}", f"y{j}") for j in range(len(shape.parts))]
    for (w, _), nj in zip(names, shape.matrices(), strict=True):
        ins[w] = quantize(rand_bf16(nj, shape.k, seed=30 + nj, scale=0.05), shape.fmt, shape.block).data
    tile, exact = run_tile(design, ins), run_fast(design, ins, exact=True)
    for (w, y), nj in zip(names, shape.matrices(), strict=True):
        even = qgemv.make_design(qgemv.Shape(nj, shape.k, shape.m, shape.fmt, shape.block), qgemv.Config(
            1, 4, config.tile_k, fmt=shape.fmt, block=shape.block))  # fmt: skip
        ref = run_fast(even, {"x": x, "w": ins[w]}, exact=True)["y"]
        assert torch.equal(tile[y], ref) and torch.equal(exact[y], ref)
    # every column but the first feeds both shim channels; column 0's second channel carries x
    weight_fifos = {f.name: f.shim_placement.col for f in design.fifos if f.name.startswith("w_") and f.shim_placement}
    assert len(weight_fifos) == 2 * config.cols - 1
    assert next(f for f in design.fifos if f.name == "x").shim_placement.col == 0


def test_an_uneven_split_streams_more_channels_and_the_tuner_takes_it_where_the_shim_binds():
    """Llama-3.2-1B's gate/up (one launch) on 8 even columns is bound by one shim channel per column; 15 channels in
    proportion reach the DDR bound, and the tuner picks it (modeled)."""
    shape = qgemv.Shape(16384, 2048, 1, "q4_0", 32, (8192, 8192))
    even = qgemv.make_design(shape, qgemv.Config(8, 4, 256, 2, 1, "q4_0", rows=4))
    uneven = qgemv.make_design(shape, qgemv.Config(8, 36, 256, 2, 2, "q4_0", rows=4, tile_m0=4))
    assert validate(even) == [] and validate(uneven) == []
    t_even, t_uneven = time_dispatch(even), time_dispatch(uneven)
    assert t_even.designs[0].limiter.startswith("shim") and t_uneven.designs[0].limiter == "ddr"
    assert t_uneven.seconds < t_even.seconds
    assert any(c.tile_m0 for c in qgemv.candidate_configs(shape))
    with pytest.raises(DesignError, match="uneven"):
        qgemv.make_design(shape, qgemv.Config(8, 36, 256, 2, 1, "q4_0", rows=4, tile_m0=4))
    with pytest.raises(DesignError, match="N=8192"):
        qgemv.make_design(shape, qgemv.Config(8, 36, 256, 2, 2, "q4_0", rows=4, tile_m0=6))


def test_the_q4_0_calls_core_cost_is_airs_published_cycle_count():
    """qgemv's efficiency is derived, not fitted: AIR's Q4_0 decode kernel runs a 140-bundle body 8x2 times per
    32x256 weight block at about one bundle per cycle (fused_decode README). Our call of that block must cost those
    2240 core cycles (loop overhead apart), so the constant cannot drift from its source."""
    shape = qgemv.Shape(256, 2048, 1, "q4_0", 32)
    config = qgemv.Config(cols=8, tile_m=32, tile_k=256, fmt="q4_0", block=32)
    k = qgemv._kernel(shape, config, 32)
    cycles = compute_cycles_per_call(
        k.variant, k.macs_per_call, k.vector_ops_per_call, k.bytes_per_call, "qgemv", npu2(), CALIBRATION
    )
    assert cycles - CALIBRATION.loop_overhead_cycles == pytest.approx(140 * 8 * 2, rel=1e-9)


def test_a_resident_x_rides_a_weight_channel_so_every_column_feeds_two():
    """x sent once, whole, on column 0's first weight channel (``Tiling.x_rides``): 16 weight channels on 8 columns,
    x's bytes counted on that channel and nowhere else, the numbers those of the separate GEMVs, and a rider whose
    host is missing or on another shim is refused with its code."""
    shape = qgemv.Shape(96, 128, 1, "q8_0", 32, (64, 32))
    config = qgemv.Config(8, 2, 64, 1, 2, "q8_0", rows=2, x_rides=True)
    design = qgemv.make_design(shape, config)
    assert validate(design) == []
    weight_fifos = [f for f in design.fifos if f.name.startswith("w_") and f.shim_placement]
    assert len(weight_fifos) == 2 * config.cols
    x = next(f for f in design.fifos if f.name == "x")
    host = next(f for f in weight_fifos if f.name == "w_0_0")
    assert x.rides_with == host.name and x.shim_placement == host.shim_placement
    assert design.runtime.moved_elements("fill", "x") == shape.m * shape.k  # sent once per launch
    mm2s = {label: n for label, n in launch_layout(design).shim_channels if " mm2s " in label}
    assert len(mm2s) == 2 * config.cols and sum(mm2s.values()) == design.ddr_read_bytes()
    w_bytes = design.runtime.moved_elements("fill", "w_0_0")  # bytes: packed uint8
    assert 2 * shape.m * shape.k + w_bytes in (mm2s["shim 0 mm2s 0"], mm2s["shim 0 mm2s 1"])
    ins = {"x": rand_bf16(shape.m, shape.k, seed=3)}
    for j, nj in enumerate(shape.matrices()):
        ins[f"w{j}"] = quantize(rand_bf16(nj, shape.k, seed=40 + j, scale=0.05), shape.fmt, shape.block).data
    tile, exact = run_tile(design, ins), run_fast(design, ins, exact=True)
    for j, nj in enumerate(shape.matrices()):
        one = qgemv.make_design(qgemv.Shape(nj, shape.k, 1, "q8_0", 32), qgemv.Config(1, 4, 64, fmt="q8_0"))
        ref = run_fast(one, {"x": ins["x"], "w": ins[f"w{j}"]}, exact=True)["y"]
        assert torch.equal(tile[f"y{j}"], ref) and torch.equal(exact[f"y{j}"], ref)
    for bad in ("nope", "w_1_0"):
        fifos = [replace(f, rides_with=bad) if f.name == "x" else f for f in design.fifos]
        codes = {v.code for v in validate(replace(design, fifos=fifos))}
        assert "SHIM_CHANNEL_SHARE" in codes
    with pytest.raises(DesignError, match="dual-channel"):
        qgemv.make_design(shape, replace(config, weight_channels=1))
    with pytest.raises(DesignError, match="uneven"):
        qgemv.make_design(shape, replace(config, tile_m0=2))
    # the timing model queues x's bytes on its host's channel: column 0's shim is that much busier
    limits = dict(time_dispatch(design).designs[0].limits)
    host_bytes = design.runtime.moved_elements("fill", "w_0_0")
    x_bytes = 2 * shape.m * shape.k
    assert limits["shim (0,0)"] / limits["shim (1,0)"] == pytest.approx((host_bytes + x_bytes) / host_bytes)


def test_a_riding_x_queued_behind_the_weights_deadlocks_as_on_the_array():
    """One shim channel runs its transfers in order: x must be sent before the weights queued behind it, which the
    design does; the same design with x moved behind them stalls in the executor (every worker waits for x)."""
    shape = qgemv.Shape(256, 128, 1, "q4_0", 32)
    design = qgemv.make_design(shape, qgemv.Config(8, 4, 64, 2, 2, "q4_0", rows=1, x_rides=True))
    ins = {"x": rand_bf16(1, 128, seed=5), "w": quantize(rand_bf16(256, 128, seed=6, scale=0.05), "q4_0", 32).data}
    run_tile(design, ins)  # as built: runs
    tasks = design.runtime.tasks
    late = [t for t in tasks if t.fifo != "x"] + [t for t in tasks if t.fifo == "x"]
    with pytest.raises(ExecutionError, match="DEADLOCK|stalls"):
        run_tile(replace(design, runtime=replace(design.runtime, tasks=late)), ins)


def test_the_tuner_takes_the_riding_x_where_the_shim_binds():
    """Llama-3.2-1B's up projection on 8 channels is bound by them; on 16 it reaches the DDR bound and is faster
    (modeled, one timing model), and the tuner takes it."""
    shape = qgemv.Shape(8192, 2048, 1, "q4_0", 32)
    one = qgemv.make_design(shape, qgemv.Config(8, 4, 256, 2, 1, "q4_0", rows=4))
    two = qgemv.make_design(shape, qgemv.Config(8, 4, 256, 2, 2, "q4_0", rows=4, x_rides=True))
    assert validate(one) == [] and validate(two) == []
    t_one, t_two = time_dispatch(one), time_dispatch(two)
    assert t_one.designs[0].limiter.startswith("shim") and t_two.designs[0].limiter == "ddr"
    assert t_two.seconds < t_one.seconds
    assert tune("qgemv", shape).config.x_rides
