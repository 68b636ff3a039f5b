"""Weight prefetch in a resident pass: a launch's weights fetched into memory-tile regions before it starts (modeled).

Why: in a resident decode the launches that stream no weights (RoPE, the cache write, attention) and every launch's
drain leave DDR partly idle, yet a matrix-vector launch's weights depend on nothing earlier in the pass. So the head
of launch i's weight stream may be fetched into a region of the memory tiles its weight links sit on while the
launches before it finish; launch i then reads that head from L2 and streams only the rest from DDR. GPU and
Tenstorrent runtimes call the technique weight prefetching. No silicon figure informs it: every number here is the
timing model's, under its constants, and the schedule is deliberately conservative.

**What moves.** Only weights that already pass a memory-tile link (``FifoLink``, a split or forward on their way to
the cores) are fetched ahead: each such weight fifo (a *feed*) writes its head into two halves of a region beside its
link, through the link's own S2MM channel, and the link reads them out in order before its usual buffers. A stream
from the shim straight into a core has nowhere to wait in L2 and is left as it is.

**When.** The window of launch i runs from the drain of the previous weight launch j (whose weights are then
consumed, so the channels of its weight links are free again) through every launch k between j and i; it ends when
launch i starts (its own fill is not credited: the fitted hop latency already carries what a refill costs). A pass's
first weight launch gets nothing. In each part a feed is active only where

- its shim MM2S channel is free: fifos take a shim tile's channels in the order of their first task, so a feed in
  channel slot s is free while the launch running meanwhile uses fewer than s + 1 channels there;
- the memory tile of its link has an S2MM channel free for each of i's feeds landing there;
- the shim tile has a BD free for each of i's feeds beside the running launch's own.

Active feeds move bytes at their share of launch i's own weight rate, all together at most the DDR rate the running
launch leaves (its DDR bytes over its time, taken off the calibrated rate); each run of activity starts one DMA hop
latency late (the stream's restart). A feed fetches at most its own bytes, and a memory tile holds at most what the
pass's packing leaves free there.

**What it saves.** The halves are a ping-pong pair: while launch i reads the first half out, the rest of the stream
can only wait for it, so DDR idles for that readout (half the head at the launch's rate without the DDR limit); from
then on DDR streams the tail while the second half and the region's refills are read. The DDR side of launch i is
``readout of half the head + (DDR bytes - head) / DDR rate``; its steady time is the larger of that and every other
limit: compute, the memory-tile channels (counted with every byte, conservatively: the link reads the head out of
its region and forwards it, though its incoming side takes only the tails), and the shim channels, each left with
the readout of half its feeds' heads (each feed read at its share of the launch's rate; its stream waits for that as
DDR waits for the whole head's) plus its feeds' tails (the heads crossed it in the window, while it was free). Fill
and drain are unchanged but for a one-time prologue (a folded RMSNorm): while the workers run it, the readout can
only fill their L1 buffers, and everything behind the readout waits, so the stream side hides only L1's share at
the readout's pace (``timing.prologue_exposed``). A launch this does not make faster fetches nothing.

**Legality.** A memory tile holds one region per weight-link layout of the pass that passes it (buffer descriptors
are fixed per transfer pattern): two write BDs, two read BDs per destination of the link, four locks; its memory is
the largest head any launch puts there. A memory tile where those BDs and locks do not fit beside the packing holds
no region. The regions are added to the packing's demand and checked against every budget (``regions_use``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tilepilot.npu.calibration import Calibration
from tilepilot.npu.design import Design, FifoLink, nbytes
from tilepilot.npu.device import Tile
from tilepilot.npu.resources import TileUse, add_use, resource_use
from tilepilot.npu.timing import (
    DesignTiming,
    busiest_channel,
    prologue_exposed,
    shim_bytes_per_cycle,
    shim_channel_bytes,
)

HALVES = 2  # a region is a ping-pong pair: written during the window, read out in order by the link
REGION_LOCKS = 4  # per region: a producer and a consumer lock for each half


@dataclass(frozen=True)
class Prefetched:
    """One launch's prefetch (modeled): its index in the pass, bytes fetched ahead, and the seconds it saves."""

    launch: int
    nbytes: int
    saved_s: float
    clock: str = "modeled"


@dataclass(frozen=True)
class _Feed:
    """One weight fifo of a launch that passes a memory-tile link: where it comes from and lands, and its bytes."""

    shim: Tile
    slot: int  # its MM2S channel on the shim tile (fifos take channels in the order of their first task)
    channel: str  # the fifo whose shim channel carries it (``ObjectFifo.channel``)
    mem: Tile
    layout: tuple  # its link's transfer pattern (kind, source and destination object sizes)
    reads: int  # the link's destinations: one read BD each per half
    nbytes: int


def _channels(design: Design) -> dict[Tile, list[str]]:
    """The carrying fifos of each shim tile's MM2S channels, in the order fills first use them (a fifo's slot)."""
    seen: dict[Tile, list[str]] = defaultdict(list)
    for task in design.runtime.tasks:
        fifo = design.fifo(task.fifo)
        if task.kind == "fill" and fifo.shim_placement is not None and fifo.channel not in seen[fifo.shim_placement]:
            seen[fifo.shim_placement].append(fifo.channel)
    return dict(seen)


def _layout(design: Design, link: FifoLink) -> tuple:
    return (
        link.kind,
        tuple(design.fifo(f).obj_bytes for f in link.srcs),
        tuple(design.fifo(f).obj_bytes for f in link.dsts),
    )


def feeds(design: Design) -> list[_Feed]:
    """The launch's weight fifos (``Design.meta["constants"]``) that pass a memory-tile link, with their bytes."""
    return _of(design).feeds


def _feeds(design: Design, channels: dict[Tile, list[str]]) -> list[_Feed]:
    constants = set(design.meta.get("constants", ()))
    slots = {ch: i for chans in channels.values() for i, ch in enumerate(chans)}
    out: dict[str, _Feed] = {}
    for task in design.runtime.tasks:
        fifo = design.fifo(task.fifo)
        if task.kind != "fill" or task.tensor not in constants or fifo.shim_placement is None:
            continue
        link = next((lk for lk in design.links if fifo.name in lk.srcs), None)
        if link is None or link.placement is None:  # straight from the shim to a core: nowhere to wait in L2
            continue
        size = nbytes(task.tap.n_elements, design.tensor(task.tensor).dtype)
        was = out.get(fifo.name)
        out[fifo.name] = _Feed(
            fifo.shim_placement,
            slots[fifo.channel],
            fifo.channel,
            link.placement,
            _layout(design, link),
            len(link.dsts),
            size + (was.nbytes if was else 0),
        )
    return list(out.values())


def _region_claim(layouts: dict[tuple, int]) -> TileUse:
    """BDs and locks of the regions of these link layouts (layout -> its link's destinations) on one memory tile."""
    return TileUse(bds=sum(HALVES * (1 + reads) for reads in layouts.values()), locks=REGION_LOCKS * len(layouts))


def _layouts(designs: Sequence[Design]) -> dict[Tile, dict[tuple, int]]:
    """Per memory tile, every weight-link layout the pass's feeds use there."""
    out: dict[Tile, dict[tuple, int]] = defaultdict(dict)
    for d in {id(d): d for d in designs}.values():
        for f in feeds(d):
            out[f.mem][f.layout] = f.reads
    return out


def regions_free(designs: Sequence[Design], use: dict[Tile, TileUse]) -> dict[Tile, int]:
    """Bytes of head a memory tile may hold after the pass's packing (``use``): its free memory, or nothing where the
    regions of every weight-link layout passing it would break its BD or lock budget."""
    dev = designs[0].device
    r = dev.mem
    out = {}
    for tile, layouts in _layouts(designs).items():
        u, claim = use.get(tile, TileUse()), _region_claim(layouts)
        fits = u.bds + claim.bds <= r.bds and u.locks + claim.locks <= r.locks
        out[tile] = max(r.memory_bytes - u.memory, 0) if fits else 0
    return out


def regions_use(designs: Sequence[Design], use: dict[Tile, TileUse], heads: dict[Tile, int]) -> dict[Tile, TileUse]:
    """The packing's demand with the regions holding ``heads`` bytes (memory tile -> largest head) added: what a
    prefetching pass claims, for the validator's budgets."""
    layouts = _layouts(designs)
    out = dict(use)
    for tile, held in heads.items():
        total = TileUse()
        add_use(total, use.get(tile, TileUse()))
        add_use(total, _region_claim(layouts[tile]))
        total.add_memory(held, f"weight prefetch regions ({len(layouts[tile])} layouts)")
        out[tile] = total
    return out


def prefetch(
    designs: Sequence[Design], timings: Sequence[DesignTiming], free: dict[Tile, int], cal: Calibration
) -> tuple[list[DesignTiming], list[Prefetched], dict[Tile, int]]:
    """The pass's launches retimed with their weights prefetched (see the module docstring), what each launch
    fetched ahead, and the head each memory tile holds at most (bytes)."""
    out = list(timings)
    done: list[Prefetched] = []
    heads: dict[Tile, int] = {}
    dev = designs[0].device
    hop_s = cal.dma_hop_latency_cycles / dev.clock_hz
    previous: int | None = None
    for i, (d, t) in enumerate(zip(designs, timings, strict=True)):
        every = feeds(d)
        fs = [f for f in every if _shim_bds_left(d, f.shim, sum(g.shim == f.shim for g in every))]
        if not fs:
            continue
        j, previous = previous, i
        if j is None:
            continue  # nothing runs before the pass's first weight launch
        total = sum(f.nbytes for f in fs)
        rate = total / (t.steady_cycles / t.clock_hz) if t.steady_cycles > 0 else 0.0
        parts = [(designs[j], out[j].drain_cycles / out[j].clock_hz, out[j].ddr_write_bytes, True)]
        parts += [(designs[k], out[k].seconds, out[k].ddr_bytes, False) for k in range(j + 1, i)]
        got = _fetch(fs, parts, rate, hop_s, cal)
        held: dict[Tile, float] = defaultdict(float)
        for g, f in zip(got, fs, strict=True):
            held[f.mem] += g
        for n, f in enumerate(fs):  # a memory tile holds at most its free memory
            if held[f.mem] > free.get(f.mem, 0):
                got[n] *= free.get(f.mem, 0) / held[f.mem]
        held = {m: min(b, free.get(m, 0)) for m, b in held.items()}
        fetched = int(sum(got))
        new = _retimed(t, fetched, cal, _shim_tails(d, fs, got, cal, _reading(t))) if fetched > 0 else t
        if new.seconds >= t.seconds:
            continue
        out[i] = new
        done.append(Prefetched(i, fetched, t.seconds - new.seconds))
        for mem, b in held.items():
            b = min(math.ceil(b), free.get(mem, 0))
            if b > 0:  # a tile that holds nothing claims no region
                heads[mem] = max(heads.get(mem, 0), b)
    return out, done, heads


def _fetch(fs: list[_Feed], parts: list, rate: float, hop_s: float, cal: Calibration) -> list[float]:
    """Bytes each feed fetches over the window's parts (launch running meanwhile, seconds, its DDR bytes, whether it
    is the weight launch before in its drain)."""
    total = sum(f.nbytes for f in fs)
    got = [0.0] * len(fs)
    late = [hop_s] * len(fs)  # what is left of each feed's restart latency
    for design, seconds, ddr_bytes, drained in parts:
        active = _active(fs, design, drained)
        want = sum(rate * fs[n].nbytes / total for n in active)
        left = max(cal.ddr_bytes_per_s - (ddr_bytes / seconds if seconds > 0 else 0.0), 0.0)
        scale = min(1.0, left / want) if want > 0 else 0.0
        for n in range(len(fs)):
            if n not in active:
                late[n] = hop_s
                continue
            moving = max(seconds - late[n], 0.0)
            late[n] = max(late[n] - seconds, 0.0)
            got[n] = min(got[n] + moving * rate * fs[n].nbytes / total * scale, fs[n].nbytes)
    return got


def _active(fs: list[_Feed], design: Design, drained: bool) -> set[int]:
    """The feeds that can move while ``design`` runs (``drained``: the weight launch before, in its drain)."""
    of = _of(design)
    use, dev = of.use, design.device
    mm2s = {} if drained else {t: len(c) for t, c in of.channels.items()}
    active = {n for n, f in enumerate(fs) if f.slot >= mm2s.get(f.shim, 0)}
    freed = of.weight_s2mm if drained else {}
    for mem in {f.mem for f in fs}:
        landing = [n for n in active if fs[n].mem == mem]
        busy = use.get(mem, TileUse()).s2mm - freed.get(mem, 0)
        if busy + len(landing) > dev.mem.s2mm_channels:
            active -= set(landing)
    for shim in {f.shim for f in fs}:
        going = [n for n in active if fs[n].shim == shim]
        if use.get(shim, TileUse()).bds + len(going) > dev.shim.bds:
            active -= set(going)
    return active


def _shim_tails(
    design: Design, fs: list[_Feed], got: list[float], cal: Calibration, reading: float
) -> dict[str, float]:
    """The limit (cycles) of each shim tile a fetched head left, as ``timing`` names and computes it (its busiest
    channel at the shim channel rate), each channel now carrying what its feeds did not fetch ahead, after waiting
    for the readout of half its feeds' heads (a feed is read at its share of the launch's rate ``reading``, as
    ``_retimed`` reads the whole head for the DDR side): what that shim still does during the launch."""
    taken: dict[tuple[str, str], float] = defaultdict(float)
    wait: dict[tuple[str, str], float] = defaultdict(float)
    total = sum(f.nbytes for f in fs)
    for g, f in zip(got, fs, strict=True):
        key = (f"shim {f.shim}", f.channel)
        taken[key] += g
        share = reading * f.nbytes / total if total else float("inf")
        wait[key] = max(wait[key], g / HALVES / share if share > 0 else 0.0)
    dev = design.device
    bpc = shim_bytes_per_cycle(dev, cal)
    per_s = bpc * dev.clock_hz  # a channel's bytes per second: its readout wait as bytes it could have carried
    out = {}
    for name in {f"shim {f.shim}" for f in fs}:
        fills, drains = _of(design).shim_bytes.get(name, ({}, {}))
        left = [max(b - taken[(name, ch)], 0.0) + wait[(name, ch)] * per_s for ch, b in fills.items()]
        out[name] = (
            max(
                busiest_channel(left, dev.shim.mm2s_channels),
                busiest_channel(list(drains.values()), dev.shim.s2mm_channels),
            )
            / bpc
        )
    return out


def _reading(t: DesignTiming) -> float:
    """The launch's byte rate without the DDR limit (every byte through its channels, at its other limits)."""
    other = max((c for name, c in t.limits if name != "ddr"), default=0.0)
    return (t.ddr_read_bytes + t.ddr_write_bytes) / (other / t.clock_hz) if other > 0 else float("inf")


def _retimed(t: DesignTiming, head: int, cal: Calibration, shim: dict[str, float] | None = None) -> DesignTiming:
    """``t`` with ``head`` bytes of its weights read from L2 (see the module docstring, "What it saves"); ``shim``:
    the limits of the shim tiles the head left (``_shim_tails``; none: as they were)."""
    clock = t.clock_hz
    shim = shim or {}
    assert set(shim) <= {name for name, _ in t.limits}, f"no such shim limit: {sorted(set(shim))}"
    ddr_bytes = t.ddr_read_bytes + t.ddr_write_bytes
    limits = tuple((name, shim.get(name, c)) for name, c in t.limits)
    other = max((c for name, c in limits if name != "ddr"), default=0.0)
    ddr_side = (head / HALVES / _reading(t) + (ddr_bytes - head) / cal.ddr_bytes_per_s) * clock
    steady = max(other, ddr_side)
    if steady >= t.steady_cycles:
        return t
    limits = tuple((name, ddr_side if name == "ddr" else c) for name, c in limits)
    new = replace(t, limits=limits)
    limiter, bound = ("ddr", "ddr") if ddr_side >= other else _tightest(new, other)
    # a prologue holds the head's readout once the workers' L1 buffers are full (the memory tile holds the head)
    exposed = prologue_exposed(limits, t.prologue[0], t.prologue[2] * t.ddr_read_bytes / _reading(t) * clock)
    fill = t.fill_cycles - t.prologue_exposed_cycles + exposed
    cycles = t.cycles - t.steady_cycles - t.fill_cycles + steady + fill
    timing = dict(seconds=cycles / clock, cycles=cycles, fill_cycles=fill, steady_cycles=steady)
    return replace(new, **timing, limiter=limiter, bound=bound, prologue_exposed_cycles=exposed)


def _tightest(t: DesignTiming, cycles: float) -> tuple[str, str]:
    """The limit of ``t`` that takes ``cycles``, and its kind: a worker's own bound, else a DMA channel's."""
    name = next(name for name, c in t.limits if c == cycles and name != "ddr")
    worker = next((w for w in t.workers if f"worker {w.name}" == name), None)
    return name, worker.bound if worker is not None else "dma"


def _shim_bds_left(design: Design, shim: Tile, extra: int) -> bool:
    """Whether the launch's own task groups leave ``extra`` BDs on ``shim`` (a fetched head splits each weight task
    in two: the head fetched earlier, the tail during the launch)."""
    return _of(design).use.get(shim, TileUse()).bds + extra <= design.device.shim.bds


@dataclass(frozen=True)
class _Launch:
    """What the schedule reads of one placed design, computed once: a pass repeats its layers' designs 16-30 times."""

    use: dict[Tile, TileUse]  # ``resource_use``
    channels: dict[Tile, list[str]]  # its shim MM2S channels' carrying fifos (``_channels``)
    feeds: list[_Feed]
    weight_s2mm: dict[Tile, int]  # S2MM channels of each memory tile its weight links take (free in its drain)
    shim_bytes: dict[str, tuple[dict[str, float], dict[str, float]]]  # ``timing.shim_channel_bytes``


_LAUNCHES: dict[int, tuple[Design, _Launch]] = {}


def _of(design: Design) -> _Launch:
    """``_Launch`` of a placed design, remembered by identity (the design held, so the id is not reused)."""
    hit = _LAUNCHES.get(id(design))
    if hit is None or hit[0] is not design:
        if len(_LAUNCHES) > 4096:
            _LAUNCHES.clear()
        channels = _channels(design)
        fs = _feeds(design, channels)
        weight_s2mm: dict[Tile, int] = defaultdict(int)
        for f in fs:
            weight_s2mm[f.mem] += 1
        hit = _LAUNCHES[id(design)] = (
            design,
            _Launch(resource_use(design), channels, fs, dict(weight_s2mm), shim_channel_bytes(design)),
        )
    return hit[1]
