"""Numerics every design declares: storage in bf16, where sums accumulate, where values get rounded.

The point of this module is that rounding is part of a design, not an accident of the host. A design
names its operand format (bf16, or AIE2P block-FP16 "bfp16"), its accumulator (fp32 inside the tile,
or bf16 partial sums rounded at every K chunk) and its output format. The tile path and the fast path
of the executor both call the helpers here, so the two apply the same rounding at the same points.

Rounding is round-to-nearest-even everywhere (PyTorch's fp32 -> bf16 conversion is RNE; a test holds
it to that on tie cases).

Block-FP16 (AIE ``bfp16ebs8``) as modeled here. ASSUMPTIONS, since AMD does not document the conversion
bit for bit: a block is 8 consecutive values along the reduction axis sharing one 8-bit exponent; each
value keeps a sign and a 7-bit magnitude mantissa without implicit leading one, so
value = sign * m * 2**(E - 7), m in 0..127, where E is the frexp exponent of the block's largest
magnitude (amax = f * 2**E with 0.5 <= f < 1, hence amax / 2**(E - 7) < 128). Mantissas are rounded
to nearest even and saturate at 127 (a value that rounds up to 128 keeps the block exponent rather than
bumping it); a block of zeros stays zero; the 8-bit exponent range is not clamped (LLM activations
never get near it). Elements much smaller than the block maximum lose precision or flush to zero,
which is the accuracy cost the gates judge. Every bfp16 value has at most 7 significant bits, so it is
exactly representable in bf16 and products of two of them are exact in fp32.

Exact partial sums. One kernel call reduces a K chunk: its products are exact in fp32 (bf16 x bf16 has
at most 16 significant bits) and are summed in fp64, then rounded once to fp32. The fp64 sum is exact,
hence independent of summation order, whenever the products of one output element span fewer than
about 53 - 16 - log2(k_chunk) binary orders of magnitude, which holds for any data an LLM produces;
this is what makes the tile path and the exact fast path agree bit for bit even though they block the
fp64 matmul differently. Chunk partials are then added to the accumulator in K order.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from tilepilot.errors import ConfigError

OPERAND_FORMATS = ("bf16", "bfp16")
ACCUMULATORS = ("fp32", "bf16")
OUTPUT_FORMATS = ("bf16", "fp32")
BFP16_BLOCK = 8  # AIE bfp16ebs8: 8 values per shared exponent (mlir-aie aie2p bfp16 emulation)
BFP16_MANTISSA_BITS = 7  # per-value magnitude bits besides the sign (assumption, see module docstring)


@dataclass(frozen=True)
class Numerics:
    """The numeric contract of one design, read by both executor paths and shown in reports.

    ``operands``: format the multiplier sees ('bf16', or 'bfp16' = block-FP16, twice the MAC rate).
    ``accumulate``: 'fp32' keeps partial sums in fp32 across K and rounds once at the end; 'bf16' rounds the
    running sum to bf16 after every K chunk (what a kernel does when it accumulates in its bf16 output buffer).
    ``k_chunk``: the K extent of one kernel call (the tile's tk); None when the kernel has no reduction.
    ``output``: dtype written to DDR. ``rounding_points``: human-readable list of where values are rounded, in
    order (e.g. ``("partial_sum:bf16", "output:bf16")``); reports and the debug skills read it.
    """

    operands: str = "bf16"
    accumulate: str = "fp32"
    k_chunk: int | None = None
    output: str = "bf16"
    rounding_points: tuple[str, ...] = field(default=("output:bf16",))

    def __post_init__(self) -> None:
        if self.operands not in OPERAND_FORMATS:
            raise ConfigError(f"Unknown operand format {self.operands!r}; use one of {OPERAND_FORMATS}.")
        if self.accumulate not in ACCUMULATORS:
            raise ConfigError(f"Unknown accumulator {self.accumulate!r}; use one of {ACCUMULATORS}.")
        if self.output not in OUTPUT_FORMATS:
            raise ConfigError(f"Unknown output format {self.output!r}; use one of {OUTPUT_FORMATS}.")
        if self.k_chunk is not None and self.k_chunk <= 0:
            raise ConfigError(f"k_chunk must be positive, got {self.k_chunk}; use the tile's K extent.")

    def to_dict(self) -> dict:
        return {
            "operands": self.operands,
            "accumulate": self.accumulate,
            "k_chunk": self.k_chunk,
            "output": self.output,
            "rounding_points": list(self.rounding_points),
        }


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round to bf16 (RNE) and return bf16; fp64 input is first rounded to fp32, then to bf16."""
    if x.dtype == torch.bfloat16:
        return x
    if x.dtype == torch.float64:
        x = x.to(torch.float32)
    return x.to(torch.bfloat16)


def _check_bf16(name: str, x: torch.Tensor) -> None:
    if x.dtype != torch.bfloat16:
        raise ConfigError(f"{name} must be a bf16 tensor (DDR storage format), got {x.dtype}; convert it first.")


def quantize_bfp16(x: torch.Tensor, axis: int = -1) -> torch.Tensor:
    """Quantize to block-FP16 along ``axis`` (blocks of 8 consecutive values); returns values in x's dtype.

    The result holds the dequantized values (exactly representable in bf16), which is what the MMUL
    multiplies; storage size of the blocked format is the design IR's business (9 bytes per 8 values).
    """
    n = x.shape[axis]
    if n % BFP16_BLOCK:
        raise ConfigError(f"bfp16 blocks need the quantized axis to be a multiple of 8, got {n}; pad the tensor.")
    moved = x.movedim(axis, -1).to(torch.float32)
    blocks = moved.reshape(*moved.shape[:-1], n // BFP16_BLOCK, BFP16_BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    _, exp = torch.frexp(amax)
    quantum = torch.ldexp(torch.ones_like(amax), exp - BFP16_MANTISSA_BITS)
    limit = float(2**BFP16_MANTISSA_BITS - 1)
    mant = torch.clamp(torch.round(blocks / quantum), -limit, limit)  # torch.round is half-to-even
    out = (mant * quantum).reshape(moved.shape).movedim(-1, axis)
    return out.to(x.dtype)


def chunk_partial(a: torch.Tensor, w: torch.Tensor, operands: str = "bf16") -> torch.Tensor:
    """fp32 partial sum of one K chunk: a[..., k] . w[n, k] summed exactly over k, rounded once to fp32.

    ``w`` is in Hugging Face [out, in] orientation; no transpose is materialised on the host.
    """
    if operands == "bfp16":
        a, w = quantize_bfp16(a, -1), quantize_bfp16(w, -1)
    elif operands != "bf16":
        raise ConfigError(f"Unknown operand format {operands!r}; use one of {OPERAND_FORMATS}.")
    return torch.matmul(a.to(torch.float64), w.to(torch.float64).transpose(-1, -2)).to(torch.float32)


def accumulate(acc: torch.Tensor, partial: torch.Tensor, mode: str = "fp32") -> torch.Tensor:
    """Add one chunk's fp32 partial to the running sum; 'bf16' mode rounds the new sum to bf16 (RNE)."""
    if mode == "fp32":
        return acc.to(torch.float32) + partial
    if mode == "bf16":
        return round_bf16(acc.to(torch.float32) + partial)
    raise ConfigError(f"Unknown accumulator {mode!r}; use one of {ACCUMULATORS}.")


def finish(acc: torch.Tensor, output: str = "bf16") -> torch.Tensor:
    """The output rounding point: the accumulator converted to the output dtype (RNE for bf16)."""
    return round_bf16(acc) if output == "bf16" else acc.to(torch.float32)


def matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    acc: str = "fp32",
    k_chunk: int | None = None,
    operands: str = "bf16",
    output: str = "bf16",
    exact: bool = True,
    row_invariant: bool = False,
) -> torch.Tensor:
    """C = x @ w^T with a design's numerics; x [..., K] and w [N, K] in bf16.

    exact=True reproduces the tile path bit for bit (chunk partials summed exactly, accumulated in K order).
    exact=False is the production path for big shapes: with an fp32 accumulator it is one
    ``torch.nn.functional.linear`` on bf16 (fp32 accumulation in the host's order, one rounding). Stated and
    tested bound versus the exact path: fewer than 1% of elements differ, by at most one bf16 ulp of the
    result plus the fp32 summation bound 2*K*2**-24*sum|x_k w_k| (the latter only matters where cancellation
    leaves a result far below its terms; fewer than 0.1% of elements exceed one ulp). With a bf16
    accumulator it loops over K chunks with fp32 matmuls and rounds every partial sum, like the tile.

    row_invariant=True (with exact=False) runs the host kernel on fixed-size row blocks (``row_blocked_linear``),
    so a row's bits depend neither on how many rows share the call nor on the host's thread count. An NPU GEMM
    computes every row the same way whatever M is; the host's kernels do not (on AMX CPUs oneDNN blocks K by M, so a
    prompt served from the prefix cache, one new row, got other logits than its cold prefill; and a step small
    enough to run on one thread splits K differently from a two-thread one). GEMM's M is a prompt chunk's length
    and varies, so GEMM asks for this; a decode GEMV's M is always its step's.
    """
    _check_bf16("x", x)
    _check_bf16("w", w)
    k = x.shape[-1]
    if w.shape[-1] != k:
        raise ConfigError(
            f"matmul needs x [..., K] and w [N, K] with equal K, got {tuple(x.shape)} and {tuple(w.shape)}."
        )
    chunk = k_chunk or k
    if k % chunk:
        raise ConfigError(f"K = {k} is not a multiple of k_chunk = {chunk}; pad K or pick a dividing chunk.")
    if operands == "bfp16":
        if chunk % BFP16_BLOCK:
            raise ConfigError(f"bfp16 operands need k_chunk to be a multiple of 8, got {chunk}; pick another tile K.")
        x, w = quantize_bfp16(x, -1), quantize_bfp16(w, -1)
        operands = "bf16"  # blocks of 8 never straddle a chunk boundary (chunk % 8 == 0), so quantize once
    if not exact and acc == "fp32":
        if row_invariant:
            return row_blocked_linear(x, w, output)
        out = torch.nn.functional.linear(x, w)
        return out if output == "bf16" else out.to(torch.float32)
    total = torch.zeros(*x.shape[:-1], w.shape[0], dtype=torch.float32 if acc == "fp32" else torch.bfloat16)
    for k0 in range(0, k, chunk):
        xs, ws = x[..., k0 : k0 + chunk], w[:, k0 : k0 + chunk]
        if exact or row_invariant:
            partial = chunk_partial(xs, ws, operands)
        else:
            partial = torch.nn.functional.linear(xs.to(torch.float32), ws.to(torch.float32))
        total = accumulate(total, partial, acc)
    return finish(total, output)


ROW_BLOCK = 64  # rows per host-kernel call of the row-invariant path (a multiple of every SIMD/AMX row tile)


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    """One pool per worker count, made on first use (its threads start lazily)."""
    return ThreadPoolExecutor(workers, thread_name_prefix="tilepilot-rows")


def row_blocked_linear(x: torch.Tensor, w: torch.Tensor, output: str = "bf16") -> torch.Tensor:
    """x @ w^T through the host's kernel, one call per block of ``ROW_BLOCK`` rows (the last zero-padded), each on
    one torch thread; blocks run side by side on as many pool threads as torch's own thread setting allows (so
    ``runtime.threads``' one-thread steps and a user's ``torch.set_num_threads`` still bound the parallelism).

    Why: the host's GEMM picks its K blocking by the problem's shape and splits K across threads when rows are few,
    so the same row got other bits in a one-row call than inside a prompt. Every call here has one shape per (K, N)
    and runs on one thread, so a row's bits are a function of that row and the weights alone (zero rows add
    nothing; the kernel treats every row of a block alike). bf16 output uses the host's bf16 kernel (fp32 sums,
    one rounding); fp32 output its fp32 kernel on the exact bf16 products. Cost: about 1-1.5x the host's own
    multi-threaded bf16 GEMM, against ~5x for the float64 sums this replaced. What it gives up: measured against the
    tile path (exact chunk partials, fp32 accumulation in K order) on 128x576x1536, 128x2048x2048 and 64x4864x896,
    0.009-0.017 % of bf16 outputs differ by one ulp, against 0.003-0.010 % for float64 sums; enough to tip a greedy
    choice that sits on a near tie (README (a) changed its question for that reason).
    """
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k)
    m = rows.shape[0]
    dtype = torch.bfloat16 if output == "bf16" else torch.float32
    a, b = rows.to(dtype), w.to(dtype)
    pad = -m % ROW_BLOCK
    if pad:
        a = torch.nn.functional.pad(a, (0, 0, 0, pad))
    out = torch.empty(m + pad, w.shape[0], dtype=dtype)
    blocks = (m + pad) // ROW_BLOCK

    def run(i: int) -> None:
        torch.set_num_threads(1)  # in this thread: a one-thread kernel never splits K
        lo = i * ROW_BLOCK
        out[lo : lo + ROW_BLOCK] = torch.nn.functional.linear(a[lo : lo + ROW_BLOCK], b)

    before = torch.get_num_threads()
    workers = min(blocks, before)
    try:
        if workers == 1:
            for i in range(blocks):
                run(i)
        else:
            list(_pool(workers).map(run, range(blocks)))
    finally:
        torch.set_num_threads(before)  # the workers' setting is process-wide for some backends: restore it
    return out[:m].reshape(*lead, w.shape[0])


def apply_fp32(fn, *xs: torch.Tensor, output: str = "bf16") -> torch.Tensor:
    """Evaluate a non-linear function in fp32 on (bf16) inputs and round once at the design's output point."""
    return finish(fn(*(x.to(torch.float32) for x in xs)), output)
