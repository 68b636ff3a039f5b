"""Design validator: every hardware rule a real XDNA2 design must obey, each failure a stable code.

A design that breaks a rule is an error, never a silent slowdown. ``validate(design)`` returns every
violation found; ``check(design)`` raises ``DesignError`` listing them and returns the placed design.

Resource accounting is a MODEL of how mlir-aie lowers object fifos (ObjectFifoStatefulTransform) as far
as we can tell from its source and tests; it is conservative where unsure. The rules:

Compute tile (64 KiB data memory, 2 S2MM + 2 MM2S channels, 16 BDs, 16 locks):
- a fifo end on the tile that goes through DMA allocates ``depth`` buffers of the object size there,
  takes one channel (S2MM when the tile consumes, MM2S when it produces; a broadcast producer still uses
  one MM2S, the stream switch fans out), ``depth`` BDs and 2 locks (AIE2 semaphore pair);
- a fifo whose single consumer worker sits on an orthogonally adjacent compute tile of its producer
  worker uses shared memory (mlir-aie AIE2TargetModel::isLegalMemAffinity: a core reaches its own,
  west, north and south memories): ``depth`` buffers and 2 locks, no DMA at all, on a tile both cores
  reach: the producer's, unless the consumer sits west of it (it cannot reach east), then the consumer's
  (ObjectFifoStatefulTransform's share_direction; ``resources.shared_buffer_tile``);
- the worker's declared ``local_bytes`` plus a 1 KiB core stack (mlir-aie default stack_size 0x400).
Memory tile (512 KiB, 6 + 6 channels, 48 BDs, 64 locks), per link placed on it:
- split: the source's buffers (``src.depth`` x source object) are the only storage (destinations are
  views at offsets); 1 S2MM + one MM2S per destination; BDs = src.depth + sum of destination depths;
  2 locks per fifo end. join: mirror image. forward: one fifo's buffers, 1 + 1 channels, 2 x depth BDs.
Shim tile (2 + 2 channels assumed, 16 BDs): one MM2S per fifo it fills, one S2MM per fifo it drains;
BDs = the most runtime tasks it runs at once (tasks of one task group), one BD per task.

Access patterns (npu dma_memcpy_nd limits, mlir-aie AIEX verifier tests ``bad_ipu_nd_*``): at most 4
dimensions; the three inner sizes in [1, 1023] with the innermost counted in 32-bit words; the
outermost (4th, repeat) size in [1, 64]; strides in 32-bit words at most 1M (2**20), non-negative,
only the repeat dimension may have stride 0; for sub-word dtypes the innermost stride must be 1 and
innermost transfer and offset must be whole 32-bit words; every element inside the tensor.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from tilepilot.errors import TilepilotError
from tilepilot.npu.design import SHIM, Design, MultiLaunchGroup, ObjectFifo, TensorAccessPattern, Tile
from tilepilot.npu.design import dtype_bytes as _dtype_bytes
from tilepilot.npu.device import Device
from tilepilot.npu.placer import SequentialPlacer
from tilepilot.npu.resources import (
    CORE_STACK_BYTES,
    TileUse,
    link_cost,
    resource_use,
    shares_memory,
    uses_shared_memory,
)

# --- limits with their sources ---------------------------------------------------------------------------------
WORD_BYTES = 4  # shim/mem DMA address and length granularity (32-bit words)
TAP_MAX_DIMS = 4  # IRON / npu dma_memcpy_nd: up to 4-D patterns
TAP_MAX_SIZE = 1023  # mlir-aie: "Length 0 exceeds the [0:1023] range" (inner 3 dims; innermost in words)
TAP_MAX_REPEAT = 64  # mlir-aie: "Length 3 exceeds the [1:64] range" (outermost dim)
TAP_MAX_STRIDE_WORDS = 1 << 20  # mlir-aie: "Stride 1 exceeds the [1:1M] range"

CODES = (
    "UNKNOWN_REF",  # a worker, link or runtime task names a fifo or tensor the design lacks
    "DUPLICATE_NAME",  # two fifos / workers / links / tensors share a name
    "TENSOR_ROLE",  # a drain writes into a design input
    "FIFO_NO_PRODUCER",
    "FIFO_NO_CONSUMER",
    "FIFO_MULTI_PRODUCER",  # an object fifo has exactly one producer
    "FIFO_ENDPOINT_MISMATCH",  # declared producer/consumers differ from use
    "FIFO_BALANCE",  # objects produced into a fifo != objects a consumer takes out (the array would hang)
    "DTYPE_MISMATCH",
    "LINK_SHAPE",  # split/join offsets or object sizes inconsistent
    "SHAPE_NOT_TILING",  # a transfer or problem shape is not a whole number of objects / tiles
    "TAP_LIMIT",
    "PLACEMENT_MISSING",
    "PLACEMENT_OFF_DEVICE",
    "PLACEMENT_SHARED",
    "L1_OVERFLOW",
    "L2_OVERFLOW",
    "DMA_CHANNELS",
    "SHIM_CHANNEL_SHARE",  # a fifo rides a shim channel (ObjectFifo.rides_with) that is not a DDR fill on its shim
    "BD_LIMIT",
    "LOCK_LIMIT",
    "WORKER_PROGRAM",  # declarative summary the default program cannot run
    "NUMERICS_MISMATCH",  # kernel variant and declared numerics disagree
    "GROUP_BINDING",
    "DISPATCH_WATCHDOG",  # one dispatch's modeled time exceeds the driver's per-dispatch watchdog
)

# The amdxdna driver's watchdog kills a dispatch running longer than ~4-6 s (xdna2.md "driver limits": amd/IRON
# llama README; ROCm/FastFlowLM #712, #704). A published limit, so a rule: the lower end of the range, since a
# design that only fits under the upper end would fail on some firmware.
DISPATCH_WATCHDOG_S = 4.0


@dataclass(frozen=True)
class Violation:
    """One broken rule: a stable ``code``, the tile concerned (if any) and a sentence with the numbers."""

    code: str
    tile: Tile | None
    message: str

    def __str__(self) -> str:
        where = f" at tile {self.tile}" if self.tile is not None else ""
        return f"{self.code}{where}: {self.message}"


class DesignError(TilepilotError, ValueError):
    """A design breaks hardware rules; ``violations`` lists every one with its code."""

    def __init__(self, violations: list[Violation], design_name: str = "design") -> None:
        self.violations = list(violations)
        self.codes = sorted({v.code for v in self.violations})
        first = self.violations[0] if self.violations else None
        more = f" (and {len(self.violations) - 1} more: {', '.join(self.codes)})" if len(self.violations) > 1 else ""
        super().__init__(
            f"{design_name} is not a legal NPU design: {first}{more}; change the kernel config or tiling."
            if first
            else f"{design_name} is not a legal NPU design."
        )


# ----------------------------------------------------------------------------------------------------------------------
# Access patterns
# ----------------------------------------------------------------------------------------------------------------------
def tap_problems(tap: TensorAccessPattern, dtype: str = "bf16") -> list[str]:
    """Why a pattern cannot be one shim/mem DMA BD (empty list = legal)."""
    problems, final = _loop_problems(tap.sizes, tap.strides, dtype)
    if final:
        return list(problems)
    problems = list(problems)
    eb = _dtype_bytes(dtype)
    off_words = tap.offset * eb / WORD_BYTES
    if off_words != int(off_words):
        problems.append(f"offset {tap.offset} is not 32-bit word aligned")
    lo, hi = tap.index_range()
    if lo < 0 or hi >= tap.tensor_elements:
        problems.append(f"reaches elements {lo}..{hi} of a tensor of {tap.tensor_elements} elements")
    return problems


@functools.lru_cache(maxsize=1 << 16)
def _loop_problems(sizes: tuple[int, ...], strides: tuple[int, ...], dtype: str) -> tuple[tuple[str, ...], bool]:
    """The problems of a pattern's loop nest alone (and whether they end the check), cached: a large GEMM's runtime
    has thousands of chunk patterns that differ only in their offsets."""
    problems: list[str] = []
    eb = _dtype_bytes(dtype)
    n = len(sizes)
    if n == 0 or n > TAP_MAX_DIMS:
        return (f"has {n} dimensions, the DMA supports 1 to {TAP_MAX_DIMS}",), True
    if any(s < 1 for s in sizes):
        return (f"has sizes {list(sizes)}; every size must be at least 1",), True
    for pos in range(n):
        size, stride = sizes[pos], strides[pos]
        dim = n - 1 - pos  # 0 = innermost
        if stride < 0:
            problems.append(f"dimension {dim} has negative stride {stride}")
            continue
        if dim == 3:
            if size > TAP_MAX_REPEAT:
                problems.append(f"repeat dimension size {size} exceeds {TAP_MAX_REPEAT}")
        elif dim == 0:
            words = size * eb / WORD_BYTES
            if eb < WORD_BYTES and size > 1 and stride != 1:
                problems.append(f"innermost stride {stride} must be 1 for {dtype} data")
            if words != int(words):
                problems.append(f"innermost size {size} x {eb:g} B is not a whole number of 32-bit words")
            elif words > TAP_MAX_SIZE:
                problems.append(f"innermost size {size} ({int(words)} words) exceeds {TAP_MAX_SIZE} words")
        else:
            if size > TAP_MAX_SIZE:
                problems.append(f"dimension {dim} size {size} exceeds {TAP_MAX_SIZE}")
            if size > 1 and stride == 0:
                problems.append(f"dimension {dim} has stride 0; only the repeat dimension may repeat data")
        if size > 1 and dim > 0:
            sw = stride * eb / WORD_BYTES
            if sw != int(sw):
                problems.append(f"dimension {dim} stride {stride} is not a whole number of 32-bit words")
            elif sw > TAP_MAX_STRIDE_WORDS:
                problems.append(f"dimension {dim} stride {int(sw)} words exceeds {TAP_MAX_STRIDE_WORDS}")
    return tuple(problems), False


def legal_taps(
    tensor_shape: tuple[int, ...],
    offset: int,
    sizes: list[int],
    strides: list[int],
    dtype: str = "bf16",
    whole: int = 1,
) -> list[TensorAccessPattern]:
    """Express an arbitrary loop nest over a DDR tensor as consecutive hardware-legal patterns (same element order).

    Unit dimensions are dropped, a long contiguous innermost run is folded into [rows, words<=1023], a too
    long outermost loop is cut into legal lengths; if the nest still does not fit, its outermost dimension
    is peeled into one pattern per index. Kernels use this so that they never hand the validator an
    illegal pattern they could have split.

    ``whole``: the elements of one object of the fifo the patterns feed or drain. Each runtime task must move
    whole objects (SHAPE_NOT_TILING), and the plain cut of a long loop (at 1023 rows, say) can end a piece inside
    an object (QA: a 6001-token residual add of a 576-wide model). The plain patterns are returned whenever every
    one of them holds whole objects, so a design that was legal keeps its patterns exactly; only when one does not
    are the loop cut, and a long run folded, on whole objects instead (and kept if that fixes it).
    """
    plain = _taps(tensor_shape, offset, sizes, strides, dtype, 1)
    if whole == 1 or all(t.n_elements % whole == 0 for t in plain):
        return plain
    cut = _taps(tensor_shape, offset, sizes, strides, dtype, whole)
    return cut if all(t.n_elements % whole == 0 for t in cut) else plain


def _taps(
    tensor_shape: tuple[int, ...], offset: int, sizes: list[int], strides: list[int], dtype: str, whole: int
) -> list[TensorAccessPattern]:
    """``legal_taps``' construction; with ``whole`` > 1 its cuts and fold keep whole ``whole``-element objects."""
    dims = [(s, st) for s, st in zip(sizes, strides, strict=True) if s != 1]
    if not dims:
        dims = [(1, 1)]
    # fold a long contiguous innermost run: size n, stride 1 -> (n / b, b) with b the largest legal divisor
    s0, st0 = dims[-1]
    if st0 == 1 and (b := _inner_block(s0, dtype, whole)):
        dims[-1:] = [(s0 // b, b), (b, 1)]
    tap = TensorAccessPattern(tensor_shape, offset, tuple(d[0] for d in dims), tuple(d[1] for d in dims))
    if not tap_problems(tap, dtype):
        return [tap]
    size, stride = dims[0]
    rest = dims[1:]
    if not rest:
        return [tap]  # a single dimension that cannot be fixed; the validator will report it
    limit = TAP_MAX_REPEAT if len(dims) == TAP_MAX_DIMS else TAP_MAX_SIZE
    out: list[TensorAccessPattern] = []
    if len(dims) <= TAP_MAX_DIMS and size > limit:  # too long an outer loop: cut it into legal lengths
        step = _whole_cut(limit, math.prod(d[0] for d in rest), whole)
        for start in range(0, size, step):
            n = min(step, size - start)
            out += _taps(
                tensor_shape,
                offset + start * stride,
                [n] + [d[0] for d in rest],
                [stride] + [d[1] for d in rest],
                dtype,
                whole,
            )
        return out
    for i in range(size):  # otherwise peel the outermost loop into one pattern per index
        out += _taps(tensor_shape, offset + i * stride, [d[0] for d in rest], [d[1] for d in rest], dtype, whole)
    return out


def _whole_cut(limit: int, inner: int, whole: int) -> int:
    """The longest cut of an outer loop, at most ``limit`` indices of ``inner`` elements each, whose pieces hold
    whole ``whole``-element objects; ``limit`` itself when it already does (always with ``whole=1``), or when no
    legal cut does (the validator then names the piece that splits an object)."""
    per_object = whole // math.gcd(whole, inner)  # outer indices that make up a whole number of objects
    return (limit // per_object) * per_object or limit


@functools.lru_cache(maxsize=1 << 12)
def _inner_block(run: int, dtype: str, whole: int = 1) -> int:
    """The largest legal innermost size dividing a contiguous ``run`` too long for one dimension (0: none needed or
    none exists); cached because every chunk of a tiled tensor asks for the same few runs.

    With ``whole`` > 1, if the rows of that size are too many for one dimension and no cut of them holds whole
    ``whole``-element objects (rows of 1028 elements and objects of 4096: only a multiple of 1024 rows would), the
    largest size whose rows can be cut into whole objects instead (1024 for that run)."""
    max_inner = int(TAP_MAX_SIZE * WORD_BYTES / _dtype_bytes(dtype))
    if run <= max_inner:
        return 0
    sizes = [d for d in range(max_inner, 0, -1) if run % d == 0 and (d * _dtype_bytes(dtype)) % WORD_BYTES == 0]
    if not sizes:
        return 0

    def cuttable(b: int) -> bool:
        return run // b <= TAP_MAX_SIZE or whole // math.gcd(whole, b) <= TAP_MAX_SIZE

    return next((b for b in sizes if cuttable(b)), sizes[0])


# ----------------------------------------------------------------------------------------------------------------------
# Resource accounting
# ----------------------------------------------------------------------------------------------------------------------
# ----------------------------------------------------------------------------------------------------------------------
# The checks
# ----------------------------------------------------------------------------------------------------------------------
def _names(design: Design) -> list[Violation]:
    out: list[Violation] = []
    for kind, names in (
        ("fifo", [f.name for f in design.fifos]),
        ("worker", [w.name for w in design.workers]),
        ("link", [lk.name for lk in design.links]),
        ("tensor", [t.name for t in design.inputs + design.outputs]),
    ):
        for n in sorted({n for n in names if names.count(n) > 1}):
            out.append(Violation("DUPLICATE_NAME", None, f"{kind} name {n!r} is used more than once"))
    fifos = {f.name for f in design.fifos}
    tensors = {t.name for t in design.inputs + design.outputs}
    for w in design.workers:
        for f in w.fifos:
            if f not in fifos:
                out.append(Violation("UNKNOWN_REF", w.placement, f"worker {w.name} uses fifo {f!r} the design lacks"))
        for f in w.acquires:
            if f not in w.fifos:
                out.append(
                    Violation("UNKNOWN_REF", w.placement, f"worker {w.name} counts acquires of {f!r}, not its fifo")
                )
    for lk in design.links:
        for f in lk.fifos:
            if f not in fifos:
                out.append(Violation("UNKNOWN_REF", lk.placement, f"link {lk.name} uses fifo {f!r} the design lacks"))
    for t in design.runtime.tasks:
        if t.fifo not in fifos:
            out.append(Violation("UNKNOWN_REF", None, f"runtime {t.kind} uses fifo {t.fifo!r} the design lacks"))
        if t.tensor not in tensors:
            out.append(Violation("UNKNOWN_REF", None, f"runtime {t.kind} uses tensor {t.tensor!r} the design lacks"))
    return out


def _endpoints(design: Design) -> list[Violation]:
    out: list[Violation] = []
    for f in design.fifos:
        prods, cons = design.producers(f.name), design.consumers(f.name)
        if not prods:
            out.append(Violation("FIFO_NO_PRODUCER", None, f"fifo {f.name} has no producer; nothing ever fills it"))
        elif len(prods) > 1:
            out.append(
                Violation(
                    "FIFO_MULTI_PRODUCER", None, f"fifo {f.name} has producers {[str(p) for p in prods]}; one only"
                )
            )
        if not cons:
            out.append(
                Violation("FIFO_NO_CONSUMER", None, f"fifo {f.name} has no consumer; its objects are never read")
            )
        if f.producer is not None and prods and f.producer not in prods:
            out.append(
                Violation(
                    "FIFO_ENDPOINT_MISMATCH",
                    None,
                    f"fifo {f.name} declares producer {f.producer} but is fed by {[str(p) for p in prods]}",
                )
            )
        if f.consumers and set(f.consumers) != set(cons):
            out.append(
                Violation(
                    "FIFO_ENDPOINT_MISMATCH",
                    None,
                    f"fifo {f.name} declares consumers "
                    f"{[str(c) for c in f.consumers]} but is read by {[str(c) for c in cons]}",
                )
            )
    return out


def _runtime(design: Design) -> list[Violation]:
    out: list[Violation] = []
    outputs = {t.name for t in design.outputs}
    # names are unique and known here (validate checks _names first); a GEMM runtime has thousands of tasks
    fifos = {f.name: f for f in design.fifos}
    tensors = {t.name: t for t in design.inputs + design.outputs}
    open_fill: dict[tuple[str, int], tuple[int, str]] = {}  # (fifo, task group) -> (elements filled, last task)
    for t in design.runtime.tasks:
        f, spec = fifos[t.fifo], tensors[t.tensor]
        where = f"runtime {t.kind} {t.tensor} <-> fifo {t.fifo}"
        if t.kind == "drain" and t.tensor not in outputs:
            out.append(Violation("TENSOR_ROLE", None, f"{where} writes into {t.tensor}, which is not a design output"))
        if spec.dtype != f.dtype:
            out.append(Violation("DTYPE_MISMATCH", None, f"{where}: tensor is {spec.dtype}, fifo is {f.dtype}"))
        if t.tap.tensor_shape != spec.shape:
            out.append(
                Violation(
                    "TAP_LIMIT", None, f"{where}: pattern is for shape {t.tap.tensor_shape}, tensor is {spec.shape}"
                )
            )
        for p in tap_problems(t.tap, spec.dtype):
            out.append(Violation("TAP_LIMIT", f.shim_placement, f"{where}: access pattern {p}"))
        if t.kind == "fill":  # fills may gather one object from several tasks of a task group (a BD chain)
            key = (t.fifo, t.group)
            open_fill[key] = (open_fill.get(key, (0, where))[0] + t.tap.n_elements, where)
        elif t.tap.n_elements % f.obj_elements:
            out.append(_not_whole(where, t.tap.n_elements, f.obj_elements))
    for (fifo, _), (n, where) in open_fill.items():
        if n % fifos[fifo].obj_elements:
            out.append(_not_whole(where, n, fifos[fifo].obj_elements, " (with the fills before it in its group)"))
    return out


def _not_whole(where: str, n: int, obj: int, chain: str = "") -> Violation:
    """A DMA that stops inside an object: its consumer would wait for the rest for ever."""
    return Violation(
        "SHAPE_NOT_TILING", None, f"{where} moves {n} elements{chain}, not a whole number of {obj}-element objects"
    )


def _links(design: Design) -> list[Violation]:
    out: list[Violation] = []
    for lk in design.links:
        srcs = [design.fifo(f) for f in lk.srcs]
        dsts = [design.fifo(f) for f in lk.dsts]
        if len({f.dtype for f in srcs + dsts}) > 1:
            out.append(Violation("DTYPE_MISMATCH", lk.placement, f"link {lk.name} mixes dtypes of its fifos"))
        if lk.kind == "forward":
            if srcs[0].obj_elements != dsts[0].obj_elements:
                out.append(
                    Violation(
                        "LINK_SHAPE",
                        lk.placement,
                        f"forward {lk.name}: {srcs[0].obj_elements} elements in, {dsts[0].obj_elements} out",
                    )
                )
            continue
        whole, parts = (srcs[0], dsts) if lk.kind == "split" else (dsts[0], srcs)
        spans = sorted((o, o + p.obj_elements, p.name) for o, p in zip(lk.offsets, parts, strict=True))
        for (_, a1, an), (b0, _, bn) in zip(spans, spans[1:], strict=False):
            if b0 < a1:
                out.append(Violation("LINK_SHAPE", lk.placement, f"{lk.kind} {lk.name}: {an} and {bn} overlap"))
        for o0, o1, name in spans:
            if o0 < 0 or o1 > whole.obj_elements:
                out.append(
                    Violation(
                        "LINK_SHAPE",
                        lk.placement,
                        f"{lk.kind} {lk.name}: {name} at [{o0}, {o1}) falls outside "
                        f"the {whole.obj_elements}-element object of {whole.name}",
                    )
                )
        if sum(p.obj_elements for p in parts) != whole.obj_elements:
            out.append(
                Violation(
                    "LINK_SHAPE",
                    lk.placement,
                    f"{lk.kind} {lk.name}: parts hold "
                    f"{sum(p.obj_elements for p in parts)} elements, {whole.name} objects hold "
                    f"{whole.obj_elements}",
                )
            )
    return out


def _objects_produced(design: Design) -> dict[str, int | None]:
    """Objects that flow into each fifo over one launch (None where it cannot be determined)."""
    memo: dict[str, int | None] = {}

    def produced(name: str, seen: frozenset[str]) -> int | None:
        if name in memo:
            return memo[name]
        if name in seen:
            return None
        prods = design.producers(name)
        f = design.fifo(name)
        n: int | None = None
        if len(prods) == 1:
            end = prods[0]
            if end.kind == "worker":
                n = design.worker(end.name).total_acquires()[name]
            elif end.kind == "shim":
                n = design.runtime.moved_elements("fill", name) // f.obj_elements
            else:
                lk = design.link(end.name)
                counts = [produced(s, seen | {name}) for s in lk.srcs]
                n = counts[0] if counts and all(c == counts[0] for c in counts) else None
        memo[name] = n
        return n

    for f in design.fifos:
        produced(f.name, frozenset())
    return memo


def _balance(design: Design) -> list[Violation]:
    out: list[Violation] = []
    produced = _objects_produced(design)
    for lk in design.links:
        if lk.kind == "join":
            counts = {s: produced.get(s) for s in lk.srcs}
            if len(set(counts.values())) > 1:
                out.append(Violation("FIFO_BALANCE", lk.placement, f"join {lk.name} receives unequal counts {counts}"))
    for f in design.fifos:
        n = produced.get(f.name)
        if n is None:
            continue
        for end in design.consumers(f.name):
            if end.kind == "worker":
                taken = design.worker(end.name).total_acquires()[f.name]
            elif end.kind == "shim":
                taken = design.runtime.moved_elements("drain", f.name) // f.obj_elements
            else:
                continue  # links pass through whatever arrives
            if taken != n:
                out.append(
                    Violation(
                        "FIFO_BALANCE",
                        None,
                        f"fifo {f.name} receives {n} objects but {end} takes {taken}; "
                        "the array would stall or lose data",
                    )
                )
    return out


def _workers(design: Design) -> list[Violation]:
    out: list[Violation] = []
    for w in design.workers:
        if w.program is None:
            counts, steps = w.acquires_per_iteration(), w.calls_per_iteration
            bad = [f for f in w.fifos if counts[f] not in (1, steps)]
            if bad:
                out.append(
                    Violation(
                        "WORKER_PROGRAM",
                        w.placement,
                        f"worker {w.name} acquires {bad} in counts the default "
                        "program cannot run; give it a custom program",
                    )
                )
        if (w.kernel.variant == "bfp16") != (design.numerics.operands == "bfp16"):
            out.append(
                Violation(
                    "NUMERICS_MISMATCH",
                    w.placement,
                    f"worker {w.name} runs a {w.kernel.variant} kernel but the "
                    f"design declares {design.numerics.operands} operands",
                )
            )
    return out


def _placement(design: Design) -> list[Violation]:
    out: list[Violation] = []
    dev = design.device
    seen: dict[Tile, str] = {}
    for w in design.workers:
        if w.placement is None:
            out.append(
                Violation("PLACEMENT_MISSING", None, f"worker {w.name} has no tile (no free compute tile left?)")
            )
            continue
        if not dev.is_compute(w.placement):
            out.append(
                Violation(
                    "PLACEMENT_OFF_DEVICE",
                    w.placement,
                    f"worker {w.name} is placed on a {dev.kind(w.placement)} "
                    f"tile; workers need a compute tile of {dev.name}",
                )
            )
        if w.placement in seen:
            out.append(
                Violation("PLACEMENT_SHARED", w.placement, f"workers {seen[w.placement]} and {w.name} share a tile")
            )
        seen.setdefault(w.placement, w.name)
    for lk in design.links:
        if lk.placement is None:
            out.append(Violation("PLACEMENT_MISSING", None, f"link {lk.name} has no memory tile"))
        elif not dev.is_mem(lk.placement):
            out.append(
                Violation(
                    "PLACEMENT_OFF_DEVICE",
                    lk.placement,
                    f"link {lk.name} is placed on a "
                    f"{dev.kind(lk.placement)} tile; links need a memory tile of {dev.name}",
                )
            )
    for f in design.fifos:
        if SHIM not in design.producers(f.name) + design.consumers(f.name):
            if f.rides_with:
                msg = f"fifo {f.name} rides {f.rides_with}'s shim channel but has no DDR end; drop rides_with"
                out.append(Violation("SHIM_CHANNEL_SHARE", None, msg))
            continue
        if f.rides_with:
            out += _rider_problems(design, f)
        if f.shim_placement is None:
            out.append(Violation("PLACEMENT_MISSING", None, f"fifo {f.name} has no shim tile for its DDR end"))
        elif not dev.is_shim(f.shim_placement):
            out.append(
                Violation(
                    "PLACEMENT_OFF_DEVICE",
                    f.shim_placement,
                    f"fifo {f.name}'s DDR end is on a "
                    f"{dev.kind(f.shim_placement)} tile; it needs a shim tile of {dev.name}",
                )
            )
    return out


def _rider_problems(design: Design, f: ObjectFifo) -> list[Violation]:
    """A fifo riding another's shim channel (``ObjectFifo.rides_with``) needs a fifo filled from DDR on the same
    shim tile that has a channel of its own, and must itself be filled from DDR (a packet-switched channel carries
    one direction)."""
    names = {g.name: g for g in design.fifos}
    host = names.get(f.rides_with or "")
    why = None
    if host is None:
        why = f"names no fifo of the design ({f.rides_with!r})"
    elif host.rides_with:
        why = f"rides {host.name}, which itself rides {host.rides_with}; name the fifo that owns the channel"
    elif SHIM not in design.producers(f.name) or SHIM not in design.producers(host.name):
        why = f"and {host.name} must both be filled from DDR to share an MM2S channel"
    elif host.shim_placement != f.shim_placement:
        why = f"is on shim {f.shim_placement} but {host.name}'s channel is on shim {host.shim_placement}"
    if why is None:
        return []
    return [Violation("SHIM_CHANNEL_SHARE", f.shim_placement, f"fifo {f.name} rides a shim channel but {why}")]


def _resources(design: Design) -> list[Violation]:
    return budget_problems(design.device, resource_use(design))


def tile_budgets(dev: Device, tile: Tile, u: TileUse) -> tuple[tuple[str, int, int], ...]:
    """(budget, used, available) for every per-tile budget the demand ``u`` is held to on ``tile``: memory on compute
    and memory tiles, S2MM and MM2S channels, BDs, locks. The one statement of those rules: ``budget_problems`` words
    the ones broken, ``within_budgets`` only asks, a packing search measures how far they are overrun."""
    r = dev.resources(tile)
    memory = (("memory", u.memory, r.memory_bytes),) if dev.kind(tile) in ("compute", "mem") else ()
    return (
        *memory,
        ("s2mm", u.s2mm, r.s2mm_channels),
        ("mm2s", u.mm2s, r.mm2s_channels),
        ("bds", u.bds, r.bds),
        ("locks", u.locks, r.locks),
    )


def _breaches(dev: Device, tile: Tile, u: TileUse) -> Iterator[str]:
    """The per-tile budgets ``u`` breaks on ``tile`` (``tile_budgets``' names), in that order."""
    return (name for name, used, have in tile_budgets(dev, tile, u) if used > have)


def within_budgets(dev: Device, uses: dict[Tile, TileUse]) -> bool:
    """Whether the demand ``uses`` keeps every per-tile budget (what a packing trial asks, thousands of times)."""
    return not any(next(_breaches(dev, tile, u), None) for tile, u in uses.items())


def budget_problems(dev: Device, uses: dict[Tile, TileUse]) -> list[Violation]:
    """Every per-tile budget (memory, DMA channels, BDs, locks) the demand ``uses`` breaks on ``dev``."""
    out: list[Violation] = []
    for tile, u in sorted(uses.items()):
        kind = dev.kind(tile)
        r = dev.resources(tile)
        for breach in _breaches(dev, tile, u):
            if breach == "memory":
                code = "L1_OVERFLOW" if kind == "compute" else "L2_OVERFLOW"
                message = f"{kind} tile {tile} needs {u.memory} B of {r.memory_bytes} B ({'; '.join(u.parts)})"
            elif breach in ("s2mm", "mm2s"):
                inward = breach == "s2mm"
                direction = "S2MM (in)" if inward else "MM2S (out)"
                used, have = (u.s2mm, r.s2mm_channels) if inward else (u.mm2s, r.mm2s_channels)
                code, message = "DMA_CHANNELS", f"{kind} tile {tile} needs {used} {direction} DMA channels, has {have}"
            elif breach == "bds":
                code, message = "BD_LIMIT", f"{kind} tile {tile} needs {u.bds} buffer descriptors, has {r.bds}"
            else:
                code, message = "LOCK_LIMIT", f"{kind} tile {tile} needs {u.locks} locks, has {r.locks}"
            out.append(Violation(code, tile, message))
    return out


def validate(design: Design, place: bool = True) -> list[Violation]:
    """Every rule ``design`` breaks (empty = legal). Unplaced parts are placed first with SequentialPlacer."""
    out = _names(design)
    if any(v.code in ("UNKNOWN_REF", "DUPLICATE_NAME") for v in out):
        return out  # later checks look things up by name
    out += _endpoints(design) + _runtime(design) + _links(design) + _workers(design)
    if not any(v.code in ("FIFO_NO_PRODUCER", "FIFO_MULTI_PRODUCER") for v in out):
        out += _balance(design)
    if place and not design.is_placed():
        design = SequentialPlacer().place(design)
    placement = _placement(design)
    out += placement
    if not any(v.code in ("PLACEMENT_OFF_DEVICE",) for v in placement):
        out += _resources(design)
    return out


def check(design: Design, place: bool = True) -> Design:
    """Raise DesignError if ``design`` breaks any rule; otherwise return it placed."""
    if place and not design.is_placed():
        design = SequentialPlacer().place(design)
    violations = validate(design, place=False)
    if violations:
        raise DesignError(violations, design.name)
    return design


def validate_group(group: MultiLaunchGroup, place: bool = True) -> list[Violation]:
    """Violations of every launch (prefixed with its name) plus GROUP_BINDING problems of the group itself."""
    out: list[Violation] = []
    for d in group.designs:
        out += [Violation(v.code, v.tile, f"launch {d.name}: {v.message}") for v in validate(d, place)]
    out += [Violation("GROUP_BINDING", None, f"group {group.name}: {p}") for p in group.binding_problems()]
    return out


def check_group(group: MultiLaunchGroup, place: bool = True) -> MultiLaunchGroup:
    violations = validate_group(group, place)
    if violations:
        raise DesignError(violations, f"group {group.name}")
    if place:
        placer = SequentialPlacer()
        return MultiLaunchGroup(group.name, [placer.place(d) for d in group.designs], list(group.bindings))
    return group


def dispatch_problems(name: str, seconds: float, limit_s: float = DISPATCH_WATCHDOG_S) -> list[Violation]:
    """DISPATCH_WATCHDOG when one dispatch's modeled time exceeds the driver's per-dispatch watchdog."""
    if seconds > limit_s:
        return [
            Violation(
                "DISPATCH_WATCHDOG",
                None,
                f"dispatch {name} is modeled at {seconds:.3f} s, beyond the driver's {limit_s:.1f} s per-dispatch "
                "watchdog (amdxdna kills it); split it into several dispatches",
            )
        ]
    return []


def check_dispatch(name: str, seconds: float, limit_s: float = DISPATCH_WATCHDOG_S) -> None:
    """Raise DesignError (DISPATCH_WATCHDOG) when a dispatch would outlive the driver's watchdog."""
    problems = dispatch_problems(name, seconds, limit_s)
    if problems:
        raise DesignError(problems, f"dispatch {name}")


__all__ = [
    "CODES",
    "DISPATCH_WATCHDOG_S",
    "budget_problems",
    "check_dispatch",
    "dispatch_problems",
    "CORE_STACK_BYTES",
    "DesignError",
    "TileUse",
    "Violation",
    "check",
    "check_group",
    "legal_taps",
    "link_cost",
    "resource_use",
    "shares_memory",
    "tap_problems",
    "uses_shared_memory",
    "validate",
    "validate_group",
]
