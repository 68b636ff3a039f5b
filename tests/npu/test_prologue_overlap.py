"""A launch's one-time prologue (a GEMV's folded RMSNorm) and the stream behind it (``npu.timing.prologue_exposed``):
the workers pay the whole prologue before their first call, the DMAs do not wait for them until the buffers fed from
DDR are full, so a stream-bound launch hides as much of it as its buffers hold and a worker-bound one hides none.

What could go wrong and is checked: the buffers counted twice (a link's two ends) or counted for x (sent once), a
stream credited with more buffering than its bytes, a worker-bound launch credited, a stream-bound one credited
beyond its buffers, the prologue paid again at each task-group boundary, a prefetched launch keeping the memory
tile's credit though the memory tile holds its head, and the fit's short evaluation disagreeing."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tilepilot.kernels import qgemv
from tilepilot.kernels.qgemv import chunk_bytes
from tilepilot.npu import prefetch as pf
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.npu.placer import SequentialPlacer
from tilepilot.npu.timing import evaluate, profile, prologue_exposed, stream_cycles, time_design
from tilepilot.npu.validate import check

# Llama-3.2-1B's Q/K/V launch with its RMSNorm folded in, at the tiling its resident decode uses
SHAPE = qgemv.Shape(3072, 2048, 1, "q4_0", 32, parts=(2048, 512, 512), norm_eps=1e-5)
CONFIG = qgemv.Config(cols=8, tile_m=8, tile_k=1024, depth=2, weight_channels=2, rows=4, x_rides=True)


def _design(shape=SHAPE, config=CONFIG):
    return check(SequentialPlacer().place(qgemv.make_design(shape, config)))


def test_a_stream_holds_ahead_its_link_store_and_its_workers_fifos_beyond_their_first_object():
    d = _design()
    t = time_design(d)
    per_block = CONFIG.rows * CONFIG.tile_m * chunk_bytes(SHAPE, CONFIG.tile_k)  # a column's rows of one call
    # a column's two channels join in its memory tile: one stream holding one joined object there and one object
    # per worker, one more each than the fill carries; x and the norm weight arrive once and hold nothing ahead
    weights = d.meta["weight_bytes"]
    assert t.prologue[1] == pytest.approx(CONFIG.cols * 2 * per_block / weights)
    assert t.prologue[2] == pytest.approx(CONFIG.cols * per_block / weights)
    single = time_design(_design(config=replace(CONFIG, depth=1)))
    assert single.prologue[1] < t.prologue[1]


def test_a_stream_holds_ahead_at_most_its_bytes_but_its_first_objects():
    shape = qgemv.Shape(64, 256, 1, "q8_0", 32, norm_eps=1e-5)
    for config in (
        qgemv.Config(4, 4, 128, 2, 2, "q8_0", 32, rows=4, x_rides=True),
        qgemv.Config(1, 16, 256, 4, 2, "q8_0", 32, rows=1, x_rides=True),
    ):
        d = _design(shape, config)
        t = time_design(d)
        first = config.rows * config.tile_m * chunk_bytes(shape, config.tile_k)  # a column's first objects
        column = d.meta["weight_bytes"] / config.cols  # one stream's bytes
        assert t.prologue[1] * column <= column - first + 1e-9
        assert 0 <= t.prologue[2] <= t.prologue[1] < 1


def test_a_stream_bound_launch_hides_a_prologue_its_buffers_cover():
    d = _design()
    t = time_design(d)
    cycles, ahead, _ = t.prologue
    assert t.bound == "ddr" and cycles > 0
    assert ahead * stream_cycles(t.limits) >= cycles  # the stream fills the buffers slower than the norm runs
    assert t.prologue_exposed_cycles == 0
    # with nothing ahead the stream waits for the whole prologue; with half of what it needs, for the other half
    p = profile(d)
    none = evaluate(replace(p, ahead=(0.0, 0.0)), CALIBRATION)
    assert none.fill_cycles == pytest.approx(t.fill_cycles + cycles)
    half = evaluate(replace(p, ahead=(cycles / stream_cycles(t.limits) / 2, 0.0)), CALIBRATION)
    assert half.fill_cycles == pytest.approx(t.fill_cycles + cycles / 2)
    assert t.seconds < half.seconds < none.seconds
    short = evaluate(p, CALIBRATION, detail=False)  # what a fit evaluates
    assert short.cycles == pytest.approx(t.cycles) and short.fill_cycles == pytest.approx(t.fill_cycles)


def test_a_worker_bound_launch_pays_its_whole_prologue():
    worker_bound = (("worker a", 100.0), ("worker b", 90.0), ("ddr", 80.0))
    assert prologue_exposed(worker_bound, 30.0, 1e12) == pytest.approx(30.0)
    # bound by its stream with 20 cycles of slack: the workers' own limit absorbs 20, the buffers the rest
    stream_bound = (("worker a", 80.0), ("shim (0,0)", 100.0), ("ddr", 60.0))
    assert prologue_exposed(stream_bound, 30.0, 1e12) == pytest.approx(10.0)
    assert prologue_exposed(stream_bound, 30.0, 5.0) == pytest.approx(25.0)  # buffers that hold 5 cycles of it
    assert prologue_exposed(stream_bound, 0.0, 5.0) == 0.0
    # a memory tile waits for the workers as they do
    mem_bound = (("worker a", 80.0), ("mem tile (0,1)", 100.0), ("ddr", 60.0))
    assert prologue_exposed(mem_bound, 30.0, 1e12) == pytest.approx(30.0)
    rng = random.Random(0)
    for _ in range(2000):
        limits = [(n, rng.uniform(0, 100)) for n in ("worker a", "mem tile (0,1)", "shim (0,0)", "ddr")]
        cycles, hidden = rng.uniform(0, 50), rng.uniform(0, 80)
        assert -1e-9 <= prologue_exposed(limits, cycles, hidden) <= cycles + 1e-9


def test_a_prologue_is_paid_once_not_at_every_task_group_boundary():
    p = replace(profile(_design()), ahead=(0.0, 0.0))  # the prologue wholly exposed
    one, three = evaluate(p, CALIBRATION), evaluate(replace(p, n_groups=3), CALIBRATION)
    bubble = one.fill_cycles - one.prologue_exposed_cycles + one.drain_cycles
    assert one.prologue_exposed_cycles == pytest.approx(one.prologue[0])
    assert three.cycles == pytest.approx(one.cycles + 2 * bubble)


def test_a_prefetched_launch_hides_its_prologue_only_in_l1():
    t = time_design(_design())
    assert t.prologue_exposed_cycles == 0
    new = pf._retimed(t, int(t.ddr_read_bytes * 0.3), CALIBRATION)
    assert new.steady_cycles < t.steady_cycles and new.seconds < t.seconds
    # the memory tile holds the head being read out: crediting its buffers too would expose less
    with_mem_tile = prologue_exposed(new.limits, t.prologue[0], t.prologue[1] * stream_cycles(new.limits))
    assert new.prologue_exposed_cycles > with_mem_tile
    assert new.fill_cycles == pytest.approx(t.fill_cycles + new.prologue_exposed_cycles)
    assert new.cycles == pytest.approx(new.fill_cycles + new.steady_cycles + new.drain_cycles)
