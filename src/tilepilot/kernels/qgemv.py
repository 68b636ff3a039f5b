"""Quantized GEMV: y[M, N] = x[M, K] @ dequant(Wq)[N, K]^T for decode, packed weights streamed as stored.

The weight tensor ``w`` is the packed uint8 array of ``model/quant.py`` ([N, K / block * block_bytes]: per
block an fp16 scale, an fp16 min for q4_1, then the codes), so every DMA moves the true bytes of the format
(Q4_0 at block 32: 4.5 bits per weight). The dataflow is the GEMV's (``kernels/gemv.py``) with one change
of element type: column c's shim streams, per kernel call, a (tile_m, tile_k / block * block_bytes) byte
block; the compute tile decodes it (unpack nibbles, scale, add min: ``quant.dequantize_blocks``), rounds
the weights once to bf16 and runs the bf16 matvec with fp32 accumulation across K and one bf16 rounding.

Weight feed (``weight_channels``): 1 = one shim MM2S channel per column carries the weights (x rides the
other channel of column 0's shim); 2 = both MM2S channels of every column carry half of each weight block
(rows [0, tile_m/2) and [tile_m/2, tile_m)) into the column's memory tile, which joins them into one object
for the compute tile, as AIR's dual-channel fused decode does; x then needs a shim of
its own, the first column the design does not use, so 2 channels need cols < the device's columns. The tuner
picks whichever the timing model says is faster. ``tile_m0`` > 0 (uneven, channel-proportional rows): column 0's
second channel carries x, its weights ride one channel with ``tile_m0`` rows per worker, every other column feeds
both channels with ``tile_m`` rows per worker, so 8 columns stream weights on 15 shim channels; a column's rows of
each matrix stay contiguous (``gemv.Tiling``). The tuner tries the best-balanced row pairs the shape divides into.

Numerics: exactly a bf16 GEMV over ``QuantTensor.deployed()`` (the dequantized weights rounded once to
bf16), which is what the oracle runs. Fast path: dequantize the whole tensor, then ``numerics.matmul`` with
the GEMV's K chunks (exact=True bit-identical to the tile path, tested on small shapes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from math import prod

import torch

from tilepilot.kernels.gemv import (
    K_GRANULE,
    MAX_TOKENS,
    TILE_M_CHOICES,
    Tiling,
    WeightStream,
    check_feed,
    check_folds,
    check_parts,
    constant_inputs,
    epilogue,
    epilogue_ops,
    fold_points,
    fold_suffix,
    folded_fast,
    folded_reference,
    folds,
    gate_blocks,
    kernel_params,
    matvec_dataflow,
    matvec_tensors,
    parts_suffix,
    prenorm_local_bytes,
    prenormed,
    prologue_meta,
    resident_x,
    rope_local_bytes,
    rope_output_bytes,
    tensor_names,
    tile_fits,
    tile_k_choices,
    x_chunk,
    x_must_ride,
    x_object,
)
from tilepilot.model.quant import QUANT_FORMATS, block_bytes, deployed_packed, dequantize_packed
from tilepilot.npu import numerics as nx
from tilepilot.npu.design import Design, TileKernel
from tilepilot.npu.device import Device, npu2
from tilepilot.npu.validate import CORE_STACK_BYTES, WORD_BYTES, DesignError, Violation

FAMILY = "qgemv"
VARIANTS = ("vector",)
# vector ops per decoded weight in the tile (unpack, convert, scale, [add min], round): AIE2P decodes a
# 512-bit register of nibbles per few cycles; counted as element operations for the timing model.
DEQUANT_OPS = {"q4_0": 3, "q4_1": 4, "q8_0": 2}


@dataclass(frozen=True)
class Shape:
    """``parts``: a multi-matrix launch (e.g. Q/K/V, gate/up: matrices reading the same x), the output rows of each
    matrix, summing to ``n``; empty = one matrix of ``n`` rows (tensors ``w``/``y``; parts: ``w0``.. / ``y0``..).
    ``norm_eps``: the launch's x is the *input* of an RMSNorm (weight tensor ``g``) that every worker applies to its
    resident x before the first call (``gemv.resident_x``): the norm's own launch is saved. ``residual``: y is added
    to the residual tensor ``r`` ([m, n], riding in x's object) before it is written, with the residual add's own
    arithmetic (``gemv.add_residual``): the add's launch is saved. ``gated``: of two equal matrices (gate, up) only
    silu(gate) * up is written (``swiglu.silu_mul``), each worker keeping its gate rows until their up rows are done:
    the SwiGLU launch is saved. ``rope_dim``: the first ``rope_parts`` matrices' outputs are rotated by RoPE (heads of
    ``rope_dim`` rows; the table ``cs`` rides in x's object) before they are written, with the RoPE kernel's own
    arithmetic, each worker holding a head's blocks until its last (``gemv.rope_blocks``): the RoPE launch is saved.
    All need ``x_rides``; a residual one matrix."""

    n: int
    k: int
    m: int = 1
    fmt: str = "q4_0"
    block: int = 32
    parts: tuple[int, ...] = ()
    norm_eps: float | None = None
    residual: bool = False
    gated: bool = False
    rope_dim: int = 0
    rope_parts: int = 0

    def matrices(self) -> tuple[int, ...]:
        return self.parts or (self.n,)


@dataclass(frozen=True)
class Config:
    """``tile_m``/``tile_k`` 0 = the default for the shape. ``fmt``/``block`` describe the data (the plan sets
    them from its weight format; the tuner never changes them). ``rows``: compute rows per column, each worker
    decoding its own share of the column's output rows (the tile's dequantization is the kernel's bottleneck)."""

    cols: int = 8
    tile_m: int = 0
    tile_k: int = 0
    depth: int = 2
    weight_channels: int = 1
    fmt: str = "q4_0"
    block: int = 32
    rows: int = 1
    tile_m0: int = 0
    x_rides: bool = False

    def tiling(self) -> Tiling:
        return Tiling(
            self.cols, self.rows, self.tile_m, self.tile_k, self.depth, self.weight_channels, self.tile_m0, self.x_rides
        )


def _err(message: str) -> DesignError:
    return DesignError([Violation("SHAPE_NOT_TILING", None, message)], FAMILY)


def chunk_bytes(shape: Shape, tile_k: int) -> int:
    return tile_k // shape.block * block_bytes(shape.fmt, shape.block)


def l1_bytes(shape: Shape, config: Config) -> int:
    """W byte chunk x depth, x chunk and y block double-buffered, fp32 acc, stack (the larger worker of an uneven
    split). No decoded copy of the chunk: the kernel decodes a block into vector registers and multiplies it there
    (AIR's ``proj_qmm`` keeps only its 32-float accumulator beside the packed block), so L1 holds packed bytes."""
    tm, tk, m, t = max(config.tile_m, config.tile_m0), config.tile_k, shape.m, config.tiling()
    w = config.depth * tm * chunk_bytes(shape, tk)
    x = 2 * prod(x_object(shape)) if config.x_rides else 2 * 2 * m * tk  # resident x (+ g, r), or its chunks
    x += prenorm_local_bytes(shape) + rope_local_bytes(shape, t) + rope_output_bytes(shape, t)
    return w + x + 2 * 2 * m * tm + 4 * m * tm + CORE_STACK_BYTES


def _resolve(shape: Shape, config: Config, device: Device) -> Config:
    if config.tile_m and config.tile_k:
        return config
    d = default_config(shape, device, config.cols, config.weight_channels, config.rows)
    return replace(d, depth=config.depth)


def _check(shape: Shape, config: Config, device: Device) -> None:
    if shape.fmt not in QUANT_FORMATS:
        raise _err(f"weight format {shape.fmt!r} is not a block format; use one of {QUANT_FORMATS}")
    if (config.fmt, config.block) != (shape.fmt, shape.block):
        raise _err(f"config is for {config.fmt}/{config.block} but the weights are {shape.fmt}/{shape.block}")
    if min(shape.n, shape.k, shape.m) < 1 or shape.m > MAX_TOKENS:
        raise _err(f"shape {shape} is not a GEMV (1..{MAX_TOKENS} tokens, non-empty)")
    c = config
    check_feed(c.weight_channels, c.x_rides, c.cols, c.rows, c.tile_m, device, _err, c.tile_m0)
    if not 1 <= config.rows <= min(4, device.compute_rows):
        raise _err(f"{config.rows} compute rows per column do not fit {device.name}; use 1..4")
    if not 1 <= config.cols <= device.columns or config.depth < 1 or config.tile_m < 1:
        raise _err(f"config {config} does not fit {device.name}")
    if config.tile_m0 < 0:
        raise _err(f"tile_m0 {config.tile_m0} must be 0 (even split) or a row count")
    check_parts(shape, config.tiling().rows_per_iteration(), _err)
    check_folds(shape, config.tiling(), _err)
    if shape.k % config.tile_k or config.tile_k % K_GRANULE or config.tile_k % shape.block:
        raise _err(f"K={shape.k} does not split into chunks of {config.tile_k} (multiples of 32 and the block)")
    if chunk_bytes(shape, config.tile_k) % WORD_BYTES:
        raise _err(f"a {config.tile_k}-value chunk of {shape.fmt} is not a whole number of 32-bit words")


def _kernel(shape: Shape, config: Config, tile_m: int | None = None) -> TileKernel:
    """The tile's decode-and-matvec kernel for ``tile_m`` rows per call (default the config's)."""
    fmt, block = shape.fmt, shape.block

    def qmatvec_tile(ins: list[torch.Tensor], outs: list[torch.Tensor], ctx) -> None:
        wq, x = ins[:2]
        x = x_chunk(resident_x(x, shape, ctx), tk, ctx.step)  # a resident x is read chunk by chunk (Tiling.x_rides)
        w = dequantize_packed(wq, fmt, block).to(torch.bfloat16)  # decode in the tile, one bf16 rounding
        if ctx.first:
            ctx.scratch["acc"] = torch.zeros((m, tm), dtype=torch.float32)
        ctx.scratch["acc"] = nx.accumulate(ctx.scratch["acc"], nx.chunk_partial(x, w, "bf16"), "fp32")
        if not ctx.last:
            return
        epilogue(nx.finish(ctx.scratch["acc"], "bf16"), ins, outs, ctx, shape, quiet)  # the folds' epilogue, if any

    tm, tk, m = tile_m or config.tile_m, config.tile_k, shape.m
    quiet = gate_blocks(shape, config.tiling().rows_per_iteration())
    return TileKernel(
        name=f"qmatvec_{fmt}_b{block}_{tm}x{tk}",
        fn=qmatvec_tile,
        variant="vector",
        macs_per_call=m * tm * tk,
        vector_ops_per_call=DEQUANT_OPS[fmt] * tm * tk + epilogue_ops(shape, m * tm),
        bytes_per_call=tm * chunk_bytes(shape, tk) + 2 * m * tk + 4 * m * tm,
        params={**kernel_params(shape, config.tiling(), tm), "fmt": fmt, "block": block},
    )


def make_design(shape: Shape, config: Config | None = None, device: Device | None = None) -> Design:
    device = device or npu2()
    config = _resolve(shape, config or default_config(shape, device), device)
    _check(shape, config, device)
    m, n, k, tm, tk = shape.m, shape.n, shape.k, config.tile_m, config.tile_k
    rb = k // shape.block * block_bytes(shape.fmt, shape.block)  # packed bytes per weight row
    stream = WeightStream("uint8", rb, chunk_bytes(shape, tk))
    kernels = {t: _kernel(shape, config, t) for t in {tm, config.tile_m0} if t}

    quiet = gate_blocks(shape, config.tiling().rows_per_iteration())
    tiling = config.tiling()

    def local(rows: int) -> int:
        # fp32 accumulator (blocks decode in registers), normed x, a gated launch's kept gate rows, a roped one's held
        # blocks and table columns
        return 4 * m * rows + prenorm_local_bytes(shape) + 2 * m * rows * quiet + rope_local_bytes(shape, tiling)

    fifos, links, workers, rt = matvec_dataflow(
        shape, config.tiling(), stream, kernels.__getitem__, "qmv", local, device
    )
    inputs, outputs = matvec_tensors(shape, stream)
    points, tail = fold_points(shape)
    design = Design(
        name=f"qgemv_{shape.fmt}_b{shape.block}_{n}x{k}_m{m}{parts_suffix(shape)}{fold_suffix(shape)}",
        device=device,
        inputs=inputs,
        outputs=outputs,
        fifos=fifos,
        links=links,
        workers=workers,
        runtime=rt,
        numerics=nx.Numerics(
            "bf16", "fp32", tk, "bf16", (*points, f"weights:{shape.fmt}->bf16", "accumulate:fp32", "output:bf16", *tail)
        ),
        fast=_fast(shape, config),
    )
    design.meta = {
        "family": FAMILY,
        "shape": asdict(shape),
        "config": asdict(config),
        "macs": design.total_macs(),
        "useful_macs": m * n * k,
        "ddr_read_bytes": design.ddr_read_bytes(),
        "ddr_write_bytes": design.ddr_write_bytes(),
        "weight_bytes": n * rb,
        "constants": constant_inputs(shape),
    }
    if prenormed(shape):
        design.meta["prologue"] = prologue_meta(shape)
    return design


def _fast(shape: Shape, config: Config):
    """Each matrix of the launch as its own GEMV: the rows of a multi-matrix launch are computed exactly as the
    separate launches compute them (same K chunks, same roundings), so merging launches changes no bit."""

    def fast(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        def matvec(x: torch.Tensor, w: str) -> torch.Tensor:
            wd = deployed_packed(inputs[w], shape.fmt, shape.block)
            return nx.matmul(x, wd, acc="fp32", k_chunk=config.tile_k, operands="bf16", exact=exact)

        return folded_fast(shape, tensor_names(shape), inputs, matvec, exact)

    return fast


def reference(inputs: dict[str, torch.Tensor], shape: Shape | None = None) -> dict[str, torch.Tensor]:
    """FP32 y = x @ deployed(W)^T (the dequantized weights rounded to bf16, as the deployment defines them); with an
    RMSNorm prologue, of the FP32 RMSNorm of x (``oracle.ops.rmsnorm``); with a residual, plus the residual."""
    shape = shape or Shape(1, 1)

    def weight(w: str) -> torch.Tensor:
        return dequantize_packed(inputs[w], shape.fmt, shape.block).to(torch.bfloat16)

    return folded_reference(shape, tensor_names(shape), inputs, weight)


fits = tile_fits(_check, l1_bytes)


def candidate_configs(shape: Shape, device: Device | None = None) -> list[Config]:
    """Columns x compute rows x rows per call x K chunk x depth x weight channels, most tiles and biggest calls
    first."""
    device = device or npu2()
    ks = [t for t in tile_k_choices(shape.k) if t % shape.block == 0][:6]
    out: list[tuple[tuple, Config]] = []
    for cols in (8, 4, 2, 1):
        for rows in (1, 2, 4):
            for ch in (1, 2):
                for tm in TILE_M_CHOICES:
                    for tk in ks:
                        for depth in (2, 1):
                            rides = x_must_ride(cols, ch, device) or (folds(shape) and ch == 2)
                            cfg = Config(cols, tm, tk, depth, ch, shape.fmt, shape.block, rows, x_rides=rides)
                            if fits(shape, cfg, device):
                                out.append(((depth != 2, -cols * rows * ch, -tm * tk, ch, rows), cfg))
    for cfg in uneven_configs(shape, device, [t for t in tile_k_choices(shape.k) if t % shape.block == 0]):
        out.append(((cfg.depth != 2, -(2 * cfg.cols - 1) * cfg.rows, -cfg.tile_m * cfg.tile_k, 3, cfg.rows), cfg))
    out.sort(key=lambda x: x[0])
    return [c for _, c in out]


def uneven_configs(shape: Shape, device: Device, ks: list[int], per_rows: int = 1, chunks: int = 2) -> list[Config]:
    """Uneven, channel-proportional splits on every column (``Tiling.tile_m0``: 15 weight channels on 8 columns):
    for each compute-row count the ``per_rows`` row pairs (tile_m0, tile_m) whose busiest channel carries the fewest
    rows over the launch, among those whose rows per iteration divide every matrix of the launch, each with the
    ``chunks`` largest K chunks that fit L1 double-buffered."""
    cols = device.columns
    out: list[Config] = []
    for rows in (4, 2, 1):
        if rows > min(4, device.compute_rows):
            continue
        pairs = []
        for tm in range(2, 2 * max(TILE_M_CHOICES) + 1, 2):
            for tm0 in range(2, tm + 1, 2):
                total = rows * (tm0 + (cols - 1) * tm)
                if all(n % total == 0 for n in shape.matrices()):
                    per_iteration = [n // total for n in shape.matrices()]
                    busiest = max(rows * tm0, rows * tm // 2) * sum(per_iteration)  # rows on the busiest channel
                    pairs.append((busiest, -tm, tm0, tm))
        for _, _, tm0, tm in sorted(pairs)[:per_rows]:
            legal = [c for c in (Config(cols, tm, tk, 2, 2, shape.fmt, shape.block, rows, tm0) for tk in ks)]
            out += [c for c in legal if fits(shape, c, device)][:chunks]
    return out


def default_config(
    shape: Shape, device: Device | None = None, cols: int | None = None, channels: int = 1, rows: int = 1
) -> Config:
    """The GEMV's default (8 columns, one row, biggest chunks that fit), one weight channel per column; ``cols``,
    ``channels`` and ``rows`` fix those choices (a plan may name them and leave the tiles to the default)."""
    device = device or npu2()
    channels = 2 if folds(shape) else channels  # what rides in a resident x needs it, on a second channel
    col_choices = (cols,) if cols else (8, 4, 2, 1)
    for c in col_choices:
        if c > device.columns:
            continue
        for tm in (16, 8, 4, 2):
            for tk in tile_k_choices(shape.k):
                rides = x_must_ride(c, channels, device) or folds(shape)
                cfg = Config(c, tm, tk, 2, channels, shape.fmt, shape.block, rows, x_rides=rides)
                if fits(shape, cfg, device):
                    return cfg
    raise _err(f"no quantized GEMV tiling fits {shape}")
