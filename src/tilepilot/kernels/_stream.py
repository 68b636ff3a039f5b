"""The row-streaming dataflow shared by the row-wise families (rmsnorm, rope, swiglu, bias).

A row-wise op maps R independent work rows to R rows, so the array only has to keep rows flowing:
the R rows are cut into ``tiles`` contiguous ranges, one per worker (worker i on column i % columns,
compute row 2 + i // columns: one tile per column first, as IRON's elementwise designs do). Each
worker streams its range in objects of ``rows_per_call`` rows, one fifo per streamed input from a shim
and one per output back to a shim. ``held`` inputs (a norm weight, a bias vector) are read from DDR
once and broadcast to every worker, which keeps them for the whole launch (depth 1): a weight the size
of one row must not cost a DDR read per row.

Shim budget: a worker with two streamed inputs and one output uses three DDR streams; npu2 has 2 MM2S +
2 S2MM per shim, so more than 8 such workers exhaust the shims and the validator says so (the limit
the paper's authors hit, npu2_kernel_measurements.json ``constraints_observed``).

Worker program (custom, declared to the timing model as one iteration of ``calls`` kernel calls):
acquire the held buffers once; per call acquire one object of every stream and output, call, release;
release the held buffers at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from tilepilot.npu.design import (
    Acquire,
    Call,
    Design,
    ObjectFifo,
    Release,
    Runtime,
    TensorAccessPattern,
    TensorSpec,
    Tile,
    TileKernel,
    Worker,
    dtype_bytes,
)
from tilepilot.npu.device import FIRST_COMPUTE_ROW, Device
from tilepilot.npu.numerics import Numerics
from tilepilot.npu.validate import CORE_STACK_BYTES, TAP_MAX_SIZE, DesignError, Violation, legal_taps


@dataclass(frozen=True)
class Stream:
    """A DDR tensor read or written row by row: ``width`` elements per work row (row-major, contiguous).

    ``tail``: a small tensor of ``tail_elements`` (same dtype) every object of this input stream also carries after
    its rows, gathered by a chain of buffer descriptors on the same channel, so it is read again with every object.
    It is how a worker gets one more input when its tile's two S2MM channels are taken (RoPE's x and table streams
    plus a per-head norm's weights)."""

    tensor: str
    width: int
    dtype: str = "bf16"
    tail: str | None = None
    tail_elements: int = 0

    def object_elements(self, rows_per_call: int) -> int:
        return rows_per_call * self.width + self.tail_elements


@dataclass(frozen=True)
class Held:
    """A small DDR tensor every worker needs whole (weight, bias): read once, broadcast, kept."""

    tensor: str
    elements: int
    dtype: str = "bf16"


def shape_error(family: str, message: str) -> DesignError:
    return DesignError([Violation("SHAPE_NOT_TILING", None, message)], family)


def tile_of(i: int, device: Device) -> Tile:
    """Worker i's tile: one per column first, then the next compute row."""
    return Tile(i % device.columns, FIRST_COMPUTE_ROW + i // device.columns)


def split_calls(calls: int, tiles: int) -> list[tuple[int, int]]:
    """(first call, number of calls) per worker: contiguous, as even as possible."""
    return [(i * calls // tiles, (i + 1) * calls // tiles - i * calls // tiles) for i in range(tiles)]


def l1_bytes(
    ins: Sequence[Stream], outs: Sequence[Stream], held: Sequence[Held], rpc: int, depth: int, local: int
) -> int:
    """Compute-tile memory of one worker: stream fifos x depth, held buffers once, locals, stack."""
    streams = sum(depth * s.object_elements(rpc) * dtype_bytes(s.dtype) for s in (*ins, *outs))
    return int(streams + sum(h.elements * dtype_bytes(h.dtype) for h in held)) + local + CORE_STACK_BYTES


def row_taps(
    shape: tuple[int, ...], row0: int, rows: int, width: int, rpc: int, dtype: str
) -> list[TensorAccessPattern]:
    """Rows [row0, row0 + rows) of a contiguous [*, width] view of a DDR tensor, as few legal patterns as fit.

    First try one nest [rows / b, b, width] (b the largest divisor of ``rows`` the DMA allows; ``legal_taps``
    folds a long row and chunks a long repeat dimension); if that needs many pieces, fall back to pieces of
    at most TAP_MAX_SIZE rows. Every piece holds whole objects (multiples of ``rpc`` rows).
    """
    b = max(d for d in range(1, min(rows, TAP_MAX_SIZE) + 1) if rows % d == 0)
    sizes, strides = ([rows, width], [width, 1]) if b == rows else ([rows // b, b, width], [b * width, width, 1])
    taps = legal_taps(shape, row0 * width, sizes, strides, dtype)
    if len(taps) <= 4 and all(t.n_elements % (rpc * width) == 0 for t in taps):
        return taps
    block = max(rpc, (TAP_MAX_SIZE // rpc) * rpc)
    out: list[TensorAccessPattern] = []
    for r in range(row0, row0 + rows, block):
        n = min(block, row0 + rows - r)
        out += legal_taps(shape, r * width, [n, width], [width, 1], dtype)
    return out


def program_for(streams: Sequence[str], held: Sequence[str], outs: Sequence[str], calls: int):
    """The worker program: held buffers acquired once, one object per stream and output per call."""

    def program(worker: Worker) -> Iterator:
        kept = []
        for h in held:
            bufs = yield Acquire(h, 1)
            kept.append(bufs[0])
        for step in range(calls):
            ins, res = [], []
            for f in streams:
                bufs = yield Acquire(f, 1)
                ins.append(bufs[0])
            for f in outs:
                bufs = yield Acquire(f, 1)
                res.append(bufs[0])
            yield Call(tuple(ins + kept), tuple(res), 0, step, calls)
            for f in (*streams, *outs):
                yield Release(f, 1)
        for h in held:
            yield Release(h, 1)

    return program


def build(
    *,
    name: str,
    family: str,
    device: Device,
    rows: int,
    tiles: int,
    rows_per_call: int,
    depth: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    streams_in: Sequence[Stream],
    held: Sequence[Held],
    streams_out: Sequence[Stream],
    kernel: TileKernel,
    local_bytes: int,
    numerics: Numerics,
    fast: Callable,
) -> Design:
    """A row-streaming design (see module docstring); ``kernel.fn`` sees [rpc, width] objects, held buffers last."""
    if rows < 1 or rows_per_call < 1 or rows % rows_per_call:
        raise shape_error(
            family, f"{rows} rows do not split into objects of {rows_per_call} rows; pick a dividing size"
        )
    calls = rows // rows_per_call
    if not 1 <= tiles <= min(calls, device.n_compute_tiles):
        raise shape_error(
            family,
            f"{tiles} tiles cannot share {calls} objects of {rows_per_call} rows on {device.name}; "
            f"use 1..{min(calls, device.n_compute_tiles)} tiles",
        )
    if depth < 1:
        raise shape_error(family, f"fifo depth {depth} is not positive")
    specs = {t.name: t for t in (*inputs, *outputs)}
    fifos: list[ObjectFifo] = []
    workers: list[Worker] = []
    rt = Runtime()
    held_fifos = [f"{h.tensor}_bcast" for h in held]
    for h, f in zip(held, held_fifos, strict=True):
        fifos.append(ObjectFifo(f, (h.elements,), h.dtype, 1))
        for tap in legal_taps(specs[h.tensor].shape, 0, [h.elements], [1], h.dtype):
            rt.fill(f, h.tensor, tap, 0)
    for i, (first, n) in enumerate(split_calls(calls, tiles)):
        ins = [f"{s.tensor}_{i}" for s in streams_in]
        outs = [f"{s.tensor}_{i}" for s in streams_out]
        moves = [(s, f, rt.fill) for s, f in zip(streams_in, ins, strict=True)]
        moves += [(s, f, rt.drain) for s, f in zip(streams_out, outs, strict=True)]
        for s, f, _ in moves:
            fifos.append(ObjectFifo(f, (s.object_elements(rows_per_call),) if s.tail else (rows_per_call, s.width),
                                    s.dtype, depth))  # fmt: skip
        if any(s.tail for s in streams_in):
            # an object gathered from two tensors is a chain of BDs per object: one task group per object (its rows
            # of every stream, a tail after its stream's rows), so a shim never holds more than one object's BDs;
            # each group boundary costs a pipeline fill and drain (``npu.timing``), nothing for a one-object launch
            for c in range(n):
                row0 = (first + c) * rows_per_call
                for s, f, move in moves:
                    sizes, strides = [rows_per_call, s.width], [s.width, 1]
                    for tap in legal_taps(specs[s.tensor].shape, row0 * s.width, sizes, strides, s.dtype):
                        move(f, s.tensor, tap, c)
                    for tap in legal_taps(specs[s.tail].shape, 0, [s.tail_elements], [1], s.dtype) if s.tail else []:
                        move(f, s.tail, tap, c)
        else:
            for s, f, move in moves:
                taps = row_taps(specs[s.tensor].shape, first * rows_per_call, n * rows_per_call, s.width,
                                rows_per_call, s.dtype)  # fmt: skip
                for g, tap in enumerate(taps):
                    move(f, s.tensor, tap, g)
        acquires = {f: n for f in (*ins, *outs)} | dict.fromkeys(held_fifos, 1)
        workers.append(
            Worker(
                name=f"{family}_{i}",
                kernel=kernel,
                inputs=(*ins, *held_fifos),
                outputs=tuple(outs),
                iterations=1,
                placement=tile_of(i, device),
                local_bytes=local_bytes,
                acquires=acquires,
                calls_per_iteration=n,
                program=program_for(ins, held_fifos, outs, n),
            )
        )
    design = Design(
        name=name,
        device=device,
        inputs=list(inputs),
        outputs=list(outputs),
        fifos=fifos,
        workers=workers,
        runtime=rt,
        numerics=numerics,
        fast=fast,
    )
    return design
