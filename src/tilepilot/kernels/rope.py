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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tilepilot.kernels import _stream as st
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
    rows: int  # tokens
    heads: int
    head_dim: int
    table_dtype: str = "bf16"


@dataclass(frozen=True)
class Config(rw.RowConfig):
    """Tokens (with all their heads) streamed through ``tiles`` workers (``rowwise.RowConfig``), rotating the
    pairs of ``layout`` by a table whose angles are computed in ``angles`` precision (only "half" and "fp32" are ever
    candidates: the checkpoints' layout and Hugging Face's table)."""

    layout: str = "half"
    angles: str = "fp32"


def width(shape: Shape) -> int:
    return shape.heads * shape.head_dim


def l1_bytes(shape: Shape, config: Config) -> int:
    x = st.Stream("x", width(shape))
    cs = st.Stream("cs", shape.head_dim, shape.table_dtype)
    return st.l1_bytes([x, cs], [x], [], config.rows_per_call, config.depth, 0)


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


def _kernel(shape: Shape, config: Config) -> TileKernel:
    d = shape.head_dim

    def rope_tile(ins: list[torch.Tensor], outs: list[torch.Tensor], ctx) -> None:
        outs[0].copy_(rotate_rows(ins[0], ins[1], d, config.layout))

    rpc, w = config.rows_per_call, width(shape)
    tb = 2 if shape.table_dtype == "bf16" else 4
    return TileKernel(
        name=f"rope_{config.variant}_{shape.heads}x{d}"
        + ("" if config.layout == "half" else f"_{config.layout}")
        + ("" if config.angles == "fp32" else f"_angles_{config.angles}"),
        fn=rope_tile,
        variant=config.variant,
        vector_ops_per_call=rpc * w * OPS_PER_ELEMENT,
        bytes_per_call=rpc * (2 * 2 * w + tb * d),
        params={"head_dim": d},
    )


def _check(shape: Shape, config: Config) -> None:
    rw.check_choice(FAMILY, "variant", config.variant, VARIANTS)
    rw.check_choice(FAMILY, "table dtype", shape.table_dtype, TABLE_DTYPES)
    rw.check_choice(FAMILY, "layout", config.layout, LAYOUTS)
    rw.check_choice(FAMILY, "angles", config.angles, ANGLES)
    if min(shape.rows, shape.heads, shape.head_dim) < 1 or shape.head_dim % 4:
        raise st.shape_error(FAMILY, f"shape {shape} is empty or head_dim is not a multiple of 4 (two word halves)")


def make_design(shape: Shape, config: Config | None = None, device: Device | None = None) -> Design:
    device = device or npu2()
    config = config or default_config(shape, device)
    _check(shape, config)
    w = width(shape)
    design = st.build(
        name=f"rope_{shape.rows}x{shape.heads}x{shape.head_dim}",
        family=FAMILY,
        device=device,
        rows=shape.rows,
        tiles=config.tiles,
        rows_per_call=config.rows_per_call,
        depth=config.depth,
        inputs=[TensorSpec("x", (shape.rows, w)), TensorSpec("cs", (shape.rows, shape.head_dim), shape.table_dtype)],
        outputs=[TensorSpec("y", (shape.rows, w))],
        streams_in=[st.Stream("x", w), st.Stream("cs", shape.head_dim, shape.table_dtype)],
        held=[],
        streams_out=[st.Stream("y", w)],
        kernel=_kernel(shape, config),
        local_bytes=0,
        numerics=nx.Numerics(
            "bf16",
            "fp32",
            None,
            "bf16",
            (f"angles:{config.angles}", f"table:{shape.table_dtype}", "rotate:fp32", "output:bf16"),
        ),
        fast=_fast(shape, config.layout),
    )
    design.meta = rw.design_meta(design, FAMILY, shape, config, shape.rows * w)
    return design


def _fast(shape: Shape, layout: str = "half"):
    def fast(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        return {"y": rotate_rows(inputs["x"], inputs["cs"], shape.head_dim, layout)}

    return fast


def reference(inputs: dict[str, torch.Tensor], shape: Shape | None = None) -> dict[str, torch.Tensor]:
    """FP32 ``oracle.ops.apply_rope`` with full tables rebuilt from ``cs`` (pass an fp32 ``cs`` for the true op)."""
    x, cs = inputs["x"], inputs["cs"]
    d = cs.shape[-1]
    half = d // 2
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
