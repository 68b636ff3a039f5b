"""GEMV: y[M, N] = x[M, K] @ W[N, K]^T for decode (M = 1 token, or a few), weights streamed from DDR.

Decode projections read every weight once per token, so a GEMV is a weight stream: what matters is how
many tiles pull weights in parallel and how long each kernel call keeps the core busy per byte.

Dataflow (``cols`` <= 8 columns x ``rows`` <= 4 compute rows, worker (r, c) on tile (c, 2 + r)):
- W is cut by output rows: column c owns rows [c*N/cols, (c+1)*N/cols). Its shim streams, per kernel
  call, a (rows*tile_m, tile_k) block; with one row of workers it goes straight to the worker, with
  several the column's memory tile splits it into one (tile_m, tile_k) object per row.
- x is one broadcast fifo from shim 0 to every worker, (M, tile_k) per call, re-sent for every block
  of output rows (a worker keeps no full copy of x, so K is not bounded by tile memory); but see below.
- ``weight_channels`` = 2 (the quantized GEMV's choice too): both shim MM2S channels of every column carry the
  column's weights (half of each block; with one compute row the halves are joined in the memory tile, with
  several each channel's block is split to its own rows); x then takes the shim of a column the design leaves
  free, or, with ``x_rides``, is sent once, whole, ahead of column 0's first weight stream and stays resident in
  every worker. One channel per column caps a bf16 GEMV at 8 channels' rate (~50 GB/s modeled), below the DDR's;
  two on several compute rows reach the DDR bound.
- each worker holds an (M, tile_m) output object while it streams K / tile_k weight and x chunks,
  accumulating in an fp32 scratch accumulator and rounding once to bf16; several rows are joined in
  the column's memory tile and drained through the column's shim.

Numerics: bf16 operands (variant "bfp16": both operands quantized in blocks of 8 along K, the AIE2P
block-FP16 mode), exact fp32 partial sums per call, fp32 accumulation across K, one bf16 rounding.
Production fast path (exact=False): one ``torch.nn.functional.linear`` on bf16 (fp32 accumulation
inside, one rounding), within one bf16 ulp of the exact path on a small fraction of elements.

AIR's registry (npu2_kernel_measurements.json) writes GEMV tiles as "herd_m/tile_m/m_input"; here
``cols`` is herd_m and ``tile_m`` is m_input (rows per kernel call). ``from_air_tile`` maps one onto
the other for calibration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from math import prod
from typing import Any

import torch

from tilepilot.kernels import rmsnorm, rope, swiglu
from tilepilot.kernels.rmsnorm import normalize_rows
from tilepilot.kernels.swiglu import silu_mul
from tilepilot.npu import numerics as nx
from tilepilot.npu.design import (
    Acquire,
    Call,
    Design,
    Op,
    Release,
    Runtime,
    TensorAccessPattern,
    TensorSpec,
    Tile,
    TileKernel,
    Worker,
    dtype_bytes,
    join,
    split,
)
from tilepilot.npu.design import ObjectFifo as Fifo
from tilepilot.npu.device import FIRST_COMPUTE_ROW, MEM_ROW, SHIM_ROW, Device, npu2
from tilepilot.npu.validate import (
    CORE_STACK_BYTES,
    TAP_MAX_DIMS,
    TAP_MAX_REPEAT,
    TAP_MAX_SIZE,
    WORD_BYTES,
    DesignError,
    Violation,
    legal_taps,
    tap_problems,
)
from tilepilot.oracle.ops import linear
from tilepilot.oracle.ops import rmsnorm as rms_reference

FAMILY = "gemv"
VARIANTS = ("vector", "scalar", "bfp16")
# Tokens one GEMV design handles; more rows are a GEMM (prefill), not a matrix-vector product.
MAX_TOKENS = 16
# Rows per kernel call the candidates try (AIR's registry uses m_input 1..16).
TILE_M_CHOICES = (32, 16, 8, 4, 2)
# K per call must be a multiple of the vector width (32 bf16 lanes of a 512-bit register, AM027); block-FP16
# also needs blocks of 8 (numerics.BFP16_BLOCK), which 32 covers.
K_GRANULE = 32
# A deliberately degraded accumulator, kept so the accuracy gates can be shown to catch a real kernel mistake
# (tests/gates/test_kl_gate.py): a scalar loop adding each product to its bf16 output, so every running sum is
# rounded to bf16 (numerics: bf16 accumulation with a K chunk of 1). Never a tuner candidate, never a default.
SERIAL_BF16 = "bf16_serial"
ACCUMULATORS = (*nx.ACCUMULATORS, SERIAL_BF16)


@dataclass(frozen=True)
class Shape:
    """``parts``: a multi-matrix launch (matrices reading the same x, e.g. Q/K/V), each matrix's output rows, summing
    to ``n``; empty = one matrix (tensors ``w``/``y``; with parts ``w0``.. / ``y0``..). ``norm_eps``, ``residual``,
    ``gated``, ``rope_dim``: an RMSNorm prologue, a residual-add, SwiGLU or RoPE epilogue folded into the launch, as
    the quantized GEMV's (``kernels/qgemv.py``; the same dataflow, the same helpers below, so a bf16 decode saves the
    same launches)."""

    n: int  # output features (rows of W in Hugging Face [out, in] layout)
    k: int  # input features
    m: int = 1  # tokens
    parts: tuple[int, ...] = ()
    norm_eps: float | None = None
    residual: bool = False
    gated: bool = False
    rope_dim: int = 0
    rope_parts: int = 0

    def matrices(self) -> tuple[int, ...]:
        return self.parts or (self.n,)


def tensor_names(shape: Any) -> list[tuple[str, str]]:
    """(weight input, output) DDR tensor names of each matrix of a matrix-vector launch (gemv, qgemv), in order."""
    if not shape.parts:
        return [("w", "y")]
    return [(f"w{j}", f"y{j}") for j in range(len(shape.parts))]


def check_parts(shape: Any, rows_per_block: int, err: Callable[[str], DesignError]) -> None:
    """Every matrix of the launch splits into ``rows_per_block`` (columns x compute rows x tile_m) row blocks."""
    if shape.parts and (sum(shape.parts) != shape.n or min(shape.parts) < 1 or len(shape.parts) < 2):
        raise err(f"parts {shape.parts} must be two or more matrices whose rows sum to N={shape.n}")
    for n in shape.matrices():
        if n % rows_per_block:
            raise err(f"N={n} does not split into blocks of {rows_per_block} rows (columns x rows x tile_m)")


@dataclass(frozen=True)
class Config:
    cols: int = 8
    rows: int = 1
    tile_m: int = 8
    tile_k: int = 1024
    variant: str = "vector"
    depth: int = 2
    # "bf16": partial sums accumulate in the bf16 output block (rounded after every K chunk), the cheaper kernel
    # that loses accuracy with K; the default fp32 scratch accumulator rounds once; SERIAL_BF16 rounds after every
    # product (the degraded kernel of the gates' tests).
    acc: str = "fp32"
    # The weight feed, as the quantized GEMV's (``qgemv.Config``): 1 = one shim MM2S channel per column; 2 = both
    # channels of every column carry half of each weight block, with x on the shim of a column the design leaves
    # free, or, on every column, riding column 0's first weight channel and resident in every worker (``x_rides``,
    # ``Tiling.x_rides``). One channel per column caps a bf16 GEMV at 8 channels' rate.
    weight_channels: int = 1
    x_rides: bool = False

    def tiling(self) -> Tiling:
        return Tiling(self.cols, self.rows, self.tile_m, self.tile_k, self.depth, self.weight_channels, 0, self.x_rides)


def _err(message: str) -> DesignError:
    return DesignError([Violation("SHAPE_NOT_TILING", None, message)], "gemv")


def l1_bytes(shape: Shape, config: Config) -> int:
    """Compute-tile memory one worker needs: W chunk x depth, x chunk and y block double-buffered, fp32 acc, stack;
    a resident x with what rides in it, the normed copy of a prologue and the gate rows a gated launch keeps."""
    tm, tk, m = config.tile_m, config.tile_k, shape.m
    acc = 4 * m * tm if config.acc == "fp32" else 0
    x = prod(x_object(shape)) if config.x_rides else 2 * m * tk  # resident whole x (+ g, r), or a double-buffered chunk
    y = rope_output_bytes(shape, config.tiling())  # a roped worker's output buffers beyond the double buffer
    fold = _fold_local_bytes(shape, config)
    return 2 * (config.depth * tm * tk + x + 2 * m * tm) + y + acc + fold + CORE_STACK_BYTES


def _fold_local_bytes(shape: Shape, config: Config) -> int:
    """L1 the folds add to a worker's scratch: the normed x of a prologue, the kept gate rows of a gated launch, a
    roped launch's held blocks and table columns."""
    gate = 2 * shape.m * config.tile_m * gate_blocks(shape, rows_per_iteration(config))
    return prenorm_local_bytes(shape) + gate + rope_local_bytes(shape, config.tiling())


def rows_per_iteration(config: Config) -> int:
    return config.tiling().rows_per_iteration()


def rows_per_worker(shape: Shape, config: Config) -> int:
    return shape.n // (config.cols * config.rows)


def _check(shape: Shape, config: Config, device: Device) -> None:
    if config.variant not in VARIANTS:
        raise _err(f"variant {config.variant!r} is unknown; use one of {VARIANTS}")
    if config.acc not in ACCUMULATORS:
        raise _err(f"accumulator {config.acc!r} is unknown; use one of {ACCUMULATORS}")
    if min(shape.n, shape.k, shape.m) < 1:
        raise _err(f"shape {shape} has an empty dimension")
    if shape.m > MAX_TOKENS:
        raise _err(f"a GEMV handles at most {MAX_TOKENS} tokens, got M={shape.m}; use the gemm family")
    if not 1 <= config.rows <= device.compute_rows or not 1 <= config.cols <= device.columns:
        raise _err(f"{config.rows} x {config.cols} tiles do not fit {device.name}")
    if config.depth < 1 or config.tile_m < 1 or config.tile_k < 1:
        raise _err(f"config {config} has a non-positive tile size or depth")
    check_feed(config.weight_channels, config.x_rides, config.cols, config.rows, config.tile_m, device, _err)
    check_parts(shape, config.cols * config.rows * config.tile_m, _err)
    check_folds(shape, config.tiling(), _err)
    if folds(shape) and config.acc != "fp32":
        raise _err("a launch with a folded op accumulates in fp32 (acc='fp32'): its epilogue reads the finished rows")
    if shape.k % config.tile_k or config.tile_k % K_GRANULE:
        raise _err(
            f"K={shape.k} is not a whole number of {config.tile_k}-element chunks, or the chunk is not a multiple "
            f"of {K_GRANULE}; pick a chunk that divides K"
        )


def folds(shape: Any) -> bool:
    """Whether the launch needs a resident x: something rides in it (a prologue's norm weight, an epilogue's
    residual or RoPE table), or its workers keep state across blocks (a gated launch's gate rows)."""
    return prenormed(shape) or with_residual(shape) or gated(shape) or roped(shape)


def check_folds(shape: Any, t: Tiling, err: Callable[[str], DesignError]) -> None:
    """The rules of the ops a matrix-vector launch may fold (gemv and qgemv alike): each needs a resident x; a SwiGLU
    gates the second of two equal matrices and takes no residual; a residual adds to one matrix's outputs; a RoPE
    epilogue (``rope_blocks``) rotates whole heads of its first ``rope_parts`` matrices, with no other epilogue."""
    if folds(shape) and not t.x_rides:
        raise err("an RMSNorm prologue or a residual, SwiGLU or RoPE epilogue needs a resident x: x_rides (2 channels)")
    if gated(shape) and (len(shape.parts) != 2 or shape.parts[0] != shape.parts[1] or with_residual(shape)):
        raise err("a SwiGLU epilogue gates the second of two equal matrices (gate, up) and takes no residual")
    if with_residual(shape) and shape.parts:
        raise err("a residual epilogue adds to one matrix's outputs; a multi-matrix launch cannot take one")
    if roped(shape):
        _check_rope(shape, t, err)


# A head's blocks a worker may hold and write at once: its output fifo's depth (each buffer a BD and a lock pair of its
# tile); more is refused rather than left to fail the tile's budgets late.
ROPE_MAX_HEAD_BLOCKS = 4


def roped(shape: Any) -> bool:
    """Whether the launch rotates its first ``rope_parts`` matrices' outputs (``Shape.rope_dim``, the head size: the
    RoPE launch as its epilogue)."""
    return bool(getattr(shape, "rope_dim", 0))


def _check_rope(shape: Any, t: Tiling, err: Callable[[str], DesignError]) -> None:
    d, mats = shape.rope_dim, shape.matrices()
    if d % 2 or not 1 <= shape.rope_parts <= len(mats) or with_residual(shape) or gated(shape):
        raise err(f"a RoPE epilogue rotates 1..{len(mats)} matrices' heads of an even size, with no other epilogue")
    if t.tile_m0:
        raise err("a RoPE epilogue needs an even row split (tile_m0 = 0): every worker holds the same rows of a head")
    block = t.rows * t.tile_m
    if (d // 2) % block:
        raise err(
            f"a RoPE epilogue needs a column's rows per call ({t.rows} x {t.tile_m}) to divide half a head ({d // 2}): "
            "each worker then computes both rows of each pair it rotates; pick tile_m or rows to suit"
        )
    for n in mats[: shape.rope_parts]:
        if n % (d * t.cols):
            raise err(f"a RoPE epilogue needs whole heads of {d} rows per column; N={n} over {t.cols} columns is not")
    if rope_head_blocks(shape, t) > ROPE_MAX_HEAD_BLOCKS:
        raise err(
            f"a RoPE epilogue writes a head's {rope_head_blocks(shape, t)} blocks at once, more than the "
            f"{ROPE_MAX_HEAD_BLOCKS} objects a worker's output fifo holds here; use more rows per call"
        )


def block_writes(shape: Any, t: Tiling) -> list[int]:
    """Output objects a worker writes after each of its blocks (one per block of rows per iteration, matrices in
    order): 1; none for a gated launch's gate blocks (kept, ``gate_blocks``); for a rotated matrix (``roped``) none
    until the last block of each head, then all the head's blocks, rotated (``rope_blocks``)."""
    total = t.rows_per_iteration()
    its = [n // total for n in shape.matrices()]
    quiet = gate_blocks(shape, total)
    out = [0 if b < quiet else 1 for b in range(sum(its))]
    if roped(shape):
        per_head = rope_head_blocks(shape, t)
        for b in range(rope_blocks(shape, t)):
            out[b] = per_head if b % per_head == per_head - 1 else 0
    return out


def rope_parts(shape: Any) -> int:
    """How many of the launch's first matrices its RoPE epilogue rotates (0: none)."""
    return shape.rope_parts if roped(shape) else 0


def rope_head_blocks(shape: Any, t: Tiling) -> int:
    """A column's blocks per head of a rotated matrix: the output objects a worker writes at once."""
    return shape.rope_dim // (t.rows * t.tile_m)


def rope_blocks(shape: Any, t: Tiling) -> int:
    """Blocks of the rotated matrices (the first ``rope_parts``), which a worker holds until the last block of each
    head: a column owns whole heads and makes ``rows * tile_m`` rows of them per block, a divisor of half a head, so
    each of its workers makes rows i of a head's first half and i + head_dim/2 of its second, the pairs RoPE rotates
    together, in two blocks half a head apart."""
    return sum(n // t.rows_per_iteration() for n in shape.matrices()[: shape.rope_parts]) if roped(shape) else 0


def rope_frequencies(shape: Any, t: Tiling, row: int) -> list[int]:
    """The frequencies (first-half rows of a head) of the pairs the worker at compute row ``row`` rotates, in the
    order of its held blocks."""
    block, tm = t.rows * t.tile_m, t.tile_m
    return [i * block + row * tm + j for i in range(shape.rope_dim // 2 // block) for j in range(tm)]


def rope_table(x: torch.Tensor, shape: Any, freqs: list[int]) -> torch.Tensor:
    """A worker's columns of the RoPE table riding in x's object (``x_object``): [cos | sin] of its frequencies."""
    m, k, d = shape.m, shape.k, shape.rope_dim
    start = m * k + prenormed(shape) * k
    cs = x.view(-1)[start : start + m * d].view(m, d)
    idx = torch.tensor(freqs)
    return torch.cat((cs[:, idx], cs[:, d // 2 + idx]), dim=1)


def rope_local_bytes(shape: Any, t: Tiling) -> int:
    """A roped worker's scratch: a head's blocks until its last, and its columns of the table."""
    return 2 * 2 * shape.m * t.tile_m * rope_head_blocks(shape, t) if roped(shape) else 0


def rope_output_bytes(shape: Any, t: Tiling) -> int:
    """The output fifo's buffers a roped worker holds beyond the double buffer (a head's objects at once): L1 the
    validator counts with the fifo, not with the worker's scratch."""
    return 2 * shape.m * t.tile_m * max(rope_head_blocks(shape, t) - 2, 0) if roped(shape) else 0


def x_must_ride(cols: int, channels: int, device: Device) -> bool:
    """Whether x must ride a weight channel (``Tiling.x_rides``): a dual-channel feed on every column leaves no
    free column's shim for it."""
    return channels == 2 and cols == device.columns


def check_feed(
    channels: int,
    x_rides: bool,
    cols: int,
    rows: int,
    tile_m: int,
    device: Device,
    err: Callable[[str], DesignError],
    tile_m0: int = 0,
) -> None:
    """The weight-feed rules every matrix-vector family shares (``Tiling``): 1 or 2 shim MM2S channels per column;
    a resident x rides a weight channel of a dual-channel feed; otherwise two channels need a free column's shim
    for x, except in an uneven split (``tile_m0``), whose x takes column 0's second channel and whose other
    columns feed both; each channel carries whole rows, and the compute rows share the channels evenly."""
    if channels not in (1, 2):
        raise err(f"weight_channels must be 1 or 2, got {channels}")
    if tile_m0:
        if x_rides:
            raise err("an uneven split keeps x on column 0's second channel; it cannot also ride a weight channel")
        if channels != 2 or cols < 2 or tile_m0 % 2 or tile_m % 2:
            raise err("an uneven split feeds columns 1.. on both channels (weight_channels 2, cols >= 2, even tiles)")
    elif x_rides:
        if channels != 2 or (rows * tile_m) % 2:
            raise err("a resident x rides a weight channel of a dual-channel feed (weight_channels 2, even tile_m)")
    elif channels == 2 and (cols >= device.columns or (rows * tile_m) % 2):
        raise err("two weight channels per column need a free column's shim for x (or x_rides) and an even tile_m")
    if rows > 1 and rows % channels:
        raise err(f"{rows} compute rows do not share {channels} weight channels evenly")


def _numerics(config: Config) -> nx.Numerics:
    operands = "bfp16" if config.variant == "bfp16" else "bf16"
    points = ("operands:bfp16",) if operands == "bfp16" else ()
    if config.acc == SERIAL_BF16:
        return nx.Numerics(operands, "bf16", 1, "bf16", points + ("partial_sum:bf16 (every product)", "output:bf16"))
    points += ("partial_sum:bf16",) if config.acc == "bf16" else ("accumulate:fp32",)
    return nx.Numerics(operands, config.acc, config.tile_k, "bf16", points + ("output:bf16",))


def _serial_sum(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, operands: str) -> torch.Tensor:
    """``y + x @ w^T`` adding one product at a time to the bf16 running sum ``y``, each new sum rounded (SERIAL_BF16).

    Products of bf16 (or bfp16) values are exact in fp32; the sum is rounded as ``nx.accumulate`` does. The tile
    path calls it per K chunk with the running output, the fast path once over all of K: the same additions in
    the same order, so the two agree bit for bit (bfp16 blocks of 8 never straddle a chunk of 32)."""
    if operands == "bfp16":
        x, w = nx.quantize_bfp16(x, -1), nx.quantize_bfp16(w, -1)
    xs = x.to(torch.float32)
    for k0 in range(0, x.shape[-1], K_GRANULE):
        cols = w[:, k0 : k0 + K_GRANULE].t().to(torch.float32)  # [<=32, N], contiguous rows of W's columns
        for j in range(cols.shape[0]):
            y = nx.accumulate(y, xs[..., k0 + j : k0 + j + 1] * cols[j], "bf16")
    return y


def _kernel(shape: Shape, config: Config) -> TileKernel:
    operands = "bfp16" if config.variant == "bfp16" else "bf16"

    def matvec_tile(ins: list[torch.Tensor], outs: list[torch.Tensor], ctx) -> None:
        w, x = ins[:2]
        x = x_chunk(resident_x(x, shape, ctx), tk, ctx.step)  # a resident x is read chunk by chunk (Tiling.x_rides)
        if folds(shape):  # fp32 accumulation (_check), then the epilogue on the finished rows
            if ctx.first:
                ctx.scratch["acc"] = torch.zeros((m, tm), dtype=torch.float32)
            ctx.scratch["acc"] = nx.accumulate(ctx.scratch["acc"], nx.chunk_partial(x, w, operands), "fp32")
            if ctx.last:
                epilogue(nx.finish(ctx.scratch["acc"], "bf16"), ins, outs, ctx, shape, quiet)
            return
        (y,) = outs
        if config.acc == SERIAL_BF16:
            y.copy_(_serial_sum(torch.zeros_like(y) if ctx.first else y, x, w, operands))
            return
        partial = nx.chunk_partial(x, w, operands)
        if config.acc == "bf16":
            if ctx.first:
                y.zero_()
            y.copy_(nx.accumulate(y, partial, "bf16"))
            return
        if ctx.first:
            ctx.scratch["acc"] = torch.zeros(y.shape, dtype=torch.float32)
        ctx.scratch["acc"] = nx.accumulate(ctx.scratch["acc"], partial, "fp32")
        if ctx.last:
            y.copy_(nx.finish(ctx.scratch["acc"], "bf16"))

    tm, tk, m = config.tile_m, config.tile_k, shape.m
    quiet = gate_blocks(shape, rows_per_iteration(config))
    suffix = {"bf16": "_bf16acc", SERIAL_BF16: "_bf16serial"}.get(config.acc, "")
    return TileKernel(
        name=f"matvec_{config.variant}_{tm}x{tk}{suffix}",
        fn=matvec_tile,
        variant=config.variant,
        macs_per_call=m * tm * tk,
        vector_ops_per_call=epilogue_ops(shape, m * tm),
        bytes_per_call=2 * (tm * tk + m * tk) + (4 * m * tm if config.acc == "fp32" else 0),
        params=kernel_params(shape, config.tiling(), tm),
    )


def kernel_params(shape: Any, t: Tiling, tile_m: int) -> dict[str, Any]:
    """What a matrix-vector worker's kernel reads of its launch (gemv and qgemv alike): its rows and chunk per call,
    the shape, and where its folds' data sit (``residual_rows``, ``epilogue``)."""
    return {
        "tile_m": tile_m,
        "tile_k": t.tile_k,
        "m": shape.m,
        "k": shape.k,
        "n": shape.n,
        "normed": int(prenormed(shape)),
        "rope_blocks": rope_blocks(shape, t),
    }


def epilogue(out: torch.Tensor, ins: list[torch.Tensor], outs: list[torch.Tensor], ctx, shape: Any, quiet: int) -> None:
    """Write a finished (m, tile_m) block of a launch with folded ops (gemv and qgemv alike): a gated launch keeps a
    gate block (it has no output object) until the up block of the same rows, then writes silu(gate) * up; a
    residual launch adds its rows of the residual (``ins[2]``, riding in x: ``residual_rows``); a roped launch keeps
    a rotated matrix's blocks until the head's last, then rotates them with its table columns (``ins[2]``:
    ``rope_table``) by the RoPE kernel's arithmetic (``rope.rotate_rows``, element by element: the worker's pairs
    rotated together are the whole head's) and writes them in order."""
    if roped(shape) and ctx.iteration < ctx.params["rope_blocks"]:
        held = ctx.scratch.setdefault("held", [])
        held.append(out)
        if outs:  # the head's last block: rotate the worker's rows of the head as one (``rope_blocks``), write all
            ctx.scratch["held"] = []
            head = torch.cat(held, dim=1)  # first-half rows, then their partners, in frequency order
            rotated = rope.rotate_rows(head, ins[2], head.shape[1])
            for o, piece in zip(outs, rotated.split(out.shape[1], dim=1), strict=True):
                o.copy_(piece)
        return
    if gated(shape) and not outs:
        ctx.scratch.setdefault("gate", {})[ctx.iteration] = out
        return
    if gated(shape):
        out = silu_mul(ctx.scratch["gate"].pop(ctx.iteration - quiet), out, exact=True)
    elif with_residual(shape):
        out = add_residual(out, ins[2])
    outs[0].copy_(out)


def epilogue_ops(shape: Any, outputs: int) -> int:
    """Vector ops of a call's epilogue on its ``outputs`` elements, charged every call (an upper bound)."""
    if roped(shape):
        return outputs * rope.OPS_PER_ELEMENT
    return outputs * (swiglu.OPS_PER_ELEMENT if gated(shape) else int(with_residual(shape)))


# ----------------------------------------------------------------------------------------------------------------------
# access patterns
# ----------------------------------------------------------------------------------------------------------------------
def _largest_divisor(n: int, limit: int, multiple: int = 1) -> int:
    """Largest d <= limit dividing n with d % multiple == 0 (1 if none besides, when multiple == 1)."""
    for d in range(min(n, limit), 0, -1):
        if n % d == 0 and d % multiple == 0:
            return d
    return 0


def stream_taps(
    tensor_shape: tuple[int, ...], offset: int, sizes: list[int], strides: list[int], dtype: str = "bf16"
) -> list[TensorAccessPattern]:
    """A loop nest over a DDR tensor as few hardware-legal 4-D patterns as possible, in the same element order.

    Contiguous dimensions are merged, a long contiguous run is factored into dimensions within the DMA's
    limits, and the outermost dimension becomes the repeat dimension (which alone may have stride 0, e.g.
    x re-sent for every block of rows); a repeat count above the hardware's is split into consecutive
    patterns. Anything this cannot express falls back to the validator's generic ``legal_taps``.
    """
    dims = [(s, st) for s, st in zip(sizes, strides, strict=True) if s != 1]
    merged: list[tuple[int, int]] = []
    for s, st in reversed(dims):
        if merged and st != 0 and st == merged[-1][0] * merged[-1][1]:
            s0, st0 = merged.pop()
            merged.append((s * s0, st0))
        else:
            merged.append((s, st))
    dims = list(reversed(merged)) or [(1, 1)]
    eb = dtype_bytes(dtype)
    s0, st0 = dims[-1]
    if st0 == 1:
        max_inner = int(TAP_MAX_SIZE * WORD_BYTES / eb)
        if s0 > max_inner:
            words = max(1, int(WORD_BYTES / eb)) if eb < WORD_BYTES else 1
            b = _largest_divisor(s0, max_inner, words)
            if b:
                run = [(b, 1)]
                rest = s0 // b
                while rest > TAP_MAX_SIZE and len(dims) - 1 + len(run) + 1 < TAP_MAX_DIMS:
                    d = _largest_divisor(rest, TAP_MAX_SIZE)
                    if d <= 1:
                        break
                    run.insert(0, (d, run[0][0] * run[0][1]))
                    rest //= d
                run.insert(0, (rest, run[0][0] * run[0][1]))
                dims = dims[:-1] + run
    if len(dims) > TAP_MAX_DIMS:
        return legal_taps(tensor_shape, offset, [s for s, _ in dims], [st for _, st in dims], dtype)
    outer = dims[0]
    if len(dims) < TAP_MAX_DIMS and (outer[1] == 0 or outer[0] > TAP_MAX_SIZE):
        dims = [outer] + [(1, 0)] * (TAP_MAX_DIMS - len(dims)) + dims[1:]
    taps: list[TensorAccessPattern] = []
    if len(dims) == TAP_MAX_DIMS and dims[0][0] > TAP_MAX_REPEAT:
        size, stride = dims[0]
        for start in range(0, size, TAP_MAX_REPEAT):
            chunk = min(TAP_MAX_REPEAT, size - start)
            taps.append(
                TensorAccessPattern(
                    tensor_shape,
                    offset + start * stride,
                    (chunk,) + tuple(s for s, _ in dims[1:]),
                    (stride,) + tuple(st for _, st in dims[1:]),
                )
            )
    else:
        taps.append(TensorAccessPattern(tensor_shape, offset, tuple(s for s, _ in dims), tuple(st for _, st in dims)))
    if any(tap_problems(t, dtype) for t in taps):
        return legal_taps(tensor_shape, offset, list(sizes), list(strides), dtype)
    return taps


# ----------------------------------------------------------------------------------------------------------------------
# the design
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WeightStream:
    """How a matrix-vector family's weights sit in DDR and travel to the tiles: ``dtype`` of the weight stream,
    ``row`` elements per weight row in DDR and ``chunk`` elements of a row per kernel call (bf16: K and tile_k;
    packed blocks: the row's and the chunk's bytes)."""

    dtype: str
    row: int
    chunk: int


@dataclass(frozen=True)
class Tiling:
    """The tiling every matrix-vector design shares (see the module docstring): ``cols`` x ``rows`` workers,
    ``tile_m`` output rows x ``tile_k`` of K per call, weight fifos ``depth`` deep, the weights of a column on
    ``channels`` shim MM2S channels (2: a free column's shim carries x, so ``cols`` < the device's columns).

    ``tile_m0`` > 0: an uneven, channel-proportional row split: column 0's second shim channel carries x, so its
    weights ride one channel and its workers take ``tile_m0`` rows per call, while every other column feeds both
    channels with ``tile_m`` rows per worker; with 8 columns the weights stream on 15 shim channels.

    ``x_rides``: x is sent once per launch, whole, ahead of column 0's first weight stream on that stream's shim
    channel (``ObjectFifo.rides_with``), and stays in every worker's memory for the launch (``resident_x_program``),
    so every column of the array can feed weights on both channels: 16 weight channels on 8 columns. AIR's fused
    decode does the same for its projections: x resident in each core, sent once, the shims carrying weights
    (``proj_qmm_acc`` reads block j of its resident x). x must arrive whole before the weights behind it move,
    which its one whole-x object guarantees (an x re-sent per block on a shared channel could block the weights the
    workers wait for)."""

    cols: int
    rows: int
    tile_m: int
    tile_k: int
    depth: int
    channels: int = 1
    tile_m0: int = 0
    x_rides: bool = False

    def column(self, c: int) -> tuple[int, int]:
        """(weight channels, rows per worker and call) of column ``c``."""
        if self.tile_m0 and c == 0:
            return 1, self.tile_m0
        return self.channels, self.tile_m

    def rows_per_iteration(self) -> int:
        """Output rows all columns produce per iteration: every matrix of a launch is a whole number of these."""
        return sum(self.rows * self.column(c)[1] for c in range(self.cols))


def matvec_dataflow(
    shape: Any,
    t: Tiling,
    stream: WeightStream,
    kernel: Callable[[int], TileKernel],
    worker: str,
    local_bytes: Callable[[int], int],
    device: Device,
) -> tuple[list[Fifo], list, list[Worker], Runtime]:
    """Fifos, links, workers and runtime of a matrix-vector design, for every family that streams a weight matrix
    past one x broadcast (gemv over bf16 rows, qgemv over packed blocks: ``stream`` says which).

    Column c owns rows [c*N_j/cols, (c+1)*N_j/cols) of each matrix j of the launch (``shape.parts``) and its
    workers run them one matrix after the other; per call a column streams a (rows*tile_m, chunk) block over
    ``channels`` shim channels (two: half the rows each, joined in the memory tile), split by the memory tile into
    one (tile_m, chunk) object per compute row; x is re-sent for every output block; outputs are joined per column
    and drained to each matrix's own output tensor. The tasks come in runs of at most TAP_MAX_REPEAT output blocks
    of one matrix (every stream of a run is one or two patterns), and runs share a task group while every shim's
    buffer descriptors hold them (``Runtime.packed``): each group boundary drains the pipeline.
    ``kernel(tile_m)`` and ``local_bytes(tile_m)`` give a worker's kernel and local memory for its rows per call
    (columns differ under an uneven split, ``Tiling.tile_m0``); a column's rows of a matrix are contiguous."""
    cols, rows, tk, depth, m, k = t.cols, t.rows, t.tile_k, t.depth, shape.m, shape.k
    cb, rb = stream.chunk, stream.row
    ksteps = k // tk
    total = t.rows_per_iteration()
    blocks = [rows * t.column(c)[1] for c in range(cols)]  # output rows column c produces per iteration
    starts = [sum(blocks[:c]) for c in range(cols)]
    iters = sum(nj // total for nj in shape.matrices())
    normed, res, gate = prenormed(shape), with_residual(shape), gated(shape)
    writes = block_writes(shape, t)
    y_depth = max(2, *writes)  # a roped worker writes a head's blocks at once
    if t.x_rides:  # x whole, once, on column 0's first weight channel (Tiling.x_rides), with what rides in it
        x = Fifo(
            "x", x_object(shape), "bf16", 1, shim_placement=Tile(0, SHIM_ROW), rides_with="w_0_0", role=f"{worker}.x"
        )
        fifos: list[Fifo] = [x]
    else:
        x_col = cols if t.channels == 2 and not t.tile_m0 else 0
        fifos = [Fifo("x", (m, tk), "bf16", 2, shim_placement=Tile(x_col, SHIM_ROW))]
    calls = iters * ksteps
    workers: list[Worker] = []
    links = []
    for c in range(cols):
        ch, tm = t.column(c)
        block = blocks[c]
        sub = block // ch  # weight rows each shim channel carries per call
        shim, mem = Tile(c, SHIM_ROW), Tile(c, MEM_ROW)
        w_names = [f"w_{c}_{j}" for j in range(ch)]
        fifos += [Fifo(name, (sub, cb), stream.dtype, depth, shim_placement=shim) for name in w_names]
        if rows == 1:
            w_in = [w_names[0]]
            if ch == 2:  # both shim MM2S channels feed the column's memory tile, which joins the halves
                w_in = [f"w_{c}"]
                fifos.append(Fifo(w_in[0], (tm, cb), stream.dtype, depth))
                links.append(join(f"w_join_{c}", w_names, w_in[0], [0, sub * cb], mem))
            y_out = [f"y_{c}"]
            fifos.append(Fifo(y_out[0], (m, tm), "bf16", y_depth, shim_placement=shim))
        else:  # each channel's block is split in the memory tile, one (tile_m, chunk) object per compute row
            per = rows // ch
            w_in = [f"w_{c}_{j}_{r}" for j in range(ch) for r in range(per)]
            fifos += [Fifo(name, (tm, cb), stream.dtype, depth) for name in w_in]
            for j in range(ch):
                dsts = w_in[j * per : (j + 1) * per]
                links.append(split(f"w_split_{c}_{j}", w_names[j], dsts, [r * tm * cb for r in range(per)], mem))
            y_out = [f"y_{c}_{r}" for r in range(rows)]
            fifos += [Fifo(name, (m, tm), "bf16", y_depth) for name in y_out]
            fifos.append(Fifo(f"y_l2_{c}", (rows, m, tm), "bf16", 2, shim_placement=shim))
            links.append(join(f"y_join_{c}", y_out, f"y_l2_{c}", [r * m * tm for r in range(rows)], mem))
        for r in range(rows):
            if t.x_rides:  # one loop over every block and K chunk, x held throughout (resident_x_program)
                first_row = _block_rows(shape, total, starts[c], blocks[c], r * tm) if res else None
                freqs = rope_frequencies(shape, t, r) if roped(shape) else None
                program = resident_x_program(iters, ksteps, first_row, writes=writes, rope=freqs and (shape, freqs))
                loop = dict(iterations=1, calls_per_iteration=calls, program=program,
                            acquires={w_in[r]: calls, "x": 1, y_out[r]: sum(writes)})  # fmt: skip
            else:
                loop = dict(iterations=iters, calls_per_iteration=ksteps,
                            acquires={w_in[r]: ksteps, "x": ksteps, y_out[r]: 1})  # fmt: skip
            workers.append(
                Worker(
                    name=f"{worker}_{r}_{c}",
                    kernel=kernel(tm),
                    inputs=(w_in[r], "x"),
                    outputs=(y_out[r],),
                    placement=Tile(c, FIRST_COMPUTE_ROW + r),
                    local_bytes=local_bytes(tm),
                    **loop,
                )
            )
    runs: list[list[tuple[str, str, str, Any]]] = []  # one unit of tasks per run of output blocks
    for j_mat, (nj, (w_t, y_t)) in enumerate(zip(shape.matrices(), tensor_names(shape), strict=True)):
        its = nj // total  # iterations of this matrix: every column produces blocks[c] of its rows in each
        y_t = "y" if gate else y_t  # a gated launch writes silu(first) * second, at the second's blocks
        # a rotated matrix's runs end at head boundaries: a head's blocks drain together, after its last block's
        # weights, which a later task group (after this one's drains) would never bring
        per_head = rope_head_blocks(shape, t) if j_mat < rope_parts(shape) else 1
        step = TAP_MAX_REPEAT // per_head * per_head
        for i0 in range(0, its, step):
            nb = min(step, its - i0)
            run: list[tuple[str, str, str, Any]] = []
            # x is re-sent for every output block (the broadcast delivers each object to every worker), or sent
            # whole once, first, when it rides a weight channel
            if not t.x_rides:
                run += [("fill", "x", "x", tap) for tap in stream_taps((m, k), 0, [nb, ksteps, m, tk], [0, tk, k, 1])]
            elif not runs:
                run += [("fill", "x", "x", tap) for tap in stream_taps((m, k), 0, [m, k], [k, 1])]
                if normed:  # the same object's next k elements, from the norm weight: one BD chain on x's channel
                    run += [("fill", "x", "g", tap) for tap in stream_taps((k,), 0, [k], [1])]
                if roped(shape):  # then the RoPE table of the tokens' positions
                    d = shape.rope_dim
                    run += [("fill", "x", "cs", tap) for tap in stream_taps((m, d), 0, [m, d], [d, 1])]
                if res:  # then the residual the outputs are added to
                    n = shape.n
                    run += [("fill", "x", "r", tap) for tap in stream_taps((m, n), 0, [m, n], [n, 1])]
            for c in range(cols):
                (ch, tm), block = t.column(c), blocks[c]
                sub = block // ch
                row0 = its * starts[c] + i0 * block  # column c's first row of this run
                for j in range(ch):
                    w_off = (row0 + j * sub) * rb
                    taps = stream_taps((nj, rb), w_off, [nb, ksteps, sub, cb], [block * rb, cb, rb, 1], stream.dtype)
                    run += [("fill", f"w_{c}_{j}", w_t, tap) for tap in taps]
                y_fifo = f"y_{c}" if rows == 1 else f"y_l2_{c}"
                run += [
                    ("drain", y_fifo, y_t, tap)
                    for tap in stream_taps((m, nj), row0, [nb, rows, m, tm], [block, tm, nj, 1])
                    if not (gate and j_mat == 0)
                ]
            runs.append(run)
    rt = Runtime.packed([runs], device.shim.bds, {f.name: f.shim_placement for f in fifos})
    return fifos, links, workers, rt


def resident_x_program(
    blocks: int,
    ksteps: int,
    first_row: Callable[[int], int] | None = None,
    quiet: int = 0,
    writes: Sequence[int] | None = None,
    rope: tuple[Any, list[int]] | None = None,
) -> Callable[[Worker], Iterator[Op]]:
    """A matrix-vector worker's program when x stays resident (``Tiling.x_rides``): acquire the whole x once, then
    for each of ``blocks`` output blocks hold its output objects while ``ksteps`` weight chunks stream past; each
    call is step k of ``ksteps`` of block b (the kernel reads chunk k of x, ``x_chunk``). ``first_row(b)``: the
    block's first output row, for a launch whose residual rides in x's object: each call also gets the worker's
    rows of the residual (``residual_rows``). ``writes[b]``: the output objects block b writes (``block_writes``;
    default one, none for the first ``quiet``): a gated launch keeps its gate blocks in the worker (``Shape.gated``)
    and writes silu of each times the matching later block; a roped one (``rope``: the shape and the worker's
    frequencies) writes a head's blocks after its last, whose calls also get the worker's table columns."""
    writes = writes if writes is not None else [0 if b < quiet else 1 for b in range(blocks)]

    def program(w: Worker) -> Iterator[Op]:
        wf, xf = w.inputs
        (yf,) = w.outputs
        (x,) = yield Acquire(xf, 1)
        table = rope_table(x, *rope) if rope is not None else None
        for b in range(blocks):
            ys = tuple((yield Acquire(yf, writes[b]))) if writes[b] else ()
            extra = () if first_row is None else (residual_rows(x, w.kernel.params, first_row(b)),)
            extra += (table,) if table is not None and ys and b < w.kernel.params.get("rope_blocks", 0) else ()
            for step in range(ksteps):
                (wb,) = yield Acquire(wf, 1)
                yield Call((wb, x, *extra), ys, b, step, ksteps)
                yield Release(wf, 1)
            if ys:
                yield Release(yf, len(ys))
        yield Release(xf, 1)

    return program


def gated(shape: Any) -> bool:
    """Whether the launch writes silu(first matrix) * second matrix (``Shape.gated``: SwiGLU as its epilogue)."""
    return bool(getattr(shape, "gated", False))


def gate_blocks(shape: Any, rows_per_iteration: int) -> int:
    """Output blocks of a gated launch's first matrix (gate), which each worker keeps instead of writing (0 when
    the launch is not gated)."""
    return shape.parts[0] // rows_per_iteration if gated(shape) else 0


def with_residual(shape: Any) -> bool:
    """Whether the launch adds a residual to its outputs (``Shape.residual``: the residual add as its epilogue)."""
    return bool(getattr(shape, "residual", False))


def x_object(shape: Any) -> tuple[int, ...]:
    """The shape of a resident x's one object: (m, k), or, with what rides in it (a prologue's norm weight, an
    epilogue's RoPE table or residual), flat: x, then the norm weight (k), then the table (m x rope_dim) or the
    residual (m x n), each gathered from its own tensor by one chain of buffer descriptors on x's channel."""
    m, k = shape.m, shape.k
    if not prenormed(shape) and not with_residual(shape) and not roped(shape):
        return (m, k)
    table = m * shape.rope_dim if roped(shape) else 0
    return (m * k + prenormed(shape) * k + table + with_residual(shape) * m * shape.n,)


def residual_rows(x: torch.Tensor, params: Any, row: int) -> torch.Tensor:
    """The (m, tile_m) view of the residual riding at the end of x's object for output rows [row, row + tile_m)."""
    m, k, n, tm = params["m"], params["k"], params["n"], params["tile_m"]
    start = m * k + params["normed"] * k
    return x.view(-1)[start : start + m * n].view(m, n)[:, row : row + tm]


def _block_rows(shape: Any, total: int, start: int, block: int, offset: int) -> Callable[[int], int]:
    """First output row of block b for a worker whose column starts at ``start`` (rows per iteration ``block``) and
    whose compute row starts ``offset`` rows into it (the drain's pattern, ``matvec_dataflow``)."""
    its = shape.n // total
    return lambda b: its * start + b * block + offset


def add_residual(y: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The residual add's arithmetic (``kernels.eltwise``: both bf16 operands in fp32, one rounding), residual first
    as the block graph's add takes it."""
    return nx.apply_fp32(torch.add, r, y)


def prenormed(shape: Any) -> bool:
    """Whether the launch normalizes x first (``Shape.norm_eps``: RMSNorm as the launch's prologue)."""
    return getattr(shape, "norm_eps", None) is not None


def resident_x(x: torch.Tensor, shape: Any, ctx: Any) -> torch.Tensor:
    """The x a call multiplies: the buffer itself, or for a prenormed launch (x resident, its last row the norm
    weight) the RMSNorm of x, computed once per worker into its scratch before the first call (the rmsnorm kernel's
    own arithmetic, ``rmsnorm.normalize_rows``, so the launch equals RMSNorm then GEMV bit for bit)."""
    if len(x_object(shape)) == 2:
        return x
    m, k = shape.m, shape.k
    if not prenormed(shape):
        return x.view(-1)[: m * k].view(m, k)
    if "xn" not in ctx.scratch:
        flat = x.view(-1)
        ctx.scratch["xn"] = normalize_rows(flat[: m * k].view(m, k), flat[m * k : m * k + k], shape.norm_eps)
    return ctx.scratch["xn"]


def prologue_meta(shape: Any) -> dict[str, Any] | None:
    """``design.meta["prologue"]`` of a prenormed launch: each worker's one-time RMSNorm of its resident x, costed
    as the rmsnorm kernel's per-element and per-row work (``npu.timing``: what the stream behind it does not hide
    lengthens the fill)."""
    if not prenormed(shape):
        return None
    m, k = shape.m, shape.k
    ops = m * (k * rmsnorm.OPS_PER_ELEMENT + rmsnorm.OPS_PER_ROW)
    return {"family": rmsnorm.FAMILY, "vector_ops": ops, "bytes": 2 * 2 * m * k + 2 * k}


def prenorm_local_bytes(shape: Any) -> int:
    """L1 a prenormed worker holds beside its resident x object: the normalized copy of x."""
    return 2 * shape.m * shape.k if prenormed(shape) else 0


def x_chunk(x: torch.Tensor, tile_k: int, step: int) -> torch.Tensor:
    """Chunk ``step`` of x for a call: the buffer itself when x streams in chunks, its slice when x is resident."""
    return x if x.shape[-1] == tile_k else x[..., step * tile_k : (step + 1) * tile_k]


def matvec_tensors(shape: Any, stream: WeightStream) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The DDR inputs (x, each matrix's weights) and outputs (each matrix's y) of a matrix-vector launch."""
    names = tensor_names(shape)
    mats = shape.matrices()
    inputs = [TensorSpec("x", (shape.m, shape.k))] + ([TensorSpec("g", (shape.k,))] if prenormed(shape) else [])
    inputs += [TensorSpec("r", (shape.m, shape.n))] if with_residual(shape) else []
    inputs += [TensorSpec("cs", (shape.m, shape.rope_dim))] if roped(shape) else []
    inputs += [TensorSpec(w, (nj, stream.row), stream.dtype) for nj, (w, _) in zip(mats, names, strict=True)]
    outputs = [TensorSpec(y, (shape.m, nj)) for nj, (_, y) in zip(mats, names, strict=True)]
    if gated(shape):
        outputs = [TensorSpec("y", (shape.m, mats[1]))]
    return inputs, outputs


def constant_inputs(shape: Any) -> list[str]:
    """The DDR inputs of a matrix-vector launch that no earlier launch writes (the weights, a fused norm's gain):
    a resident pass may fetch them before the launch starts (``npu.resident``'s weight prefetch)."""
    return (["g"] if prenormed(shape) else []) + [w for w, _ in tensor_names(shape)]


def parts_suffix(shape: Any) -> str:
    return "_parts" + "_".join(map(str, shape.parts)) if shape.parts else ""


def make_design(shape: Shape, config: Config | None = None, device: Device | None = None) -> Design:
    device = device or npu2()
    config = config or default_config(shape, device)
    _check(shape, config, device)
    m, n, k = shape.m, shape.n, shape.k
    stream = WeightStream("bf16", k, config.tile_k)
    tiling = config.tiling()
    local = (4 * m * config.tile_m if config.acc == "fp32" else 0) + _fold_local_bytes(shape, config)
    kernel = _kernel(shape, config)
    fifos, links, workers, rt = matvec_dataflow(
        shape, tiling, stream, lambda tm: kernel, "mv", lambda tm: local, device
    )
    inputs, outputs = matvec_tensors(shape, stream)
    numerics = _numerics(config)
    points, tail = fold_points(shape)
    design = Design(
        name=f"gemv_{n}x{k}_m{m}{parts_suffix(shape)}{fold_suffix(shape)}",
        device=device,
        inputs=inputs,
        outputs=outputs,
        fifos=fifos,
        links=links,
        workers=workers,
        runtime=rt,
        numerics=replace(numerics, rounding_points=(*points, *numerics.rounding_points, *tail)),
        fast=_fast(config, shape),
    )
    design.meta = {
        "family": FAMILY,
        "shape": asdict(shape),
        "config": asdict(config),
        "macs": design.total_macs(),
        "useful_macs": m * n * k,
        "ddr_read_bytes": design.ddr_read_bytes(),
        "ddr_write_bytes": design.ddr_write_bytes(),
        "weight_bytes": 2 * n * k,
        "constants": constant_inputs(shape),
    }
    if prenormed(shape):
        design.meta["prologue"] = prologue_meta(shape)
    return design


def fold_points(shape: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The numerics points a launch's folds add before (prologue) and after (epilogues) its own."""
    points = ("prologue:rmsnorm(fp32)->bf16",) if prenormed(shape) else ()
    tail = ("epilogue:add(fp32)->bf16",) if with_residual(shape) else ()
    tail += ("epilogue:silu*up(fp32)->bf16",) if gated(shape) else ()
    tail += ("epilogue:rope(fp32)->bf16",) if roped(shape) else ()
    return points, tail


def fold_suffix(shape: Any) -> str:
    """The design-name suffix of a launch's folds."""
    tags = (("_rms", prenormed(shape)), ("_res", with_residual(shape)), ("_glu", gated(shape)), ("_rope", roped(shape)))
    return "".join(tag for tag, on in tags if on)


def _fast(config: Config, shape: Shape | None = None):
    """Each matrix of the launch as its own GEMV (a multi-matrix launch computes exactly what separate launches do)."""
    operands = "bfp16" if config.variant == "bfp16" else "bf16"
    names = tensor_names(shape or Shape(1, 1))

    def one(x: torch.Tensor, w: torch.Tensor, exact: bool) -> torch.Tensor:
        if config.acc == SERIAL_BF16:
            return _serial_sum(torch.zeros(*x.shape[:-1], w.shape[0], dtype=torch.bfloat16), x, w, operands)
        return nx.matmul(x, w, acc=config.acc, k_chunk=config.tile_k, operands=operands, exact=exact)

    def fast(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        return folded_fast(shape or Shape(1, 1), names, inputs, lambda x, w: one(x, inputs[w], exact), exact)

    return fast


def folded_fast(
    shape: Any, names: list[tuple[str, str]], inputs: dict[str, torch.Tensor], matvec: Callable, exact: bool
) -> dict[str, torch.Tensor]:
    """A matrix-vector launch's outputs on the fast path (gemv and qgemv alike): the prologue's RMSNorm of x, then
    ``matvec(x, weight tensor name)`` for each (weight, output) of ``names``, then the residual add or SwiGLU
    epilogue, each with its own kernel's arithmetic, so the launch computes what the separate launches compute."""
    x = normalize_rows(inputs["x"], inputs["g"], shape.norm_eps) if prenormed(shape) else inputs["x"]
    out = {y: matvec(x, w) for w, y in names}
    if roped(shape):  # the RoPE kernel's arithmetic on each rotated matrix's heads
        for _, y in names[: shape.rope_parts]:
            out[y] = rope.rotate_rows(out[y], inputs["cs"], shape.rope_dim)
    if with_residual(shape):
        out = {y: add_residual(v, inputs["r"]) for y, v in out.items()}
    if gated(shape):
        return {"y": silu_mul(out["y0"], out["y1"], exact=exact)}
    return out


def folded_reference(
    shape: Any, names: list[tuple[str, str]], inputs: dict[str, torch.Tensor], weight: Callable
) -> dict[str, torch.Tensor]:
    """The FP32 reference of a matrix-vector launch with its folds (gemv and qgemv alike): the FP32 RMSNorm of x
    (``oracle.ops.rmsnorm``), ``linear`` with ``weight(name)`` for each (weight, output) of ``names``, plus the
    residual, or silu(gate) * up."""
    x = rms_reference(inputs["x"], inputs["g"], shape.norm_eps) if prenormed(shape) else inputs["x"]
    r = inputs["r"].to(torch.float32) if with_residual(shape) else 0
    out = {y: linear(x, weight(w)) + r for w, y in names}
    for _, y in names[: shape.rope_parts] if roped(shape) else ():
        out[y] = _rope_reference(out[y], inputs["cs"], shape.rope_dim)
    if gated(shape):
        return {"y": torch.nn.functional.silu(out["y0"]) * out["y1"]}
    return out


def _rope_reference(y: torch.Tensor, cs: torch.Tensor, d: int) -> torch.Tensor:
    """FP32 RoPE of y's heads (half layout) by the table ``cs`` ([m, d] = [cos | sin]), no rounding."""
    h = y.to(torch.float32).reshape(y.shape[0], -1, d)
    c, s = (cs.to(torch.float32)[:, None, : d // 2], cs.to(torch.float32)[:, None, d // 2 :])
    y1, y2 = h[..., : d // 2], h[..., d // 2 :]
    return torch.cat((y1 * c - y2 * s, y2 * c + y1 * s), dim=-1).reshape(y.shape)


def reference(inputs: dict[str, torch.Tensor], shape: Shape | None = None) -> dict[str, torch.Tensor]:
    """FP32 y = x @ W^T from the (bf16) inputs, no intermediate rounding (oracle ``linear``); a multi-matrix
    launch's inputs ``w0``.. give outputs ``y0``..; with folds (``shape``), ``folded_reference``'s."""
    weights = sorted(k for k in inputs if k == "w" or (k[:1] == "w" and k[1:].isdigit()))
    return folded_reference(shape or Shape(1, 1), [(w, "y" + w[1:]) for w in weights], inputs, inputs.__getitem__)


# ----------------------------------------------------------------------------------------------------------------------
# configs
# ----------------------------------------------------------------------------------------------------------------------
def tile_k_choices(k: int, limit: int | None = None) -> list[int]:
    """K chunks a worker can stream: K itself, and divisors of K that a single DMA row can carry (<= 2046 bf16)."""
    max_strided = TAP_MAX_SIZE * WORD_BYTES // 2
    out = [k] if k % K_GRANULE == 0 else []
    out += [d for d in range(min(k - 1, max_strided), K_GRANULE - 1, -1) if k % d == 0 and d % K_GRANULE == 0]
    return [d for d in out if limit is None or d <= limit]


def tile_fits(check: Callable[[Any, Any, Device], None], l1: Callable[[Any, Any], int]) -> Callable[..., bool]:
    """``fits(shape, config, device)`` for a matrix-vector family: the config passes the family's shape ``check``
    (which raises ``DesignError``) and one worker's ``l1`` bytes fit compute-tile memory. The GEMV families (gemv,
    qgemv) prune their candidates with it before building any design."""

    def fits(shape: Any, config: Any, device: Device) -> bool:
        try:
            check(shape, config, device)
        except DesignError:
            return False
        return l1(shape, config) <= device.compute.memory_bytes

    return fits


fits = tile_fits(_check, l1_bytes)


def candidate_configs(shape: Shape, device: Device | None = None) -> list[Config]:
    """Configs worth timing, most promising first: more tiles, then bigger calls; arithmetic pre-filter only."""
    device = device or npu2()
    ks = tile_k_choices(shape.k)[:6]
    out: list[tuple[tuple, Config]] = []
    for rows in (1, 2, 4):
        for cols in (8, 4, 2, 1):
            if rows > device.compute_rows or cols > device.columns:
                continue
            for tm in TILE_M_CHOICES:
                for tk in ks:
                    for variant in ("vector", "bfp16", "scalar"):
                        for depth in (2, 1):
                            for ch in (1, 2):
                                rides = x_must_ride(cols, ch, device) or (folds(shape) and ch == 2)
                                cfg = Config(cols, rows, tm, tk, variant, depth, weight_channels=ch, x_rides=rides)
                                if not fits(shape, cfg, device):
                                    continue
                                rank = (variant != "vector", depth != 2, -rows * cols * ch, -tm * tk, ch, rows)
                                out.append((rank, cfg))
    out.sort(key=lambda x: x[0])
    return [c for _, c in out]


def default_config(shape: Shape, device: Device | None = None) -> Config:
    """One row of workers on as many columns as divide N (8 measured best), the biggest chunks that fit L1.

    The hand default mirrors the published AIR GEMVs (8 columns x 1 row, vector kernel, double-buffered);
    the tuner may find more (e.g. several rows per column).
    """
    device = device or npu2()
    channels = 2 if folds(shape) else 1  # what rides in a resident x needs it, on a second channel
    for cols in (8, 4, 2, 1):
        if cols > device.columns:
            continue
        for tm in (16, 8, 4, 2):
            for tk in tile_k_choices(shape.k):
                rides = folds(shape) or x_must_ride(cols, channels, device)
                cfg = Config(cols, 1, tm, tk, "vector", 2, weight_channels=channels, x_rides=rides)
                if fits(shape, cfg, device):
                    return cfg
    raise _err(f"no GEMV tiling fits {shape}; N must split into columns x an even block and K into 32-element chunks")


def from_air_tile(shape: Shape, tile: str, device: Device | None = None) -> Config:
    """Our config for an AIR registry GEMV tile "herd_m/tile_m/m_input" (calibration): same columns and rows
    per kernel call, one row of workers, the largest K chunk that fits L1 double-buffered."""
    device = device or npu2()
    herd_m, _tile_m, m_input = (int(v) for v in tile.split("/"))
    for tk in tile_k_choices(shape.k):
        cfg = Config(herd_m, 1, m_input, tk, "vector", 2)
        if fits(shape, cfg, device):
            return cfg
    raise _err(f"AIR tile {tile} of {shape} has no legal equivalent here")
