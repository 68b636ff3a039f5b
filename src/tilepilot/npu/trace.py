"""A run's timeline: every dispatch, DMA, host operation and CPU fallback, written as Chrome trace JSON.

Two clocks meet on one timeline and must never be confused: NPU work (dispatches, launches, DMAs) and
host<->device buffer syncs (there is no real device buffer to copy into) have a *modeled* duration from
``npu.timing``; CPU groups of a plan have a *modeled* host cost too (``HostCost.cpu_model_s``) and carry the
wall clock they really took beside it (``measured_s``), and other host work has a *measured* duration. Each event
carries its ``clock`` so every reader (the summary, Perfetto, the independent evaluator) can tell which
is which. The NPU and the host sit in separate Chrome "processes" so a viewer
shows them as separate lanes.

Times are seconds inside the program and microseconds in the Chrome file (the format's unit).

The Chrome file also lays every launch and DMA out on the array, one track per compute column, memory
tile and shim DMA channel, when the writer is given the launches' ``LaunchLayout`` (read off the designs'
placement): a launch appears on each column its workers occupy with that column's MACs, its DDR traffic
on the shim channels and memory tiles that carry it with their bytes. Those placement copies have
category ``placement`` and are never read back as events, so counts and totals stay those of the run.
The model does not schedule transfers inside a launch, so a placed DMA spans its launch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tilepilot.errors import InputError, WorkspaceError
from tilepilot.files import write_text_atomic
from tilepilot.npu.design import Design, MultiLaunchGroup, nbytes

# "cpu": work on the host's CPU. A CPU group of a plan has a modeled cost (clock "modeled", its wall clock beside as
# measured_s); a CPU step outside the plan (embedding lookup, RoPE tables) is measured (clock "measured").
KINDS = ("dispatch", "launch", "dma", "sync", "cpu")
# Kinds whose duration comes from the timing model unless the caller says otherwise.
MODELED_KINDS = ("dispatch", "launch", "dma", "sync")
CLOCKS = ("modeled", "measured")
STAGES = ("prefill", "decode")

# Kinds that occupy the timeline on their own. Launches and DMAs happen *inside* a dispatch, so counting
# them in totals would count the same modeled time twice.
TOP_LEVEL_KINDS = ("dispatch", "sync", "cpu")

# Chrome "process" / "thread" lanes. The NPU is four processes: its dispatch overview (dispatches, launches,
# DDR traffic as the run recorded them), the compute columns, the memory tiles and the shim DMA channels, each
# column / tile / channel one thread; the host is one process with one lane per kind of host work.
_PID = {"npu": 1, "columns": 2, "mem": 3, "shim": 4, "host": 5}
_LANES = {
    "dispatch": ("npu", 1, "dispatches (modeled)"),
    "launch": ("npu", 2, "launches (modeled)"),
    "dma": ("npu", 3, "DDR traffic per launch (modeled)"),
    "sync": ("host", 1, "buffer sync (modeled)"),
    "cpu": ("host", 3, "cpu groups (modeled; wall clock beside)"),
}
_CPU_STEP_LANE = ("host", 2, "cpu steps outside the plan (measured)")  # cpu events on the measured clock
_PROCESS_NAMES = {
    "npu": "NPU dispatches (modeled time)",
    "columns": "NPU compute columns (modeled time)",
    "mem": "NPU memory tiles (modeled time)",
    "shim": "NPU shim DMA channels (modeled time)",
    "host": "Host (syncs and CPU groups modeled, other CPU steps measured)",
}
DISPATCH_PARTS_KEPT = 4096  # distinct dispatch timings whose launch list add_dispatch keeps ready
UNPLACED = -1  # column of workers / links / shim fifos a design leaves unplaced
PLACEMENT_CAT = "placement"


@dataclass(frozen=True)
class TraceEvent:
    """One interval on the timeline; ``clock`` says whether its duration was modeled or measured."""

    name: str
    kind: str
    start_s: float
    end_s: float
    clock: str
    group: str | None = None
    layer: int | None = None
    stage: str | None = None
    bytes: int = 0
    macs: int = 0
    # host work whose duration is modeled (a CPU group) may carry the wall clock it really took, labelled measured;
    # it is reported beside the timeline, never part of it
    measured_s: float | None = None
    # the duration exactly as recorded (end_s - start_s carries the rounding of the cursor position, so a sum of
    # those would depend on what came before, e.g. a measured host event; modeled totals sum this instead)
    recorded_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"Trace event kind {self.kind!r} is unknown; use one of {', '.join(KINDS)}.")
        if self.clock not in CLOCKS:
            raise InputError(f"Trace event clock {self.clock!r} is unknown; use 'modeled' or 'measured'.")
        if self.stage is not None and self.stage not in STAGES:
            raise InputError(f"Trace event stage {self.stage!r} is unknown; use 'prefill', 'decode' or None.")
        if not (self.end_s >= self.start_s >= 0.0):
            raise InputError(
                f"Trace event {self.name!r} has start {self.start_s} s and end {self.end_s} s; "
                "times must be non-negative with end >= start."
            )
        if self.bytes < 0 or self.macs < 0:
            raise InputError(f"Trace event {self.name!r} has negative bytes or MACs; record counts >= 0.")

    @property
    def duration_s(self) -> float:
        return self.recorded_s if self.recorded_s is not None else self.end_s - self.start_s

    @property
    def label(self) -> str:
        """The kernel group the event is summarised under (its own name when it belongs to none)."""
        return self.group or self.name


def on_modeled_timeline(e: TraceEvent) -> bool:
    """A top-level event whose duration is modeled: what a modeled TTFT or decode step sums. CPU steps outside the
    plan (measured) share the timeline but never enter a modeled figure."""
    return e.kind in TOP_LEVEL_KINDS and e.clock == "modeled"


@dataclass(frozen=True)
class GroupSummary:
    """Totals of one kernel group's top-level events under one clock."""

    group: str
    clock: str
    count: int
    total_ms: float
    share: float  # of all top-level time on the timeline (modeled + measured), 0..1


@dataclass(frozen=True)
class LaunchLayout:
    """Where one launch sits on the array, read off its design: MACs per compute column, bytes per memory tile
    and per shim DMA channel. ``UNPLACED`` (-1) stands for workers, links or fifos the design leaves unplaced."""

    columns: tuple[tuple[int, int], ...]  # (column, MACs of the workers placed in it)
    mem_tiles: tuple[tuple[int, int], ...]  # (column, bytes its links pass through)
    shim_channels: tuple[tuple[str, int], ...]  # (channel label, bytes it moves between DDR and the array)


def launch_layout(design: Design) -> LaunchLayout:
    """The layout of one design: columns from worker placement, memory-tile bytes from the links placed there,
    shim-channel bytes from the runtime tasks, packed onto the channels largest first as the timing model does
    (a fifo placed on a shim tile uses that tile's channels, an unplaced one any shim channel)."""
    dev = design.device
    cols: dict[int, int] = {}
    for w in design.workers:
        col = w.placement.col if w.placement is not None else UNPLACED
        macs = int(w.kernel.macs_per_call) * int(w.calls_per_iteration) * int(w.iterations)
        cols[col] = cols.get(col, 0) + macs
    tensors = {t.name: t for t in design.inputs + design.outputs}
    task_bytes: dict[tuple[str, str], int] = {}
    for t in design.runtime.tasks:
        dtype = tensors[t.tensor].dtype if t.tensor in tensors else "bf16"
        key = (t.kind, t.fifo)
        task_bytes[key] = task_bytes.get(key, 0) + nbytes(t.tap.n_elements, dtype)
    fifo_bytes: dict[str, int] = {}
    for (_, fifo), n in task_bytes.items():
        fifo_bytes[fifo] = fifo_bytes.get(fifo, 0) + n
    mem: dict[int, int] = {}
    for lk in design.links:
        col = lk.placement.col if lk.placement is not None else UNPLACED
        through = max(sum(fifo_bytes.get(f, 0) for f in lk.srcs), sum(fifo_bytes.get(f, 0) for f in lk.dsts))
        mem[col] = mem.get(col, 0) + through
    shim_of = {f.name: f.shim_placement for f in design.fifos}
    channel_of = {f.name: f.channel for f in design.fifos}
    on_channel: dict[tuple[str, str], int] = {}  # a rider's bytes go on its host's channel (ObjectFifo.channel)
    for (kind, fifo), n in task_bytes.items():
        key = (kind, channel_of.get(fifo, fifo))
        on_channel[key] = on_channel.get(key, 0) + n
    load: dict[tuple[int, str, int], int] = {}
    for (kind, fifo), n in sorted(on_channel.items(), key=lambda kv: (-kv[1], kv[0])):
        direction = "mm2s" if kind == "fill" else "s2mm"  # fill: DDR -> array; drain: array -> DDR
        per_tile = dev.shim.mm2s_channels if kind == "fill" else dev.shim.s2mm_channels
        tile = shim_of.get(fifo)
        columns = [tile.col] if tile is not None else list(range(dev.columns))
        choices = [(c, direction, ch) for c in columns for ch in range(per_tile)]
        best = min(choices, key=lambda k: (load.get(k, 0), k))
        load[best] = load.get(best, 0) + n
    shim = tuple((f"shim {c} {d} {ch}", n) for (c, d, ch), n in sorted(load.items()))
    return LaunchLayout(tuple(sorted(cols.items())), tuple(sorted(mem.items())), shim)


def layouts_of(designs: Iterable[Design | MultiLaunchGroup]) -> dict[str, tuple[LaunchLayout, ...]]:
    """Layouts by design name (the name a launch event carries); multi-launch groups give one per launch.

    A name can stand for several designs (one shape tuned to several tile configs), so each name maps to
    every distinct layout; the writer places a launch only on the one whose MACs match it."""
    out: dict[str, list[LaunchLayout]] = {}
    for d in designs:
        for one in d.designs if isinstance(d, MultiLaunchGroup) else [d]:
            layout = launch_layout(one)
            seen = out.setdefault(one.name, [])
            if layout not in seen:
                seen.append(layout)
    return {name: tuple(v) for name, v in out.items()}


def _pick(candidates: LaunchLayout | Sequence[LaunchLayout] | None, macs: int) -> LaunchLayout | None:
    """The layout of a launch of ``macs`` MACs: the only candidate whose workers do that many, else none
    (an ambiguous launch stays on the overview lanes rather than on columns it may not have used)."""
    if candidates is None:
        return None
    if isinstance(candidates, LaunchLayout):
        candidates = (candidates,)
    match = [c for c in candidates if sum(m for _, m in c.columns) == macs]
    return match[0] if len(set(match)) == 1 else None


def library_layouts(library: object) -> dict[str, tuple[LaunchLayout, ...]]:
    """Layouts of every design a ``runtime.dispatcher.KernelLibrary`` built (what a run dispatched).

    Duck-typed on ``library.designs()``: the trace sits below the runtime and must not import it.
    """
    return layouts_of(library.designs())


@dataclass
class Trace:
    """An append-only list of events plus a cursor at the end of the timeline.

    A synchronous runner does one thing at a time, so ``add`` places each new top-level event at the
    cursor and advances it; DMAs and launches inside a dispatch are placed explicitly with ``record``.
    """

    events: list[TraceEvent] = field(default_factory=list)
    cursor_s: float = 0.0
    # per dispatch timing (by id, the timing held so the id stays its own): what add_dispatch reads of it every call
    _dispatch_parts: dict[int, tuple] = field(default_factory=dict, repr=False, compare=False)

    def record(self, event: TraceEvent) -> TraceEvent:
        """Append an event with explicit times (e.g. a DMA inside a dispatch); the cursor never moves back."""
        self.events.append(event)
        if event.kind in TOP_LEVEL_KINDS:
            self.cursor_s = max(self.cursor_s, event.end_s)
        return event

    def add(
        self,
        kind: str,
        name: str,
        duration_s: float,
        *,
        clock: str | None = None,
        group: str | None = None,
        layer: int | None = None,
        stage: str | None = None,
        bytes: int = 0,
        macs: int = 0,
        measured_s: float | None = None,
    ) -> TraceEvent:
        """Append an event at the cursor. NPU kinds and syncs default to the modeled clock, host work to measured."""
        if duration_s < 0:
            raise InputError(f"Trace event {name!r} has negative duration {duration_s} s; durations must be >= 0.")
        if clock is None:
            clock = "modeled" if kind in MODELED_KINDS else "measured"
        start = self.cursor_s
        event = TraceEvent(
            name,
            kind,
            start,
            start + duration_s,
            clock,
            group,
            layer,
            stage,
            int(bytes),
            int(macs),
            measured_s,
            float(duration_s),
        )
        return self.record(event)

    def add_dispatch(
        self,
        timing: Any,
        *,
        group: str | None = None,
        layer: int | None = None,
        stage: str | None = None,
    ) -> TraceEvent:
        """Record a modeled dispatch (an ``npu.timing.GroupTiming``) at the cursor: the dispatch itself, one
        launch event per design inside it, and each launch's DDR traffic as a DMA event over the launch.

        The dispatch overhead comes first; the remaining non-kernel time (tile configuration, per-launch cost)
        is spread evenly before the launches.
        """
        group = group or timing.name
        parts = self._dispatch_parts.get(id(timing))
        if parts is None or parts[0] is not timing:
            designs = tuple(timing.designs)
            gap = max(timing.seconds - timing.dispatch_overhead_s - sum(d.seconds for d in designs), 0.0) / len(designs)
            launches = tuple((d.name, f"ddr {d.name}", d.ddr_bytes, d.macs, d.seconds) for d in designs)
            total_bytes, total_macs = sum(d.ddr_bytes for d in designs), sum(d.macs for d in designs)
            if len(self._dispatch_parts) >= DISPATCH_PARTS_KEPT:  # decode attention on the NPU: one per context
                self._dispatch_parts.clear()
            parts = self._dispatch_parts[id(timing)] = (timing, total_bytes, total_macs, gap, launches)
        _, total_bytes, total_macs, gap, launches = parts
        dispatch = self.add(
            "dispatch",
            timing.name,
            timing.seconds,
            group=group,
            layer=layer,
            stage=stage,
            bytes=total_bytes,
            macs=total_macs,
        )
        t = dispatch.start_s + timing.dispatch_overhead_s
        append = self.events.append  # launches and DMAs are inside the dispatch: the cursor does not move
        for name, ddr_name, ddr_bytes, macs, seconds in launches:
            t += gap
            end = min(t + seconds, dispatch.end_s)
            append(TraceEvent(name, "launch", t, end, "modeled", group, layer, stage, ddr_bytes, macs))
            append(TraceEvent(ddr_name, "dma", t, end, "modeled", group, layer, stage, ddr_bytes))
            t = end
        return dispatch

    # --- queries ----------------------------------------------------------------------------------------------------
    def top_level(self) -> list[TraceEvent]:
        return [e for e in self.events if e.kind in TOP_LEVEL_KINDS]

    def count(self, kind: str, stage: str | None = None) -> int:
        """How many events of a kind (optionally in one stage), e.g. dispatches per decode token."""
        return sum(1 for e in self.events if e.kind == kind and (stage is None or e.stage == stage))

    def total_s(self, clock: str | None = None, stage: str | None = None) -> float:
        """Summed duration of top-level events, optionally only one clock or stage."""
        return sum(
            e.duration_s
            for e in self.top_level()
            if (clock is None or e.clock == clock) and (stage is None or e.stage == stage)
        )

    def summary(self) -> list[GroupSummary]:
        """Per kernel group and clock: count, total ms and share of the whole timeline, largest first."""
        totals: dict[tuple[str, str], list[float]] = {}
        for e in self.top_level():
            acc = totals.setdefault((e.label, e.clock), [0, 0.0])
            acc[0] += 1
            acc[1] += e.duration_s
        whole = sum(t for _, t in totals.values())
        rows = [
            GroupSummary(group, clock, int(n), t * 1e3, (t / whole) if whole > 0 else 0.0)
            for (group, clock), (n, t) in totals.items()
        ]
        return sorted(rows, key=lambda r: (-r.total_ms, r.group, r.clock))

    def format_summary(self) -> str:
        """A plain-text table; each row says whether its time is modeled or measured."""
        rows = self.summary()
        lines = [f"{'group':<32} {'clock':<9} {'count':>6} {'total ms':>11} {'share':>7}"]
        for r in rows:
            lines.append(f"{r.group:<32} {r.clock:<9} {r.count:>6} {r.total_ms:>11.3f} {r.share:>7.1%}")
        lines.append(
            f"NPU times are modeled ({self.total_s('modeled') * 1e3:.3f} ms); "
            f"host times are measured ({self.total_s('measured') * 1e3:.3f} ms)."
        )
        return "\n".join(lines)

    def stage_slice(self, stage: str) -> Trace:
        """The events of one stage, shifted so the stage starts at t = 0 (one file per stage in a workspace)."""
        mine = [e for e in self.events if e.stage == stage]
        t0 = min((e.start_s for e in mine), default=0.0)
        out = Trace()
        for e in mine:
            out.record(replace(e, start_s=e.start_s - t0, end_s=e.end_s - t0))
        return out

    # --- Chrome trace JSON ------------------------------------------------------------------------------------------
    def to_chrome_dict(self, layouts: Mapping[str, LaunchLayout | Sequence[LaunchLayout]] | None = None) -> dict:
        """The Chrome trace-event format (JSON object form) that Perfetto and chrome://tracing load.

        Every event is written once on its own lane (complete events ``X``, microseconds); with ``layouts``
        (see ``launch_layout``) each launch is also placed on its compute columns and each launch's DDR traffic
        on its shim channels and memory tiles, as ``placement`` events carrying that track's MACs or bytes.
        Every pid and tid is named by an ``M`` metadata event.
        """
        layouts = layouts or {}
        placed: dict[str, LaunchLayout | None] = {}
        events: list[dict] = []
        threads: dict[tuple[str, int], str] = {
            (proc, tid): lane for proc, tid, lane in (*_LANES.values(), _CPU_STEP_LANE)
        }
        for i, e in enumerate(self.events):
            proc, tid, _ = _CPU_STEP_LANE if e.kind == "cpu" and e.clock == "measured" else _LANES[e.kind]
            args = {k: v for k, v in asdict(e).items() if k not in ("name", "kind", "start_s", "end_s", "recorded_s")}
            if args.get("measured_s") is None:
                args.pop("measured_s", None)
            args["event"] = i
            events.append(_x(e.name, e.kind, e.start_s, e.duration_s, _PID[proc], tid, args))
            layout = None
            if e.kind == "launch":
                layout = placed[e.name] = _pick(layouts.get(e.name), e.macs)
            elif e.kind == "dma" and e.name.startswith("ddr "):
                layout = placed.get(e.name[4:])  # the traffic of the launch recorded just before it
            if layout is not None:
                events += self._placed(e, i, layout, threads)
        meta: list[dict] = []
        for proc, pid in _PID.items():
            if proc in ("npu", "host") or any(p == proc for p, _ in threads):
                meta.append(
                    {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": _PROCESS_NAMES[proc]}}
                )
                meta.append(
                    {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
                )
        for (proc, tid), lane in sorted(threads.items(), key=lambda kv: (_PID[kv[0][0]], kv[0][1])):
            meta.append({"name": "thread_name", "ph": "M", "pid": _PID[proc], "tid": tid, "args": {"name": lane}})
            meta.append(
                {"name": "thread_sort_index", "ph": "M", "pid": _PID[proc], "tid": tid, "args": {"sort_index": tid}}
            )
        return {
            "traceEvents": meta + events,
            "displayTimeUnit": "ms",
            "otherData": {
                "producer": "tilepilot",
                "clocks": "NPU events are modeled by tilepilot's timing model; host events are measured wall-clock.",
                "placement": (
                    "compute-column, memory-tile and shim-channel tracks are modeled: each launch spans its columns "
                    "for the launch's modeled time; DMA tracks carry the bytes of the launch's DDR traffic and span "
                    "the launch (the model does not schedule transfers inside a launch)"
                    if layouts
                    else "no design layouts were given: launches and DMAs are on the overview lanes only"
                ),
                "modeled_ms": self.total_s("modeled") * 1e3,
                "measured_ms": self.total_s("measured") * 1e3,
            },
        }

    @staticmethod
    def _placed(e: TraceEvent, index: int, layout: LaunchLayout, threads: dict[tuple[str, int], str]) -> list[dict]:
        """Copies of a launch (per column) or of its DDR traffic (per shim channel and memory tile)."""
        common = {"clock": "modeled", "group": e.group, "layer": e.layer, "stage": e.stage, "event": index}
        out: list[dict] = []

        def put(proc: str, tid: int, lane: str, args: dict) -> None:
            threads.setdefault((proc, tid), lane)
            out.append(_x(e.name, PLACEMENT_CAT, e.start_s, e.duration_s, _PID[proc], tid, {**common, **args}))

        if e.kind == "launch":
            for col, macs in layout.columns:
                lane = f"column {col} compute" if col != UNPLACED else "compute (unplaced workers)"
                put("columns", _tid(col), lane, {"macs": macs, "bytes": e.bytes, "launch_macs": e.macs})
            return out
        for col, nbytes_ in layout.mem_tiles:
            lane = f"memory tile {col}" if col != UNPLACED else "memory tile (unplaced links)"
            put("mem", _tid(col), lane, {"bytes": nbytes_, "macs": 0})
        for label, nbytes_ in layout.shim_channels:
            _, col, direction, ch = label.split()
            tid = 1 + 4 * int(col) + (0 if direction == "mm2s" else 2) + int(ch)
            lane = f"{label} ({'DDR -> array' if direction == 'mm2s' else 'array -> DDR'})"
            put("shim", tid, lane, {"bytes": nbytes_, "macs": 0})
        return out

    def to_chrome(
        self, path: str | os.PathLike, layouts: Mapping[str, LaunchLayout | Sequence[LaunchLayout]] | None = None
    ) -> Path:
        """Write Chrome trace JSON atomically (temp file then rename), so no half-written trace is left."""
        return write_text_atomic(path, json.dumps(self.to_chrome_dict(layouts)))

    def write_stages(
        self, directory: str | os.PathLike, layouts: Mapping[str, LaunchLayout | Sequence[LaunchLayout]] | None = None
    ) -> dict[str, Path]:
        """``prefill.json`` and ``decode.json`` under ``directory``, one Chrome trace per stage that has events."""
        out = {}
        for stage in STAGES:
            part = self.stage_slice(stage)
            if part.events:
                out[stage] = part.to_chrome(Path(directory) / f"{stage}.json", layouts)
        return out

    @classmethod
    def from_chrome(cls, path: str | os.PathLike) -> Trace:
        """Read back a trace this module wrote (the evaluator re-counts dispatches from the file)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            raw = [e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") in KINDS]
            events = [_event_from_chrome(e) for e in raw]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise WorkspaceError(
                f"Trace file {path} is not a tilepilot Chrome trace ({e}); re-run to rewrite it."
            ) from e
        trace = cls()
        for ev in sorted(events, key=lambda e: e.start_s):
            trace.record(ev)
        return trace

    def extend(self, events: Iterable[TraceEvent]) -> None:
        for e in events:
            self.record(e)


def _x(name: str, cat: str, start_s: float, dur_s: float, pid: int, tid: int, args: dict) -> dict:
    """One complete ("X") event; the format counts time in microseconds."""
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": start_s * 1e6,
        "dur": dur_s * 1e6,
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def _tid(col: int) -> int:
    """Thread id of a column's track: column c is tid c + 1; the unplaced track sorts last."""
    return col + 1 if col != UNPLACED else 999


def _event_from_chrome(e: dict) -> TraceEvent:
    args = e.get("args", {})
    start = float(e["ts"]) / 1e6
    return TraceEvent(
        name=str(e["name"]),
        kind=str(e["cat"]),
        start_s=start,
        end_s=start + float(e["dur"]) / 1e6,
        clock=str(args["clock"]),
        group=args.get("group"),
        layer=args.get("layer"),
        stage=args.get("stage"),
        bytes=int(args.get("bytes", 0)),
        macs=int(args.get("macs", 0)),
        measured_s=None if args.get("measured_s") is None else float(args["measured_s"]),
    )
