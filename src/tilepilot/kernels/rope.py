"""RoPE in the Hugging Face half-rotation layout: y = [x1 c - x2 s, x2 c + x1 s] per head.

``x1``/``x2`` are the first and second halves of each head (``rotate_half``, not interleaved pairs).
x is the projection output [T, heads * head_dim] as it leaves the GEMM (seq-first, no transpose).

Tables: cos/sin are computed on the host in fp32 (``table``/``table_for``: the oracle's inverse
frequencies, with Llama-3 frequency scaling when the spec has it) for the absolute positions of the
rows, so decode passes the tables of its position offset. Both halves of a head use the same
frequencies, so only half a head of each is needed: the streamed table ``cs`` is [T, head_dim] =
[cos(f_0..f_{d/2-1}) | sin(f_0..f_{d/2-1})], in ``Shape.table_dtype`` (bf16 by default, as Hugging Face's
bf16 models cast their tables; fp32 costs twice the table bytes and removes that rounding).

Dataflow (``kernels/_stream.py``): rows (tokens) cut over ``tiles`` workers, ``rows_per_call`` tokens per
call with all their heads; three DDR streams per worker (x and cs in, y out), so 8 workers at most on
npu2 (AIR's measured RoPE runs "8/1").

Numerics: bf16 x, fp32 inside (x1*c, x2*s, their difference / sum, each an fp32 operation), one
round-to-nearest-even to bf16. The fast path does exactly this, so production == exact.

Per-head RMSNorm prologue (``Shape.norm_heads``: Qwen3's q_norm and k_norm folded into the RoPE launch that reads
them, as AIR fused Qwen3's per-head QK-norm into its attention-input ELF): x is the *input* of the norms, and every
head is normalized with its own norm's weight (``g``, one head_dim row per norm, held by every worker) by the
rmsnorm kernel's own arithmetic (``rmsnorm.normalize_rows``, one bf16 rounding) before it is rotated, so the launch
equals the norm launches then RoPE bit for bit; the norms' launches and their outputs' DDR round trips are saved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tilepilot.kernels import _stream as st
from tilepilot.kernels import rmsnorm
from tilepilot.kernels import rowwise as rw
from tilepilot.model.spec import ModelSpec
from tilepilot.npu import numerics as nx
from tilepilot.npu.design import Design, TensorSpec, TileKernel, torch_dtype
from tilepilot.npu.device import Device, npu2
from tilepilot.oracle import ops
from tilepilot.oracle.rope import inv_freq_for

FAMILY = "rope"
VARIANTS = rw.VARIANTS
TABLE_DTYPES = ("bf16", "fp32")
# Which elements of a head RoPE rotates together. "half" pairs element i with i + head_dim/2 (Hugging Face's
# ``rotate_half``, the layout every checkpoint read here is trained in); "interleaved" pairs 2i with 2i+1 (GPT-J,
# and llama.cpp's GGUF Q/K, which its converter permutes to suit it). Running "interleaved" on half-rotation
# weights is the mistake of a GGUF-minded deployment: right at position 0 (the identity), wrong from position 1.
LAYOUTS = ("half", "interleaved")
# The precision the table's angles (position x inverse frequency) are computed in before cos/sin. "fp32" is Hugging
# Face's (and the runner's) table; "bf16" is the mistake of a table built in the model's dtype: position, inverse
# frequency and their product each rounded to bf16, right at early positions (small angles, exact integer positions)
# and off by up to half a bf16 ulp of the angle later (~1 rad at position 256 at frequency 1), so late positions
# rotate wrongly.
ANGLES = ("fp32", "bf16")
# Config fields with named choices (what a debug skill may switch one at a time).
OPTIONS = {"variant": VARIANTS, "layout": LAYOUTS, "angles": ANGLES}
OPS_PER_ELEMENT = 4  # ESTIMATE: two fp32 multiplies, one add/sub, one bf16 convert per output element


@dataclass(frozen=True)
class Shape:
    """``norm_heads``: a per-head RMSNorm prologue (module docstring), the heads each norm weight serves, in order
    (Q's then K's), summing to ``heads``; () = none. ``norm_eps``: the norms' epsilon."""

    rows: int  # tokens
    heads: int
    head_dim: int
    table_dtype: str = "bf16"
    norm_heads: tuple[int, ...] = ()
    norm_eps: float = 1e-6


@dataclass(frozen=True)
class Config(rw.RowConfig):
    """Tokens (with all their heads) streamed through ``tiles`` workers (``rowwise.RowConfig``), rotating the
    pairs of ``layout`` by a table whose angles are computed in ``angles`` precision (only "half" and "fp32" are ever
    candidates: the checkpoints' layout and Hugging Face's table)."""

    layout: str = "half"
    angles: str = "fp32"


def width(shape: Shape) -> int:
    return shape.heads * shape.head_dim


def _x_stream(shape: Shape) -> st.Stream:
    """x's stream; with a norm prologue every x object also carries the norms' weights (one head_dim row each): a
    compute tile has two input channels, which x and the table already take."""
    return st.Stream("x", width(shape), tail="g" if shape.norm_heads else None, tail_elements=_g_elements(shape))


def _g_elements(shape: Shape) -> int:
    return len(shape.norm_heads) * shape.head_dim


def l1_bytes(shape: Shape, config: Config) -> int:
    ins = [_x_stream(shape), st.Stream("cs", shape.head_dim, shape.table_dtype)]
    return st.l1_bytes(ins, [st.Stream("y", width(shape))], [], config.rows_per_call, config.depth, 0)


# ----------------------------------------------------------------------------------------------------------------------
# Host tables
# ----------------------------------------------------------------------------------------------------------------------
def table(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: str = "bf16", angles: str = "fp32") -> torch.Tensor:
    """[len(positions), head_dim] = [cos | sin] of positions x inv_freq, stored in ``dtype``; the angles are
    computed in fp32, or with ``angles="bf16"`` from bf16 positions and inverse frequencies, rounded to bf16."""
    half = inv_freq.shape[0]
    if angles == "bf16":
        pos, freq = nx.round_bf16(positions.float()), nx.round_bf16(inv_freq.float())
        ang = (pos[:, None] * freq[None, :]).float()  # a bf16 multiply: the product rounded to bf16, then widened
        return torch.cat((ang.cos(), ang.sin()), dim=-1).to(torch_dtype(dtype))
    cos, sin = ops.rope_tables(positions, inv_freq)
    return torch.cat((cos[:, :half], sin[:, :half]), dim=-1).to(torch_dtype(dtype))


def table_for(spec: ModelSpec, start: int, count: int, dtype: str = "bf16", angles: str = "fp32") -> torch.Tensor:
    """The table of positions ``start .. start+count-1`` for ``spec`` (decode: start = tokens already cached)."""
    return table(inv_freq_for(spec), torch.arange(start, start + count), dtype, angles)


def shape_for(spec: ModelSpec, rows: int, which: str = "q", table_dtype: str = "bf16") -> Shape:
    """The rope shape of the Q (``which="q"``) or K projection output of ``spec`` for ``rows`` tokens."""
    heads = spec.n_heads if which == "q" else spec.n_kv_heads
    return Shape(rows, heads, spec.head_dim, table_dtype)


# ----------------------------------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------------------------------
def rotate_rows(x: torch.Tensor, cs: torch.Tensor, head_dim: int, layout: str = "half") -> torch.Tensor:
    """Rotate x [n, heads * head_dim] (bf16) by the table rows cs [n, head_dim]; fp32 inside, bf16 out.

    Pair i (frequency i) is elements (i, i + head_dim/2) in the "half" layout, (2i, 2i+1) in "interleaved"."""
    n = x.shape[0]
    half = head_dim // 2
    xf = x.to(torch.float32).reshape(n, -1, head_dim)
    c = cs[:, :half].to(torch.float32)[:, None, :]
    s = cs[:, half:].to(torch.float32)[:, None, :]
    if layout == "interleaved":
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        y = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).reshape(n, -1, head_dim)
    else:
        x1, x2 = xf[..., :half], xf[..., half:]
        y = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return nx.round_bf16(y).reshape(n, -1)


def normalize_heads(
    x: torch.Tensor, g: torch.Tensor, shape: Shape, norm: Callable[..., torch.Tensor] = rmsnorm.normalize_rows
) -> torch.Tensor:
    """x [n, heads * head_dim] with each head normalized by its norm's weight row of g (``Shape.norm_heads``), by
    ``norm(rows, weight, eps)`` on rows of head_dim: the rmsnorm kernel's arithmetic (what a per-head norm launch
    computes), or the oracle's FP32 op for the reference."""
    n, d = x.shape[0], shape.head_dim
    parts, h0 = [], 0
    for j, heads in enumerate(shape.norm_heads):
        rows = x[:, h0 * d : (h0 + heads) * d].reshape(-1, d)
        parts.append(norm(rows, g[j], shape.norm_eps).reshape(n, heads * d))
        h0 += heads
    return torch.cat(parts, dim=1)


def _kernel(shape: Shape, config: Config) -> TileKernel:
    d = shape.head_dim

    def rope_tile(ins: list[torch.Tensor], outs: list[torch.Tensor], ctx) -> None:
        x = ins[0]
        if shape.norm_heads:  # x's object: the rows, then the norms' weights (``_x_stream``)
            flat = x.view(-1)
            x = normalize_heads(flat[: rpc * w].view(rpc, w), flat[rpc * w :].view(-1, d), shape)
        outs[0].copy_(rotate_rows(x, ins[1], d, config.layout))

    rpc, w = config.rows_per_call, width(shape)
    tb = 2 if shape.table_dtype == "bf16" else 4
    normed = bool(shape.norm_heads)
    norm_ops = rpc * (w * rmsnorm.OPS_PER_ELEMENT + shape.heads * rmsnorm.OPS_PER_ROW) if normed else 0
    return TileKernel(
        name=f"rope_{config.variant}_{shape.heads}x{d}"
        + ("" if config.layout == "half" else f"_{config.layout}")
        + ("" if config.angles == "fp32" else f"_angles_{config.angles}")
        + ("_rms" if normed else ""),
        fn=rope_tile,
        variant=config.variant,
        vector_ops_per_call=rpc * w * OPS_PER_ELEMENT + norm_ops,
        bytes_per_call=rpc * (2 * 2 * w + tb * d) + 2 * _g_elements(shape),
        params={"head_dim": d},
    )


def _check(shape: Shape, config: Config) -> None:
    rw.check_choice(FAMILY, "variant", config.variant, VARIANTS)
    rw.check_choice(FAMILY, "table dtype", shape.table_dtype, TABLE_DTYPES)
    rw.check_choice(FAMILY, "layout", config.layout, LAYOUTS)
    rw.check_choice(FAMILY, "angles", config.angles, ANGLES)
    if min(shape.rows, shape.heads, shape.head_dim) < 1 or shape.head_dim % 4:
        raise st.shape_error(FAMILY, f"shape {shape} is empty or head_dim is not a multiple of 4 (two word halves)")
    if shape.norm_heads and (sum(shape.norm_heads) != shape.heads or min(shape.norm_heads) < 1):
        raise st.shape_error(FAMILY, f"norm heads {shape.norm_heads} do not cover the {shape.heads} heads once each")


def make_design(shape: Shape, config: Config | None = None, device: Device | None = None) -> Design:
    device = device or npu2()
    config = config or default_config(shape, device)
    _check(shape, config)
    w = width(shape)
    inputs = [TensorSpec("x", (shape.rows, w)), TensorSpec("cs", (shape.rows, shape.head_dim), shape.table_dtype)]
    if shape.norm_heads:
        inputs.append(TensorSpec("g", (len(shape.norm_heads), shape.head_dim)))
    prologue = ("prologue:rmsnorm(fp32)->bf16",) if shape.norm_heads else ()
    design = st.build(
        name=f"rope_{shape.rows}x{shape.heads}x{shape.head_dim}" + ("_rms" if shape.norm_heads else ""),
        family=FAMILY,
        device=device,
        rows=shape.rows,
        tiles=config.tiles,
        rows_per_call=config.rows_per_call,
        depth=config.depth,
        inputs=inputs,
        outputs=[TensorSpec("y", (shape.rows, w))],
        streams_in=[_x_stream(shape), st.Stream("cs", shape.head_dim, shape.table_dtype)],
        held=[],
        streams_out=[st.Stream("y", w)],
        kernel=_kernel(shape, config),
        local_bytes=0,
        numerics=nx.Numerics(
            "bf16",
            "fp32",
            None,
            "bf16",
            (*prologue, f"angles:{config.angles}", f"table:{shape.table_dtype}", "rotate:fp32", "output:bf16"),
        ),
        fast=_fast(shape, config.layout),
    )
    design.meta = rw.design_meta(design, FAMILY, shape, config, shape.rows * w)
    return design


def _fast(shape: Shape, layout: str = "half"):
    def fast(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        x = normalize_heads(inputs["x"], inputs["g"], shape) if shape.norm_heads else inputs["x"]
        return {"y": rotate_rows(x, inputs["cs"], shape.head_dim, layout)}

    return fast


def reference(inputs: dict[str, torch.Tensor], shape: Shape | None = None) -> dict[str, torch.Tensor]:
    """FP32 ``oracle.ops.apply_rope`` with full tables rebuilt from ``cs`` (pass an fp32 ``cs`` for the true op); with
    a per-head norm prologue (``shape.norm_heads``), of the FP32 RMSNorm of each head (``oracle.ops.rmsnorm``)."""
    x, cs = inputs["x"], inputs["cs"]
    d = cs.shape[-1]
    half = d // 2
    if shape is not None and shape.norm_heads:
        x = normalize_heads(x, inputs["g"], shape, ops.rmsnorm)
    cos = torch.cat((cs[:, :half], cs[:, :half]), dim=-1).to(torch.float32)
    sin = torch.cat((cs[:, half:], cs[:, half:]), dim=-1).to(torch.float32)
    y = ops.apply_rope(x.reshape(x.shape[0], -1, d), cos, sin)
    return {"y": y.reshape(x.shape[0], -1)}


def candidate_configs(shape: Shape, device: Device | None = None) -> list[Config]:
    """More tiles first (8 = one per column; more exhausts the shims), then more tokens per call."""
    return rw.row_candidates(shape.rows, device or npu2(), lambda c: l1_bytes(shape, c), Config)


def default_config(shape: Shape, device: Device | None = None) -> Config:
    why = f"no RoPE tiling fits {shape}; one token's heads do not fit tile memory"
    return rw.first_candidate(FAMILY, candidate_configs(shape, device), why)
