"""RMSNorm: y = weight * x / sqrt(mean(x^2) + eps) per row, streamed through ``tiles`` compute tiles.

One family covers both norms of the decoder, because they are the same op on different row views:

- the block and final norms: ``Shape(rows=T, width=hidden)``, x is [T, hidden];
- the per-head Q/K norm of Qwen3: ``Shape(rows=T, width=head_dim, heads=n_heads)``, x is the projection's
  output [T, heads * head_dim] (no reshape, no transpose), normalized in rows of head_dim.

Dataflow (``kernels/_stream.py``): the T x heads work rows are cut into ``tiles`` contiguous ranges, one
worker each (one per column first), streamed ``rows_per_call`` rows per kernel call; the weight is read
once and broadcast to every worker. Two DDR streams per worker (x in, y out) plus one broadcast.

Numerics (declared in the design): bf16 in and out; inside, fp32. The mean of squares is the exact sum
of the (exact) squares of the bf16 inputs rounded once to fp32; ``rsqrt(ms + eps)`` is evaluated in fp64
and rounded to fp32 (a correctly rounded fp32 rsqrt: the hardware's approximation is less accurate, which
the per-kernel gate against the FP32 op must tolerate); then ``(x * inv) * weight`` in fp32 and one
round-to-nearest-even to bf16. Unlike Hugging Face's bf16 module, x * inv is not rounded to bf16 before
the weight multiply. The fast path computes exactly this at tensor level, so production == exact.

``Config.acc="fp16"`` is the mistake of a kernel written for fp16 activations: the squares are rounded to fp16
and summed in fp16 vector lanes. A row whose sum of squares exceeds 65504 (one massive channel of a trained
model's residual stream, e.g. SmolLM2-135M's channel 507 at the first token, |x| ~ 650 from layer 2 on, whose
square alone is 4.2e5) overflows to Inf, 1/sqrt(Inf) is 0 and the whole row is written as zeros; every other row
stays within one fp16 rounding of the fp32 kernel, so unit-scale probes pass it. Never a default or a candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tilepilot.errors import ConfigError
from tilepilot.kernels import _stream as st
from tilepilot.kernels import rowwise as rw
from tilepilot.npu import numerics as nx
from tilepilot.npu.design import Design, TensorSpec, TileKernel
from tilepilot.npu.device import Device, npu2
from tilepilot.oracle import ops

FAMILY = "rmsnorm"
VARIANTS = rw.VARIANTS
# Sum-of-squares accumulators: "fp32" (exact squares, one rounding) is every default and candidate; "fp16" is the
# narrow accumulator of a kernel written for fp16 (module docstring).
ACCUMULATORS = ("fp32", "fp16")
# fp16 vector lanes the "fp16" accumulator sums in before its lane reduction (a 512-bit AIE-ML vector of fp16).
FP16_LANES = 32
# Config fields with named choices (what a debug skill may switch one at a time).
OPTIONS = {"variant": VARIANTS, "acc": ACCUMULATORS}
# ESTIMATE of fp32 vector operations per element: square-accumulate, scale by 1/rms, weight multiply, bf16
# convert. Per row: a lane reduction and one rsqrt (~32 ops, an AIE rsqrt is a short Newton iteration).
OPS_PER_ELEMENT = 4
OPS_PER_ROW = 32


@dataclass(frozen=True)
class Shape:
    rows: int  # tokens
    width: int  # elements normalized together (hidden, or head_dim for per-head Q/K norm)
    heads: int = 1  # > 1: per-head norm; x is [rows, heads * width]
    eps: float = 1e-6


@dataclass(frozen=True)
class Config(rw.RowConfig):
    """Work rows (tokens x heads) streamed through ``tiles`` workers (``rowwise.RowConfig``); ``acc`` is the
    type the sum of squares accumulates in (``ACCUMULATORS``)."""

    acc: str = "fp32"


def work_rows(shape: Shape) -> int:
    return shape.rows * shape.heads


def l1_bytes(shape: Shape, config: Config) -> int:
    s = st.Stream("x", shape.width)
    return st.l1_bytes([s], [s], [st.Held("w", shape.width)], config.rows_per_call, config.depth, _local(config))


def _local(config: Config) -> int:
    return 4 * config.rows_per_call  # fp32 sums of squares of the rows in flight


def fp16_sum_squares(x: torch.Tensor) -> torch.Tensor:
    """Sum of squares of [n, width] bf16 rows as an fp16 kernel computes it: each square rounded to fp16, added into
    ``FP16_LANES`` fp16 lanes (a zero-padded last vector), then the lanes halved pairwise in fp16; returned in fp32.
    Squares are non-negative, so a row overflows to Inf exactly when a partial sum passes 65504."""
    n, width = x.shape
    sq = x.to(torch.float32).square().to(torch.float16)
    pad = -width % FP16_LANES
    if pad:
        sq = torch.cat([sq, sq.new_zeros(n, pad)], dim=1)
    vectors = sq.reshape(n, -1, FP16_LANES)
    acc = vectors[:, 0]
    for i in range(1, vectors.shape[1]):
        acc = acc + vectors[:, i]  # fp16 + fp16, rounded to fp16 (Inf past 65504)
    while acc.shape[1] > 1:
        half = acc.shape[1] // 2
        acc = acc[:, :half] + acc[:, half:]
    return acc[:, 0].to(torch.float32)


def normalize_rows(x: torch.Tensor, weight: torch.Tensor, eps: float, acc: str = "fp32") -> torch.Tensor:
    """The kernel's arithmetic on [n, width] bf16 rows (tile path per object, fast path on all rows)."""
    xf = x.to(torch.float32)
    if acc == "fp16":
        ms = fp16_sum_squares(x) / x.shape[-1]
    else:
        ms = (x.to(torch.float64).square().sum(-1) / x.shape[-1]).to(torch.float32)
    inv = torch.rsqrt(ms.to(torch.float64) + eps).to(torch.float32)
    return nx.round_bf16((xf * inv[:, None]) * weight.to(torch.float32))


def _kernel(shape: Shape, config: Config) -> TileKernel:
    eps, acc = shape.eps, config.acc

    def rmsnorm_tile(ins: list[torch.Tensor], outs: list[torch.Tensor], ctx) -> None:
        x, w = ins
        outs[0].copy_(normalize_rows(x, w, eps, acc))

    rpc, w = config.rows_per_call, shape.width
    suffix = "" if acc == "fp32" else f"_{acc}acc"
    return TileKernel(
        name=f"rmsnorm_{config.variant}_{w}{suffix}",
        fn=rmsnorm_tile,
        variant=config.variant,
        vector_ops_per_call=rpc * (w * OPS_PER_ELEMENT + OPS_PER_ROW),
        bytes_per_call=2 * 2 * rpc * w + 2 * w,
        params={"width": w, "eps": eps},
    )


def _check(shape: Shape, config: Config, device: Device) -> None:
    rw.check_choice(FAMILY, "variant", config.variant, VARIANTS)
    rw.check_choice(FAMILY, "accumulator", config.acc, ACCUMULATORS)
    if min(shape.rows, shape.width, shape.heads) < 1 or shape.eps < 0:
        raise st.shape_error(FAMILY, f"shape {shape} has an empty dimension or a negative eps")
    if shape.width % 2:
        raise st.shape_error(FAMILY, f"width {shape.width} is odd; bf16 rows must be whole 32-bit words")


def make_design(shape: Shape, config: Config | None = None, device: Device | None = None) -> Design:
    device = device or npu2()
    config = config or default_config(shape, device)
    _check(shape, config, device)
    cols = shape.heads * shape.width
    x = st.Stream("x", shape.width)
    y = st.Stream("y", shape.width)
    suffix = f"_h{shape.heads}" if shape.heads > 1 else ""
    design = st.build(
        name=f"rmsnorm_{shape.rows}x{shape.width}{suffix}",
        family=FAMILY,
        device=device,
        rows=work_rows(shape),
        tiles=config.tiles,
        rows_per_call=config.rows_per_call,
        depth=config.depth,
        inputs=[TensorSpec("x", (shape.rows, cols)), TensorSpec("w", (shape.width,))],
        outputs=[TensorSpec("y", (shape.rows, cols))],
        streams_in=[x],
        held=[st.Held("w", shape.width)],
        streams_out=[y],
        kernel=_kernel(shape, config),
        local_bytes=_local(config),
        numerics=_numerics(config),
        fast=_fast(shape, config.acc),
    )
    design.meta = rw.design_meta(design, FAMILY, shape, config, shape.rows * cols)
    return design


def _numerics(config: Config) -> nx.Numerics:
    """The declared numerics; ``accumulate`` names the K accumulator of a reduction kernel (fp32 here: the
    normalization itself), so an fp16 sum of squares shows as its own rounding point."""
    squares = "sum_squares:exact->fp32" if config.acc == "fp32" else "sum_squares:fp16"
    return nx.Numerics("bf16", "fp32", None, "bf16", (squares, "rsqrt:fp32", "scale_weight:fp32", "output:bf16"))


def _fast(shape: Shape, acc: str = "fp32"):
    def fast(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        x = inputs["x"]
        y = normalize_rows(x.reshape(-1, shape.width), inputs["w"], shape.eps, acc)
        return {"y": y.reshape(x.shape)}

    return fast


def reference(inputs: dict[str, torch.Tensor], shape: Shape | None = None) -> dict[str, torch.Tensor]:
    """FP32 RMSNorm of the oracle (``oracle.ops.rmsnorm``) over rows of ``shape.width``."""
    if shape is None:
        raise ConfigError("rmsnorm.reference needs the shape (width, heads, eps); pass shape=Shape(...).")
    x = inputs["x"]
    y = ops.rmsnorm(x.reshape(-1, shape.width), inputs["w"], shape.eps)
    return {"y": y.reshape(x.shape)}


def candidate_configs(shape: Shape, device: Device | None = None) -> list[Config]:
    """More tiles first (up to one per column; 16 only if the shims allow it), then bigger objects."""
    return rw.row_candidates(work_rows(shape), device or npu2(), lambda c: l1_bytes(shape, c), Config)


def default_config(shape: Shape, device: Device | None = None) -> Config:
    why = f"no RMSNorm tiling fits {shape}; a single row does not fit tile memory"
    return rw.first_candidate(FAMILY, candidate_configs(shape, device), why)
