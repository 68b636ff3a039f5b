"""The design IR: an NPU program as plain objects that map one to one onto an IRON program.

IRON (Xilinx/mlir-aie ``python/iron``) describes a dispatch as object fifos between endpoints, workers
running a kernel in a loop over acquired fifo objects, memory-tile links that split / join / forward
objects, and a runtime sequence that fills and drains DDR tensors through access patterns. tilepilot
keeps exactly those concepts so that (a) a design here could be printed as an IRON program, (b) the
validator can count hardware resources the way mlir-aie allocates them, and (c) the tile executor can
run the dataflow literally.

Relations are explicit and checkable rather than implied by call order:
- a fifo's endpoints are *derived* from use (a worker listing it as input is a consumer, a runtime
  ``fill`` makes the shim its producer, a link's source is consumed by the link ...). A fifo may also
  declare ``producer`` / ``consumers``; the validator then checks the declaration against use.
- a worker's per-iteration behaviour is summarised declaratively (``acquires`` per fifo per iteration,
  ``calls_per_iteration``) so the timing model never has to run its program; the executor checks that
  the program it runs (default or custom) matches the summary.

``Design.meta`` conventions (read by the timing model and the registry): ``family``, ``shape`` (dict),
``config`` (dict), ``macs`` (total), ``ddr_read_bytes``, ``ddr_write_bytes``, and for padded kernels
``logical_shape``. ``Design.total_macs()`` / ``ddr_read_bytes()`` recompute the last three from the
IR itself; tests hold the two equal. ``fallback`` (list of names), only where a kernel had to build a design
otherwise than its usual way, because that one breaks a rule (eltwise's "whole-object cuts" and "packed task
groups" for long prompts); see ``fallbacks``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from tilepilot.errors import ConfigError
from tilepilot.npu.device import Device, Tile, npu2
from tilepilot.npu.numerics import Numerics

__all__ = [
    "DTYPE_BYTES",
    "SHIM",
    "Acquire",
    "Binding",
    "Call",
    "CallContext",
    "Design",
    "Endpoint",
    "FifoLink",
    "MultiLaunchGroup",
    "ObjectFifo",
    "Release",
    "Runtime",
    "RuntimeTask",
    "TensorAccessPattern",
    "TensorSpec",
    "Tile",
    "TileKernel",
    "Worker",
    "default_program",
    "dtype_bytes",
    "forward",
    "join",
    "link_end",
    "nbytes",
    "split",
    "torch_dtype",
    "worker_end",
]

# Bytes per element. bfp16 (AIE bfp16ebs8): 8 values x 8 bits (sign + 7-bit mantissa) + one 8-bit shared exponent
# = 9 bytes per 8 values. Only whole blocks of 8 can be stored in that format.
DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp32": 4.0, "bfp16": 9.0 / 8.0, "int8": 1.0, "uint8": 1.0}
# uint8: packed quantized weights (model/quant.py), streamed as raw bytes and decoded inside a compute tile
_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "uint8": torch.uint8}


def dtype_bytes(dtype: str) -> float:
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"Unknown dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)}.")
    return DTYPE_BYTES[dtype]


def nbytes(n_elements: int, dtype: str) -> int:
    """Storage bytes of ``n_elements`` values; rounds partial bfp16 blocks up to a whole block."""
    if dtype == "bfp16":
        return math.ceil(n_elements / 8) * 9
    return int(n_elements * dtype_bytes(dtype))


def torch_dtype(dtype: str) -> torch.dtype:
    if dtype not in _TORCH_DTYPES:
        raise ConfigError(f"dtype {dtype!r} has no host tensor type; DDR and fifo tensors must be bf16 or fp32.")
    return _TORCH_DTYPES[dtype]


# ----------------------------------------------------------------------------------------------------------------------
# DDR tensors and access patterns
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    """A tensor in DDR that a design reads or writes (one runtime-sequence argument)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return nbytes(self.n_elements, self.dtype)


@dataclass(frozen=True)
class TensorAccessPattern:
    """IRON's TensorAccessPattern: which elements of a DDR tensor one DMA task moves, in which order.

    ``sizes`` / ``strides`` are listed outermost first (IRON order) and count elements; the transfer visits
    ``offset + sum(i_d * strides[d])`` for the index vector in row-major order over ``sizes``. Hardware
    limits (at most 4 dimensions, ranges of sizes and strides) are the validator's job, so an illegal
    pattern can still be built and reported with a code.
    """

    tensor_shape: tuple[int, ...]
    offset: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensor_shape", tuple(map(int, self.tensor_shape)))
        object.__setattr__(self, "sizes", tuple(map(int, self.sizes)))
        object.__setattr__(self, "strides", tuple(map(int, self.strides)))
        if len(self.sizes) != len(self.strides):
            raise ConfigError(
                f"Access pattern has {len(self.sizes)} sizes but {len(self.strides)} strides; give one stride per size."
            )

    @classmethod
    def contiguous(cls, tensor_shape: Sequence[int], offset: int = 0, n: int | None = None) -> TensorAccessPattern:
        """The whole tensor (or ``n`` elements from ``offset``) in memory order."""
        total = math.prod(tensor_shape)
        n = total - offset if n is None else n
        return cls(tuple(tensor_shape), offset, (n,), (1,))

    @property
    def n_elements(self) -> int:
        return math.prod(self.sizes) if self.sizes else 0

    @property
    def tensor_elements(self) -> int:
        return math.prod(self.tensor_shape)

    def indices(self) -> np.ndarray:
        """Flat element offsets in transfer order (int64)."""
        idx = np.array([self.offset], dtype=np.int64)
        for size, stride in zip(self.sizes, self.strides, strict=True):
            idx = (idx[:, None] + np.arange(size, dtype=np.int64)[None, :] * stride).reshape(-1)
        return idx

    def index_range(self) -> tuple[int, int]:
        """Smallest and largest flat offset touched, computed without enumerating the pattern."""
        lo = hi = self.offset
        for size, stride in zip(self.sizes, self.strides, strict=True):
            span = (size - 1) * stride
            lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
        return lo, hi


# ----------------------------------------------------------------------------------------------------------------------
# Fifos, endpoints and memory-tile links
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Endpoint:
    """One end of an object fifo: a worker, a memory-tile link, or the shim (DDR via the runtime sequence)."""

    kind: str  # "worker" | "link" | "shim"
    name: str

    def __str__(self) -> str:
        return self.name if self.kind != "shim" else "shim"


SHIM = Endpoint("shim", "shim")


def worker_end(name: str) -> Endpoint:
    return Endpoint("worker", name)


def link_end(name: str) -> Endpoint:
    return Endpoint("link", name)


@dataclass(frozen=True)
class ObjectFifo:
    """A bounded queue of ``depth`` buffers of ``obj_shape`` between one producer and one or more consumers.

    Several consumers = broadcast (every consumer sees every object). ``shim_placement`` is the shim tile
    serving this fifo's DDR end, if it has one (set by the placer when left ``None``). ``producer`` and
    ``consumers`` are optional declarations; the design derives the real endpoints from use.

    ``rides_with``: another fifo filled from the same shim tile whose MM2S channel also carries this fifo's
    transfers, packet-switched (each BD of a channel may carry its own packet ID, so one stream reaches
    different destinations; AIR's fused decode routes its flows this way). It takes no channel of its own and
    its bytes queue on the other fifo's channel. A small stream (a decode step's activation) can then share a
    channel with a weight stream instead of idling a whole one.

    ``role``: the buffer's role in a kernel that serves launches of several sizes. In a resident pass
    (``npu/resident.py``) the worker-side buffers of one role, side and depth on one tile are one buffer set sized to
    the largest, whatever the object size of each launch: AIR's fused decode runs every projection on one
    ``proj_qmm`` role, its resident x buffer sized for the widest K. The buffer and its locks are shared; each
    distinct object size keeps its own buffer descriptors (a tile's descriptors are fixed when the array is
    configured, one transfer length each). Without a role a buffer shares only with buffers of its exact layout.
    """

    name: str
    obj_shape: tuple[int, ...]
    dtype: str = "bf16"
    depth: int = 2
    producer: Endpoint | None = None
    consumers: tuple[Endpoint, ...] = ()
    shim_placement: Tile | None = None
    rides_with: str | None = None
    role: str | None = None

    @property
    def channel(self) -> str:
        """The fifo whose shim channel carries this fifo's DDR transfers: the one it rides, else itself."""
        return self.rides_with or self.name

    def __post_init__(self) -> None:
        object.__setattr__(self, "obj_shape", tuple(int(s) for s in self.obj_shape))
        object.__setattr__(self, "consumers", tuple(self.consumers))
        if self.depth < 1:
            raise ConfigError(f"Fifo {self.name} has depth {self.depth}; a fifo needs at least one buffer.")

    @property
    def obj_elements(self) -> int:
        return math.prod(self.obj_shape)

    @property
    def obj_bytes(self) -> int:
        return nbytes(self.obj_elements, self.dtype)

    @property
    def buffer_bytes(self) -> int:
        """Memory one side of the fifo occupies on a tile: depth x object size."""
        return self.depth * self.obj_bytes


@dataclass(frozen=True)
class FifoLink:
    """IRON's ObjectFifoLink on a memory tile.

    ``split``: one source object is cut into one object per destination, destination i taking
    ``obj_elements(dst_i)`` elements from flat element ``offsets[i]`` of the source object.
    ``join``: the reverse, source i lands at ``offsets[i]`` of the destination object.
    ``forward``: one source to one destination of the same size (staging in L2).
    """

    name: str
    kind: str  # "split" | "join" | "forward"
    srcs: tuple[str, ...]
    dsts: tuple[str, ...]
    offsets: tuple[int, ...] = ()
    placement: Tile | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "srcs", tuple(self.srcs))
        object.__setattr__(self, "dsts", tuple(self.dsts))
        object.__setattr__(self, "offsets", tuple(int(o) for o in self.offsets))
        if self.kind not in ("split", "join", "forward"):
            raise ConfigError(f"Link {self.name} has kind {self.kind!r}; use split, join or forward.")
        if self.kind == "split" and (len(self.srcs) != 1 or len(self.offsets) != len(self.dsts)):
            raise ConfigError(f"Split link {self.name} needs one source and one offset per destination.")
        if self.kind == "join" and (len(self.dsts) != 1 or len(self.offsets) != len(self.srcs)):
            raise ConfigError(f"Join link {self.name} needs one destination and one offset per source.")
        if self.kind == "forward" and (len(self.srcs) != 1 or len(self.dsts) != 1):
            raise ConfigError(f"Forward link {self.name} needs exactly one source and one destination.")

    @property
    def fifos(self) -> tuple[str, ...]:
        return self.srcs + self.dsts


def split(name: str, src: str, dsts: Sequence[str], offsets: Sequence[int], placement: Tile | None = None) -> FifoLink:
    return FifoLink(name, "split", (src,), tuple(dsts), tuple(offsets), placement)


def join(name: str, srcs: Sequence[str], dst: str, offsets: Sequence[int], placement: Tile | None = None) -> FifoLink:
    return FifoLink(name, "join", tuple(srcs), (dst,), tuple(offsets), placement)


def forward(name: str, src: str, dst: str, placement: Tile | None = None) -> FifoLink:
    return FifoLink(name, "forward", (src,), (dst,), (0,), placement)


# ----------------------------------------------------------------------------------------------------------------------
# Kernels, worker programs, workers
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class CallContext:
    """What a tile kernel sees besides its buffers: where it is in the loop and its worker's scratch memory.

    ``scratch`` persists across calls of one worker (declared in ``Worker.local_bytes``), e.g. an fp32
    accumulator that lives across the K loop.
    """

    worker: str
    iteration: int
    step: int
    steps: int
    scratch: dict[str, Any]
    params: Mapping[str, Any]

    @property
    def first(self) -> bool:
        return self.step == 0

    @property
    def last(self) -> bool:
        return self.step == self.steps - 1


KernelFn = Callable[[list[torch.Tensor], list[torch.Tensor], CallContext], None]


@dataclass(frozen=True)
class TileKernel:
    """The compute a worker calls per step: ``fn(inputs, outputs, ctx)`` writes into its output buffers.

    ``variant``: 'vector' (MMUL / vector unit), 'scalar' (scalar core rate), 'bfp16' (block-FP16 MMUL).
    ``macs_per_call`` and ``vector_ops_per_call`` (non-MAC element operations, e.g. adds, exp) and
    ``bytes_per_call`` (bytes the core touches in L1 per call) are what the timing model reads.
    ``borrowed_ops``: (family, vector ops per call) of arithmetic that is another family's inner loop (attention
    decoding a q8_0 KV block is the quantized GEMV's block decode), timed at that family's efficiency, as a fused
    prologue is timed at its own family's.
    """

    name: str
    fn: KernelFn
    variant: str = "vector"
    macs_per_call: int = 0
    vector_ops_per_call: int = 0
    bytes_per_call: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)
    borrowed_ops: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.variant not in ("vector", "scalar", "bfp16"):
            raise ConfigError(f"Kernel {self.name} has variant {self.variant!r}; use vector, scalar or bfp16.")


@dataclass(frozen=True)
class Acquire:
    """Worker-program op: acquire ``n`` objects of a fifo; the executor sends back the list of buffers."""

    fifo: str
    n: int = 1


@dataclass(frozen=True)
class Release:
    fifo: str
    n: int = 1


@dataclass(frozen=True)
class Call:
    """Worker-program op: call the worker's kernel on these buffers (step ``step`` of ``steps``)."""

    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    iteration: int
    step: int
    steps: int


Op = Acquire | Release | Call
Program = Callable[["Worker"], Iterator[Op]]


@dataclass(frozen=True)
class Worker:
    """The program of one compute tile: loop ``iterations`` times over acquired fifo objects, calling a kernel.

    Declarative summary (what the timing model reads): per iteration the worker acquires
    ``acquires[f]`` objects of each fifo f (default 1) and calls its kernel ``calls_per_iteration`` times.
    The default program derives the loop from that summary: fifos with count 1 are held for the whole
    iteration, fifos with count == calls_per_iteration are acquired and released around every call
    (GEMM: C held, A and W streamed over K). Anything else needs a custom ``program``.
    """

    name: str
    kernel: TileKernel
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    iterations: int = 1
    placement: Tile | None = None
    local_bytes: int = 0
    acquires: Mapping[str, int] = field(default_factory=dict)
    calls_per_iteration: int = 1
    program: Program | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        if self.iterations < 0 or self.calls_per_iteration < 1:
            raise ConfigError(f"Worker {self.name} needs iterations >= 0 and calls_per_iteration >= 1.")

    @property
    def fifos(self) -> tuple[str, ...]:
        return self.inputs + self.outputs

    def acquires_per_iteration(self) -> dict[str, int]:
        """Objects acquired from each fifo (inputs and outputs) in one iteration."""
        return {f: int(self.acquires.get(f, 1)) for f in self.fifos}

    def total_acquires(self) -> dict[str, int]:
        return {f: n * self.iterations for f, n in self.acquires_per_iteration().items()}

    @property
    def macs_per_iteration(self) -> int:
        return self.kernel.macs_per_call * self.calls_per_iteration

    @property
    def total_macs(self) -> int:
        return self.macs_per_iteration * self.iterations

    def run_program(self) -> Iterator[Op]:
        return (self.program or default_program)(self)


def default_program(worker: Worker) -> Iterator[Op]:
    """The acquire / call / release loop implied by a worker's declarative summary.

    A fifo acquired once per iteration is held across all calls of the iteration (GEMM's C, a norm
    weight); one acquired ``calls_per_iteration`` times is taken and given back around every call (GEMM's
    A and W over K, streamed chunks). Held fifos are acquired outputs first, in declaration order.
    """
    counts = worker.acquires_per_iteration()
    steps = worker.calls_per_iteration
    bad = [f for f in worker.fifos if counts[f] not in (1, steps)]
    if bad:
        raise ConfigError(
            f"Worker {worker.name} acquires {', '.join(f'{f} x{counts[f]}' for f in bad)} per iteration, "
            "which the default program cannot express; give the worker a custom program."
        )
    held = [f for f in worker.outputs + worker.inputs if counts[f] == 1]
    streamed = [f for f in worker.inputs + worker.outputs if steps > 1 and counts[f] == steps]
    for it in range(worker.iterations):
        bufs_held: dict[str, torch.Tensor] = {}
        for f in held:
            bufs = yield Acquire(f, 1)
            bufs_held[f] = bufs[0]
        for step in range(steps):
            now: dict[str, torch.Tensor] = dict(bufs_held)
            for f in streamed:
                bufs = yield Acquire(f, 1)
                now[f] = bufs[0]
            yield Call(tuple(now[f] for f in worker.inputs), tuple(now[f] for f in worker.outputs), it, step, steps)
            for f in streamed:
                yield Release(f, 1)
        for f in held:
            yield Release(f, 1)


# ----------------------------------------------------------------------------------------------------------------------
# Runtime sequence
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RuntimeTask:
    """One shim DMA task of the runtime sequence: move ``tap`` of DDR ``tensor`` into (fill) or out of (drain) a fifo.

    Tasks of one ``group`` run concurrently; groups run in ascending order, each starting when the previous
    one has finished (IRON task groups, bounded by the shim's BDs).
    """

    kind: str  # "fill" | "drain"
    fifo: str
    tensor: str
    tap: TensorAccessPattern
    group: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("fill", "drain"):
            raise ConfigError(f"Runtime task kind {self.kind!r} is unknown; use fill or drain.")


@dataclass
class Runtime:
    """The host-side program of one dispatch: an ordered list of fill / drain tasks in task groups."""

    tasks: list[RuntimeTask] = field(default_factory=list)
    # (the task list it was built from, its length, elements moved per (kind, fifo)): see _moved
    _shim_index: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def fill(self, fifo: str, tensor: str, tap: TensorAccessPattern, group: int = 0) -> Runtime:
        self.tasks.append(RuntimeTask("fill", fifo, tensor, tap, group))
        return self

    def drain(self, fifo: str, tensor: str, tap: TensorAccessPattern, group: int = 0) -> Runtime:
        self.tasks.append(RuntimeTask("drain", fifo, tensor, tap, group))
        return self

    @classmethod
    def packed(
        cls,
        streams: Sequence[Sequence[Sequence[tuple[str, str, str, TensorAccessPattern]]]],
        shim_bds: int,
        shim_of: Mapping[str, object],
        rounds: bool = False,
    ) -> Runtime:
        """Units of (kind, fifo, tensor, tap) tasks in order, packed into task groups that keep every shim within
        its ``shim_bds`` buffer descriptors; every group boundary costs the launch a pipeline fill and drain
        (``npu.timing``), so a design is built with as few groups as its BDs allow.

        ``streams``: independent sequences of units (e.g. one per column), each counted from group 0. A unit starts
        a new group when it does not fit the current one on some shim (``shim_of``: each fifo's shim; ``rounds``:
        always, each unit is one iteration of a sequential launch loop); a unit too big for any group is cut between
        groups. Order is kept, so every task's inputs come from the same or an earlier group and no group waits on
        a later one. Every fifo a task moves must have its shim in ``shim_of``: its BDs are counted against that
        shim's, and unplaced ones would all be pooled under one shim that does not exist.
        """
        unplaced = sorted({f for units in streams for tasks in units for _, f, _, _ in tasks if shim_of.get(f) is None})
        if unplaced:
            raise ValueError(f"Runtime.packed: fifos {unplaced} have no shim placement; place them before packing")
        rt = cls()
        for units in streams:
            group, used = 0, {}
            for tasks in units:
                need: dict[object, int] = {}
                for _, fifo, _, _ in tasks:
                    need[shim_of.get(fifo)] = need.get(shim_of.get(fifo), 0) + 1
                if used and (rounds or any(used.get(k, 0) + n > shim_bds for k, n in need.items())):
                    group, used = group + 1, {}
                for kind, fifo, tensor, tap in tasks:
                    key = shim_of.get(fifo)
                    if used.get(key, 0) == shim_bds:
                        group, used = group + 1, {}
                    (rt.fill if kind == "fill" else rt.drain)(fifo, tensor, tap, group)
                    used[key] = used.get(key, 0) + 1
        rt.tasks.sort(key=lambda t: t.group)  # stable: task order within a fifo is kept
        return rt

    def groups(self) -> list[list[RuntimeTask]]:
        """Tasks bucketed by group id, in execution order (task order preserved inside a group)."""
        buckets: dict[int, list[RuntimeTask]] = {}
        for t in self.tasks:
            buckets.setdefault(t.group, []).append(t)
        return [buckets[g] for g in sorted(buckets)]

    def fills(self, fifo: str) -> bool:
        """True when a task of this runtime fills ``fifo`` from DDR (the shim is its producer)."""
        return ("fill", fifo) in self._moved()

    def drains(self, fifo: str) -> bool:
        """True when a task of this runtime drains ``fifo`` to DDR (the shim is its consumer)."""
        return ("drain", fifo) in self._moved()

    def moved_elements(self, kind: str, fifo: str) -> int:
        """Elements the runtime's ``kind`` ("fill" / "drain") tasks move through ``fifo`` over one launch."""
        return self._moved().get((kind, fifo), 0)

    def _moved(self) -> dict[tuple[str, str], int]:
        """Elements moved per (kind, fifo) by the tasks (a key per fifo a task names), rebuilt whenever the task list
        is replaced or grows.

        The validator and the placer ask for a fifo's endpoints once per fifo and per check, and a large GEMM's
        runtime has thousands of tasks: scanning them on every question made validation quadratic (most of a
        tuner's time). Tasks are frozen, so a list that is the same object with the same length (appends are the
        only growth; a sort keeps the totals) moves the same elements."""
        idx = self._shim_index
        if idx is None or idx[0] is not self.tasks or idx[1] != len(self.tasks):
            moved: dict[tuple[str, str], int] = {}
            for t in self.tasks:
                moved[(t.kind, t.fifo)] = moved.get((t.kind, t.fifo), 0) + t.tap.n_elements
            idx = self._shim_index = (self.tasks, len(self.tasks), moved)
        return idx[2]


# ----------------------------------------------------------------------------------------------------------------------
# Design and multi-launch group
# ----------------------------------------------------------------------------------------------------------------------
FastFn = Callable[..., dict[str, torch.Tensor]]


@dataclass
class Design:
    """One NPU launch: device + DDR tensors + fifos + links + workers + runtime + declared numerics.

    ``fast(inputs: dict[str, Tensor], *, exact: bool = False) -> dict[str, Tensor]`` computes the same
    outputs at tensor level with the same rounding points (exact=True: bit-identical to the tile path;
    exact=False: the production path, documented per family). ``meta``: see module docstring.
    """

    name: str
    device: Device = field(default_factory=npu2)
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    fifos: list[ObjectFifo] = field(default_factory=list)
    links: list[FifoLink] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    runtime: Runtime = field(default_factory=Runtime)
    numerics: Numerics = field(default_factory=Numerics)
    fast: FastFn | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    # --- lookups ----------------------------------------------------------------------------------------------------
    def fifo(self, name: str) -> ObjectFifo:
        for f in self.fifos:
            if f.name == name:
                return f
        raise KeyError(name)

    def worker(self, name: str) -> Worker:
        for w in self.workers:
            if w.name == name:
                return w
        raise KeyError(name)

    def link(self, name: str) -> FifoLink:
        for lk in self.links:
            if lk.name == name:
                return lk
        raise KeyError(name)

    def tensor(self, name: str) -> TensorSpec:
        for t in self.inputs + self.outputs:
            if t.name == name:
                return t
        raise KeyError(name)

    # --- derived endpoints ------------------------------------------------------------------------------------------
    def producers(self, fifo: str) -> list[Endpoint]:
        """Every endpoint that writes into ``fifo`` according to use (a legal fifo has exactly one)."""
        out: list[Endpoint] = [worker_end(w.name) for w in self.workers if fifo in w.outputs]
        out += [link_end(lk.name) for lk in self.links if fifo in lk.dsts]
        if self.runtime.fills(fifo):
            out.append(SHIM)
        return out

    def consumers(self, fifo: str) -> list[Endpoint]:
        out: list[Endpoint] = [worker_end(w.name) for w in self.workers if fifo in w.inputs]
        out += [link_end(lk.name) for lk in self.links if fifo in lk.srcs]
        if self.runtime.drains(fifo):
            out.append(SHIM)
        return out

    def endpoint_tile(self, end: Endpoint, fifo: str) -> Tile | None:
        """Where an endpoint of ``fifo`` sits (None while unplaced)."""
        if end.kind == "worker":
            return self.worker(end.name).placement
        if end.kind == "link":
            return self.link(end.name).placement
        return self.fifo(fifo).shim_placement

    # --- totals the timing model and registry read ------------------------------------------------------------------
    def total_macs(self) -> int:
        return sum(w.total_macs for w in self.workers)

    def ddr_read_bytes(self) -> int:
        return sum(
            nbytes(t.tap.n_elements, self.tensor(t.tensor).dtype) for t in self.runtime.tasks if t.kind == "fill"
        )

    def ddr_write_bytes(self) -> int:
        return sum(
            nbytes(t.tap.n_elements, self.tensor(t.tensor).dtype) for t in self.runtime.tasks if t.kind == "drain"
        )

    def is_placed(self) -> bool:
        return (
            all(w.placement is not None for w in self.workers)
            and all(lk.placement is not None for lk in self.links)
            and all(  # the shim is a fifo's endpoint exactly when a runtime task fills or drains it
                f.shim_placement is not None
                for f in self.fifos
                if self.runtime.fills(f.name) or self.runtime.drains(f.name)
            )
        )

    def with_updates(self, **changes: Any) -> Design:
        return replace(self, **changes)

    def summary(self) -> str:
        """A few lines for logs and debug skills: counts and where things sit."""
        lines = [
            f"design {self.name} on {self.device.name}: {len(self.workers)} workers, {len(self.fifos)} fifos, "
            f"{len(self.links)} links, {len(self.runtime.tasks)} runtime tasks",
            f"  numerics: {self.numerics.to_dict()}",
            f"  MACs {self.total_macs():,}; DDR read {self.ddr_read_bytes():,} B, write {self.ddr_write_bytes():,} B",
        ]
        for w in self.workers:
            lines.append(
                f"  worker {w.name} @ {w.placement} kernel {w.kernel.name}/{w.kernel.variant} x{w.iterations} "
                f"in {list(w.inputs)} out {list(w.outputs)}"
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class Binding:
    """Output ``src_tensor`` of launch ``src_launch`` feeds input ``dst_tensor`` of a later launch ``dst_launch``."""

    src_launch: str
    src_tensor: str
    dst_launch: str
    dst_tensor: str


@dataclass
class MultiLaunchGroup:
    """Several designs run back to back in one dispatch (one host round trip), with tensors passed between them.

    Inputs of a launch that no binding feeds are group inputs, named ``<launch>.<tensor>``; every launch
    output is a group output under the same naming. ``binding_problems()`` lists what makes bindings
    inconsistent (the "merged-launch argument mismatch" fault); the validator reports each as GROUP_BINDING.
    """

    name: str
    designs: list[Design]
    bindings: list[Binding] = field(default_factory=list)

    def design(self, name: str) -> Design:
        for d in self.designs:
            if d.name == name:
                return d
        raise KeyError(name)

    def launch_index(self, name: str) -> int:
        return [d.name for d in self.designs].index(name)

    def bound_inputs(self) -> set[tuple[str, str]]:
        return {(b.dst_launch, b.dst_tensor) for b in self.bindings}

    def group_inputs(self) -> list[tuple[str, TensorSpec]]:
        bound = self.bound_inputs()
        return [(d.name, t) for d in self.designs for t in d.inputs if (d.name, t.name) not in bound]

    def group_outputs(self) -> list[tuple[str, TensorSpec]]:
        return [(d.name, t) for d in self.designs for t in d.outputs]

    def binding_problems(self) -> list[str]:
        problems: list[str] = []
        names = [d.name for d in self.designs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            problems.append(f"launch names {dupes} appear more than once; give every launch a unique name")
        devices = {d.device.name for d in self.designs}
        if len(devices) > 1:
            problems.append(f"launches target different devices {sorted(devices)}; a group runs on one device")
        seen: dict[tuple[str, str], Binding] = {}
        for b in self.bindings:
            where = f"binding {b.src_launch}.{b.src_tensor} -> {b.dst_launch}.{b.dst_tensor}"
            if b.src_launch not in names or b.dst_launch not in names:
                problems.append(f"{where} names a launch that is not in the group")
                continue
            src_d, dst_d = self.design(b.src_launch), self.design(b.dst_launch)
            src = next((t for t in src_d.outputs if t.name == b.src_tensor), None)
            dst = next((t for t in dst_d.inputs if t.name == b.dst_tensor), None)
            if src is None:
                problems.append(f"{where}: {b.src_launch} has no output {b.src_tensor!r}")
            if dst is None:
                problems.append(f"{where}: {b.dst_launch} has no input {b.dst_tensor!r}")
            if src is not None and dst is not None and (src.shape != dst.shape or src.dtype != dst.dtype):
                problems.append(f"{where}: shape/dtype {src.shape}/{src.dtype} does not match {dst.shape}/{dst.dtype}")
            if self.launch_index(b.src_launch) >= self.launch_index(b.dst_launch):
                problems.append(f"{where}: the source launch does not run before the destination launch")
            key = (b.dst_launch, b.dst_tensor)
            if key in seen:
                problems.append(f"{where}: input already bound by {seen[key].src_launch}.{seen[key].src_tensor}")
            seen[key] = b
        return problems


def fallbacks(obj: Design | MultiLaunchGroup) -> list[str]:
    """The fallback constructions (``Design.meta``'s ``fallback``) a design, or any launch of a group, was built with.

    A kernel builds a design otherwise than its usual way only where the usual one breaks a rule; a selector of
    configs (the tuner, the calibration harness) takes such a design only when no usual one is legal, so adding a
    fallback never changes which design a shape gets where one was legal before (nor the figures timed from it).
    """
    designs = obj.designs if isinstance(obj, MultiLaunchGroup) else [obj]
    return [f for d in designs for f in d.meta.get("fallback", ())]
