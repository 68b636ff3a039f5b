"""Elementwise add (the residual) and multiply on bf16, streamed from DDR through ``tiles`` compute tiles.

The flat tensor of ``n`` elements is cut into ``tiles`` contiguous slices, one per worker; each worker
streams its slice in ``chunk``-element objects: two input fifos from a shim and one output fifo back to a
shim, i.e. three DDR streams per tile. Workers go one per column first (tile i on column i % columns),
so up to 8 tiles each get their own shim; a 9th tile needs more shim MM2S channels than npu2 has and
the validator says so (the limit the paper's authors hit). Each tile needs 3 fifos x depth x chunk x 2 B
of L1: chunk 4096 with double buffering fits 64 KiB, 8192 does not.

Numerics: both operands are upcast to fp32, combined, rounded once to bf16 (RNE); the fast path does
the same at tensor level, so exact and production paths coincide.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tilepilot.kernels import rowwise as rw
from tilepilot.npu import numerics as nx
from tilepilot.npu.design import (
    Design,
    ObjectFifo,
    Runtime,
    TensorAccessPattern,
    TensorSpec,
    Tile,
    TileKernel,
    Worker,
)
from tilepilot.npu.device import FIRST_COMPUTE_ROW, SHIM_ROW, Device, npu2
from tilepilot.npu.validate import CORE_STACK_BYTES, DesignError, legal_taps

FAMILY = "eltwise"
OPS = {"add": torch.add, "mul": torch.mul}
STREAMS = (("fill", "a"), ("fill", "b"), ("drain", "c"))  # each worker's three DDR streams, in runtime order
VARIANTS = rw.VARIANTS
# Config fields with named choices (what a debug skill may switch one at a time).
OPTIONS = {"variant": VARIANTS, "store": rw.STORES}


@dataclass(frozen=True)
class Shape:
    n: int  # elements of the flat tensors
    op: str = "add"


@dataclass(frozen=True)
class Config:
    tiles: int = 8
    chunk: int = 2048
    depth: int = 2
    variant: str = "vector"
    pad: bool = False
    store: str = "bf16"  # the sum's write type (``rowwise.STORES``); only "bf16" is ever a candidate


def _err(message: str) -> DesignError:
    return rw.shape_error(FAMILY, message)


def padded_n(shape: Shape, config: Config) -> int:
    block = config.tiles * config.chunk
    return -(-shape.n // block) * block


def l1_bytes(config: Config) -> int:
    return 3 * config.depth * config.chunk * 2 + CORE_STACK_BYTES


def tile_of(i: int, device: Device) -> Tile:
    """Worker i's tile: one per column first, then the next row."""
    return Tile(i % device.columns, FIRST_COMPUTE_ROW + i // device.columns)


def _kernel(shape: Shape, config: Config) -> TileKernel:
    fn_op, kind = OPS[shape.op], config.store

    def eltwise_tile(ins: list[torch.Tensor], outs: list[torch.Tensor], ctx) -> None:
        outs[0].copy_(rw.store(fn_op(ins[0].to(torch.float32), ins[1].to(torch.float32)), kind))

    suffix = "" if kind == "bf16" else f"_{kind}"
    return TileKernel(
        name=f"{shape.op}_{config.variant}_{config.chunk}{suffix}",
        fn=eltwise_tile,
        variant=config.variant,
        vector_ops_per_call=config.chunk,
        bytes_per_call=3 * 2 * config.chunk,
        params={"op": shape.op, "chunk": config.chunk},
    )


def make_design(shape: Shape, config: Config | None = None, device: Device | None = None) -> Design:
    device = device or npu2()
    config = config or default_config(shape, device)
    if shape.op not in OPS:
        raise _err(f"op {shape.op!r} is not elementwise here; use one of {sorted(OPS)}")
    rw.check_choice(FAMILY, "variant", config.variant, VARIANTS)
    rw.check_choice(FAMILY, "store", config.store, rw.STORES)
    if config.tiles < 1 or config.tiles > device.n_compute_tiles or config.chunk < 2 or config.chunk % 2:
        raise _err(f"{config.tiles} tiles of {config.chunk}-element chunks cannot run on {device.name}")
    n = padded_n(shape, config)
    if n != shape.n and not config.pad:
        raise _err(f"n={shape.n} is not a multiple of tiles x chunk = {config.tiles * config.chunk}; set pad=True")
    per_tile = n // config.tiles
    kernel = _kernel(shape, config)
    fifos, workers = [], []
    for i in range(config.tiles):
        a, b, c = f"a_{i}", f"b_{i}", f"c_{i}"
        fifos += [ObjectFifo(x, (config.chunk,), "bf16", config.depth) for x in (a, b, c)]
        workers.append(
            Worker(
                f"{shape.op}_{i}",
                kernel,
                (a, b),
                (c,),
                iterations=per_tile // config.chunk,
                placement=tile_of(i, device),
            )
        )
    rt, fallback = _runtime(n, config, device)
    design = Design(
        name=f"{shape.op}_{shape.n}",
        device=device,
        inputs=[TensorSpec("a", (n,)), TensorSpec("b", (n,))],
        outputs=[TensorSpec("c", (n,))],
        fifos=fifos,
        workers=workers,
        runtime=rt,
        numerics=nx.Numerics("bf16", "fp32", None, "bf16", ("compute:fp32", *rw.store_point(config.store))),
        fast=rw.with_store(_fast(shape), config.store),
    )
    design.meta = rw.design_meta(design, FAMILY, shape, config, n, padded_shape={"n": n, "op": shape.op})
    if fallback:  # only on designs the usual construction could not make legal: every other meta is as it was
        design.meta["fallback"] = fallback
    return design


def _runtime(n: int, config: Config, device: Device) -> tuple[Runtime, list[str]]:
    """Each worker's slice filled from a and b and drained to c: stream by stream, all in one task group, unless that
    needs more buffer descriptors than a shim has.

    A slice longer than one pattern holds (1023 rows of up to 2046 elements) is cut into several patterns, on whole
    objects where the plain cut would split one (``legal_taps``' ``whole``: a task must move whole objects). The
    one-group runtime is what every length had before long prompts were supported, and it is kept whenever its
    shims' BDs suffice, so every design legal before is unchanged (and so the calibration rows and modeled figures
    timed from them). Only a slice of many patterns (a prime number of 64-element objects, say: ~9 per stream,
    24-27 BDs on a 16-BD shim) falls back to ``_packed``. Also returns the fallbacks taken (``Design.meta``'s
    ``fallback``), by name.
    """
    per_tile = n // config.tiles
    slices = [legal_taps((n,), i * per_tile, [per_tile], [1], whole=config.chunk) for i in range(config.tiles)]
    # every slice is cut alike (the cuts depend on its length only): the first one says whether the cuts moved
    fallback = ["whole-object cuts"] if slices[0] != legal_taps((n,), 0, [per_tile], [1]) else []
    per_shim: dict[int, int] = {}
    for i, taps in enumerate(slices):
        col = tile_of(i, device).col  # the shim the placer gives a worker's streams: its own column's
        per_shim[col] = per_shim.get(col, 0) + len(STREAMS) * len(taps)
    if max(per_shim.values()) > device.shim.bds:
        return _packed(slices, device), [*fallback, "packed task groups"]
    rt = Runtime()
    for i, taps in enumerate(slices):
        for kind, x in STREAMS:
            for tap in taps:
                (rt.fill if kind == "fill" else rt.drain)(f"{x}_{i}", x, tap)
    return rt, fallback


def _packed(slices: list[list[TensorAccessPattern]], device: Device) -> Runtime:
    """``_runtime``'s tasks in as few task groups as the shims' BDs allow (``Runtime.packed``, as gemv and attention
    do; each group boundary costs a pipeline fill and drain). A boundary falls between one pattern's a, b and c
    tasks and the next's, so each group drains what it fills and no group waits on a later one; inside a group the
    tasks keep the stream-by-stream order."""
    units: dict[int, list[list[tuple[str, str, str, TensorAccessPattern]]]] = {}
    shim_of: dict[str, Tile] = {}
    for i, taps in enumerate(slices):
        col = tile_of(i, device).col
        shim_of |= {f"{x}_{i}": Tile(col, SHIM_ROW) for _, x in STREAMS}
        units.setdefault(col, []).extend([[(kind, f"{x}_{i}", x, tap) for kind, x in STREAMS] for tap in taps])
    rt = Runtime.packed(list(units.values()), device.shim.bds, shim_of)
    rank = {fifo: r for r, fifo in enumerate(shim_of)}
    rt.tasks.sort(key=lambda t: (t.group, rank[t.fifo]))  # stable: a stream's patterns stay in order
    return rt


def _fast(shape: Shape):
    fn_op = OPS[shape.op]

    def fast(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        return {"c": nx.apply_fp32(fn_op, inputs["a"], inputs["b"])}

    return fast


def reference(inputs: dict[str, torch.Tensor], shape: Shape | None = None) -> dict[str, torch.Tensor]:
    """FP32 result of the shape's op (add by default) on the bf16 inputs, without rounding."""
    op = shape.op if shape is not None else "add"
    return {"c": OPS[op](inputs["a"].to(torch.float32), inputs["b"].to(torch.float32))}


def prepare_inputs(design: Design, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
    """Flatten and zero-pad a and b to the design's length."""
    n = design.tensor("a").shape[0]
    return {"a": _pad(a.reshape(-1), n), "b": _pad(b.reshape(-1), n)}


def crop_outputs(design: Design, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"c": outputs["c"][: design.meta["logical_shape"]["n"]]}


def _pad(t: torch.Tensor, n: int) -> torch.Tensor:
    t = t.to(torch.bfloat16)
    if t.numel() == n:
        return t
    out = torch.zeros(n, dtype=torch.bfloat16)
    out[: t.numel()] = t
    return out


def candidate_configs(shape: Shape, device: Device | None = None) -> list[Config]:
    """More tiles (up to the 8 the shims can feed) and bigger chunks first; unpadded before padded."""
    device = device or npu2()
    out: list[tuple[tuple, Config]] = []
    for tiles in rw.TILE_CHOICES:
        if tiles > device.n_compute_tiles:
            continue
        for chunk in (4096, 2048, 1024, 512, 256, 64):
            for variant in VARIANTS:
                cfg = Config(tiles, chunk, 2, variant)
                if l1_bytes(cfg) > device.compute.memory_bytes:
                    continue
                n = padded_n(shape, cfg)
                if n > 2 * shape.n:
                    continue
                if n != shape.n:
                    cfg = Config(tiles, chunk, 2, variant, pad=True)
                out.append(((n != shape.n, n, variant != "vector", tiles > device.columns, -tiles, -chunk), cfg))
    out.sort(key=lambda x: x[0])
    return [c for _, c in out]


def default_config(shape: Shape, device: Device | None = None) -> Config:
    cands = candidate_configs(shape, device)
    if not cands:
        return Config(tiles=1, chunk=2, pad=True)
    return cands[0]
