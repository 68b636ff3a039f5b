"""The performance model: how long a design, a dispatch and the host work around it take on XDNA2 (modeled).

There is no XDNA2 to run on and no simulator, so NPU time is computed from the design's structure and the
constants of ``npu/calibration.py``. The model is deliberately a bounds model: each resource a design uses
(a core, a tile's DMA channels, a memory tile's channels, the shim's channels, DDR) gives a lower bound on
the time, and a design takes as long as its tightest bound plus the time to fill and drain its pipeline.

Per worker, per kernel call (cycles)::

    compute  = macs / (peak_macs(variant) * eff) + vector_ops / (vector_ops_per_cycle * eff) + loop_overhead
               (scalar variant: macs / scalar_macs_per_cycle + vector_ops / scalar_ops_per_cycle + loop_overhead)
               and at least bytes_per_call / core_load_bytes_per_cycle
    dma_in   = busiest input channel:  bytes per call on it / stream_bytes_per_cycle
    dma_out  = busiest output channel: same
    call     = max(compute + max(single-buffered dma in, single-buffered dma out), dma_in, dma_out)

A fifo of depth >= 2 lets its DMA overlap the kernel (double buffering); a depth-1 fifo makes the kernel
wait for its transfer, so that transfer adds to the compute. With every fifo double-buffered this is
``max(compute, dma_in, dma_out)``; with none it is ``compute + max(dma_in, dma_out)``: the transfers no
longer overlap the kernel, but the refill of the inputs and the drain of the outputs still run at the
same time on their own channels.

Per design (cycles)::

    steady = max(worker calls * call  (slowest worker),
                 busiest memory-tile channel: bytes over the run / stream_bytes_per_cycle,
                 busiest shim channel: bytes over the run / min(stream_bytes_per_cycle, shim channel DDR rate),
                 DDR bytes (read + write) / usable DDR bandwidth)
    design = fill + steady + drain + (task groups - 1) * (fill + drain)

A one-time prologue of the workers (a folded RMSNorm) adds to the fill only what the stream behind it cannot hide
in the buffers fed from DDR (``prologue_exposed``), and once, not at each task-group boundary.

Per dispatch: ``dispatch_overhead + sum(tiles configured * tile_config + design) + (launches - 1) *
launch_in_group``, where a design configures one tile per worker and one per memory tile holding links.

Results are memoized on a design's structure (fifos, links, workers, runtime tasks, device, family), so a
full model whose layers repeat the same designs times in milliseconds.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tilepilot.errors import ConfigError, InputError
from tilepilot.npu.calibration import CALIBRATION, Calibration
from tilepilot.npu.design import Design, FifoLink, MultiLaunchGroup, Worker, nbytes
from tilepilot.npu.device import Device, Tile
from tilepilot.npu.validate import shares_memory

BOUNDS = ("compute", "dma", "ddr")


# ----------------------------------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerTiming:
    """One worker's steady state. Cycle counts are per iteration (``calls_per_iteration`` kernel calls)."""

    name: str
    iterations: int
    calls_per_iteration: int
    compute_cycles: float
    dma_in_cycles: float
    dma_out_cycles: float
    iteration_cycles: float
    double_buffered: bool
    bound: str  # "compute" | "dma"
    macs: int

    @property
    def total_cycles(self) -> float:
        return self.iteration_cycles * self.iterations


@dataclass(frozen=True)
class DesignTiming:
    """Modeled time of one launch of a design, with the bound that set it. All times are modeled."""

    name: str
    seconds: float
    cycles: float
    fill_cycles: float
    drain_cycles: float
    steady_cycles: float
    bound: str  # "compute" | "dma" | "ddr"
    limiter: str  # which resource: "worker <name>", "mem tile ...", "shim ...", "ddr"
    macs: int
    ddr_read_bytes: int
    ddr_write_bytes: int
    workers: tuple[WorkerTiming, ...]
    limits: tuple[tuple[str, float], ...]  # every lower bound considered, in cycles
    clock_hz: float
    clock: str = "modeled"
    # (cycles, ahead, ahead in L1) of a one-time prologue (``DesignProfile.ahead``); ``prologue_exposed_cycles``, the
    # part the stream behind it does not hide, is in ``fill_cycles``
    prologue: tuple[float, float, float] = (0.0, 0.0, 0.0)
    prologue_exposed_cycles: float = 0.0

    @property
    def ddr_bytes(self) -> int:
        return self.ddr_read_bytes + self.ddr_write_bytes

    @property
    def flops_per_s(self) -> float:
        return 2.0 * self.macs / self.seconds if self.seconds > 0 else 0.0

    @property
    def ddr_bytes_per_s(self) -> float:
        return self.ddr_bytes / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "clock": self.clock,
            "seconds": self.seconds,
            "bound": self.bound,
            "limiter": self.limiter,
            "cycles": self.cycles,
            "fill_cycles": self.fill_cycles,
            "drain_cycles": self.drain_cycles,
            "steady_cycles": self.steady_cycles,
            "prologue_cycles": self.prologue[0],
            "prologue_exposed_cycles": self.prologue_exposed_cycles,
            "macs": self.macs,
            "ddr_read_bytes": self.ddr_read_bytes,
            "ddr_write_bytes": self.ddr_write_bytes,
            "limits": dict(self.limits),
            "workers": [w.__dict__ | {"total_cycles": w.total_cycles} for w in self.workers],
        }


@dataclass(frozen=True)
class GroupTiming:
    """One dispatch (a single design or a multi-launch group): host round trip + launches. Modeled."""

    name: str
    seconds: float
    dispatch_overhead_s: float
    launch_overhead_s: float  # launches after the first + configuring every launch's tiles
    designs: tuple[DesignTiming, ...]
    clock: str = "modeled"
    # a resident pass's weight prefetch (``npu/prefetch.py``): one ``Prefetched`` per launch that fetched ahead
    prefetched: tuple = ()

    @property
    def launches(self) -> int:
        return len(self.designs)

    @property
    def macs(self) -> int:
        return sum(d.macs for d in self.designs)

    @property
    def ddr_bytes(self) -> int:
        return sum(d.ddr_bytes for d in self.designs)

    def by_kind(self, ddr_bytes_per_s: float) -> list[dict]:
        """The launches grouped by kernel kind (a design name's first word), costliest first: count, modeled
        seconds, the part of them that is pipeline fill and drain, DDR bytes, and those bytes' time at
        ``ddr_bytes_per_s``. It shows where a dispatch's time goes beyond its DDR floor: a launch kind whose seconds
        sit well above its DDR time is bound by fills and drains or compute, not by the weight feed."""
        kinds: dict[str, dict] = {}
        for d in self.designs:
            k = kinds.setdefault(
                d.name.split("_")[0], {"launches": 0, "seconds": 0.0, "fill_drain_s": 0.0, "ddr_bytes": 0, "bounds": {}}
            )
            k["launches"] += 1
            k["seconds"] += d.seconds
            k["fill_drain_s"] += (d.fill_cycles + d.drain_cycles) / d.clock_hz
            k["ddr_bytes"] += d.ddr_bytes
            k["bounds"][d.bound] = k["bounds"].get(d.bound, 0) + 1
        rows = [
            {"kind": name, **k, "ddr_s": k["ddr_bytes"] / ddr_bytes_per_s, "clock": "modeled"}
            for name, k in kinds.items()
        ]
        return sorted(rows, key=lambda r: (-r["seconds"], r["kind"]))


# ----------------------------------------------------------------------------------------------------------------------
# Structure: the hashable summary of a design that the model reads (and memoizes on)
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Fifo:
    name: str
    obj_bytes: int
    depth: int
    shim: Tile | None
    shared: bool  # producer and consumer workers are neighbours sharing memory: no DMA
    channel: str  # the fifo whose shim channel carries its transfers (``ObjectFifo.channel``)


@dataclass(frozen=True)
class _Worker:
    name: str
    variant: str
    macs_per_call: int
    vector_ops_per_call: int
    bytes_per_call: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    iterations: int
    calls_per_iteration: int
    acquires: tuple[tuple[str, int], ...]
    borrowed_ops: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class _Task:
    kind: str
    fifo: str
    nbytes: int
    group: int


@dataclass(frozen=True)
class Structure:
    """Everything about a design that its modeled time depends on, and nothing else (hashable)."""

    device: Device
    family: str | None
    fifos: tuple[_Fifo, ...]
    links: tuple[FifoLink, ...]
    workers: tuple[_Worker, ...]
    tasks: tuple[_Task, ...]
    meta_ddr_bytes: tuple[int, int]
    # (round trips per worker iteration, bytes each way): state a worker sends out and must get back before it goes
    # on (a GEMM's partial sums per L2 K tile, ``design.meta["spill"]``); paid serially, through the tile's DMA
    spill: tuple[int, int] = (0, 0)
    # (family, vector ops, bytes touched) of the work every worker does once before its first call, on data that
    # has arrived (a fused RMSNorm normalizing its resident x, ``design.meta["prologue"]``); what the stream behind it
    # does not hide lengthens the fill (``prologue_exposed``)
    prologue: tuple[str, int, int] = ("", 0, 0)


def structure(design: Design) -> Structure:
    """The structural key of a design: two designs with equal keys have equal modeled times."""
    tensors = {t.name: t for t in design.inputs + design.outputs}
    # The model needs only bytes per (kind, fifo, task group), so tasks are aggregated: the key stays small.
    task_bytes: dict[tuple[str, str, int], int] = {}
    for t in design.runtime.tasks:
        if t.tensor not in tensors:
            raise InputError(
                f"Design {design.name}: runtime task on {t.fifo} names tensor {t.tensor!r}, which is not a design "
                "input or output; declare the tensor."
            )
        key = (t.kind, t.fifo, t.group)
        task_bytes[key] = task_bytes.get(key, 0) + nbytes(t.tap.n_elements, tensors[t.tensor].dtype)
    tasks = [_Task(kind, fifo, n, group) for (kind, fifo, group), n in task_bytes.items()]
    workers = tuple(
        _Worker(
            w.name,
            w.kernel.variant,
            int(w.kernel.macs_per_call),
            int(w.kernel.vector_ops_per_call),
            int(w.kernel.bytes_per_call),
            w.inputs,
            w.outputs,
            int(w.iterations),
            int(w.calls_per_iteration),
            tuple(sorted(w.acquires_per_iteration().items())),
            tuple(w.kernel.borrowed_ops),
        )
        for w in design.workers
    )
    shared = _shared_memory_fifos(design)
    meta = design.meta or {}
    family = meta.get("family")
    return Structure(
        device=design.device,
        family=str(family) if family is not None else None,
        fifos=tuple(
            _Fifo(f.name, f.obj_bytes, f.depth, f.shim_placement, f.name in shared, f.channel) for f in design.fifos
        ),
        links=tuple(design.links),
        workers=workers,
        tasks=tuple(tasks),
        meta_ddr_bytes=(int(meta.get("ddr_read_bytes", 0) or 0), int(meta.get("ddr_write_bytes", 0) or 0)),
        spill=tuple(int(v) for v in meta.get("spill", (0, 0))),
        prologue=_prologue(meta.get("prologue")),
    )


def _prologue(p: dict | None) -> tuple[str, int, int]:
    return ("", 0, 0) if not p else (str(p["family"]), int(p["vector_ops"]), int(p["bytes"]))


def _shared_memory_fifos(design: Design) -> set[str]:
    """Fifos from one worker to one neighbouring worker (the validator's shared-memory rule), found in one pass."""
    off_array = {t.fifo for t in design.runtime.tasks} | {f for lk in design.links for f in lk.fifos}
    producers: dict[str, list[Worker]] = {}
    consumers: dict[str, list[Worker]] = {}
    for w in design.workers:
        for f in w.outputs:
            producers.setdefault(f, []).append(w)
        for f in w.inputs:
            consumers.setdefault(f, []).append(w)
    return {
        f
        for f, prods in producers.items()
        if f not in off_array
        and len(prods) == 1
        and len(consumers.get(f, [])) == 1
        and shares_memory(prods[0].placement, consumers[f][0].placement)
    }


# ----------------------------------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------------------------------
def time_design(design: Design, cal: Calibration = CALIBRATION) -> DesignTiming:
    """Modeled time of one launch of ``design`` (no dispatch overhead; see ``time_group``)."""
    result = _time_structure(structure(design), cal)
    return replace(result, name=design.name)


def time_group(group: MultiLaunchGroup | Design | Sequence[Design], cal: Calibration = CALIBRATION) -> GroupTiming:
    """Modeled time of one dispatch: host round trip + each launch + the extra cost of every launch after the first.

    Accepts a multi-launch group, a single design (a dispatch of one launch) or a list of designs.
    """
    name, designs = _launches(group)
    timings = tuple(time_design(d, cal) for d in designs)
    return _group_timing(name, timings, sum(tiles_configured(d) for d in designs), cal)


def _launches(group: MultiLaunchGroup | Design | Sequence[Design]) -> tuple[str, list[Design]]:
    if isinstance(group, MultiLaunchGroup):
        name, designs = group.name, list(group.designs)
    elif isinstance(group, Design):
        name, designs = group.name, [group]
    else:
        designs = list(group)
        name = "+".join(d.name for d in designs)
    if not designs:
        raise InputError(f"Dispatch {name!r} holds no launches; give it at least one design.")
    return name, designs


def _group_timing(name: str, timings: tuple[DesignTiming, ...], tiles: int, cal: Calibration) -> GroupTiming:
    extra = (len(timings) - 1) * cal.launch_in_group_s + tiles * cal.tile_config_s
    seconds = cal.dispatch_overhead_s + extra + sum(t.seconds for t in timings)
    return GroupTiming(name, seconds, cal.dispatch_overhead_s, extra, timings)


@dataclass(frozen=True, eq=False)
class GroupProfile:
    """A dispatch reduced to its launches' profiles and the tiles it configures: time it under many calibrations
    with ``time_group_profile`` without re-reading the designs (what a fit does)."""

    name: str
    designs: tuple[tuple[str, DesignProfile], ...]
    tiles: int


def group_profile(group: MultiLaunchGroup | Design | Sequence[Design]) -> GroupProfile:
    """The profile of a dispatch (same inputs as ``time_group``)."""
    name, designs = _launches(group)
    return GroupProfile(name, tuple((d.name, profile(d)) for d in designs), sum(tiles_configured(d) for d in designs))


def time_group_profile(gp: GroupProfile, cal: Calibration = CALIBRATION, *, detail: bool = True) -> GroupTiming:
    """``time_group`` of a profiled dispatch: identical figures, no design read (``detail``: see ``evaluate``)."""
    timings = tuple(replace(evaluate(p, cal, detail=detail), name=name) for name, p in gp.designs)
    return _group_timing(gp.name, timings, gp.tiles, cal)


def tiles_configured(design: Design) -> int:
    """Tiles a launch must configure: one per worker, one per memory tile holding links (unplaced links: one each)."""
    mem = {lk.placement if lk.placement is not None else lk.name for lk in design.links}
    return len(design.workers) + len(mem)


def time_dispatch(design: Design, cal: Calibration = CALIBRATION) -> GroupTiming:
    """A single design dispatched on its own (what a standalone kernel measurement sees)."""
    return time_group(design, cal)


def clear_cache() -> None:
    """Forget memoized timings (only needed by tests that count model evaluations)."""
    _time_structure.cache_clear()


@dataclass(frozen=True)
class _WorkerProfile:
    """What the model needs of one worker that does not depend on the constants (cycles per kernel call)."""

    name: str
    variant: str
    macs_per_call: int
    vector_ops_per_call: int
    bytes_per_call: int
    iterations: int
    calls_per_iteration: int
    dma_in: float
    dma_out: float
    serial: float
    double_buffered: bool
    borrowed_ops: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, eq=False)
class DesignProfile:
    """A design's structure reduced to the numbers the model combines with the constants. Computing it is most of
    the work of timing a design; evaluating it under a calibration is a few arithmetic operations, which is what
    makes a fit (hundreds of calibrations over the same designs) and its cross-validation cheap. Identity-hashed."""

    device: Device
    family: str | None
    workers: tuple[_WorkerProfile, ...]
    fixed_limits: tuple[tuple[str, float], ...]  # memory-tile channels: cycles, independent of the constants
    shim_limits: tuple[tuple[str, float], ...]  # busiest shim channel per shim tile, in bytes
    ddr_read: int
    ddr_write: int
    fill_paths: tuple[tuple[int, float], ...]  # (hops, object-transfer cycles) of every distinct fill path
    drain_paths: tuple[tuple[int, float], ...]
    n_groups: int
    macs: int
    spill: tuple[int, int] = (0, 0)
    prologue: tuple[str, int, int] = ("", 0, 0)
    # (all buffers, L1 alone): the smallest share of its bytes a stream fed from DDR can hold ahead (``_ahead``)
    ahead: tuple[float, float] = (0.0, 0.0)

    @functools.cached_property
    def distinct_workers(self) -> tuple[_WorkerProfile, ...]:
        """One worker per distinct timing (a 32-tile GEMM has one): all a fit needs to find the slowest."""
        seen: dict[tuple, _WorkerProfile] = {}
        for w in self.workers:
            seen.setdefault(dataclasses.astuple(replace(w, name="")), w)
        return tuple(seen.values())


@functools.lru_cache(maxsize=8192)
def _profile(s: Structure) -> DesignProfile:
    dev = s.device
    bpc = float(dev.stream_bytes_per_cycle)
    fifos = {f.name: f for f in s.fifos}
    _check_names(s, fifos)
    fifo_bytes = _bytes_through_fifos(s, fifos)
    workers = tuple(_worker_profile(w, fifos, dev) for w in s.workers)
    fixed = tuple((name, cyc) for name, cyc, _ in _mem_tile_limits(s, fifo_bytes, dev, bpc))
    # A shim channel streams 8 B/cycle into the array but fetches from DDR through the NoC, which caps one channel;
    # the busiest channel is kept in bytes so the rate is applied at evaluation.
    shim = tuple((name, cyc) for name, cyc, _ in _shim_limits(s, fifos, dev, 1.0))
    ddr_read = max(sum(t.nbytes for t in s.tasks if t.kind == "fill"), s.meta_ddr_bytes[0])
    ddr_write = max(sum(t.nbytes for t in s.tasks if t.kind == "drain"), s.meta_ddr_bytes[1])
    fills = _pareto({p for w in s.workers for f in w.inputs for p in _paths(f, s, fifos, bpc, _producer_link)})
    drains = _pareto({p for w in s.workers for f in w.outputs for p in _paths(f, s, fifos, bpc, _consumer_link)})
    macs = sum(w.macs_per_call * w.calls_per_iteration * w.iterations for w in s.workers)
    groups = len({t.group for t in s.tasks})
    ahead = _ahead(s, fifos, fifo_bytes) if s.prologue[1] else (0.0, 0.0)
    return DesignProfile(
        dev, s.family, workers, fixed, shim, ddr_read, ddr_write, fills, drains, groups, macs, s.spill, s.prologue,
        ahead,
    )  # fmt: skip


def _ahead(s: Structure, fifos: dict[str, _Fifo], fifo_bytes: dict[str, float]) -> tuple[float, float]:
    """What the buffers fed from DDR can hold ahead of the workers, as a share of the bytes they carry: per stream
    (the fifos of shim fill tasks and every fifo their links pass objects to, joined streams together), its buffers
    beyond the first object each, which the fill path already carries: each link's memory-tile store (its source's
    for a split or forward, its destination's for a join: ``resources.link_cost``) and each worker's input fifo (its
    consumer's L1). A buffer holds at most its depth and the objects it carries (x, sent once, holds nothing ahead),
    and a stream at most all its bytes but its first objects. The smallest share over the streams that carry more
    than one object each (the first to fill stops its channel), for all buffers and for L1 alone."""
    roots = {t.fifo for t in s.tasks if t.kind == "fill"}
    group = {f: f for f in roots}  # union-find over the fifos of one stream

    def find(f: str) -> str:
        while group[f] != f:
            f = group[f]
        return f

    links: list[FifoLink] = []
    frontier = set(roots)
    while frontier:
        new = [lk for lk in s.links if set(lk.srcs) & frontier and lk not in links]
        links += new
        frontier = {d for lk in new for d in lk.dsts} - set(group)
        for lk in new:
            for f in lk.fifos:
                group.setdefault(f, f)
            for f in lk.fifos[1:]:
                group[find(f)] = find(lk.fifos[0])

    def objects(name: str) -> float:
        f = fifos.get(name)
        return fifo_bytes.get(name, 0.0) / f.obj_bytes if f is not None and f.obj_bytes else 0.0

    def ahead(name: str) -> float:
        return max(min(fifos[name].depth, objects(name)) - 1, 0.0) * fifos[name].obj_bytes if name in fifos else 0.0

    stores = {lk.srcs[0] if lk.kind in ("split", "forward") else lk.dsts[0] for lk in links}
    consumed = {f for w in s.workers for f in w.inputs} & set(group)
    shares: list[tuple[float, float]] = []
    for top in {find(r) for r in roots}:
        members = [f for f in group if find(f) == top]
        mine = [r for r in roots if r in members]
        if all(objects(r) <= 1 for r in mine):
            continue
        carried = sum(fifo_bytes.get(r, 0.0) for r in mine)
        most = carried - sum(fifos[r].obj_bytes for r in mine)
        l1 = min(sum(ahead(f) for f in members if f in consumed), most)
        total = min(sum(ahead(f) for f in members if f in stores) + l1, most)
        shares.append((total / carried, l1 / carried) if carried else (0.0, 0.0))
    return (min(a for a, _ in shares), min(b for _, b in shares)) if shares else (0.0, 0.0)


def profile(design: Design) -> DesignProfile:
    """The constant-independent summary of ``design`` (memoized on its structure)."""
    return _profile(structure(design))


@functools.lru_cache(maxsize=8192)
def _time_structure(s: Structure, cal: Calibration) -> DesignTiming:
    return evaluate(_profile(s), cal)


def evaluate(p: DesignProfile, cal: Calibration, *, detail: bool = True) -> DesignTiming:
    """Modeled time of one launch of a profiled design under ``cal`` (see the module docstring for the terms).

    ``detail=False`` (a fit's inner loop) times each distinct worker once and reports only those: the same
    seconds, cycles and bound, fewer ``workers`` and ``limits`` entries."""
    dev = p.device
    trips, nbytes = p.spill
    # a spilled partial sum goes out and comes back, one DMA hop each way, before the next K tile can start
    spill = trips * 2 * (cal.dma_hop_latency_cycles + nbytes / float(dev.stream_bytes_per_cycle))
    chosen = p.workers if detail else p.distinct_workers
    workers = tuple(_time_worker(w, p.family, dev, cal, spill) for w in chosen)
    limits: list[tuple[str, float, str]] = [(f"worker {wt.name}", wt.total_cycles, wt.bound) for wt in workers]
    limits += [(name, cyc, "dma") for name, cyc in p.fixed_limits]
    shim_bpc = shim_bytes_per_cycle(dev, cal)
    limits += [(name, b / shim_bpc, "dma") for name, b in p.shim_limits]
    limits.append(("ddr", (p.ddr_read + p.ddr_write) / cal.ddr_bytes_per_s * dev.clock_hz, "ddr"))

    resource, steady, bound = max(limits, key=lambda x: x[1]) if limits else ("none", 0.0, "compute")
    hop = cal.dma_hop_latency_cycles
    paths = max((n * hop + b for n, b in p.fill_paths), default=0.0)
    prologue = (_prologue_cycles(p, cal), *p.ahead)
    named = tuple((name, cyc) for name, cyc, _ in limits)
    exposed = prologue_exposed(named, prologue[0], p.ahead[0] * stream_cycles(named))
    fill = paths + exposed
    drain = max((n * hop + b for n, b in p.drain_paths), default=0.0)
    bubbles = max(p.n_groups - 1, 0) * (paths + drain)  # the prologue runs once, not at every group boundary
    cycles = fill + steady + drain + bubbles
    return DesignTiming(
        name="",
        seconds=cycles / dev.clock_hz,
        cycles=cycles,
        fill_cycles=fill,
        drain_cycles=drain,
        steady_cycles=steady,
        bound=bound,
        limiter=resource,
        macs=p.macs,
        ddr_read_bytes=p.ddr_read,
        ddr_write_bytes=p.ddr_write,
        workers=workers,
        limits=named,
        clock_hz=dev.clock_hz,
        prologue=prologue,
        prologue_exposed_cycles=exposed,
    )


def _streams(name: str) -> bool:
    """Whether a limit is the stream's from DDR (the DDR bandwidth, a shim tile's channels)."""
    return name == "ddr" or name.startswith("shim ")


def stream_cycles(limits: Sequence[tuple[str, float]]) -> float:
    """The longest of a launch's stream limits (``_streams``): the cycles its stream from DDR takes."""
    return max((c for name, c in limits if _streams(name)), default=0.0)


def prologue_exposed(limits: Sequence[tuple[str, float]], cycles: float, hidden: float) -> float:
    """Cycles a one-time prologue of ``cycles`` adds to a launch whose steady state is ``max(limits)``. The workers
    run it before their first call, so their limits grow by all of it, as do the memory tiles' (their outgoing side
    waits for the workers' buffers to free). The stream from DDR does not wait until the buffers it feeds are full,
    which takes it ``hidden`` cycles (``DesignProfile.ahead``'s share of its bytes at its own pace), so the stream
    limits grow only by what is left of the prologue after that. A launch bound by its stream hides a prologue its
    buffers cover, as the array does (the DMAs run on their own); a worker-bound one pays all of it."""
    if cycles <= 0 or not limits:
        return 0.0
    steady = max(c for _, c in limits)
    rest = max((c for name, c in limits if not _streams(name)), default=0.0)
    return max(rest + cycles, stream_cycles(limits) + max(cycles - hidden, 0.0)) - steady


def _prologue_cycles(p: DesignProfile, cal: Calibration) -> float:
    """Cycles of the workers' one-time prologue, at the efficiency of the family whose arithmetic it is (a fused
    RMSNorm costs what the RMSNorm kernel's own inner loop costs per element); paid after the first data arrive and
    before the first call (``prologue_exposed``: how much of it the stream behind hides)."""
    family, ops, nbytes = p.prologue
    if not ops:
        return 0.0
    return compute_cycles_per_call("vector", 0, ops, nbytes, family, p.device, cal)


def _pareto(paths: set[tuple]) -> tuple[tuple, ...]:
    """Drop paths that no constants can make the longest (another is at least as long in every term)."""

    def dominated(p: tuple) -> bool:
        return any(q != p and all(a >= b for a, b in zip(q, p, strict=True)) for q in paths)

    return tuple(sorted(p for p in paths if not dominated(p)))


def _check_names(s: Structure, fifos: dict[str, _Fifo]) -> None:
    used = {f for w in s.workers for f in w.inputs + w.outputs} | {t.fifo for t in s.tasks}
    used |= {f for lk in s.links for f in lk.fifos}
    missing = sorted(used - set(fifos))
    if missing:
        raise InputError(f"Design refers to fifos {missing} that it does not declare; add them to design.fifos.")


def peak_macs_per_cycle(variant: str, device: Device, cal: Calibration) -> float:
    """MACs per cycle per tile of a kernel variant before efficiency: vector bf16, block-FP16, or scalar."""
    if variant == "vector":
        return float(device.bf16_macs_per_cycle)
    if variant == "bfp16":
        return float(device.bfp16_macs_per_cycle)
    if variant == "scalar":
        return cal.scalar_macs_per_cycle
    raise ConfigError(f"Kernel variant {variant!r} is unknown; use vector, scalar or bfp16.")


def compute_cycles_per_call(
    variant: str,
    macs: int,
    vector_ops: int,
    bytes_touched: int,
    family: str | None,
    device: Device,
    cal: Calibration,
) -> float:
    """Core cycles of one kernel call, loop overhead included."""
    if variant == "scalar":
        work = macs / cal.scalar_macs_per_cycle + vector_ops / cal.scalar_ops_per_cycle
    else:
        eff = cal.efficiency(family)
        work = macs / (peak_macs_per_cycle(variant, device, cal) * eff) + vector_ops / (cal.vector_ops_per_cycle * eff)
    work = max(work, bytes_touched / cal.core_load_bytes_per_cycle)
    return work + cal.loop_overhead_cycles


def borrowed_cycles(vector_ops: int, family: str, variant: str, cal: Calibration) -> float:
    """Core cycles of ``vector_ops`` that are ``family``'s inner loop inside another family's kernel
    (``TileKernel.borrowed_ops``), at that family's efficiency (scalar kernels at the scalar rate); no loop overhead of
    their own: they run inside the host kernel's call."""
    if variant == "scalar":
        return vector_ops / cal.scalar_ops_per_cycle
    return vector_ops / (cal.vector_ops_per_cycle * cal.efficiency(family))


def busiest_channel(loads: Sequence[float], channels: int) -> float:
    """Largest per-channel load when transfers (each on one channel) are spread over ``channels`` (LPT). Loads are
    non-negative; no more loads than channels is each on its own channel (the LPT result, without the loop: the
    GEMM candidate ranking, ``kernels.gemm.modeled_estimate``, calls this thousands of times per shape)."""
    if not loads:
        return 0.0
    if len(loads) <= max(channels, 1):
        return max(0.0, float(max(loads)))
    bins = [0.0] * max(channels, 1)
    for x in sorted(loads, reverse=True):
        i = bins.index(min(bins))
        bins[i] += x
    return max(bins)


def _worker_profile(w: _Worker, fifos: dict[str, _Fifo], dev: Device) -> _WorkerProfile:
    bpc = float(dev.stream_bytes_per_cycle)
    acq = dict(w.acquires)
    calls = w.calls_per_iteration

    def per_call(f: str) -> float:
        # A fifo between neighbouring workers lives in shared tile memory: the core reads it, no DMA moves it.
        return 0.0 if fifos[f].shared else fifos[f].obj_bytes * acq.get(f, 1) / calls

    dma_in = busiest_channel([per_call(f) / bpc for f in w.inputs], dev.compute.s2mm_channels)
    dma_out = busiest_channel([per_call(f) / bpc for f in w.outputs], dev.compute.mm2s_channels)
    # Single-buffered fifos make the core wait: after a call releases its buffers, the refill of the inputs and
    # the drain of the outputs run in parallel (own channels), and the next call starts when both are done.
    serial = max(
        busiest_channel([per_call(f) / bpc for f in w.inputs if fifos[f].depth < 2], dev.compute.s2mm_channels),
        busiest_channel([per_call(f) / bpc for f in w.outputs if fifos[f].depth < 2], dev.compute.mm2s_channels),
    )
    return _WorkerProfile(
        w.name,
        w.variant,
        w.macs_per_call,
        w.vector_ops_per_call,
        w.bytes_per_call,
        w.iterations,
        calls,
        dma_in,
        dma_out,
        serial,
        all(fifos[f].depth >= 2 for f in w.inputs + w.outputs),
        w.borrowed_ops,
    )


def _time_worker(
    w: _WorkerProfile, family: str | None, dev: Device, cal: Calibration, spill: float = 0.0
) -> WorkerTiming:
    calls = w.calls_per_iteration
    compute = compute_cycles_per_call(
        w.variant, w.macs_per_call, w.vector_ops_per_call, w.bytes_per_call, family, dev, cal
    )
    compute += sum(borrowed_cycles(ops, fam, w.variant, cal) for fam, ops in w.borrowed_ops)
    dma_in, dma_out, serial = w.dma_in, w.dma_out, w.serial
    call = max(compute + serial, dma_in, dma_out)
    bound = "compute" if compute + serial >= max(dma_in, dma_out) and compute >= serial else "dma"
    return WorkerTiming(
        name=w.name,
        iterations=w.iterations,
        calls_per_iteration=calls,
        compute_cycles=compute * calls,
        dma_in_cycles=dma_in * calls,
        dma_out_cycles=dma_out * calls,
        iteration_cycles=call * calls + spill,
        double_buffered=w.double_buffered,
        bound=bound,
        macs=w.macs_per_call * calls * w.iterations,
    )


def _bytes_through_fifos(s: Structure, fifos: dict[str, _Fifo]) -> dict[str, float]:
    """Bytes each fifo carries over the whole launch, from whichever end knows: shim tasks, workers, or links."""
    known: dict[str, float] = {}
    for t in s.tasks:
        known[t.fifo] = known.get(t.fifo, 0.0) + t.nbytes
    task_fifos = {t.fifo for t in s.tasks}
    for w in s.workers:
        acq = dict(w.acquires)
        for f in w.inputs + w.outputs:
            if f in fifos and f not in task_fifos:
                b = fifos[f].obj_bytes * acq.get(f, 1) * w.iterations
                known[f] = max(known.get(f, 0.0), b)  # broadcast: every consumer sees the same objects
    # Links pass objects one for one: a split/join/forward moves as many objects on each side.
    for _ in range(len(s.links) + 1):
        changed = False
        for lk in s.links:
            objects = [known[f] / fifos[f].obj_bytes for f in lk.fifos if f in known and fifos[f].obj_bytes]
            if not objects:
                continue
            n = max(objects)
            for f in lk.fifos:
                if f not in known and f in fifos:
                    known[f] = n * fifos[f].obj_bytes
                    changed = True
        if not changed:
            break
    return known


def _mem_tile_limits(
    s: Structure, fifo_bytes: dict[str, float], dev: Device, bpc: float
) -> list[tuple[str, float, str]]:
    """Per memory tile: its busiest input and output channel over the launch (links on one tile share them)."""
    by_tile: dict[str, tuple[list[float], list[float]]] = {}
    for lk in s.links:
        key = f"mem tile {lk.placement}" if lk.placement is not None else f"mem tile of {lk.name}"
        ins, outs = by_tile.setdefault(key, ([], []))
        ins += [fifo_bytes.get(f, 0.0) / bpc for f in lk.srcs]
        outs += [fifo_bytes.get(f, 0.0) / bpc for f in lk.dsts]
    out = []
    for key, (ins, outs) in by_tile.items():
        cyc = max(busiest_channel(ins, dev.mem.s2mm_channels), busiest_channel(outs, dev.mem.mm2s_channels))
        out.append((key, cyc, "dma"))
    return out


def _shim_loads(s: Structure, fifos: dict[str, _Fifo]) -> dict[str, tuple[dict[str, float], dict[str, float], int]]:
    """Per shim tile, by its limit's name: the bytes each MM2S (fill) and S2MM (drain) channel carries over the launch,
    by carrying fifo, and how many shim tiles' channels it has (fifos without a shim placement share the device's)."""
    by_tile: dict[str, tuple[dict[str, float], dict[str, float], int]] = {}
    for t in s.tasks:
        tile = fifos[t.fifo].shim
        key = f"shim {tile}" if tile is not None else "shim (unplaced)"
        scale = 1 if tile is not None else s.device.columns
        fills, drains, _ = by_tile.setdefault(key, ({}, {}, scale))
        side = fills if t.kind == "fill" else drains
        channel = fifos[t.fifo].channel  # a rider's bytes queue on its host's channel
        side[channel] = side.get(channel, 0.0) + t.nbytes
    return by_tile


def _shim_limits(s: Structure, fifos: dict[str, _Fifo], dev: Device, bpc: float) -> list[tuple[str, float, str]]:
    """Per shim tile: busiest channel. Fifos without a shim placement share the whole device's shim channels."""
    out = []
    for key, (fills, drains, scale) in _shim_loads(s, fifos).items():
        cyc = max(
            busiest_channel([b / bpc for b in fills.values()], dev.shim.mm2s_channels * scale),
            busiest_channel([b / bpc for b in drains.values()], dev.shim.s2mm_channels * scale),
        )
        out.append((key, cyc, "dma"))
    return out


def shim_channel_bytes(design: Design) -> dict[str, tuple[dict[str, float], dict[str, float]]]:
    """Per shim tile, by its limit's name in ``DesignTiming.limits``: the bytes each of its MM2S (fill) and S2MM
    (drain) channels carries over one launch, by carrying fifo (what the shim limits are computed from)."""
    s = structure(design)
    return {key: (fills, drains) for key, (fills, drains, _) in _shim_loads(s, {f.name: f for f in s.fifos}).items()}


def shim_bytes_per_cycle(dev: Device, cal: Calibration) -> float:
    """A shim channel's rate: it streams ``stream_bytes_per_cycle`` into the array, capped by its fetch from DDR."""
    return min(float(dev.stream_bytes_per_cycle), cal.shim_channel_bytes_per_s / dev.clock_hz)


def _producer_link(s: Structure, fifo: str) -> FifoLink | None:
    return next((lk for lk in s.links if fifo in lk.dsts), None)


def _consumer_link(s: Structure, fifo: str) -> FifoLink | None:
    return next((lk for lk in s.links if fifo in lk.srcs), None)


def _paths(fifo: str, s: Structure, fifos: dict[str, _Fifo], bpc: float, next_link, depth: int = 0) -> set:
    """(hops, object-transfer cycles) of every path from ``fifo`` through links to the shim: one hop per link, each
    paying the DMA hop latency (a constant, applied at evaluation) and its object's transfer at the stream rate.
    ``next_link`` is ``_producer_link`` (fill: towards the source) or ``_consumer_link`` (drain: on to the sink).
    (Moving the shim hop at the shim channel's DDR rate instead raised the cross-validated loss, 0.01222 -> 0.01256.)
    """
    own = fifos[fifo].obj_bytes / bpc
    lk = next_link(s, fifo)
    if lk is None or depth > len(s.links):
        return {(1, own)}
    ends = lk.srcs if next_link is _producer_link else lk.dsts
    return {(n + 1, b + own) for e in ends for n, b in _paths(e, s, fifos, bpc, next_link, depth + 1)}


# ----------------------------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HostCost:
    """Host-side costs around dispatches, all modeled: buffer syncs and uploads (there is no device buffer) and CPU
    groups (``cpu_model_s``); a CPU group's measured wall clock is reported beside its modeled cost, never in it."""

    cal: Calibration = CALIBRATION

    def sync_s(self, nbytes: int) -> float:
        """One host<->device buffer sync of ``nbytes`` (modeled): fixed cost + copy at host bandwidth."""
        return self._copy_s(nbytes, self.cal.host_copy_bytes_per_s, "buffer sync")

    def handoff_s(self, nbytes: int) -> float:
        """One activation handed over through the host into a dispatch's own buffer (the paper's host handoff)."""
        return self._copy_s(nbytes, self.cal.host_handoff_bytes_per_s, "handoff")

    def _copy_s(self, nbytes: int, bytes_per_s: float, what: str) -> float:
        if nbytes < 0:
            raise InputError(f"A {what} of {nbytes} bytes is impossible; pass a byte count >= 0.")
        return self.cal.host_sync_fixed_s + nbytes / bytes_per_s

    @property
    def sync_fixed_s(self) -> float:
        """The fixed part of a sync alone: what a zero-copy buffer pays (cache maintenance, no copy)."""
        return self.cal.host_sync_fixed_s

    def alloc_s(self) -> float:
        """Allocating and mapping one device buffer (paid per dispatch when buffers are not reused)."""
        return self.cal.host_alloc_s

    def syncs_s(self, sizes: Sequence[int]) -> float:
        """Several buffer syncs, one fixed cost each."""
        return sum(self.sync_s(n) for n in sizes)

    def weights_s(self, nbytes: int, *, preloaded: bool) -> float:
        """Per-call cost of a launch's weights: nothing when preloaded once, a full sync when synced per call."""
        return 0.0 if preloaded else self.sync_s(nbytes)

    def preload_s(self, nbytes: int) -> float:
        """One-time upload of static weights (paid once per deployment, not per call)."""
        return self.sync_s(nbytes)

    def cpu_fallback_s(self, measured_s: float) -> float:
        """A CPU op that really ran: its measured wall-clock time, unchanged (trace it with clock='measured')."""
        if measured_s < 0:
            raise InputError(f"Measured CPU time {measured_s} s is negative; pass the wall-clock seconds it took.")
        return float(measured_s)

    def cpu_model_s(self, nbytes_streamed: int, flops: int = 0, heads: int = 0) -> float:
        """Modeled host cost of a CPU group: a roofline of its bytes at ``host_cpu_bytes_per_s`` and its arithmetic
        at ``host_cpu_flops_per_s`` (the slower of the two), plus ``host_cpu_head_s`` per query head of the host
        attentions it runs (a Python loop over heads). A function of the shapes and the constants only."""
        if nbytes_streamed < 0 or flops < 0 or heads < 0:
            raise InputError(
                f"A CPU op streaming {nbytes_streamed} bytes with {flops} FLOPs over {heads} heads is impossible; "
                "pass counts >= 0."
            )
        roofline = max(nbytes_streamed / self.cal.host_cpu_bytes_per_s, flops / self.cal.host_cpu_flops_per_s)
        return roofline + heads * self.cal.host_cpu_head_s

    def cpu_estimate_s(self, nbytes_streamed: int) -> float:
        """Modeled estimate of a CPU op that was not run (analytic plan timing): bytes / host CPU bandwidth."""
        if nbytes_streamed < 0:
            raise InputError(f"A CPU op streaming {nbytes_streamed} bytes is impossible; pass a count >= 0.")
        return nbytes_streamed / self.cal.host_cpu_bytes_per_s
