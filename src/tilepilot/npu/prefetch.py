"""Weight prefetch in a resident pass: a launch's weights fetched into memory-tile regions before it starts (modeled).

Why: in a resident decode every launch pays its pipeline fill and drain, and the launches that stream no weights
(RoPE, the cache write, attention) leave DDR partly idle, yet a matrix-vector launch's weights depend on nothing
earlier in the pass. So the stream of launch i's weights may run ahead into a region of the memory tiles its
weight links sit on, while the launches before it finish; launch i then reads that part from L2 and streams only
the rest from DDR during its own steady state. GPU and Tenstorrent runtimes call the technique weight prefetching.
No silicon figure informs it: every number here is the timing model's, under its constants.

Only weights that already pass a memory-tile link (``FifoLink``: a split or forward on the way to the cores) are
fetched ahead: the link's own channels write the region and read it out (one more BD each), so no route changes. A
stream from the shim straight into a core has nowhere to wait in L2 and is left as it is.

The schedule, per launch i with such constant inputs (``Design.meta["constants"]``: weights, a fused norm's gain):

- its **window** runs from the drain of the previous such launch j (whose weights are then consumed, so its weight
  links' channels are free) through every launch between j and i to the end of i's own pipeline fill (its links'
  channels are its own); a pass's first such launch has only its fill;
- in each part of the window the prefetch moves bytes at ``min(i's own weight feed rate x the share of i's shim
  MM2S channels the part leaves free, the DDR rate left beside the part's own DDR traffic)``, and at nothing in a
  part whose launch leaves no S2MM channel free on one of i's memory tiles; one DMA hop latency (the shim -> memory
  tile path) is taken off at i's feed rate;
- it holds at most what the memory tiles have free after the pass's packing, in the proportion i's stream uses
  each of them, and never more than i's linked constant bytes.

Launch i is timed with that many fewer DDR bytes, and kept as it was where that is not faster. Its shim-channel and
memory-tile limits keep every byte and its fill and drain are unchanged (conservative: the prefetched bytes crossed
the same shim channel earlier, and reading them from L2 could shorten the fill; neither is credited).

Legality: one region per memory tile, reused by every launch in turn (a launch consumes its prefetched head first,
before the next launch's prefetch starts in its drain), sized to the largest share any launch puts there, with two
more buffer descriptors and two locks. A memory tile whose budgets do not allow that holds no region.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tilepilot.npu.calibration import Calibration
from tilepilot.npu.design import Design, nbytes
from tilepilot.npu.device import Tile
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

    @property
    def nbytes(self) -> int:
        return sum(self.linked.values())


def _stream(design: Design) -> _Stream:
    constants = set(design.meta.get("constants", ()))
    linked: dict[Tile, int] = defaultdict(int)
    channels: dict[Tile, set[str]] = defaultdict(set)
    for task in design.runtime.tasks:
        fifo = design.fifo(task.fifo)
        if task.kind != "fill" or task.tensor not in constants or fifo.shim_placement is None:
            continue
        link = next((lk for lk in design.links if fifo.name in lk.srcs), None)
        if link is None or link.placement is None:  # straight from the shim to a core: nowhere to wait in L2
            continue
        linked[link.placement] += nbytes(task.tap.n_elements, design.tensor(task.tensor).dtype)
        channels[fifo.shim_placement].add(fifo.channel)
    return _Stream(dict(linked), {t: len(c) for t, c in channels.items()})


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
            landing = _channel_free(s, designs[previous], drained=True)
            parts.append((drain_s, landing * min(feed, _left(cal, j.ddr_write_bytes, drain_s))))
            for k in range(previous + 1, i):
                share = _free_share(s, _mm2s_used(designs[k]), mm2s) * _channel_free(s, designs[k])
                parts.append((out[k].seconds, min(feed * share, _left(cal, out[k].ddr_bytes, out[k].seconds))))
        fill_s = t.fill_cycles / t.clock_hz
        parts.append((fill_s, min(feed, _left(cal, own_reads, fill_s))))  # on its own links' channels
        previous = i
        ahead = sum(sec * rate for sec, rate in parts) - hop_s * feed
        room = min((free.get(m, 0) * s.nbytes / b for m, b in s.linked.items()), default=0.0)
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


def _channel_free(s: _Stream, design: Design, drained: bool = False) -> float:
    """1 when ``design``, running meanwhile, leaves an S2MM channel free on every memory tile the stream stages on
    (for the prefetch to land through), else 0. ``drained``: ``design`` is the weight launch before, in its drain,
    so the channels its own weight links used are free again."""
    have = design.device.mem.s2mm_channels
    use = _use(design)
    weights = _weight_s2mm(design) if drained else {}
    for m in s.linked:
        busy = use.get(m, TileUse()).s2mm - weights.get(m, 0)
        if busy + 1 > have:
            return 0.0
    return 1.0


def _weight_s2mm(design: Design) -> dict[Tile, int]:
    """S2MM channels of each memory tile that a launch's constant (weight) links take."""
    constants = set(design.meta.get("constants", ()))
    fed = {t.fifo for t in design.runtime.tasks if t.kind == "fill" and t.tensor in constants}
    out: dict[Tile, int] = defaultdict(int)
    for lk in design.links:
        if lk.placement is not None and fed & set(lk.srcs):
            out[lk.placement] += len(lk.srcs)
    return dict(out)


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
