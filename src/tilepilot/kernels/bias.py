"""Bias add: y[r, :] = x[r, :] + b, the QKV (and O) projection bias of Qwen2-style models.

Dataflow (``kernels/_stream.py``): rows of x streamed through ``tiles`` workers (one per column first),
``rows_per_call`` rows per kernel call; the bias vector is read once and broadcast to every worker,
which keeps it for the whole launch. Two DDR streams per worker plus the broadcast.

Numerics: bf16 in and out; x + b computed in fp32 (exact for two bf16 values unless far apart in
magnitude) and rounded once to bf16 (RNE). Production fast path == exact path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tilepilot.kernels import _stream as st
from tilepilot.kernels import rowwise as rw
from tilepilot.npu import numerics as nx
from tilepilot.npu.design import Design, TensorSpec, TileKernel
from tilepilot.npu.device import Device, npu2
from tilepilot.oracle import ops

FAMILY = "bias"
VARIANTS = rw.VARIANTS
OPS_PER_ELEMENT = 2  # ESTIMATE: one fp32 add and one bf16 convert per element
# Config fields with named choices (what a debug skill may switch one at a time).
OPTIONS = {"variant": VARIANTS}


@dataclass(frozen=True)
class Shape:
    rows: int  # tokens
    width: int  # output features of the projection


@dataclass(frozen=True)
class Config(rw.RowConfig):
    """Rows of x streamed through ``tiles`` workers (``rowwise.RowConfig``)."""


def l1_bytes(shape: Shape, config: Config) -> int:
    s = st.Stream("x", shape.width)
    return st.l1_bytes([s], [s], [st.Held("b", shape.width)], config.rows_per_call, config.depth, 0)


def add_bias(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x [n, width] + b [width] in fp32, rounded once to bf16."""
    return nx.round_bf16(x.to(torch.float32) + b.to(torch.float32))


def _kernel(shape: Shape, config: Config) -> TileKernel:
    def bias_tile(ins: list[torch.Tensor], outs: list[torch.Tensor], ctx) -> None:
        outs[0].copy_(add_bias(ins[0], ins[1]))

    rpc, w = config.rows_per_call, shape.width
    return TileKernel(
        name=f"bias_{config.variant}_{w}",
        fn=bias_tile,
        variant=config.variant,
        vector_ops_per_call=rpc * w * OPS_PER_ELEMENT,
        bytes_per_call=2 * 2 * rpc * w + 2 * w,
        params={"width": w},
    )


def make_design(shape: Shape, config: Config | None = None, device: Device | None = None) -> Design:
    device = device or npu2()
    config = config or default_config(shape, device)
    rw.check_choice(FAMILY, "variant", config.variant, VARIANTS)
    if min(shape.rows, shape.width) < 1 or shape.width % 2:
        raise st.shape_error(FAMILY, f"shape {shape} is empty or has an odd width (rows must be whole words)")
    design = st.build(
        name=f"bias_{shape.rows}x{shape.width}",
        family=FAMILY,
        device=device,
        rows=shape.rows,
        tiles=config.tiles,
        rows_per_call=config.rows_per_call,
        depth=config.depth,
        inputs=[TensorSpec("x", (shape.rows, shape.width)), TensorSpec("b", (shape.width,))],
        outputs=[TensorSpec("y", (shape.rows, shape.width))],
        streams_in=[st.Stream("x", shape.width)],
        held=[st.Held("b", shape.width)],
        streams_out=[st.Stream("y", shape.width)],
        kernel=_kernel(shape, config),
        local_bytes=0,
        numerics=nx.Numerics("bf16", "fp32", None, "bf16", ("add:fp32", "output:bf16")),
        fast=_fast(),
    )
    design.meta = rw.design_meta(design, FAMILY, shape, config, shape.rows * shape.width)
    return design


def _fast():
    def fast(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        return {"y": add_bias(inputs["x"], inputs["b"])}

    return fast


def reference(inputs: dict[str, torch.Tensor], shape: Shape | None = None) -> dict[str, torch.Tensor]:
    """FP32 x + b (``oracle.ops.add`` with the bias broadcast over rows)."""
    return {"y": ops.add(inputs["x"], inputs["b"])}


def candidate_configs(shape: Shape, device: Device | None = None) -> list[Config]:
    """More tiles first (one per column), then bigger objects."""
    return rw.row_candidates(shape.rows, device or npu2(), lambda c: l1_bytes(shape, c), Config)


def default_config(shape: Shape, device: Device | None = None) -> Config:
    why = f"no bias tiling fits {shape}; one row does not fit tile memory"
    return rw.first_candidate(FAMILY, candidate_configs(shape, device), why)
