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

KV-cache write epilogue (``Shape.kv_format`` "q8_0" or "q4_0": the ``kv_write`` of a quantized cache folded into the
RoPE launch that rotates K, ``kernels.bind.CachedRope``): the last ``kv_heads`` heads of x are K's and V's rows ride
after them in the same x object (x is [q | k | v] as the Q/K/V projections write them side by side); the launch writes
the rotated Q heads as y and the cache's stored row of [rotated k | v] as ``kv``, quantized by the KV-write kernel's
own quantizer (``model.quant.pack_kv_rows``, ``kernels/kvquant.py``), so it equals RoPE then the KV-write launch bit
for bit. Inside a one-dispatch decode the write's own launch is mostly pipeline fill and drain (Llama-3.2-1B's: 4.3
us per layer, 91 % of it fill and drain, modeled), and the rotated K's DDR round trip goes with it. A bf16 cache has
no write launch to fold (the producers' drains land in the cache).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from tilepilot.kernels import _stream as st
from tilepilot.kernels import kvquant, rmsnorm
from tilepilot.kernels import rowwise as rw
from tilepilot.model.quant import GGUF_BLOCK, KV_FORMATS, kv_unit, pack_kv_rows
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
    (Q's then K's), summing to ``heads``; () = none. ``norm_eps``: the norms' epsilon. ``kv_format``: a KV-cache
    write epilogue in that quantized format ("bf16" = none), whose K is the last ``kv_heads`` of the ``heads``."""

    rows: int  # tokens
    heads: int
    head_dim: int
    table_dtype: str = "bf16"
    norm_heads: tuple[int, ...] = ()
    norm_eps: float = 1e-6
    kv_format: str = "bf16"
    kv_heads: int = 0


@dataclass(frozen=True)
class Config(rw.RowConfig):
    """Tokens (with all their heads) streamed through ``tiles`` workers (``rowwise.RowConfig``), rotating the
    pairs of ``layout`` by a table whose angles are computed in ``angles`` precision (only "half" and "fp32" are ever
    candidates: the checkpoints' layout and Hugging Face's table)."""

    layout: str = "half"
    angles: str = "fp32"
    # the KV cache a write epilogue stores (``Shape.kv_format``): data, not tiling; the plan sets it on a launch that
    # writes the cache (``plan.apply_kv_cache``), every candidate carries the shape's, a launch without one ignores it
    kv_format: str = "bf16"


def width(shape: Shape) -> int:
    """Values rotated per token."""
    return shape.heads * shape.head_dim


def writes_cache(shape: Shape) -> bool:
    """Whether the launch also stores the step's KV rows (a quantized cache's write folded in)."""
    return shape.kv_format != "bf16"


def x_width(shape: Shape) -> int:
    """Values read per token: the rotated heads, then V's rows under a cache write."""
    return width(shape) + (shape.kv_heads * shape.head_dim if writes_cache(shape) else 0)


def y_width(shape: Shape) -> int:
    """Values written per token as y: every rotated head, or under a cache write only those before K's."""
    return width(shape) - (shape.kv_heads * shape.head_dim if writes_cache(shape) else 0)


def kv_width(shape: Shape) -> int:
    """Bytes of the cache's stored row per token under a cache write ([k | v] as ``kv_format`` blocks), else 0."""
    return kv_unit(shape.kv_format, 2 * shape.kv_heads * shape.head_dim)[0] if writes_cache(shape) else 0


def _x_stream(shape: Shape) -> st.Stream:
    """x's stream; with a norm prologue every x object also carries the norms' weights (one head_dim row each): a
    compute tile has two input channels, which x and the table already take."""
    return st.Stream("x", x_width(shape), tail="g" if shape.norm_heads else None, tail_elements=_g_elements(shape))


def _out_streams(shape: Shape) -> list[st.Stream]:
    """y (when any head is not K's under a cache write), then the stored rows under a cache write."""
    ys = [st.Stream("y", y_width(shape))] if y_width(shape) else []
    return ys + ([st.Stream("kv", kv_width(shape), "uint8")] if writes_cache(shape) else [])


def _g_elements(shape: Shape) -> int:
    return len(shape.norm_heads) * shape.head_dim


def l1_bytes(shape: Shape, config: Config) -> int:
    ins = [_x_stream(shape), st.Stream("cs", shape.head_dim, shape.table_dtype)]
    return st.l1_bytes(ins, _out_streams(shape), [], config.rows_per_call, config.depth, 0)


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
        flat = ins[0].view(-1)  # x's object: the rows, then the norms' weights (``_x_stream``)
        x = flat[: rpc * xw].view(rpc, xw)
        g = flat[rpc * xw :].view(-1, d) if shape.norm_heads else None
        y = rotate_rows(_prologue(shape, x, g), ins[1], d, config.layout)
        for out, value in zip(outs, _epilogue(shape, y, x), strict=True):
            out.copy_(value)

    rpc, w, xw = config.rows_per_call, width(shape), x_width(shape)
    tb = 2 if shape.table_dtype == "bf16" else 4
    normed = bool(shape.norm_heads)
    norm_ops = rpc * (w * rmsnorm.OPS_PER_ELEMENT + shape.heads * rmsnorm.OPS_PER_ROW) if normed else 0
    kvw = 2 * shape.kv_heads * d if writes_cache(shape) else 0
    write_ops = rpc * (kvw * kvquant.OPS_PER_VALUE + kvw // GGUF_BLOCK * kvquant.OPS_PER_BLOCK)
    return TileKernel(
        name=f"rope_{config.variant}_{shape.heads}x{d}"
        + ("" if config.layout == "half" else f"_{config.layout}")
        + ("" if config.angles == "fp32" else f"_angles_{config.angles}")
        + ("_rms" if normed else "")
        + (f"_kv{shape.kv_format}" if kvw else ""),
        fn=rope_tile,
        variant=config.variant,
        vector_ops_per_call=rpc * w * OPS_PER_ELEMENT + norm_ops + write_ops,
        bytes_per_call=rpc * (2 * xw + 2 * y_width(shape) + kv_width(shape) + tb * d) + 2 * _g_elements(shape),
        params={"head_dim": d},
    )


def _prologue(shape: Shape, x: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
    """The heads to rotate of x's rows, each normalized first under a per-head norm prologue (V's rows riding after
    them under a cache write are not rotated)."""
    heads = x[:, : width(shape)]
    return normalize_heads(heads, g, shape) if shape.norm_heads else heads


def _epilogue(shape: Shape, y: torch.Tensor, x: torch.Tensor) -> list[torch.Tensor]:
    """The launch's outputs from the rotated heads ``y`` and x's rows (``_out_streams``' order): y, or under a cache
    write the heads before K's, then the stored [rotated k | v] rows."""
    if not writes_cache(shape):
        return [y]
    yw = y_width(shape)
    kv = pack_kv_rows(torch.cat((y[:, yw:], x[:, width(shape) :]), dim=1), shape.kv_format)
    return [y[:, :yw], kv] if yw else [kv]


def _check(shape: Shape, config: Config) -> None:
    rw.check_choice(FAMILY, "variant", config.variant, VARIANTS)
    rw.check_choice(FAMILY, "table dtype", shape.table_dtype, TABLE_DTYPES)
    rw.check_choice(FAMILY, "layout", config.layout, LAYOUTS)
    rw.check_choice(FAMILY, "angles", config.angles, ANGLES)
    if min(shape.rows, shape.heads, shape.head_dim) < 1 or shape.head_dim % 4:
        raise st.shape_error(FAMILY, f"shape {shape} is empty or head_dim is not a multiple of 4 (two word halves)")
    if shape.norm_heads and (sum(shape.norm_heads) != shape.heads or min(shape.norm_heads) < 1):
        raise st.shape_error(FAMILY, f"norm heads {shape.norm_heads} do not cover the {shape.heads} heads once each")
    if writes_cache(shape) and config.kv_format != shape.kv_format:
        raise st.shape_error(
            FAMILY,
            f"the config writes a {config.kv_format} cache but the cache is {shape.kv_format}; set kv_format",
        )


def _check_cache_write(shape: Shape) -> None:
    """A cache write's format, K heads and stored row (checked before any tiling is sized by its bytes)."""
    if not writes_cache(shape):
        return
    rw.check_choice(FAMILY, "KV-cache format", shape.kv_format, tuple(f for f in KV_FORMATS if f != "bf16"))
    if not 1 <= shape.kv_heads <= shape.heads:
        raise st.shape_error(FAMILY, f"a cache write needs 1 to {shape.heads} K heads, got {shape.kv_heads}")
    kvquant.check_row(FAMILY, 2 * shape.kv_heads * shape.head_dim, shape.kv_format)


def make_design(shape: Shape, config: Config | None = None, device: Device | None = None) -> Design:
    device = device or npu2()
    _check_cache_write(shape)
    config = config or default_config(shape, device)
    _check(shape, config)
    w = x_width(shape)
    inputs = [TensorSpec("x", (shape.rows, w)), TensorSpec("cs", (shape.rows, shape.head_dim), shape.table_dtype)]
    if shape.norm_heads:
        inputs.append(TensorSpec("g", (len(shape.norm_heads), shape.head_dim)))
    outs = _out_streams(shape)
    prologue = ("prologue:rmsnorm(fp32)->bf16",) if shape.norm_heads else ()
    epilogue = (f"epilogue:quantize:{shape.kv_format}(fp32 scale->fp16)",) if writes_cache(shape) else ()
    design = st.build(
        name=f"rope_{shape.rows}x{shape.heads}x{shape.head_dim}"
        + ("_rms" if shape.norm_heads else "")
        + (f"_kv{shape.kv_format}" if writes_cache(shape) else ""),
        family=FAMILY,
        device=device,
        rows=shape.rows,
        tiles=config.tiles,
        rows_per_call=config.rows_per_call,
        depth=config.depth,
        inputs=inputs,
        outputs=[TensorSpec(o.tensor, (shape.rows, o.width), o.dtype) for o in outs],
        streams_in=[_x_stream(shape), st.Stream("cs", shape.head_dim, shape.table_dtype)],
        held=[],
        streams_out=outs,
        kernel=_kernel(shape, config),
        local_bytes=0,
        numerics=nx.Numerics(
            "bf16",
            "fp32",
            None,
            "bf16",
            (*prologue, f"angles:{config.angles}", f"table:{shape.table_dtype}", "rotate:fp32", "output:bf16")
            + epilogue,
        ),
        fast=_fast(shape, config.layout),
    )
    design.meta = rw.design_meta(design, FAMILY, shape, config, shape.rows * w)
    return design


def _fast(shape: Shape, layout: str = "half"):
    names = [o.tensor for o in _out_streams(shape)]

    def fast(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        x = inputs["x"]
        y = rotate_rows(_prologue(shape, x, inputs.get("g")), inputs["cs"], shape.head_dim, layout)
        return dict(zip(names, _epilogue(shape, y, x), strict=True))

    return fast


def reference(inputs: dict[str, torch.Tensor], shape: Shape | None = None) -> dict[str, torch.Tensor]:
    """FP32 ``oracle.ops.apply_rope`` with full tables rebuilt from ``cs`` (pass an fp32 ``cs`` for the true op); with
    a per-head norm prologue (``shape.norm_heads``), of the FP32 RMSNorm of each head (``oracle.ops.rmsnorm``)."""
    x, cs = inputs["x"], inputs["cs"]
    d = cs.shape[-1]
    half = d // 2
    heads = x[:, : width(shape)] if shape is not None else x
    if shape is not None and shape.norm_heads:
        heads = normalize_heads(heads, inputs["g"], shape, ops.rmsnorm)
    cos = torch.cat((cs[:, :half], cs[:, :half]), dim=-1).to(torch.float32)
    sin = torch.cat((cs[:, half:], cs[:, half:]), dim=-1).to(torch.float32)
    y = ops.apply_rope(heads.reshape(x.shape[0], -1, d), cos, sin).reshape(x.shape[0], -1)
    if shape is None or not writes_cache(shape):
        return {"y": y}
    # the cache's stored bytes are defined by its format: the FP32 rotation rounded to bf16 (what the cache holds
    # before it quantizes), then the KV-write kernel's quantizer
    names = [o.tensor for o in _out_streams(shape)]
    return dict(zip(names, _epilogue(shape, y.to(torch.bfloat16), x), strict=True))


def candidate_configs(shape: Shape, device: Device | None = None) -> list[Config]:
    """More tiles first (8 = one per column; more exhausts the shims), then more tokens per call; under a cache
    write each carries the shape's format."""
    cands = rw.row_candidates(shape.rows, device or npu2(), lambda c: l1_bytes(shape, c), Config)
    return [replace(c, kv_format=shape.kv_format) for c in cands] if writes_cache(shape) else cands


def default_config(shape: Shape, device: Device | None = None) -> Config:
    why = f"no RoPE tiling fits {shape}; one token's heads do not fit tile memory"
    return rw.first_candidate(FAMILY, candidate_configs(shape, device), why)
