"""Weight prefetch in a resident pass: a launch's weights fetched into memory-tile regions before it starts (modeled).

Why: in a resident decode every launch pays its pipeline fill and drain, and the launches that stream no weights
(RoPE, the cache write, attention) leave DDR partly idle, yet a matrix-vector launch's weights depend on nothing
earlier in the pass. So the stream of launch i's weights may run ahead into a region of the memory tiles its
weight links sit on, while the launches before it finish; launch i then reads that part from L2 and streams only
the rest from DDR during its own steady state. The technique is the same one GPU and Tenstorrent runtimes call
weight prefetching. No silicon figure informs it: every number here is the timing model's, under its constants.

The prefetched head of a weight stream waits on the memory tile of its link, or, for a stream that goes from the
shim straight to a core, on the memory tile of its column, and goes up to the core packet-switched onto the stream's
own port (as ``ObjectFifo.rides_with`` shares a shim channel), into the fifo's own L1 buffers.

The schedule, per launch i with constant inputs (``Design.meta["constants"]``: weights, a fused norm's gain):

- its **window** runs from the drain of the previous such launch j (whose own weights are then consumed) through
  every launch between j and i to the end of i's own pipeline fill; a pass's first such launch has only its fill;
- in each part of the window the prefetch moves bytes at ``min(i's own weight feed rate x the share of i's shim
  MM2S channels the part leaves free, the DDR rate left beside the part's own DDR traffic)``; one DMA hop latency
  (the prefetch's shim -> memory tile path) is taken off at i's feed rate;
- it holds at most what the memory tiles have free after the pass's packing, in the proportion i's stream uses
  each of them, and never more than i's linked constant bytes.

Launch i is timed with that many fewer DDR bytes. Its shim-channel and memory-tile limits keep every byte and its
fill and drain are unchanged (conservative: the prefetched bytes crossed the same shim channel earlier, and reading
them from L2 could shorten the fill, neither of which is credited).

Legality: one region per memory tile, reused by every launch in turn (a launch consumes its prefetched head first,
before the next launch's prefetch starts in its drain), sized to the largest share any launch puts there, with one
S2MM and one MM2S channel of its own (the prefetch runs while other launches use the tile's channels), two buffer
descriptors and two locks. A memory tile whose budgets do not allow that holds no region.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tilepilot.npu.calibration import Calibration
from tilepilot.npu.design import Design, nbytes
from tilepilot.npu.device import MEM_ROW, Tile
from tilepilot.npu.resources import TileUse, resource_use
from tilepilot.npu.timing import DesignTiming, evaluate, profile

REGION_BDS = 2  # the region's write and read descriptors
REGION_LOCKS = 2  # its producer and consumer locks


@dataclass(frozen=True)
class Prefetched:
    """One launch's prefetch (modeled): its index in the pass, bytes fetched ahead, and the seconds it saves."""

    launch: int
    nbytes: int
    saved_s: float
    clock: str = "modeled"


@dataclass(frozen=True)
class _Stream:
    """What a launch's constant inputs ask of the array: bytes per memory tile they would be staged on, and MM2S
    channels per shim tile."""

    linked: dict[Tile, int]
    channels: dict[Tile, int]
    unlinked: frozenset[Tile]  # memory tiles it would stage on without a link of its own there

    @property
    def nbytes(self) -> int:
        return sum(self.linked.values())


def _stream(design: Design) -> _Stream:
    constants = set(design.meta.get("constants", ()))
    linked: dict[Tile, int] = defaultdict(int)
    channels: dict[Tile, set[str]] = defaultdict(set)
    unlinked: set[Tile] = set()
    for task in design.runtime.tasks:
        fifo = design.fifo(task.fifo)
        if task.kind != "fill" or task.tensor not in constants or fifo.shim_placement is None:
            continue
        # staged on the memory tile of its link, else on the one above its shim tile (the column it streams up)
        link = next((lk for lk in design.links if fifo.name in lk.srcs), None)
        where = link.placement if link is not None and link.placement is not None else above(fifo.shim_placement)
        if where != getattr(link, "placement", None):
            unlinked.add(where)
        linked[where] += nbytes(task.tap.n_elements, design.tensor(task.tensor).dtype)
        channels[fifo.shim_placement].add(fifo.channel)
    return _Stream(dict(linked), {t: len(c) for t, c in channels.items()}, frozenset(unlinked))


def above(shim: Tile) -> Tile:
    """The memory tile of a shim tile's column."""
    return Tile(shim.col, MEM_ROW)


def _mm2s_used(design: Design) -> dict[Tile, int]:
    """MM2S channels a launch keeps busy on each shim tile (its fills' carrying fifos)."""
    used: dict[Tile, set[str]] = defaultdict(set)
    for task in design.runtime.tasks:
        fifo = design.fifo(task.fifo)
        if task.kind == "fill" and fifo.shim_placement is not None:
            used[fifo.shim_placement].add(fifo.channel)
    return {t: len(c) for t, c in used.items()}


def regions_free(designs: Sequence[Design], use: dict[Tile, TileUse]) -> dict[Tile, int]:
    """Bytes a prefetch region may take on each memory tile after the pass's packing (``use``): the tile's free
    memory, or nothing where two more BDs or locks would break its budgets (its channels are checked per launch)."""
    dev = designs[0].device
    r = dev.mem
    out = {}
    for tile in dev.mem_tiles():
        u = use.get(tile, TileUse())
        fits = u.bds + REGION_BDS <= r.bds and u.locks + REGION_LOCKS <= r.locks
        out[tile] = max(r.memory_bytes - u.memory, 0) if fits else 0
    return out


def prefetch(
    designs: Sequence[Design], timings: Sequence[DesignTiming], free: dict[Tile, int], cal: Calibration
) -> tuple[list[DesignTiming], list[Prefetched], dict[Tile, int]]:
    """The pass's launches retimed with their weights prefetched (see the module docstring), what each launch
    fetched ahead, and the region each memory tile holds (bytes; the claim a legal pass makes)."""
    out = list(timings)
    done: list[Prefetched] = []
    regions: dict[Tile, int] = {}
    hop_s = cal.dma_hop_latency_cycles / designs[0].device.clock_hz
    mm2s = designs[0].device.shim.mm2s_channels
    previous: int | None = None
    for i, (d, t) in enumerate(zip(designs, timings, strict=True)):
        s = _stream(d)
        if s.nbytes == 0:
            continue
        steady_s = t.steady_cycles / t.clock_hz
        feed = s.nbytes / steady_s if steady_s > 0 else 0.0
        own_reads = max(t.ddr_read_bytes - s.nbytes, 0)
        parts = []  # (seconds, rate) of each part of the window
        if previous is not None:
            j = out[previous]
            drain_s = j.drain_cycles / j.clock_hz
            landing = _channel_free(s, designs[previous], "s2mm", s.unlinked)
            parts.append((drain_s, landing * min(feed, _left(cal, j.ddr_write_bytes, drain_s))))
            for k in range(previous + 1, i):
                share = _free_share(s, _mm2s_used(designs[k]), mm2s) * _channel_free(s, designs[k], "s2mm", s.linked)
                parts.append((out[k].seconds, min(feed * share, _left(cal, out[k].ddr_bytes, out[k].seconds))))
        fill_s = t.fill_cycles / t.clock_hz
        parts.append((fill_s, _channel_free(s, d, "s2mm", s.unlinked) * min(feed, _left(cal, own_reads, fill_s))))
        previous = i
        ahead = sum(sec * rate for sec, rate in parts) - hop_s * feed
        room = min((free.get(m, 0) * s.nbytes / b for m, b in s.linked.items()), default=0.0)
        room *= _channel_free(s, d, "mm2s", s.unlinked)  # the region is read out while launch i runs
        fetched = int(max(min(ahead, room, s.nbytes), 0.0))
        if fetched <= 0:
            continue
        p = profile(d)
        new = replace(evaluate(replace(p, ddr_read=p.ddr_read - fetched), cal), name=t.name)
        new = replace(new, ddr_read_bytes=t.ddr_read_bytes)  # the launch's traffic: every byte still crosses DDR
        if new.seconds >= t.seconds:  # not bound by its DDR stream: fetching ahead would buy nothing
            continue
        out[i] = new
        done.append(Prefetched(i, fetched, t.seconds - new.seconds))
        for m, b in s.linked.items():
            regions[m] = max(regions.get(m, 0), -(-fetched * b // s.nbytes))
    return out, done, regions


def _left(cal: Calibration, nbytes: float, seconds: float) -> float:
    """DDR rate left beside a part moving ``nbytes`` in ``seconds``."""
    return max(cal.ddr_bytes_per_s - (nbytes / seconds if seconds > 0 else 0.0), 0.0)


def _channel_free(s: _Stream, design: Design, side: str, tiles) -> float:
    """1 when ``design`` leaves one DMA channel of ``side`` free on each of ``tiles`` (memory tiles the stream
    stages on) for the prefetch, else 0. A stream's own link moves its prefetch on its own channels while the link's
    launch fills and after the launch before it has drained, so those parts check only the tiles where it has no
    link; a launch running in between may use any channel of any tile, so it is checked on all of them."""
    dev = design.device
    have = dev.mem.s2mm_channels if side == "s2mm" else dev.mem.mm2s_channels
    use = _use(design)
    for m in tiles:
        u = use.get(m, TileUse())
        if (u.s2mm if side == "s2mm" else u.mm2s) + 1 > have:
            return 0.0
    return 1.0


_USES: dict[int, tuple[Design, dict[Tile, TileUse]]] = {}


def _use(design: Design) -> dict[Tile, TileUse]:
    """``resource_use`` of a placed design, remembered by identity (a pass repeats its layers' designs)."""
    hit = _USES.get(id(design))
    if hit is None or hit[0] is not design:
        if len(_USES) > 4096:
            _USES.clear()
        hit = _USES[id(design)] = (design, resource_use(design))
    return hit[1]


def _free_share(s: _Stream, used: dict[Tile, int], channels: int) -> float:
    """Share of a prefetching launch's shim MM2S channels that a launch running meanwhile leaves free."""
    total = sum(s.channels.values())
    free = sum(min(n, max(channels - used.get(t, 0), 0)) for t, n in s.channels.items())
    return free / total if total else 0.0
