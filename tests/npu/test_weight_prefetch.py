"""Weight prefetch in a resident pass (``npu/prefetch.py``): a GEMV launch's weights fetched ahead into free
memory-tile regions during the gaps before it, and the launch timed with the rest streamed from DDR after the first
half of its head is read out.

What could go wrong and is checked: a launch made slower, a first launch credited with no window, more bytes fetched
than a feed has or a memory tile holds, a window credited where the shim channel, the memory tile's S2MM channels,
the shim BDs or the DDR rate are not there, regions that break a budget, a launch without weights touched, and a
prefetched pass that is not the same pass otherwise."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tilepilot.kernels import eltwise, qgemv
from tilepilot.npu import prefetch as pf
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.npu.design import nbytes
from tilepilot.npu.placer import SequentialPlacer
from tilepilot.npu.resident import pack, time_resident
from tilepilot.npu.resources import TileUse
from tilepilot.npu.timing import time_design
from tilepilot.npu.validate import budget_problems, check


def _gemv(n: int = 2048, k: int = 2048):
    """A q4_0 GEMV on 8 columns x 4 rows, both shim channels of a column feeding weights: bound by DDR."""
    cfg = qgemv.Config(cols=8, tile_m=2, tile_k=512, weight_channels=2, fmt="q4_0", block=32, rows=4, x_rides=True)
    design = qgemv.make_design(qgemv.Shape(n=n, k=k, m=1, fmt="q4_0", block=32), cfg)
    return check(SequentialPlacer().place(design))


def _add(tiles: int = 1, chunk: int = 2048):
    cfg = eltwise.Config(tiles=tiles, chunk=chunk)
    return check(SequentialPlacer().place(eltwise.make_design(eltwise.Shape(n=tiles * chunk * 8), cfg)))


def _pass():
    return [_gemv(), _add(), _gemv(2048, 8192)]  # the add keeps column 0's shim channels


def _packed():
    designs = _pass()
    p = pack("p", designs)
    return p.designs(designs), p.use


def test_a_pass_that_prefetches_is_faster_and_no_launch_is_slower():
    designs = _pass()
    plain, fetched = time_resident("p", designs), time_resident("p", designs, prefetch=True)
    assert fetched.seconds < plain.seconds
    assert [p.launch for p in fetched.prefetched] == [2]  # the first GEMV has nothing before it; the add no weights
    for a, b in zip(plain.designs, fetched.designs, strict=True):
        assert b.seconds <= a.seconds
        assert (b.fill_cycles, b.drain_cycles, b.ddr_read_bytes) == (a.fill_cycles, a.drain_cycles, a.ddr_read_bytes)
    assert fetched.designs[:2] == plain.designs[:2]
    saved = sum(p.saved_s for p in fetched.prefetched)
    assert fetched.seconds == pytest.approx(plain.seconds - saved)
    assert time_resident("p", designs, prefetch=True) == fetched  # modeled: the same figures every time


def test_the_launch_waits_for_half_its_head_to_be_read_out_before_ddr_streams_on():
    designs, _ = _packed()
    t = time_design(designs[2])
    head = 400_000
    new = pf._retimed(t, head, CALIBRATION)
    other = max(c for name, c in t.limits if name != "ddr")
    ddr = t.ddr_read_bytes + t.ddr_write_bytes
    readout = head / 2 / (ddr / (other / t.clock_hz))
    expect = max(other, (readout + (ddr - head) / CALIBRATION.ddr_bytes_per_s) * t.clock_hz)
    assert new.steady_cycles == pytest.approx(expect) and new.steady_cycles < t.steady_cycles
    assert new.cycles == pytest.approx(t.fill_cycles + expect + t.drain_cycles)
    # the whole stream fetched ahead: the launch is left at its other limits plus the first half's readout
    assert pf._retimed(t, ddr, CALIBRATION).steady_cycles == pytest.approx(max(other, other / 2))
    # its DDR traffic during the launch never runs above the calibrated rate
    assert (ddr - head) / (new.steady_cycles / t.clock_hz) <= CALIBRATION.ddr_bytes_per_s * (1 + 1e-9)


def test_a_shim_channel_carries_only_the_tails_of_the_heads_fetched_through_it():
    """The head crossed the shim in the window: during the launch each shim channel waits for the readout of half its
    feeds' heads, then carries their tails and whatever else rides it (here x on column 0's first channel), while
    the memory tiles are still counted with every byte."""
    designs, _ = _packed()
    d = designs[2]
    fs, t = pf.feeds(d), time_design(d)
    limits = dict(t.limits)
    shims = {f"shim {f.shim}" for f in fs}
    instant = float("inf")  # a readout taking no time: what the channels carry alone
    # nothing fetched: the limits the timing model gives the launch, channel by channel
    assert pf._shim_tails(d, fs, [0.0] * len(fs), CALIBRATION, 1e9) == pytest.approx({n: limits[n] for n in shims})
    # all of every stream fetched: what is left on a shim is what is not a weight (x riding, y drained)
    weights = set(d.meta["constants"])
    bpc = min(d.device.stream_bytes_per_cycle, CALIBRATION.shim_channel_bytes_per_s / d.device.clock_hz)
    tails = pf._shim_tails(d, fs, [f.nbytes for f in fs], CALIBRATION, instant)
    for name, cycles in tails.items():
        other = [
            nbytes(task.tap.n_elements, d.tensor(task.tensor).dtype)
            for task in d.runtime.tasks
            if task.tensor not in weights and f"shim {d.fifo(task.fifo).shim_placement}" == name
        ]
        assert cycles == pytest.approx(max(other, default=0) / bpc)
        assert cycles < limits[name] / 10
    # half of each fetched, read out at a finite rate: each channel waits for half its feed's head at the feed's share
    halves = [f.nbytes / 2 for f in fs]
    alone = pf._shim_tails(d, fs, halves, CALIBRATION, instant)
    reading = pf._reading(t)
    half = pf._shim_tails(d, fs, halves, CALIBRATION, reading)
    total = sum(f.nbytes for f in fs)
    wait = max(f.nbytes / 4 / (reading * f.nbytes / total) for f in fs) * d.device.clock_hz
    assert all(tails[n] < alone[n] < limits[n] for n in shims)
    assert all(half[n] == pytest.approx(alone[n] + wait, rel=0.05) for n in shims if n != "shim (0,0)")
    # with cores fast enough that the shim channels bind once half the stream is fetched: counting the heads on the
    # shim as well (as if they crossed it during the launch) would keep the launch there
    fast = replace(t, limits=tuple((n, c / 4 if n.startswith("worker") else c) for n, c in t.limits))
    head = int(sum(halves))
    as_if = pf._retimed(fast, head, CALIBRATION)
    now = pf._retimed(fast, head, CALIBRATION, pf._shim_tails(d, fs, halves, CALIBRATION, pf._reading(fast)))
    assert as_if.limiter.startswith("shim") and now.steady_cycles < as_if.steady_cycles
    assert all(c == limits[n] for n, c in now.limits if n.startswith("mem tile"))  # counted with every byte
    # a head whose readout leaves its shim slower than no prefetch at all changes nothing: the launch as it was
    one = [float(fs[0].nbytes)] + [0.0] * (len(fs) - 1)
    slow = pf._shim_tails(d, fs, one, CALIBRATION, 1e3)
    assert pf._retimed(fast, fs[0].nbytes, CALIBRATION, slow) is fast


def test_feeds_move_only_while_their_shim_channel_is_free():
    designs, _ = _packed()
    fs = pf.feeds(designs[2])
    assert {f.slot for f in fs} == {0, 1}
    add_cols = {f.shim_placement for f in designs[1].fifos if f.shim_placement is not None}
    active = pf._active(fs, designs[1], drained=False)
    busy = {t: len(c) for t, c in pf._of(designs[1]).channels.items()}
    for n, f in enumerate(fs):  # the add takes both channels of its column: those feeds wait
        assert (n in active) == (f.shim not in add_cols or f.slot >= busy[f.shim])
    assert len(active) < len(fs)
    assert pf._active(fs, designs[0], drained=True) == set(range(len(fs)))  # the GEMV before, drained: all move


def test_the_gemv_before_frees_only_its_weight_channels_in_its_drain():
    designs, _ = _packed()
    gemv, fs = designs[0], pf.feeds(designs[2])
    use = pf._of(gemv).use
    assert all(use[f.mem].s2mm == gemv.device.mem.s2mm_channels for f in fs)  # splits and joins take all six
    assert pf._active(fs, gemv, drained=False) == set()  # while it runs, nothing lands beside it
    assert all(n == 2 for n in pf._of(gemv).weight_s2mm.values())  # in its drain its two weight splits' are free


def test_a_shim_without_bds_left_or_ddr_without_headroom_moves_nothing(monkeypatch):
    designs, _ = _packed()
    fs = pf.feeds(designs[2])
    full = TileUse(bds=designs[0].device.shim.bds)
    real = pf._of
    starved = replace(real(designs[0]), use={f.shim: full for f in fs})
    monkeypatch.setattr(pf, "_of", lambda d: starved if d is designs[0] else real(d))
    assert pf._active(fs, designs[0], drained=True) == set()
    monkeypatch.setattr(pf, "_of", real)
    rate = 1e9
    saturated = [(designs[0], 1e-5, CALIBRATION.ddr_bytes_per_s * 1e-5, True)]  # DDR busy the whole part
    assert pf._fetch(fs, saturated, rate, 0.0, CALIBRATION) == [0.0] * len(fs)
    half = [(designs[0], 1e-5, CALIBRATION.ddr_bytes_per_s * 1e-5 / 2, True)]
    moved = sum(pf._fetch(fs, half, CALIBRATION.ddr_bytes_per_s, 0.0, CALIBRATION))
    assert moved == pytest.approx(CALIBRATION.ddr_bytes_per_s / 2 * 1e-5)  # the half DDR left, not the full rate


def test_each_run_of_activity_starts_one_hop_late_and_a_feed_never_fetches_more_than_it_has():
    designs, _ = _packed()
    fs = pf.feeds(designs[2])
    rate, hop = 1e9, 2e-6
    part = (designs[0], 5e-6, 0, True)
    one = sum(pf._fetch(fs, [part], rate, hop, CALIBRATION))
    assert one == pytest.approx(rate * 3e-6)
    blocked = (designs[0], 5e-6, 0, False)  # the GEMV running: nothing moves, so the next run restarts late
    assert sum(pf._fetch(fs, [part, blocked, part], rate, hop, CALIBRATION)) == pytest.approx(2 * one)
    assert sum(pf._fetch(fs, [part, part], rate, hop, CALIBRATION)) == pytest.approx(rate * 8e-6)
    got = pf._fetch(fs, [(designs[0], 1.0, 0, True)], CALIBRATION.ddr_bytes_per_s, hop, CALIBRATION)
    assert got == [f.nbytes for f in fs]


def test_regions_hold_what_the_launches_put_there_within_every_budget():
    designs, use = _packed()
    timings = [time_design(d) for d in designs]
    free = {t: 20_000 for t in designs[0].device.mem_tiles()}
    _, done, heads = pf.prefetch(designs, timings, free, CALIBRATION)
    assert done and heads and all(0 < b <= 20_000 for b in heads.values())
    claimed = pf.regions_use(designs, use, heads)
    assert budget_problems(designs[0].device, claimed) == []
    for tile, held in heads.items():
        assert claimed[tile].memory == use[tile].memory + held
        assert claimed[tile].bds > use[tile].bds and claimed[tile].locks > use[tile].locks


def test_no_region_where_the_memory_tile_has_no_memory_descriptors_or_locks_left():
    designs, _ = _packed()
    r = designs[0].device.mem
    tile = pf.feeds(designs[2])[0].mem
    claim = pf._region_claim(pf._layouts(designs)[tile])
    assert claim.bds == 2 * (1 + 2) and claim.locks == pf.REGION_LOCKS  # one split layout, two destinations
    assert pf.regions_free(designs, {tile: TileUse(memory=r.memory_bytes)})[tile] == 0
    assert pf.regions_free(designs, {tile: TileUse(bds=r.bds - claim.bds + 1)})[tile] == 0
    assert pf.regions_free(designs, {tile: TileUse(bds=r.bds - claim.bds)})[tile] == r.memory_bytes
    assert pf.regions_free(designs, {tile: TileUse(locks=r.locks - claim.locks + 1)})[tile] == 0
    timings = [time_design(d) for d in designs]
    out, done, heads = pf.prefetch(designs, timings, {}, CALIBRATION)  # no region anywhere: nothing moves
    assert out == timings and done == [] and heads == {}


def test_a_stream_straight_from_the_shim_to_a_core_is_not_fetched_ahead():
    designs, _ = _packed()
    d = designs[0]
    assert pf.feeds(d) and not pf.feeds(replace(d, links=[]))


def test_a_pass_without_weights_is_the_same_pass():
    designs = [_add(), _add(4, 2048)]
    assert time_resident("p", designs, prefetch=True) == time_resident("p", designs)


def test_a_memory_tile_without_room_claims_no_region_and_the_pass_stays_legal():
    designs, use = _packed()
    timings = [time_design(d) for d in designs]
    tiles = sorted({f.mem for f in pf.feeds(designs[2])})
    free = {t: (0 if t == tiles[0] else 20_000) for t in tiles}  # no room on the first: its feeds fetch nothing
    _, done, heads = pf.prefetch(designs, timings, free, CALIBRATION)
    assert done and tiles[0] not in heads and set(heads) == set(tiles[1:])
    r = designs[0].device.mem
    full = dict(use)
    full[tiles[0]] = TileUse(bds=r.bds, locks=use[tiles[0]].locks)  # a tile at its BD budget holds no region ...
    free = pf.regions_free(designs, full)
    assert free[tiles[0]] == 0
    _, _, heads = pf.prefetch(designs, timings, free, CALIBRATION)
    assert tiles[0] not in heads and budget_problems(designs[0].device, pf.regions_use(designs, full, heads)) == []
