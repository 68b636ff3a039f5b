"""GEMM: C[M, N] = A[M, K] @ W[N, K]^T on the whole array, as IRON's whole-array matmul lays it out.

Weights stay in Hugging Face [out, in] layout: a W tile is (tile_n, tile_k) and the kernel multiplies
A_tile @ W_tile^T, so no host transpose is ever needed.

Dataflow (rows <= 4 x cols <= 8 compute tiles, worker (r, c) on tile (c, 2 + r)), in one of two orientations:
- ``orient="m_rows"`` (IRON's layout): the rows split M, the columns split N. A enters through ``n_a = largest
  divisor of rows <= cols`` shim/memory-tile pairs; each memory tile splits a (rows_per_link * tile_m, tile_k)
  object into one (tile_m, tile_k) object per row, and that row fifo is broadcast to every worker of the row. W
  enters per column through the column's memory tile (forward) and is broadcast down the column. Worker (r, c)
  computes C tiles (mb * rows + r, nb * cols + c).
- ``orient="m_cols"`` (AIR's layout: its herd [herd_m, herd_n] puts herd_m on the columns and herd_n on the rows,
  "N=32 -> tile_n=32, herd_n=1"): the columns split M, the rows split N; the operands swap roles (W is split per
  row and broadcast along it, A forwarded per column and broadcast down it). Worker (r, c) computes C tiles
  (mb * cols + c, nb * rows + r).
Either way each worker's C tile goes to its column's memory tile, where the rows are joined into one
(rows * tile_m, tile_n) object drained through the column's shim (the drain pattern puts every row's tile in
place). Per C tile a worker holds C and streams K / tile_k pairs of A and W tiles (one kernel call each).
``herd(config)`` gives (tiles along M, tiles along N).

Numerics: bf16 operands (or block-FP16 for variant "bfp16"), exact per-call partial sums, accumulated
in an fp32 scratch accumulator and rounded once (acc="fp32"), or accumulated in the bf16 C buffer and so
rounded after every K chunk (acc="bf16", what a kernel accumulating in its output buffer does).
Production fast path (exact=False): the host's kernel on fixed 64-row blocks, one thread per block, for acc="fp32"
(differs from the exact path on < 1% of elements, by one bf16 ulp except under heavy cancellation; the bound is in
``numerics.matmul`` and tested), a K-chunk loop otherwise. Fixed blocks rather than one host call because a row's
bits must not depend on M, which is a prompt chunk's length (``numerics.row_blocked_linear``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Protocol, TypeVar

import torch

from tilepilot.npu import numerics as nx
from tilepilot.npu.calibration import CALIBRATION, Calibration
from tilepilot.npu.design import Design, Runtime, TensorSpec, Tile, TileKernel, Worker, forward, join, split
from tilepilot.npu.design import ObjectFifo as Fifo
from tilepilot.npu.device import FIRST_COMPUTE_ROW, MEM_ROW, SHIM_ROW, Device, npu2
from tilepilot.npu.timing import busiest_channel, compute_cycles_per_call
from tilepilot.npu.validate import CORE_STACK_BYTES, TAP_MAX_SIZE, DesignError, Violation, legal_taps

FAMILY = "gemm"
VARIANTS = ("vector", "scalar", "bfp16")
# MMUL granularity per variant: (m, k, n) a tile must be a multiple of. bf16 4x8x8 and bfp16 8x8x8 from
# mlir-aie python/iron/kernels/linalg.py _MM_MAC_DIMS["aie2p"]; the scalar kernel only needs whole 32-bit words.
MMUL_DIMS = {"vector": (4, 8, 8), "bfp16": (8, 8, 8), "scalar": (1, 2, 2)}


@dataclass(frozen=True)
class Shape:
    m: int
    n: int
    k: int


@dataclass(frozen=True)
class Config:
    rows: int = 4
    cols: int = 8
    tile_m: int = 64
    tile_k: int = 32
    tile_n: int = 64
    variant: str = "vector"
    acc: str = "fp32"
    depth: int = 2
    pad: bool = False
    orient: str = "m_rows"  # "m_rows": rows split M (IRON); "m_cols": columns split M (AIR's herd [herd_m, herd_n])
    # AIR's L2 K tile: with bf16 accumulation (its "direct" method) the partial sum leaves the tile after every
    # tile_k_l2 of K and comes back for the next (a memory-tile round trip the kernel waits for). 0: no L2 K tiling.
    tile_k_l2: int = 0
    # The output C's dtype in DDR (and in its fifos): "bf16", or "fp32" as AIR's f32-output kernels write it (4 B per
    # element drained; the fp32 C buffer is the accumulator, so no separate one).
    out_dtype: str = "bf16"


ORIENTS = ("m_rows", "m_cols")


def herd(config: Config) -> tuple[int, int]:
    """(tiles along M, tiles along N) of a config: AIR's [herd_m, herd_n]."""
    return (config.rows, config.cols) if config.orient == "m_rows" else (config.cols, config.rows)


def _err(message: str) -> DesignError:
    return DesignError([Violation("SHAPE_NOT_TILING", None, message)], "gemm")


def padded_shape(shape: Shape, config: Config) -> Shape:
    """The shape the design computes: M, N, K rounded up to whole array blocks (rows*tile_m, cols*tile_n, tile_k)."""

    def up(x: int, b: int) -> int:
        return -(-x // b) * b

    hm, hn = herd(config)
    return Shape(up(shape.m, hm * config.tile_m), up(shape.n, hn * config.tile_n), up(shape.k, config.tile_k))


def out_bytes(config: Config) -> int:
    """Bytes of one output element (C in its fifos and in DDR)."""
    return 4 if config.out_dtype == "fp32" else 2


def accumulator(config: Config) -> str:
    """How partial sums accumulate: an fp32 output buffer accumulates in fp32 whatever ``acc`` says."""
    return "fp32" if config.out_dtype == "fp32" else config.acc


def separate_accumulator(config: Config) -> bool:
    """An fp32 scratch accumulator beside a bf16 C buffer (an fp32 C buffer accumulates in place)."""
    return config.acc == "fp32" and config.out_dtype != "fp32"


def c_depth(config: Config) -> int:
    """Buffers of the C fifo: an fp32 C buffer is the accumulator, held for the whole K loop and drained before the
    next output block starts (one buffer: AIR's f32 tiles, e.g. 64x128x4 B = 32 KiB, leave no room for two)."""
    return 1 if config.out_dtype == "fp32" else config.depth


def l1_bytes(config: Config) -> int:
    """Compute-tile memory one worker needs: A, W, C fifos x depth + fp32 accumulator + stack."""
    tm, tk, tn = config.tile_m, config.tile_k, config.tile_n
    fifos = config.depth * 2 * (tm * tk + tn * tk) + c_depth(config) * out_bytes(config) * tm * tn
    return fifos + (4 * tm * tn if separate_accumulator(config) else 0) + CORE_STACK_BYTES


def _check_config(shape: Shape, config: Config, device: Device) -> None:
    if config.variant not in VARIANTS:
        raise _err(f"variant {config.variant!r} is unknown; use one of {VARIANTS}")
    if config.orient not in ORIENTS:
        raise _err(f"orientation {config.orient!r} is unknown; use one of {ORIENTS}")
    if config.acc not in nx.ACCUMULATORS:
        raise _err(f"accumulator {config.acc!r} is unknown; use one of {nx.ACCUMULATORS}")
    if config.out_dtype not in nx.OUTPUT_FORMATS:
        raise _err(f"output dtype {config.out_dtype!r} is unknown; use one of {nx.OUTPUT_FORMATS}")
    if not 1 <= config.rows <= min(4, device.compute_rows) or not 1 <= config.cols <= device.columns:
        raise _err(
            f"{config.rows} x {config.cols} tiles do not fit {device.name}; use rows <= 4 and cols <= {device.columns}"
        )
    gm, gk, gn = MMUL_DIMS[config.variant]
    if (
        config.tile_m % gm
        or config.tile_k % gk
        or config.tile_n % gn
        or min(config.tile_m, config.tile_k, config.tile_n) < 1
    ):
        raise _err(
            f"tile {config.tile_m}x{config.tile_k}x{config.tile_n} is not a multiple of the {config.variant} "
            f"kernel's {gm}x{gk}x{gn} granularity"
        )
    if min(shape.m, shape.n, shape.k) < 1:
        raise _err(f"shape {shape} has an empty dimension")
    if config.tile_k_l2 < 0 or config.tile_k_l2 % config.tile_k:
        raise _err(f"L2 K tile {config.tile_k_l2} is not a whole number of {config.tile_k}-wide L1 K chunks")
    if not config.pad and padded_shape(shape, config) != shape:
        hm, hn = herd(config)
        raise _err(
            f"M={shape.m}, N={shape.n}, K={shape.k} do not tile into blocks of {hm}x{config.tile_m}, "
            f"{hn}x{config.tile_n}, {config.tile_k}; pick another config or set pad=True"
        )


def _numerics(config: Config) -> nx.Numerics:
    operands = "bfp16" if config.variant == "bfp16" else "bf16"
    points = ("operands:bfp16",) if operands == "bfp16" else ()
    acc = accumulator(config)
    points += ("partial_sum:bf16",) if acc == "bf16" else ("accumulate:fp32",)
    return nx.Numerics(operands, acc, config.tile_k, config.out_dtype, points + (f"output:{config.out_dtype}",))


def _kernel(config: Config) -> TileKernel:
    operands = "bfp16" if config.variant == "bfp16" else "bf16"
    acc, out = accumulator(config), config.out_dtype

    def matmul_tile(ins: list[torch.Tensor], outs: list[torch.Tensor], ctx) -> None:
        a, w = ins
        (c,) = outs
        partial = nx.chunk_partial(a, w, operands)
        if acc == "fp32":
            if ctx.first:
                ctx.scratch["acc"] = torch.zeros(c.shape, dtype=torch.float32)
            ctx.scratch["acc"] = nx.accumulate(ctx.scratch["acc"], partial, "fp32")
            if ctx.last:
                c.copy_(nx.finish(ctx.scratch["acc"], out))
        else:
            if ctx.first:
                c.zero_()  # IRON's zero kernel before the K loop
            c.copy_(nx.accumulate(c, partial, "bf16"))

    tm, tk, tn = config.tile_m, config.tile_k, config.tile_n
    return TileKernel(
        name=f"matmul_{config.variant}_{acc}_{tm}x{tk}x{tn}" + ("" if out == "bf16" else f"_{out}out"),
        fn=matmul_tile,
        variant=config.variant,
        macs_per_call=tm * tk * tn,
        bytes_per_call=2 * (tm * tk + tn * tk)
        + out_bytes(config) * tm * tn
        + (4 * tm * tn if separate_accumulator(config) else 0),
        params={"tile_m": tm, "tile_k": tk, "tile_n": tn, "acc": acc, "out": out},
    )


def _a_links(rows: int, cols: int) -> int:
    return max(d for d in range(1, rows + 1) if rows % d == 0 and d <= cols)


def make_design(shape: Shape, config: Config | None = None, device: Device | None = None) -> Design:
    device = device or npu2()
    config = config or default_config(shape, device)
    _check_config(shape, config, device)
    p = padded_shape(shape, config)
    rows, cols, tm, tk, tn, depth = config.rows, config.cols, config.tile_m, config.tile_k, config.tile_n, config.depth
    hm, hn = herd(config)
    mb_count, nb_count, kt = p.m // (hm * tm), p.n // (hn * tn), p.k // tk
    n_s = _a_links(rows, cols)
    rpl = rows // n_s
    # the operand split per row (broadcast along it) and the one forwarded per column (broadcast down it)
    m_rows = config.orient == "m_rows"
    split_op, col_op = ("A", "W") if m_rows else ("W", "A")
    split_rows = tm if m_rows else tn  # rows of the split operand in one row's object
    col_rows = tn if m_rows else tm

    fifos: list[Fifo] = []
    links = []
    for j in range(n_s):
        src = f"{split_op}_l2_{j}"
        fifos.append(Fifo(src, (rpl * split_rows, tk), "bf16", depth, shim_placement=Tile(j, SHIM_ROW)))
        dsts = [f"{split_op}_{j * rpl + i}" for i in range(rpl)]
        for d in dsts:
            fifos.append(Fifo(d, (split_rows, tk), "bf16", depth))
        name = f"{split_op}_link_{j}"
        if rpl == 1:
            links.append(forward(name, src, dsts[0], Tile(j, MEM_ROW)))
        else:
            links.append(split(name, src, dsts, [i * split_rows * tk for i in range(rpl)], Tile(j, MEM_ROW)))
    for c in range(cols):
        fifos.append(Fifo(f"{col_op}_l2_{c}", (col_rows, tk), "bf16", depth, shim_placement=Tile(c, SHIM_ROW)))
        fifos.append(Fifo(f"{col_op}_{c}", (col_rows, tk), "bf16", depth))
        links.append(forward(f"{col_op}_link_{c}", f"{col_op}_l2_{c}", f"{col_op}_{c}", Tile(c, MEM_ROW)))
        c_d = c_depth(config)
        fifos.append(Fifo(f"C_l2_{c}", (rows * tm, tn), config.out_dtype, c_d, shim_placement=Tile(c, SHIM_ROW)))
        srcs = [f"C_{r}_{c}" for r in range(rows)]
        for s_ in srcs:
            fifos.append(Fifo(s_, (tm, tn), config.out_dtype, c_d))
        links.append(join(f"C_link_{c}", srcs, f"C_l2_{c}", [r * tm * tn for r in range(rows)], Tile(c, MEM_ROW)))

    kernel = _kernel(config)

    def operands(r: int, c: int) -> tuple[str, str]:
        return (f"A_{r}", f"W_{c}") if m_rows else (f"A_{c}", f"W_{r}")

    workers = [
        Worker(
            name=f"mm_{r}_{c}",
            kernel=kernel,
            inputs=operands(r, c),
            outputs=(f"C_{r}_{c}",),
            iterations=mb_count * nb_count,
            placement=Tile(c, FIRST_COMPUTE_ROW + r),
            local_bytes=4 * tm * tn if separate_accumulator(config) else 0,
            acquires={operands(r, c)[0]: kt, operands(r, c)[1]: kt, f"C_{r}_{c}": 1},
            calls_per_iteration=kt,
        )
        for r in range(rows)
        for c in range(cols)
    ]
    runtime = _runtime(p, config, n_s, rpl, device)
    design = Design(
        name=f"gemm_{shape.m}x{shape.n}x{shape.k}" + ("" if config.out_dtype == "bf16" else f"_{config.out_dtype}out"),
        device=device,
        inputs=[TensorSpec("a", (p.m, p.k)), TensorSpec("w", (p.n, p.k))],
        outputs=[TensorSpec("c", (p.m, p.n), config.out_dtype)],
        fifos=fifos,
        links=links,
        workers=workers,
        runtime=runtime,
        numerics=_numerics(config),
        fast=_fast(config),
    )
    design.meta = {
        "family": FAMILY,
        "shape": asdict(shape),
        "config": asdict(config),
        "logical_shape": asdict(shape),
        "padded_shape": asdict(p),
        "macs": design.total_macs(),
        "useful_macs": shape.m * shape.n * shape.k,
        "ddr_read_bytes": design.ddr_read_bytes(),
        "ddr_write_bytes": design.ddr_write_bytes(),
        "spill": spill(p, config),
    }
    return design


def spill(p: Shape, config: Config) -> tuple[int, int]:
    """(round trips per C tile, bytes each way) of the partial sum a worker sends out and waits to get back: with
    bf16 accumulation and an L2 K tile, once per L2 K tile but the last (AIR's "direct" method); else none."""
    if config.acc != "bf16" or not config.tile_k_l2 or config.tile_k_l2 >= p.k:
        return 0, 0
    return -(-p.k // config.tile_k_l2) - 1, out_bytes(config) * config.tile_m * config.tile_n


def _runtime(p: Shape, config: Config, n_s: int, rpl: int, device: Device) -> Runtime:
    """Fill/drain tasks in one task group per output block (M block, N block).

    Within a group the operand that stays (A: the M block) is re-read once per N block (a zero stride), the other
    streams its N blocks."""
    rows, cols, tm, tk, tn = config.rows, config.cols, config.tile_m, config.tile_k, config.tile_n
    hm, hn = herd(config)
    mb_count, nb_count, kt = p.m // (hm * tm), p.n // (hn * tn), p.k // tk
    m_rows = config.orient == "m_rows"

    def chunk_tasks(mb: int, n0: int, n1: int) -> list[tuple[str, str, str, object, int]]:
        nbs = n1 - n0
        out = []
        if m_rows:
            for j in range(n_s):
                off = (mb * rows + j * rpl) * tm * p.k
                for tap in legal_taps((p.m, p.k), off, [nbs, kt, rpl * tm, tk], [0, tk, p.k, 1]):
                    out.append(("fill", f"A_l2_{j}", "a", tap, j))
        else:
            for j in range(n_s):
                off = (n0 * rows + j * rpl) * tn * p.k
                for tap in legal_taps((p.n, p.k), off, [nbs, kt, rpl * tn, tk], [rows * tn * p.k, tk, p.k, 1]):
                    out.append(("fill", f"W_l2_{j}", "w", tap, j))
        for c in range(cols):
            if m_rows:
                off = (n0 * cols + c) * tn * p.k
                for tap in legal_taps((p.n, p.k), off, [nbs, kt, tn, tk], [cols * tn * p.k, tk, p.k, 1]):
                    out.append(("fill", f"W_l2_{c}", "w", tap, c))
                off = mb * rows * tm * p.n + (n0 * cols + c) * tn
                for tap in legal_taps((p.m, p.n), off, [nbs, rows * tm, tn], [cols * tn, p.n, 1]):
                    out.append(("drain", f"C_l2_{c}", "c", tap, c))
            else:
                off = (mb * cols + c) * tm * p.k
                for tap in legal_taps((p.m, p.k), off, [nbs, kt, tm, tk], [0, tk, p.k, 1]):
                    out.append(("fill", f"A_l2_{c}", "a", tap, c))
                # the joined object holds row r's (tm, tn) tile at r * tm * tn: C block (M block c, N block r)
                off = (mb * cols + c) * tm * p.n + n0 * rows * tn
                for tap in legal_taps((p.m, p.n), off, [nbs, rows, tm, tn], [rows * tn, tn, p.n, 1]):
                    out.append(("drain", f"C_l2_{c}", "c", tap, c))
        return out

    rt = Runtime()
    group = 0
    for mb in range(mb_count):
        # One task group per output block: its K loop starts with the first A and W tiles still to arrive and ends
        # with its C still to leave, so every block pays the pipeline's fill and drain (the K-loop effect: a long K
        # amortizes them). Chosen by cross-validated loss over the GEMM rows (0.01222 with groups as large as the
        # shim BDs allow -> 0.01127 with one per block, calibrate/crossval.py).
        for nb in range(nb_count):
            for kind, fifo, tensor, tap, _ in chunk_tasks(mb, nb, nb + 1):
                (rt.fill if kind == "fill" else rt.drain)(fifo, tensor, tap, group)
            group += 1
    return rt


def _fast(config: Config):
    operands = "bfp16" if config.variant == "bfp16" else "bf16"

    def fast(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        c = nx.matmul(inputs["a"], inputs["w"], acc=accumulator(config), k_chunk=config.tile_k, operands=operands,
                      output=config.out_dtype, exact=exact, row_invariant=True)  # fmt: skip
        return {"c": c}

    return fast


def reference(inputs: dict[str, torch.Tensor], shape: Shape | None = None) -> dict[str, torch.Tensor]:
    """FP32 C = A @ W^T from the (bf16) inputs, no intermediate rounding."""
    return {"c": inputs["a"].to(torch.float32) @ inputs["w"].to(torch.float32).T}


def prepare_inputs(design: Design, a: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
    """Zero-pad logical A [M, K] and W [N, K] (bf16) to the design's tensor shapes (zeros add nothing to sums)."""
    a_spec, w_spec = design.tensor("a"), design.tensor("w")
    return {"a": _pad(a, a_spec.shape), "w": _pad(w, w_spec.shape)}


def crop_outputs(design: Design, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    s = design.meta["logical_shape"]
    return {"c": outputs["c"][: s["m"], : s["n"]]}


def _pad(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    if tuple(t.shape) == shape:
        return t.to(torch.bfloat16)
    out = torch.zeros(shape, dtype=torch.bfloat16)
    out[tuple(slice(0, s) for s in t.shape)] = t.to(torch.bfloat16)
    return out


def modeled_estimate(
    shape: Shape,
    config: Config,
    device: Device | None = None,
    cal: Calibration = CALIBRATION,
    *,
    family: str = FAMILY,
    w_chunk_bytes: int | None = None,
    extra_vector_ops: int = 0,
    padded: Shape | None = None,
) -> float:
    """Modeled seconds of one dispatch of ``make_design(shape, config)`` (``time_group``), without building it.

    Why: ranking candidates by padding alone picks one row of 4-row tiles at M = 1025 (the only near-zero-waste
    tiling), ~50x slower per token than 4 x 8 tiles of 64 rows padded to 1280. Timing every candidate's real design
    is too slow for a default (thousands of task groups for the tiny tilings, seconds each), so this is the timing
    model (``npu/timing.py``) evaluated in closed form on the GEMM dataflow of ``make_design``: the slowest worker's
    calls, the memory-tile and shim channels, DDR, one fill and drain per task group, the tiles configured and the
    dispatch. Tested equal to ``time_group(make_design(...))`` (tests/kernels/test_gemm_rank.py), so it cannot
    drift from the model unnoticed. No legality check: the caller validates the design it picks.

    ``family``, ``w_chunk_bytes`` (bytes of one weight row's ``tile_k`` chunk; bf16: 2 * tile_k) and
    ``extra_vector_ops`` (per kernel call) let ``qgemm``, the same dataflow with packed weights decoded in the tile,
    use it too. ``padded``: ``padded_shape(shape, config)`` when the caller has it.
    """
    device = device or npu2()
    p = padded or padded_shape(shape, config)
    rows, cols, tm, tk, tn = config.rows, config.cols, config.tile_m, config.tile_k, config.tile_n
    hm, hn = herd(config)
    groups = (p.m // (hm * tm)) * (p.n // (hn * tn))  # one task group per output block = worker iterations
    kt = p.k // tk
    bpc = float(device.stream_bytes_per_cycle)
    ob = out_bytes(config)
    a_obj, w_obj, c_obj = 2 * tm * tk, tn * (2 * tk if w_chunk_bytes is None else w_chunk_bytes), ob * tm * tn
    n_s = _a_links(rows, cols)
    rpl = rows // n_s
    split_obj, col_obj = (a_obj, w_obj) if config.orient == "m_rows" else (w_obj, a_obj)
    # bytes over the launch: the split operand's shim fifo, one row's fifo, a column's fifos, one C tile's fifo
    split_l2, split_row = groups * kt * rpl * split_obj, groups * kt * split_obj
    col_l2 = col_row = groups * kt * col_obj
    c_l2, c_tile = groups * rows * c_obj, groups * c_obj

    # the worker: one C tile per iteration, kt kernel calls each (timing._worker_profile / _time_worker)
    acc_bytes = 4 * tm * tn if separate_accumulator(config) else 0
    per_call_in = [split_obj * kt / kt / bpc, col_obj * kt / kt / bpc]
    per_call_out = [c_obj * 1 / kt / bpc]
    dma_in = busiest_channel(per_call_in, device.compute.s2mm_channels)
    dma_out = busiest_channel(per_call_out, device.compute.mm2s_channels)
    serial = max(
        busiest_channel(per_call_in if config.depth < 2 else [], device.compute.s2mm_channels),
        busiest_channel(per_call_out if c_depth(config) < 2 else [], device.compute.mm2s_channels),
    )
    bytes_per_call = a_obj + w_obj + c_obj + acc_bytes
    compute = compute_cycles_per_call(
        config.variant, tm * tk * tn, extra_vector_ops, bytes_per_call, family, device, cal
    )
    trips, spill_bytes = spill(p, config)
    spill_cycles = trips * 2 * (cal.dma_hop_latency_cycles + spill_bytes / bpc)
    worker = (max(compute + serial, dma_in, dma_out) * kt + spill_cycles) * groups

    limits = [worker]
    shim_bpc = min(bpc, cal.shim_channel_bytes_per_s / device.clock_hz)
    # memory tile c holds column c's links and, for c < n_s, the split operand's link c; shim tile c likewise (the
    # columns c >= n_s are alike, so two cases cover all)
    for with_split in (True, False) if n_s < cols else (True,):
        ins = [col_l2 / bpc] + [c_tile / bpc] * rows + ([split_l2 / bpc] if with_split else [])
        outs = [col_row / bpc, c_l2 / bpc] + ([split_row / bpc] * rpl if with_split else [])
        limits.append(
            max(busiest_channel(ins, device.mem.s2mm_channels), busiest_channel(outs, device.mem.mm2s_channels))
        )
        fills = [float(col_l2)] + ([float(split_l2)] if with_split else [])
        shim = max(
            busiest_channel(fills, device.shim.mm2s_channels),
            busiest_channel([float(c_l2)], device.shim.s2mm_channels),
        )
        limits.append(shim / shim_bpc)
    ddr = n_s * split_l2 + cols * col_l2 + cols * c_l2
    limits.append(ddr / cal.ddr_bytes_per_s * device.clock_hz)
    hop = cal.dma_hop_latency_cycles
    fill = max(2 * hop + (rpl * split_obj / bpc + split_obj / bpc), 2 * hop + (col_obj / bpc + col_obj / bpc))
    drain = 2 * hop + (rows * c_obj / bpc + c_obj / bpc)
    cycles = fill + max(limits) + drain + max(groups - 1, 0) * (fill + drain)
    tiles = rows * cols + cols  # a worker per compute tile, one memory tile per column holding links
    return cal.dispatch_overhead_s + tiles * cal.tile_config_s + cycles / device.clock_hz


# An exact tiling (no padding) ranks before every padded one while its modeled time is within this factor of the
# fastest candidate's. Why keep exact tilings at all: a padded launch's DDR tensors are larger than its neighbours'
# (M x K written, padded M' x K' read), so it cannot be bound into a fused multi-launch group (GROUP_BINDING), and
# the plans' repair skill (``fix-merged-launch-arguments``) resets configs to the family defaults expecting them not
# to pad. Why 4: at the gate prompt (24 tokens) the seed shapes' best exact tilings are 1.2-3.2x slower than padded
# ones (tiny GEMMs, fixed costs dominate) and must stay; the exact tilings that made awkward lengths slow are far
# slower at ~1,000 tokens: one row of 4-row tiles (M = 4 mod 8) 30-60x, two rows (M = 8 mod 16) 15-35x, four rows
# of 4-row tiles (M = 16 mod 32) 8-15x. The price: exact tilings of 8- and 16-row tiles (M = 32 mod 64, 64 mod 128)
# stay where padding is up to 4x faster.
EXACT_SLACK = 4.0


class _Rankable(Protocol):
    """What ``rank`` reads of a config (gemm's and qgemm's Config both have it)."""

    @property
    def rows(self) -> int: ...
    @property
    def cols(self) -> int: ...
    @property
    def tile_m(self) -> int: ...
    @property
    def tile_k(self) -> int: ...
    @property
    def tile_n(self) -> int: ...
    @property
    def variant(self) -> str: ...
    @property
    def acc(self) -> str: ...
    @property
    def pad(self) -> bool: ...


R = TypeVar("R", bound=_Rankable)


def rank(scored: Iterable[tuple[R, float, float]]) -> list[R]:
    """Configs ranked from (config, modeled seconds, padding = padded MACs / useful MACs), best first.

    The key, in order: the default numerics (vector kernel, fp32 accumulation: the others change the results and
    are the tuner's to choose, behind the gates); an exact tiling within ``EXACT_SLACK`` of the fastest candidate
    of its numerics; the modeled time (``modeled_estimate``, to the picosecond so float noise cannot split equal
    times); then less padding, more tiles, bigger tiles.

    Why time and not padding first: padding is a poor proxy for time at awkward lengths. At M = 1025 the least
    padding is one row of 4-row tiles over 1028 rows, whose ~257 output blocks per N block each pay a pipeline fill
    and drain and whose 4 x 64 x 64 calls are mostly loop overhead: ~35x slower than 4 x 8 tiles of 64 rows over
    1280 rows. ``qgemm`` ranks its configs (same fields) with this too.
    """
    scored = list(scored)
    fastest: dict[tuple[str, str], float] = {}
    for cfg, seconds, _ in scored:
        numerics = (cfg.variant, cfg.acc)
        fastest[numerics] = min(fastest.get(numerics, seconds), seconds)

    def key(item: tuple[R, float, float]) -> tuple:
        cfg, seconds, padding = item
        exact = not cfg.pad and seconds <= EXACT_SLACK * fastest[(cfg.variant, cfg.acc)]
        return (
            cfg.variant != "vector",
            cfg.acc != "fp32",
            not exact,
            round(seconds, 12),
            round(padding, 3),
            -cfg.rows * cfg.cols,
            -cfg.tile_m * cfg.tile_n,
            -cfg.tile_k,
        )

    return [cfg for cfg, _, _ in sorted(scored, key=key)]


def candidate_configs(shape: Shape, device: Device | None = None) -> list[Config]:
    """Configs worth trying, most promising first (``rank``: default numerics, exact tilings that are not much
    slower, then the modeled time)."""
    return list(_ranked(shape, device or npu2(), CALIBRATION))


def default_config(shape: Shape, device: Device | None = None) -> Config:
    """The best-ranked candidate (``candidate_configs``' first): vector kernel, fp32 accumulation, no padding unless
    padding is more than ``EXACT_SLACK`` times faster, then the least modeled time. Only the candidates of those
    numerics are estimated (a third of them): the others rank after them anyway."""
    return _default(shape, device or npu2(), CALIBRATION)


@functools.lru_cache(maxsize=512)
def _default(shape: Shape, device: Device, cal: Calibration) -> Config:
    ranked = rank(_scored(shape, device, cal, numerics=("vector", "fp32")))
    if not ranked:
        raise _err(f"no GEMM tiling fits {shape}; the shape is too small or too oddly sized for any candidate")
    return ranked[0]


@functools.lru_cache(maxsize=512)
def _ranked(shape: Shape, device: Device, cal: Calibration) -> tuple[Config, ...]:
    """The ranked candidates of a shape. Cached, as ``_default`` is: a plan asks for the same few shapes once per
    layer, and ranking estimates every candidate (~2,600 for a large GEMM, tens of microseconds each)."""
    return tuple(rank(_scored(shape, device, cal)))


def _scored(
    shape: Shape, device: Device, cal: Calibration, numerics: tuple[str, str] | None = None
) -> Iterator[tuple[Config, float, float]]:
    """(config, modeled seconds, padding) of the shape's candidates, of one (variant, acc) when ``numerics`` names
    it: what ``rank`` orders."""
    for cfg, p, padding in unranked_candidates(shape, device):
        if numerics is None or (cfg.variant, cfg.acc) == numerics:
            yield cfg, modeled_estimate(shape, cfg, device, cal, padded=p), padding


@functools.lru_cache(maxsize=512)
def unranked_candidates(shape: Shape, device: Device) -> tuple[tuple[Config, Shape, float], ...]:
    """(config, padded shape, padding) of every tiling worth trying, unranked: cheap arithmetic filters only."""
    budget = device.compute.memory_bytes
    out: list[tuple[Config, Shape, float]] = []
    for rows in (4, 2, 1):
        for cols in (8, 4, 2, 1):
            if rows > device.compute_rows or cols > device.columns:
                continue
            for tm in (64, 32, 16, 8, 4):
                for tk in (64, 32, 16, 8):
                    for tn in (64, 32, 16, 8):
                        for variant, acc in (("vector", "fp32"), ("vector", "bf16"), ("bfp16", "fp32")):
                            cfg = Config(rows, cols, tm, tk, tn, variant, acc)
                            gm, gk, gn = MMUL_DIMS[variant]
                            if tm % gm or tk % gk or tn % gn or l1_bytes(cfg) > budget:
                                continue
                            p = padded_shape(shape, cfg)
                            if p.k // tk > TAP_MAX_SIZE:
                                # a K loop longer than one DMA dimension is peeled into one pattern per step:
                                # thousands of shim BDs (BD_LIMIT), and very slow to build
                                continue
                            padding = p.m * p.n * p.k / (shape.m * shape.n * shape.k)
                            if padding > 4.0:
                                continue
                            if padding > 1.0:
                                cfg = Config(rows, cols, tm, tk, tn, variant, acc, pad=True)
                            out.append((cfg, p, padding))
    return tuple(out)
