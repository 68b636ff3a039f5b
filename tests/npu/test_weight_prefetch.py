"""Weight prefetch in a resident pass (``npu/prefetch.py``): a GEMV launch's weights fetched ahead into free
memory-tile regions during the gaps before it, and the launch timed with only the rest streamed from DDR.

What could go wrong and is checked: a launch made slower, more bytes fetched than the launch has weights or the
regions can hold, a window credited where the memory tiles have no channel, memory, BD or lock for it, a launch
without weights (no ``constants``) touched, and a prefetched pass that is not the same pass otherwise."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tilepilot.kernels import eltwise, qgemv
from tilepilot.npu import prefetch as pf
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.npu.placer import SequentialPlacer
from tilepilot.npu.resident import pack, time_resident
from tilepilot.npu.resources import TileUse
from tilepilot.npu.timing import evaluate, profile, time_design
from tilepilot.npu.validate import check


def _gemv(n: int = 2048, k: int = 2048):
    """A q4_0 GEMV on 8 columns x 4 rows, both shim channels of a column feeding weights: bound by DDR."""
    cfg = qgemv.Config(cols=8, tile_m=2, tile_k=512, weight_channels=2, fmt="q4_0", block=32, rows=4, x_rides=True)
    design = qgemv.make_design(qgemv.Shape(n=n, k=k, m=1, fmt="q4_0", block=32), cfg)
    return check(SequentialPlacer().place(design))


def _add(tiles: int = 8, chunk: int = 1024):
    cfg = eltwise.Config(tiles=tiles, chunk=chunk)
    return check(SequentialPlacer().place(eltwise.make_design(eltwise.Shape(n=tiles * chunk * 8), cfg)))


def _pass():
    return [_gemv(), _add(1, 2048), _gemv(2048, 8192)]  # the add keeps one column's shim channels


def _packed():
    designs = _pass()
    return pack("p", designs).designs(designs)


def test_a_pass_that_prefetches_is_faster_and_no_launch_is_slower():
    designs = _pass()
    plain, fetched = time_resident("p", designs), time_resident("p", designs, prefetch=True)
    assert fetched.seconds < plain.seconds
    assert [p.launch for p in fetched.prefetched] == [0, 2]  # the GEMVs; the add has no constant inputs
    for a, b in zip(plain.designs, fetched.designs, strict=True):
        assert b.seconds <= a.seconds
        assert (b.fill_cycles, b.drain_cycles, b.ddr_read_bytes) == (a.fill_cycles, a.drain_cycles, a.ddr_read_bytes)
    assert fetched.designs[1] == plain.designs[1]
    saved = sum(p.saved_s for p in fetched.prefetched)
    assert fetched.seconds == pytest.approx(plain.seconds - saved)
    assert time_resident("p", designs, prefetch=True) == fetched  # modeled: the same figures every time


def test_a_launch_is_timed_with_its_prefetched_bytes_off_its_ddr_stream():
    designs = _pass()
    fetched = time_resident("p", designs, prefetch=True)
    placed = pack("p", designs).designs(designs)
    for p in fetched.prefetched:
        d = placed[p.launch]
        weights = sum(t.tap.n_elements for t in d.runtime.tasks if t.tensor in d.meta["constants"])
        assert 0 < p.nbytes <= weights * 18 / 32  # q4_0: 18 bytes per block of 32
        prof = profile(d)
        expect = evaluate(replace(prof, ddr_read=prof.ddr_read - p.nbytes), CALIBRATION)
        assert fetched.designs[p.launch].seconds == pytest.approx(expect.seconds)


def test_the_first_launch_fetches_only_during_its_own_fill():
    (d,) = designs = [_gemv()]
    t = time_design(pack("p", designs).designs(designs)[0])
    s = pf._stream(d)
    feed = s.nbytes / (t.steady_cycles / t.clock_hz)
    other = t.ddr_read_bytes - s.nbytes
    fill_s, hop_s = t.fill_cycles / t.clock_hz, CALIBRATION.dma_hop_latency_cycles / t.clock_hz
    rate = min(feed, CALIBRATION.ddr_bytes_per_s - other / fill_s)
    (p,) = time_resident("p", designs, prefetch=True).prefetched
    assert p.nbytes == int(fill_s * rate - hop_s * feed)


def test_no_region_where_the_memory_tile_has_no_memory_descriptors_or_locks_left():
    designs = _pass()
    dev = designs[0].device
    r = dev.mem
    tile = dev.mem_tiles()[0]
    full = {tile: TileUse(memory=r.memory_bytes)}
    assert pf.regions_free(designs, full)[tile] == 0
    assert pf.regions_free(designs, {tile: TileUse(bds=r.bds - 1)})[tile] == 0
    assert pf.regions_free(designs, {tile: TileUse(locks=r.locks - 1)})[tile] == 0
    assert pf.regions_free(designs, {tile: TileUse(memory=1000)})[tile] == r.memory_bytes - 1000
    timings = [time_design(d) for d in designs]
    out, done, regions = pf.prefetch(designs, timings, {}, CALIBRATION)  # no region anywhere: nothing moves
    assert out == timings and done == [] and regions == {}


def test_regions_hold_what_the_launches_put_there_and_never_more_than_is_free():
    designs = _packed()
    timings = [time_design(d) for d in designs]
    free = {t: 20_000 for t in designs[0].device.mem_tiles()}
    _, done, regions = pf.prefetch(designs, timings, free, CALIBRATION)
    assert done and all(0 < b <= 20_000 for b in regions.values())
    assert max(p.nbytes for p in done) <= 20_000 * len(regions)


def test_a_launch_between_that_keeps_every_memory_tile_channel_busy_gives_no_window(monkeypatch):
    designs = _packed()
    timings = [time_design(d) for d in designs]
    free = pf.regions_free(designs, {})
    _, open_, _ = pf.prefetch(designs, timings, free, CALIBRATION)
    busy = TileUse(s2mm=designs[0].device.mem.s2mm_channels)
    real = pf._use
    monkeypatch.setattr(pf, "_use", lambda d: {t: busy for t in d.device.mem_tiles()} if d is designs[1] else real(d))
    _, blocked, _ = pf.prefetch(designs, timings, free, CALIBRATION)
    assert blocked[1].nbytes < open_[1].nbytes  # the add's time no longer counts for the second GEMV
    assert blocked[0] == open_[0]


def test_a_pass_without_weights_is_the_same_pass():
    designs = [_add(), _add(4, 2048)]
    assert time_resident("p", designs, prefetch=True) == time_resident("p", designs)


def test_the_gemv_before_frees_only_its_weight_channels_in_its_drain():
    gemv = _packed()[0]
    s = pf._stream(gemv)
    use = pf._use(gemv)
    assert all(use[m].s2mm == gemv.device.mem.s2mm_channels for m in s.linked)  # its splits and joins take all six
    assert pf._channel_free(s, gemv) == 0.0  # while it runs, nothing lands beside it
    assert pf._channel_free(s, gemv, drained=True) == 1.0  # in its drain, its weight splits' channels are free
    assert all(n == 2 for n in pf._weight_s2mm(gemv).values())  # both shim channels' splits of each column


def test_a_stream_straight_from_the_shim_to_a_core_is_not_fetched_ahead():
    d = _packed()[0]
    fifos = {f for t in d.runtime.tasks if t.tensor in d.meta["constants"] for f in (t.fifo,)}
    assert fifos and all(any(f in lk.srcs for lk in d.links) for f in fifos)  # this one's weights all pass links
    unlinked = replace(d, links=[])
    assert pf._stream(unlinked).nbytes == 0
