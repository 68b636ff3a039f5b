"""SwiGLU activation: y = silu(gate) * up, the gated activation between the FFN's up and down projections.

The op is elementwise, so the design treats gate, up and y ([rows, width] in DDR) as flat streams cut
into ``chunk``-element objects (AIR's measured SiLU x mul runs 8 tiles with 4096-element chunks, config
"8/1/4096"). Dataflow (``kernels/_stream.py``): contiguous ranges of chunks, one worker per column
first, three DDR streams per worker (gate in, up in, y out), so at most 8 workers on npu2 before the
shims run out of channels, and 3 fifos x depth x chunk x 2 B must fit L1 (chunk 4096 double-buffered
does, 8192 does not: the limit AIR's authors hit).

Numerics: bf16 in and out, fp32 inside. silu(g) = g / (1 + exp(-g)) in fp32, times up in fp32, one
round-to-nearest-even to bf16. The tile path and ``fast(exact=True)`` evaluate silu in fp64 and round it
to fp32 (a correctly rounded fp32 silu, identical however the host vectorizes); the production fast path
(``exact=False``) uses torch's fp32 ``silu``, which may differ from it by an fp32 ulp and so, rarely, the
bf16 output by one bf16 ulp (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tilepilot.kernels import _stream as st
from tilepilot.kernels import rowwise as rw
from tilepilot.npu import numerics as nx
from tilepilot.npu.design import Design, TensorSpec, TileKernel
from tilepilot.npu.device import Device, npu2
from tilepilot.oracle import ops

FAMILY = "swiglu"
VARIANTS = rw.VARIANTS
# ESTIMATE of fp32 vector operations per element: negate, exp (~6 ops: range reduction + polynomial on
# an AIE without a native fp32 exp), add, reciprocal (~3), two multiplies, bf16 convert.
OPS_PER_ELEMENT = 14
CHUNKS = (4096, 2048, 1024, 512, 256, 128, 64)
# Config fields with named choices (what a debug skill may switch one at a time).
OPTIONS = {"variant": VARIANTS, "store": rw.STORES}


@dataclass(frozen=True)
class Shape:
    rows: int
    width: int  # the FFN intermediate size


@dataclass(frozen=True)
class Config:
    tiles: int = 8
    chunk: int = 4096  # elements per object (any even divisor of rows * width)
    depth: int = 2
    variant: str = "vector"
    store: str = "bf16"  # the product's write type (``rowwise.STORES``); only "bf16" is ever a candidate


def elements(shape: Shape) -> int:
    return shape.rows * shape.width


def l1_bytes(config: Config) -> int:
    s = st.Stream("s", config.chunk)
    return st.l1_bytes([s, s], [s], [], 1, config.depth, 0)


def silu_mul(gate: torch.Tensor, up: torch.Tensor, exact: bool = True, store: str = "bf16") -> torch.Tensor:
    """silu(gate) * up from bf16 operands, fp32 inside, rounded once to ``store`` (bf16 by default)."""
    if exact:
        g = gate.to(torch.float64)
        act = (g / (1.0 + torch.exp(-g))).to(torch.float32)
    else:
        act = F.silu(gate.to(torch.float32))
    return rw.store(act * up.to(torch.float32), store)


def _kernel(config: Config) -> TileKernel:
    def swiglu_tile(ins: list[torch.Tensor], outs: list[torch.Tensor], ctx) -> None:
        outs[0].copy_(silu_mul(ins[0], ins[1], exact=True, store=config.store))

    suffix = "" if config.store == "bf16" else f"_{config.store}"
    return TileKernel(
        name=f"swiglu_{config.variant}_{config.chunk}{suffix}",
        fn=swiglu_tile,
        variant=config.variant,
        vector_ops_per_call=config.chunk * OPS_PER_ELEMENT,
        bytes_per_call=3 * 2 * config.chunk,
        params={"chunk": config.chunk},
    )


def make_design(shape: Shape, config: Config | None = None, device: Device | None = None) -> Design:
    device = device or npu2()
    config = config or default_config(shape, device)
    rw.check_choice(FAMILY, "variant", config.variant, VARIANTS)
    rw.check_choice(FAMILY, "store", config.store, rw.STORES)
    n = elements(shape)
    if n < 1 or config.chunk < 2 or config.chunk % 2 or n % config.chunk:
        raise st.shape_error(
            FAMILY, f"{shape.rows} x {shape.width} = {n} elements do not split into {config.chunk}-element chunks"
        )
    tensor = (shape.rows, shape.width)
    chunk = config.chunk
    design = st.build(
        name=f"swiglu_{shape.rows}x{shape.width}",
        family=FAMILY,
        device=device,
        rows=n // chunk,
        tiles=config.tiles,
        rows_per_call=1,
        depth=config.depth,
        inputs=[TensorSpec("gate", tensor), TensorSpec("up", tensor)],
        outputs=[TensorSpec("y", tensor)],
        streams_in=[st.Stream("gate", chunk), st.Stream("up", chunk)],
        held=[],
        streams_out=[st.Stream("y", chunk)],
        kernel=_kernel(config),
        local_bytes=0,
        numerics=nx.Numerics("bf16", "fp32", None, "bf16", ("silu:fp32", "mul:fp32", *rw.store_point(config.store))),
        fast=rw.with_store(_fast(), config.store),
    )
    design.meta = rw.design_meta(design, FAMILY, shape, config, n)
    return design


def _fast():
    def fast(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        return {"y": silu_mul(inputs["gate"], inputs["up"], exact=exact)}

    return fast


def reference(inputs: dict[str, torch.Tensor], shape: Shape | None = None) -> dict[str, torch.Tensor]:
    """FP32 ``silu(gate) * up`` of the oracle (``oracle.ops.swiglu``)."""
    return {"y": ops.swiglu(inputs["gate"], inputs["up"])}


def _chunks(n: int, tiles: int) -> list[int]:
    """Chunk sizes that divide n into at least ``tiles`` objects: the standard sizes, then n's even divisors."""
    std = [c for c in CHUNKS if n % c == 0 and n // c >= tiles]
    odd = [c for c in range(min(n // tiles, CHUNKS[0]), 1, -1) if c % 16 == 0 and n % c == 0 and c not in std]
    return std + odd[:2]


def candidate_configs(shape: Shape, device: Device | None = None) -> list[Config]:
    """More tiles (up to the 8 the shims can feed) and bigger chunks first."""
    device = device or npu2()
    n = elements(shape)
    out: list[tuple[tuple, Config]] = []
    for tiles in rw.TILE_CHOICES:
        if tiles > device.n_compute_tiles or n < tiles:
            continue
        chunks = _chunks(n, tiles) or ([n // tiles] if n % tiles == 0 and (n // tiles) % 2 == 0 else [])
        for chunk in [c for c in chunks if l1_bytes(Config(tiles, c)) <= device.compute.memory_bytes][:4]:
            out.append(((tiles > device.columns, -tiles, -chunk), Config(tiles, chunk, 2, "vector")))
    out.sort(key=lambda x: x[0])
    return rw.with_scalar([c for _, c in out])


def default_config(shape: Shape, device: Device | None = None) -> Config:
    why = f"no SwiGLU chunking fits {shape}; rows x width must be even"
    return rw.first_candidate(FAMILY, candidate_configs(shape, device), why)
