"""The KV-cache write of a quantized cache: new [k | v] rows in bf16 in, their q8_0 (or q4_0) blocks out.

A bf16 cache needs no kernel (the producers' drains land in the cache buffer, ``model/graph.py``); a quantized cache
(``model.quant.KV_FORMATS``) stores each row as GGUF blocks of 32 values (Q8_0: fp16 scale, 32 int8 codes; Q4_0:
fp16 scale, 16 bytes of nibbles), so someone has to compute the scales and codes: this launch, one per layer and
pass, streaming rows through the row-wise dataflow (``kernels/_stream.py``): x is the step's K rows (after RoPE) and
V rows side by side, exactly the row the cache holds, and each call writes the packed bytes of its rows.

Numerics: the quantizer of ``model.quant.pack_kv_rows`` (per Q8_0 block: the value of largest magnitude over 127,
rounded to fp16, then each value over it rounded to the nearest int8; Q4_0 as llama.cpp's), bf16 in, exact; the
fast path is the same function, so production == exact. What attention later computes with is the blocks decoded
and rounded once to bf16 (``kernels/attention.py``), which is what the oracle's own K and V go through under this
cache.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tilepilot.kernels import _stream as st
from tilepilot.kernels import rowwise as rw
from tilepilot.model.quant import GGUF_BLOCK, KV_FORMATS, block_bytes, kv_unit, pack_kv_rows
from tilepilot.npu import numerics as nx
from tilepilot.npu.design import Design, TensorSpec, TileKernel
from tilepilot.npu.device import Device, npu2

FAMILY = "kvquant"
VARIANTS = rw.VARIANTS
# ESTIMATE: per value, the block's running max of magnitudes, a multiply by the inverse scale, a round and an
# int8 convert; per block, the scale's division and fp16 conversion
OPS_PER_VALUE = 4
OPS_PER_BLOCK = 8


@dataclass(frozen=True)
class Shape:
    """``rows`` positions of one layer's [k | v] rows of ``width`` values (2 x kv_dim), stored as ``kv_format``."""

    rows: int
    width: int
    kv_format: str = "q8_0"


@dataclass(frozen=True)
class Config(rw.RowConfig):
    """Rows streamed through ``tiles`` workers (``rowwise.RowConfig``). ``kv_format``: the cache's format, data
    rather than tiling (the plan sets it, every candidate carries the shape's)."""

    kv_format: str = "q8_0"


def packed_width(shape: Shape) -> int:
    """Bytes of one stored row."""
    return kv_unit(shape.kv_format, shape.width)[0]


def l1_bytes(shape: Shape, config: Config) -> int:
    ins, outs = [st.Stream("x", shape.width)], [st.Stream("kv", packed_width(shape), "uint8")]
    return st.l1_bytes(ins, outs, [], config.rows_per_call, config.depth, 0)


def _kernel(shape: Shape, config: Config) -> TileKernel:
    def quantize_tile(ins: list[torch.Tensor], outs: list[torch.Tensor], ctx) -> None:
        outs[0].copy_(pack_kv_rows(ins[0], shape.kv_format))

    rpc, w = config.rows_per_call, shape.width
    return TileKernel(
        name=f"kvquant_{config.variant}_{shape.kv_format}_{w}",
        fn=quantize_tile,
        variant=config.variant,
        vector_ops_per_call=rpc * (w * OPS_PER_VALUE + w // GGUF_BLOCK * OPS_PER_BLOCK),
        bytes_per_call=rpc * (2 * w + packed_width(shape)),
        params={"width": w},
    )


def _check_shape(shape: Shape) -> None:
    rw.check_choice(FAMILY, "KV-cache format", shape.kv_format, tuple(f for f in KV_FORMATS if f != "bf16"))
    if shape.rows < 1:
        raise st.shape_error(FAMILY, f"shape {shape} is empty")
    check_row(FAMILY, shape.width, shape.kv_format)


def check_row(family: str, width: int, kv_format: str) -> None:
    """A row of ``width`` values stored as ``kv_format`` blocks must be whole blocks in whole 32-bit words (the RoPE
    launch that writes the cache checks its rows so too)."""
    if width < 1 or width % GGUF_BLOCK:
        raise st.shape_error(family, f"a stored row of {width} values is not whole {GGUF_BLOCK}-value blocks")
    if width // GGUF_BLOCK * block_bytes(kv_format) % 4:
        raise st.shape_error(family, f"a stored row of {width} values is not whole 32-bit words")


def make_design(shape: Shape, config: Config | None = None, device: Device | None = None) -> Design:
    device = device or npu2()
    _check_shape(shape)
    config = config or default_config(shape, device)
    rw.check_choice(FAMILY, "variant", config.variant, VARIANTS)
    if config.kv_format != shape.kv_format:
        raise st.shape_error(FAMILY, f"the config writes a {config.kv_format} cache but the cache is {shape.kv_format}")
    pw = packed_width(shape)
    design = st.build(
        name=f"kvquant_{shape.rows}x{shape.width}_{shape.kv_format}",
        family=FAMILY,
        device=device,
        rows=shape.rows,
        tiles=config.tiles,
        rows_per_call=config.rows_per_call,
        depth=config.depth,
        inputs=[TensorSpec("x", (shape.rows, shape.width))],
        outputs=[TensorSpec("kv", (shape.rows, pw), "uint8")],
        streams_in=[st.Stream("x", shape.width)],
        held=[],
        streams_out=[st.Stream("kv", pw, "uint8")],
        kernel=_kernel(shape, config),
        local_bytes=0,
        numerics=nx.Numerics("bf16", "fp32", None, "bf16", (f"quantize:{shape.kv_format}(fp32 scale->fp16)",)),
        fast=_fast(shape),
    )
    design.meta = rw.design_meta(design, FAMILY, shape, config, shape.rows * shape.width)
    return design


def _fast(shape: Shape):
    def fast(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        return {"kv": pack_kv_rows(inputs["x"], shape.kv_format)}

    return fast


def reference(inputs: dict[str, torch.Tensor], shape: Shape | None = None) -> dict[str, torch.Tensor]:
    """The quantizer itself (there is no FP32 op to compare with: the cache format defines the stored bytes)."""
    return {"kv": pack_kv_rows(inputs["x"], (shape or Shape(1, GGUF_BLOCK)).kv_format)}


def candidate_configs(shape: Shape, device: Device | None = None) -> list[Config]:
    cands = rw.row_candidates(shape.rows, device or npu2(), lambda c: l1_bytes(shape, c), Config)
    return [replace(c, kv_format=shape.kv_format) for c in cands]


def default_config(shape: Shape, device: Device | None = None) -> Config:
    why = f"no KV-quantize tiling fits {shape}; one row does not fit tile memory"
    return rw.first_candidate(FAMILY, candidate_configs(shape, device), why)


def complete_config(shape: Shape, partial: dict, device: Device | None = None) -> Config:
    """A plan's config naming only the cache format (``plan.apply_kv_cache``) completed by the default tiling for
    the shape, so one plan serves a prompt and a decode step."""
    return replace(default_config(shape, device), **partial)
