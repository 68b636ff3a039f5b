"""A run's timeline: every dispatch, DMA, host operation and CPU fallback, written as Chrome trace JSON.

Two clocks meet on one timeline and must never be confused: NPU work (dispatches, launches, DMAs) and
host<->device buffer syncs (there is no real device buffer to copy into) have a *modeled* duration from
``npu.timing``; host work we really run (host ops, CPU fallbacks) has a *measured* one. Each event
carries its ``clock`` so every reader (the summary, Perfetto, the independent evaluator) can tell which
is which. The NPU and the host sit in separate Chrome "processes" so a viewer
shows them as separate lanes.

Times are seconds inside the program and microseconds in the Chrome file (the format's unit).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tilepilot.errors import InputError, WorkspaceError

KINDS = ("dispatch", "launch", "dma", "sync", "host", "cpu")
# Kinds whose duration comes from the timing model unless the caller says otherwise.
MODELED_KINDS = ("dispatch", "launch", "dma", "sync")
CLOCKS = ("modeled", "measured")
PHASES = ("prefill", "decode")

# Kinds that occupy the timeline on their own. Launches and DMAs happen *inside* a dispatch, so counting
# them in totals would count the same modeled time twice.
TOP_LEVEL_KINDS = ("dispatch", "sync", "host", "cpu")

# Chrome "process" / "thread" lanes: NPU vs host, then one lane per kind of work.
_PID = {"npu": 1, "host": 2}
_LANES = {
    "dispatch": ("npu", 1, "dispatches"),
    "launch": ("npu", 2, "launches"),
    "dma": ("npu", 3, "dma"),
    "sync": ("host", 1, "buffer sync (modeled)"),
    "host": ("host", 2, "host ops (measured)"),
    "cpu": ("host", 3, "cpu fallback (measured)"),
}
_PROCESS_NAMES = {"npu": "NPU (modeled time)", "host": "Host (syncs modeled, host ops measured)"}


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
    phase: str | None = None
    bytes: int = 0
    macs: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"Trace event kind {self.kind!r} is unknown; use one of {', '.join(KINDS)}.")
        if self.clock not in CLOCKS:
            raise InputError(f"Trace event clock {self.clock!r} is unknown; use 'modeled' or 'measured'.")
        if self.phase is not None and self.phase not in PHASES:
            raise InputError(f"Trace event phase {self.phase!r} is unknown; use 'prefill', 'decode' or None.")
        if not (self.end_s >= self.start_s >= 0.0):
            raise InputError(
                f"Trace event {self.name!r} has start {self.start_s} s and end {self.end_s} s; "
                "times must be non-negative with end >= start."
            )
        if self.bytes < 0 or self.macs < 0:
            raise InputError(f"Trace event {self.name!r} has negative bytes or MACs; record counts >= 0.")

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def label(self) -> str:
        """The kernel group the event is summarised under (its own name when it belongs to none)."""
        return self.group or self.name


@dataclass(frozen=True)
class GroupSummary:
    """Totals of one kernel group's top-level events under one clock."""

    group: str
    clock: str
    count: int
    total_ms: float
    share: float  # of all top-level time on the timeline (modeled + measured), 0..1


@dataclass
class Trace:
    """An append-only list of events plus a cursor at the end of the timeline.

    A synchronous runner does one thing at a time, so ``add`` places each new top-level event at the
    cursor and advances it; DMAs and launches inside a dispatch are placed explicitly with ``record``.
    """

    events: list[TraceEvent] = field(default_factory=list)
    cursor_s: float = 0.0

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
        phase: str | None = None,
        bytes: int = 0,
        macs: int = 0,
    ) -> TraceEvent:
        """Append an event at the cursor. NPU kinds and syncs default to the modeled clock, host work to measured."""
        if duration_s < 0:
            raise InputError(f"Trace event {name!r} has negative duration {duration_s} s; durations must be >= 0.")
        if clock is None:
            clock = "modeled" if kind in MODELED_KINDS else "measured"
        start = self.cursor_s
        event = TraceEvent(name, kind, start, start + duration_s, clock, group, layer, phase, int(bytes), int(macs))
        return self.record(event)

    def add_dispatch(
        self,
        timing: Any,
        *,
        group: str | None = None,
        layer: int | None = None,
        phase: str | None = None,
    ) -> TraceEvent:
        """Record a modeled dispatch (an ``npu.timing.GroupTiming``) at the cursor: the dispatch itself, one
        launch event per design inside it, and each launch's DDR traffic as a DMA event over the launch.

        The dispatch overhead comes first; the remaining non-kernel time (tile configuration, per-launch cost)
        is spread evenly before the launches.
        """
        group = group or timing.name
        dispatch = self.add(
            "dispatch",
            timing.name,
            timing.seconds,
            group=group,
            layer=layer,
            phase=phase,
            bytes=sum(d.ddr_bytes for d in timing.designs),
            macs=sum(d.macs for d in timing.designs),
        )
        designs = list(timing.designs)
        gap = max(timing.seconds - timing.dispatch_overhead_s - sum(d.seconds for d in designs), 0.0) / len(designs)
        t = dispatch.start_s + timing.dispatch_overhead_s
        for d in designs:
            t += gap
            end = min(t + d.seconds, dispatch.end_s)
            common = {"clock": "modeled", "group": group, "layer": layer, "phase": phase}
            self.record(TraceEvent(d.name, "launch", t, end, bytes=d.ddr_bytes, macs=d.macs, **common))
            self.record(TraceEvent(f"ddr {d.name}", "dma", t, end, bytes=d.ddr_bytes, **common))
            t = end
        return dispatch

    # --- queries ----------------------------------------------------------------------------------------------------
    def top_level(self) -> list[TraceEvent]:
        return [e for e in self.events if e.kind in TOP_LEVEL_KINDS]

    def count(self, kind: str, phase: str | None = None) -> int:
        """How many events of a kind (optionally in one phase), e.g. dispatches per decode token."""
        return sum(1 for e in self.events if e.kind == kind and (phase is None or e.phase == phase))

    def total_s(self, clock: str | None = None, phase: str | None = None) -> float:
        """Summed duration of top-level events, optionally only one clock or phase."""
        return sum(
            e.duration_s
            for e in self.top_level()
            if (clock is None or e.clock == clock) and (phase is None or e.phase == phase)
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

    # --- Chrome trace JSON ------------------------------------------------------------------------------------------
    def to_chrome_dict(self) -> dict:
        """The Chrome trace-event format (JSON object form) that Perfetto and chrome://tracing load."""
        trace_events: list[dict] = []
        for proc, pid in _PID.items():
            trace_events.append(
                {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": _PROCESS_NAMES[proc]}}
            )
        for _kind, (proc, tid, lane) in _LANES.items():
            trace_events.append(
                {"name": "thread_name", "ph": "M", "pid": _PID[proc], "tid": tid, "args": {"name": lane}}
            )
        for e in self.events:
            proc, tid, _ = _LANES[e.kind]
            args = {k: v for k, v in asdict(e).items() if k not in ("name", "kind", "start_s", "end_s")}
            trace_events.append(
                {
                    "name": e.name,
                    "cat": e.kind,
                    "ph": "X",
                    "ts": e.start_s * 1e6,
                    "dur": e.duration_s * 1e6,
                    "pid": _PID[proc],
                    "tid": tid,
                    "args": args,
                }
            )
        return {
            "traceEvents": trace_events,
            "displayTimeUnit": "ms",
            "otherData": {
                "producer": "tilepilot",
                "clocks": "NPU events are modeled by tilepilot's timing model; host events are measured wall-clock.",
                "modeled_ms": self.total_s("modeled") * 1e3,
                "measured_ms": self.total_s("measured") * 1e3,
            },
        }

    def to_chrome(self, path: str | os.PathLike) -> Path:
        """Write Chrome trace JSON atomically (temp file then rename), so no half-written trace is left."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.to_chrome_dict(), f)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def from_chrome(cls, path: str | os.PathLike) -> Trace:
        """Read back a trace this module wrote (the evaluator re-counts dispatches from the file)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            raw = [e for e in data["traceEvents"] if e.get("ph") == "X"]
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
        phase=args.get("phase"),
        bytes=int(args.get("bytes", 0)),
        macs=int(args.get("macs", 0)),
    )
