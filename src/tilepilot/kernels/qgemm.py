"""Quantized GEMM for prefill: C[M, N] = A[M, K] @ dequant(Wq)[N, K]^T, packed weights streamed as stored.

The whole-array GEMM of ``kernels/gemm.py`` with one change of element type on the weight path: W enters
each column's shim as the packed uint8 rows of ``model/quant.py`` (per block an fp16 scale, an fp16 min for
q4_1, then the codes), so the shim and the column's memory tile move a (tile_n, tile_k / block * block_bytes)
byte object per kernel call, the true bytes of the format (Q4_0 at block 32: 4.5 bits per weight, 0.28x of
bf16). The compute tile decodes the object (``quant.dequantize_blocks``: unpack nibbles, scale, add min),
rounds the weights once to bf16 and runs the GEMM's own matmul kernel on them. A, C, their memory-tile
splits and joins, the task groups and the workers are the GEMM's, built by ``gemm.make_design`` and then
re-typed here (weight fifos, the weight tensor, its access patterns, the kernel), so the two designs cannot
drift apart.

Resources: the validator sees the packed objects in L1 (W fifo depth x packed object) and L2 (the memory
tile's forward buffers), plus the decoded bf16 chunk in each worker's local memory; the shim patterns are
byte patterns (whole 32-bit words, which ``tile_k`` a multiple of the block guarantees for even blocks).

Numerics: exactly the GEMM over ``QuantTensor.deployed()`` (dequantized, one bf16 rounding), which is what
the oracle runs: the fast path dequantizes the whole tensor and calls the GEMM's fast path, bit-identical to
the tile path with exact=True (tested on small shapes). Zero padding bytes dequantize to zero weights in all
three formats (d = 0, m = 0), so padded shapes stay exact.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields, replace

import torch

from tilepilot.kernels import gemm
from tilepilot.kernels.gemv import stream_taps, tile_fits
from tilepilot.kernels.qgemv import DEQUANT_OPS
from tilepilot.model.quant import QUANT_FORMATS, block_bytes, deployed_packed, dequantize_packed
from tilepilot.npu.calibration import CALIBRATION, Calibration
from tilepilot.npu.design import Design, Runtime, RuntimeTask, TensorSpec, TileKernel
from tilepilot.npu.device import Device, npu2
from tilepilot.npu.validate import WORD_BYTES, DesignError, Violation

FAMILY = "qgemm"
VARIANTS = ("vector", "bfp16")


@dataclass(frozen=True)
class Shape:
    m: int
    n: int
    k: int
    fmt: str = "q4_0"
    block: int = 32


@dataclass(frozen=True)
class Config:
    """The GEMM's config plus the data's format (set by the plan from its weight format, never by the tuner).
    ``tile_m``/``tile_k``/``tile_n`` 0 = the default config for the shape (a plan's config may name only the format).
    """

    rows: int = 4
    cols: int = 8
    tile_m: int = 0
    tile_k: int = 0
    tile_n: int = 0
    variant: str = "vector"
    acc: str = "fp32"
    depth: int = 2
    pad: bool = False
    fmt: str = "q4_0"
    block: int = 32

    def gemm(self) -> gemm.Config:
        names = {f.name for f in fields(gemm.Config)}
        return gemm.Config(**{k: v for k, v in asdict(self).items() if k in names})


def _err(message: str) -> DesignError:
    return DesignError([Violation("SHAPE_NOT_TILING", None, message)], FAMILY)


def chunk_bytes(shape: Shape, tile_k: int) -> int:
    return tile_k // shape.block * block_bytes(shape.fmt, shape.block)


def _check(shape: Shape, config: Config) -> None:
    if shape.fmt not in QUANT_FORMATS:
        raise _err(f"weight format {shape.fmt!r} is not a block format; use one of {QUANT_FORMATS}")
    if (config.fmt, config.block) != (shape.fmt, shape.block):
        raise _err(f"config is for {config.fmt}/{config.block} but the weights are {shape.fmt}/{shape.block}")
    if config.variant not in VARIANTS:
        raise _err(f"variant {config.variant!r} cannot decode packed weights; use one of {VARIANTS}")
    if shape.k % shape.block or config.tile_k % shape.block:
        raise _err(f"K={shape.k} and tile_k={config.tile_k} must be whole {shape.block}-value blocks")
    if chunk_bytes(shape, config.tile_k) % WORD_BYTES:
        raise _err(f"a {config.tile_k}-value chunk of {shape.fmt} is not a whole number of 32-bit words")


def l1_bytes(shape: Shape, config: Config) -> int:
    """The GEMM's L1 with the W fifo at packed size, plus the decoded bf16 chunk."""
    tn, tk = config.tile_n, config.tile_k
    packed = config.depth * tn * chunk_bytes(shape, tk)
    return gemm.l1_bytes(config.gemm()) - config.depth * 2 * tn * tk + packed + 2 * tn * tk


def _kernel(inner: TileKernel, shape: Shape, config: Config) -> TileKernel:
    fmt, block = shape.fmt, shape.block
    matmul = inner.fn

    def qmatmul_tile(ins: list[torch.Tensor], outs: list[torch.Tensor], ctx) -> None:
        a, wq = ins
        w = dequantize_packed(wq, fmt, block).to(torch.bfloat16)  # decode in the tile, one bf16 rounding
        matmul([a, w], outs, ctx)

    tn, tk = config.tile_n, config.tile_k
    return replace(
        inner,
        name=f"q{inner.name}_{fmt}_b{block}",
        fn=qmatmul_tile,
        vector_ops_per_call=inner.vector_ops_per_call + DEQUANT_OPS[fmt] * tn * tk,
        bytes_per_call=inner.bytes_per_call - 2 * tn * tk + tn * chunk_bytes(shape, tk),
        params={**inner.params, "fmt": fmt, "block": block},
    )


def _weight_tasks(tasks: list[RuntimeTask], p: gemm.Shape, config: Config, rb: int, cb: int) -> list[RuntimeTask]:
    """The GEMM's W fill tasks re-expressed over packed rows: per (task group, column fifo) the same run of N
    blocks (read off the bf16 patterns), streamed as bytes (rows of ``rb`` bytes, chunks of ``cb``)."""
    cols, tn, tk = config.cols, config.tile_n, config.tile_k
    kt = p.k // tk
    runs: dict[tuple[int, str], list[int]] = {}
    for t in tasks:
        lo, hi = t.tap.index_range()
        first, last = runs.setdefault((t.group, t.fifo), [lo, hi])
        runs[(t.group, t.fifo)] = [min(first, lo), max(last, hi)]
    out: list[RuntimeTask] = []
    for (group, fifo), (lo, hi) in runs.items():
        row0 = lo // p.k  # first weight row of the run: (n0 * cols + c) * tn
        nbs = (hi // p.k - row0) // (cols * tn) + 1
        for tap in stream_taps((p.n, rb), row0 * rb, [nbs, kt, tn, cb], [cols * tn * rb, cb, rb, 1], "uint8"):
            out.append(RuntimeTask("fill", fifo, "w", tap, group))
    return out


def make_design(shape: Shape, config: Config | None = None, device: Device | None = None) -> Design:
    device = device or npu2()
    if config is None or not (config.tile_m and config.tile_k and config.tile_n):
        config = default_config(shape, device)
    _check(shape, config)
    g = gemm.make_design(gemm.Shape(shape.m, shape.n, shape.k), config.gemm(), device)
    p = gemm.Shape(**g.meta["padded_shape"])
    bb = block_bytes(shape.fmt, shape.block)
    rb, cb = p.k // shape.block * bb, chunk_bytes(shape, config.tile_k)
    tn, tk = config.tile_n, config.tile_k
    w_fifos = {f"W_l2_{c}" for c in range(config.cols)} | {f"W_{c}" for c in range(config.cols)}
    fifos = [replace(f, obj_shape=(tn, cb), dtype="uint8") if f.name in w_fifos else f for f in g.fifos]
    kernel = _kernel(g.workers[0].kernel, shape, config)
    workers = [replace(w, kernel=kernel, local_bytes=w.local_bytes + 2 * tn * tk) for w in g.workers]
    w_tasks = [t for t in g.runtime.tasks if t.tensor == "w"]
    others = [t for t in g.runtime.tasks if t.tensor != "w"]
    runtime = Runtime(sorted(others + _weight_tasks(w_tasks, p, config, rb, cb), key=lambda t: t.group))
    design = replace(
        g,
        name=f"qgemm_{shape.fmt}_b{shape.block}_{shape.m}x{shape.n}x{shape.k}",
        inputs=[TensorSpec("a", (p.m, p.k)), TensorSpec("w", (p.n, rb), "uint8")],
        fifos=fifos,
        workers=workers,
        runtime=runtime,
        numerics=replace(g.numerics, rounding_points=(f"weights:{shape.fmt}->bf16", *g.numerics.rounding_points)),
        fast=_fast(shape, config),
    )
    design.meta = {
        **g.meta,
        "family": FAMILY,
        "shape": asdict(shape),
        "config": asdict(config),
        "ddr_read_bytes": design.ddr_read_bytes(),
        "ddr_write_bytes": design.ddr_write_bytes(),
        "weight_bytes": p.n * rb,
    }
    return design


def _fast(shape: Shape, config: Config):
    inner = gemm._fast(config.gemm())

    def fast(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        w = deployed_packed(inputs["w"], shape.fmt, shape.block)
        return inner({"a": inputs["a"], "w": w}, exact=exact)

    return fast


def reference(inputs: dict[str, torch.Tensor], shape: Shape | None = None) -> dict[str, torch.Tensor]:
    """FP32 C = A @ deployed(W)^T (the dequantized weights rounded to bf16, as the deployment defines them)."""
    shape = shape or Shape(1, 1, 32)
    w = dequantize_packed(inputs["w"], shape.fmt, shape.block).to(torch.bfloat16)
    return {"c": inputs["a"].to(torch.float32) @ w.to(torch.float32).T}


def prepare_inputs(design: Design, a: torch.Tensor, wq: torch.Tensor) -> dict[str, torch.Tensor]:
    """Zero-pad A [M, K] (bf16) and the packed W [N, row bytes] to the design's tensors (zero bytes = zero weights)."""
    a_spec, w_spec = design.tensor("a"), design.tensor("w")
    w = wq
    if tuple(wq.shape) != w_spec.shape:
        w = torch.zeros(w_spec.shape, dtype=torch.uint8)
        w[: wq.shape[0], : wq.shape[1]] = wq
    return {"a": gemm._pad(a, a_spec.shape), "w": w}


def crop_outputs(design: Design, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return gemm.crop_outputs(design, outputs)


# the GEMV families' pre-filter (format and block checks, then one worker's L1), with the packed L1 above
fits = tile_fits(lambda shape, config, device: _check(shape, config), l1_bytes)


def modeled_estimate(
    shape: Shape, config: Config, device: Device | None = None, cal: Calibration = CALIBRATION
) -> float:
    """Modeled seconds of one dispatch of ``make_design(shape, config)`` without building it: the GEMM's closed form
    (``gemm.modeled_estimate``) with this design's weight objects (packed K chunks) and decode work per call."""
    return gemm.modeled_estimate(
        gemm.Shape(shape.m, shape.n, shape.k),
        config.gemm(),
        device,
        cal,
        family=FAMILY,
        w_chunk_bytes=chunk_bytes(shape, config.tile_k),
        extra_vector_ops=DEQUANT_OPS[shape.fmt] * config.tile_n * config.tile_k,
    )


def candidate_configs(shape: Shape, device: Device | None = None) -> list[Config]:
    """The GEMM's candidates whose K chunk holds whole blocks and whose packed tiles fit L1, ranked as the GEMM ranks
    (``gemm.rank``) but by this design's own modeled time: packed weights move ~0.28x the bytes and add decode
    work per call, which can move the best tiling."""
    return list(_ranked(shape, device or npu2(), CALIBRATION))


@functools.lru_cache(maxsize=256)
def _ranked(shape: Shape, device: Device, cal: Calibration) -> tuple[Config, ...]:
    gshape = gemm.Shape(shape.m, shape.n, shape.k)
    own = {f.name for f in fields(Config)}
    scored = []
    for c, _, padding in gemm.unranked_candidates(gshape, device):
        if c.orient != "m_rows" or c.tile_k_l2:  # the packed weight path is per column, IRON's orientation only
            continue
        cfg = Config(**{k: v for k, v in asdict(c).items() if k in own}, fmt=shape.fmt, block=shape.block)
        if fits(shape, cfg, device):
            scored.append((cfg, modeled_estimate(shape, cfg, device, cal), padding))
    return tuple(gemm.rank(scored))


def default_config(shape: Shape, device: Device | None = None) -> Config:
    """The best-ranked candidate (``gemm.rank``): vector kernel, fp32 accumulation, an exact tiling unless padding is
    much faster, then the least modeled time."""
    cands = _ranked(shape, device or npu2(), CALIBRATION)
    if not cands:
        raise _err(f"no quantized GEMM tiling fits {shape}; K chunks must hold whole {shape.block}-value blocks")
    return cands[0]
