"""Device buffers and the host policies that decide when bytes move between host and NPU.

A ``DeviceBuffer`` has a host side and a device side. The host writes by *rebinding* its side to a
new tensor (never mutating in place), and a sync rebinds the device side to the host's tensor, so a
skipped sync really leaves the device reading the old contents: this is what makes a buffer wrongly
marked static produce stale results, as on hardware. No bytes are physically copied (host and device
share DRAM on Ryzen AI; a copy would be bit-identical); every sync's cost is *modeled* and recorded.

Policies (``HostPolicy`` of the plan), each changing modeled time and never a result:
- ``weights="preloaded"``: weight buffers are uploaded once (counted as load time); ``"per_call"``
  pays the upload on every use.
- ``zero_copy``: host and device map the same pages, a sync costs only its fixed part.
- ``skip_unchanged_writes``: dirty tracking; an input whose device copy is current is not rewritten,
  and a value produced on the device and consumed on the device never round-trips through the host.
  Without it every use pays a write (and a read-back for device-produced values), as IRON does.
- ``reuse_buffers``: a buffer is allocated once and reused across layers and calls; without it each
  dispatch allocates (and pays for) its buffers.
- ``handoff="host"``: every dispatch has its own argument buffers, as separate XRT kernels with their own buffer
  objects do (the paper's deployment, ``llama32_1b/docs/profile.md``: "BO Write" of each kernel's activation inputs,
  "BO Read" a zero-copy view of its outputs). An activation input is copied into the dispatch's buffer on every
  dispatch, whether or not another dispatch's buffer already holds it; reading a result on the host costs only the
  fixed part of a sync. Static inputs (weights, tables) are still skipped under ``skip_unchanged_writes``, and values
  inside one dispatch never reach the pool. ``"device"`` (the default): a result stays in the buffer the next
  dispatch reads.

``BufferPool(trust_static=True)`` trusts static buffers never to change (the fast production
behaviour); a static buffer that does change is then read stale (not under zero-copy, where the
device reads the host's pages). With ``trust_static=False`` every use of a static buffer checks that its host side is
unchanged and raises ``StaleBufferError`` if it was rewritten: the check a debug skill runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tilepilot.errors import TilepilotError
from tilepilot.plan.plan import HostPolicy

KINDS = ("weight", "activation", "table", "kv")


class StaleBufferError(TilepilotError):
    """A buffer marked static was rewritten on the host after its one upload."""


@dataclass
class SyncCostModel:
    """Modeled seconds of host-side buffer work; built from ``npu.calibration`` by the dispatcher."""

    sync_s: Callable[[int], float]  # one host<->device sync of n bytes (copy + fixed cost)
    fixed_s: float  # the fixed part alone (zero-copy: cache maintenance, no copy)
    alloc_s: float  # allocating + mapping one buffer
    # an activation handed over through the host into a dispatch's own buffer (HostPolicy.handoff="host")
    handoff_s: Callable[[int], float]


@dataclass
class SyncEvent:
    """One host-side buffer operation and its modeled cost (the dispatcher writes these to the trace)."""

    name: str
    op: str  # "to_device" | "from_device" | "upload" | "alloc"
    nbytes: int
    seconds: float


@dataclass
class DeviceBuffer:
    name: str
    kind: str
    host: torch.Tensor | None = None
    device: torch.Tensor | None = None
    static: bool = False
    host_version: int = 0
    device_version: int = -1  # host version the device side holds; -1 = never synced
    device_fresh: bool = False  # device side was written by a kernel and the host side is behind

    @property
    def nbytes(self) -> int:
        t = self.device if self.device is not None else self.host
        return 0 if t is None else t.numel() * t.element_size()

    def write(self, tensor: torch.Tensor) -> None:
        """Host writes new contents (rebinding, so the device side keeps what it had until synced)."""
        self.host = tensor
        self.host_version += 1
        self.device_fresh = False


@dataclass
class BufferStats:
    to_device: int = 0
    from_device: int = 0
    skipped: int = 0
    allocs: int = 0
    bytes_to_device: int = 0
    bytes_from_device: int = 0
    modeled_s: float = 0.0


@dataclass
class BufferPool:
    """Named device buffers under one host policy; every byte moved is reported to ``on_sync``."""

    policy: HostPolicy
    costs: SyncCostModel
    trust_static: bool = True
    on_sync: Callable[[SyncEvent], None] | None = None
    stats: BufferStats = field(default_factory=BufferStats)
    in_pass: bool = False  # set by the dispatcher while a one-dispatch pass runs
    _buffers: dict[str, DeviceBuffer] = field(default_factory=dict)

    # ---- bookkeeping ----------------------------------------------------------------------
    def _emit(self, name: str, op: str, nbytes: int, seconds: float) -> None:
        self.stats.modeled_s += seconds
        if op == "to_device" or op == "upload":
            self.stats.to_device += 1
            self.stats.bytes_to_device += nbytes
        elif op == "from_device":
            self.stats.from_device += 1
            self.stats.bytes_from_device += nbytes
        elif op == "alloc":
            self.stats.allocs += 1
        if self.on_sync is not None:
            self.on_sync(SyncEvent(name, op, nbytes, seconds))

    def _sync_s(self, nbytes: int) -> float:
        return self.costs.fixed_s if self.policy.zero_copy else self.costs.sync_s(nbytes)

    def _read_s(self, nbytes: int) -> float:
        """A read-back: under host handoff the host maps the result zero-copy (fixed cost), else a full sync."""
        return self.costs.fixed_s if self.host_handoff else self._sync_s(nbytes)

    @property
    def host_handoff(self) -> bool:
        """Whether activations reach each dispatch through the host. Never inside a one-dispatch pass
        (``in_pass``): the host cannot touch a buffer between the launches of one dispatch, so there they stay on
        the device whatever the policy says."""
        return self.policy.handoff == "host" and not self.in_pass

    def get(self, name: str) -> DeviceBuffer | None:
        return self._buffers.get(name)

    def buffer(self, name: str, kind: str = "activation", static: bool = False) -> DeviceBuffer:
        """The buffer ``name``; allocated once under ``reuse_buffers``, else freshly on every request."""
        if kind not in KINDS:
            raise ValueError(f"buffer kind must be one of {KINDS}, got {kind!r}")
        buf = self._buffers.get(name)
        if buf is None:
            buf = DeviceBuffer(name=name, kind=kind, static=static)
            self._buffers[name] = buf
            self._emit(name, "alloc", 0, self.costs.alloc_s)
        elif not self.policy.reuse_buffers and buf.kind == "activation":
            self._emit(name, "alloc", 0, self.costs.alloc_s)
        return buf

    def mark_static(self, name: str, static: bool = True) -> None:
        """Declare a buffer static (uploaded once, never re-synced): the fault-injection hook."""
        self._buffers[name].static = static

    # ---- weights ----------------------------------------------------------------------------
    def weight(self, name: str, tensor: torch.Tensor) -> DeviceBuffer:
        """Register a weight. Preloaded weights pay one upload now (load time)."""
        buf = self._buffers.get(name)
        if buf is None:
            buf = DeviceBuffer(name=name, kind="weight", host=tensor, static=True, host_version=1)
            self._buffers[name] = buf
            if self.policy.weights == "preloaded":
                self._upload(buf)
        return buf

    def _upload(self, buf: DeviceBuffer) -> None:
        buf.device = buf.host
        buf.device_version = buf.host_version
        self._emit(buf.name, "upload", buf.nbytes, self.costs.sync_s(buf.nbytes))

    def weight_view(self, buf: DeviceBuffer) -> torch.Tensor:
        """Device side of a weight for one kernel call; ``per_call`` pays the upload every time."""
        if self.policy.weights == "per_call" or buf.device is None:
            self._upload(buf)
        return buf.device

    # ---- activations ------------------------------------------------------------------------
    def _read_back(self, buf: DeviceBuffer) -> None:
        self._emit(buf.name, "from_device", buf.nbytes, self._read_s(buf.nbytes))
        buf.host = buf.device
        buf.host_version += 1
        buf.device_version = buf.host_version
        buf.device_fresh = False

    def device_view(self, buf: DeviceBuffer) -> torch.Tensor:
        """Device side of an input before a dispatch, syncing (or not) as the policy says."""
        if self.host_handoff and buf.kind == "activation" and not buf.static:
            return self._hand_over(buf)
        if buf.device_fresh:
            # Produced on the device: with dirty tracking it stays there. Without it the host reads it
            # back and writes it again into the next dispatch's input buffer, as IRON does; never inside one
            # dispatch (``in_pass``), where the next launch reads it where the last one wrote it.
            if self.policy.skip_unchanged_writes or self.in_pass:
                return buf.device
            self._read_back(buf)
        if buf.static and buf.device_version >= 0:
            if buf.device_version != buf.host_version and not self.trust_static:
                raise StaleBufferError(
                    f"buffer {buf.name} is marked static but its host contents changed after the upload; "
                    "mark it non-static so it is synced on every change"
                )
            self.stats.skipped += 1
            # zero-copy: the device reads the host's pages, so even a skipped sync cannot be stale
            return buf.host if self.policy.zero_copy else buf.device
        if buf.device_version == buf.host_version and (self.policy.skip_unchanged_writes or self.in_pass):
            self.stats.skipped += 1
            return buf.device
        return self._write(buf)

    def _hand_over(self, buf: DeviceBuffer) -> torch.Tensor:
        """Host handoff: the value reaches this dispatch's own argument buffer through the host, every time."""
        if buf.device_fresh:
            self._read_back(buf)
        return self._write(buf, self._handoff_s)

    def _handoff_s(self, nbytes: int) -> float:
        if self.policy.zero_copy:
            return self.costs.fixed_s
        return self.costs.handoff_s(nbytes)

    def _write(self, buf: DeviceBuffer, cost: Callable[[int], float] | None = None) -> torch.Tensor:
        """Sync the host side to the device side (one modeled to_device sync, or ``cost`` of its bytes)."""
        buf.device = buf.host
        buf.device_version = buf.host_version
        self._emit(buf.name, "to_device", buf.nbytes, (cost or self._sync_s)(buf.nbytes))
        return buf.device

    def produced(self, buf: DeviceBuffer, tensor: torch.Tensor) -> None:
        """A kernel wrote ``tensor`` into the device side; the host side is now behind."""
        buf.device = tensor
        buf.device_fresh = True

    def host_view(self, buf: DeviceBuffer) -> torch.Tensor:
        """Host side of a value before a CPU step, reading it back from the device if needed."""
        if buf.device_fresh:
            self._read_back(buf)
        return buf.host

    def transfer(self, name: str, op: str, nbytes: int) -> None:
        """Account a sync of part of a shared buffer (e.g. new KV-cache rows crossing host/NPU)."""
        self._emit(name, op, nbytes, self._read_s(nbytes) if op == "from_device" else self._sync_s(nbytes))
