"""LM head: logits[M, V] = x[M, K] @ E[V, K]^T, the vocabulary cut into partitions, each one GEMV launch.

A vocabulary of 49k-152k rows times K up to 3072 is 0.2-0.9 GB of bf16 weights: the largest single
weight of a small model and, per decode token, the single largest stream. As AIR's deployment does, the
head is cut along the vocabulary into partitions of ``partition_rows`` (16384 in the published registry)
and each partition is a GEMV design over its slice of the (tied or untied) embedding matrix; the
launches form one multi-launch dispatch. ``partition_rows >= V`` gives a single launch.

Partitioning is also where a classic fault lives: one partition computing the wrong rows (a bad offset
or a stale weight slice) spoils a sliver of the logits while the whole-tensor correlation still looks
fine (amd/IRON #83 saw 0.748 on one partition). ``partition_report`` checks every partition on its own.

``make_design`` returns a ``HeadGroup``: a MultiLaunchGroup (so ``time_group`` and ``validate_group``
take it as is) that also answers like one design: ``inputs``/``outputs`` ("x", "w" -> "logits"),
``numerics``, ``meta`` and ``fast(inputs, exact=False)``, which slices W by rows (views, no copy, except a
zero-padded last slice when the vocabulary does not tile) and concatenates the partitions' logits.
With more than ``gemv.MAX_TOKENS`` tokens the partitions are GEMM designs instead of GEMVs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from tilepilot.gates.metrics import max_abs_err, pearson
from tilepilot.gates.thresholds import min_correlation
from tilepilot.kernels import gemm, gemv
from tilepilot.npu.design import Design, MultiLaunchGroup, TensorSpec
from tilepilot.npu.device import Device, npu2
from tilepilot.npu.numerics import Numerics
from tilepilot.npu.validate import DesignError, Violation
from tilepilot.oracle.ops import linear

FAMILY = "lm_head"
# Vocabulary rows per partition in the published AIR LM heads (npu2_kernel_measurements.json, gemv rows
# "LM-head (per-partition)": 16384 x K for Llama-3.2-1B, Qwen3-0.6B/4B, Qwen2.5-0.5B/1.5B). The registry measured
# those shapes at 16384 rows; the Qwen deployments themselves run 8192-row partitions (``plan.paper_deployments``).
PARTITION_ROWS = 16384
PARTITION_CHOICES = (8192, 16384, 32768)
# How the last partition meets a vocabulary that ``partition_rows`` does not divide. "pad": its launch reads its own
# rows, zero-padded to the GEMV's blocks (every default and candidate). "shift": its launch is moved back to end at
# the vocabulary's last row, so every launch has the full partition shape (one design, no padded copy), which is
# only right if the assembly then drops the rows it re-read; this one keeps the launch's first rows instead, at the
# slice's own offset, so the last slice of the logits comes from the wrong vocabulary rows (amd/IRON #83's one bad
# partition). Harmless when the partition divides the vocabulary (nothing shifts).
TAILS = ("pad", "shift")
# Config fields with named choices (what a debug skill may switch one at a time).
OPTIONS = {"tail": TAILS}


@dataclass(frozen=True)
class Shape:
    vocab: int
    k: int
    m: int = 1  # tokens (decode 1; prefill computes only the last position)


@dataclass(frozen=True)
class Config:
    partition_rows: int = PARTITION_ROWS
    cols: int = 8
    rows: int = 1
    tile_m: int = 16
    tile_k: int = 512
    variant: str = "vector"
    depth: int = 2
    acc: str = "fp32"  # the partitions' GEMV accumulator (gemv.Config.acc); "bf16" rounds after every K chunk
    tail: str = "pad"  # the ragged last partition (TAILS); only "pad" is ever a candidate
    weight_channels: int = 1  # the partitions' weight feed (gemv.Config.weight_channels, x_rides)
    x_rides: bool = False

    def gemv_config(self) -> gemv.Config:
        return gemv.Config(self.cols, self.rows, self.tile_m, self.tile_k, self.variant, self.depth, self.acc,
                           self.weight_channels, self.x_rides)  # fmt: skip


def _err(message: str) -> DesignError:
    return DesignError([Violation("SHAPE_NOT_TILING", None, message)], "lm_head")


def partitions(shape: Shape, config: Config) -> list[tuple[int, int]]:
    """Vocabulary row ranges [start, stop) of the partitions, in order."""
    if config.partition_rows < 1:
        raise _err(f"partition_rows must be positive, got {config.partition_rows}")
    step = config.partition_rows
    return [(s, min(s + step, shape.vocab)) for s in range(0, shape.vocab, step)]


def launch_rows(shape: Shape, config: Config) -> list[tuple[int, int]]:
    """The rows of W each partition's launch reads: its own, or, for a shifted tail, the last full partition."""
    if config.tail not in TAILS:
        raise _err(f"tail {config.tail!r} is unknown; use one of {TAILS}")
    ranges = partitions(shape, config)
    start, stop = ranges[-1]
    if config.tail == "shift" and stop - start < config.partition_rows <= shape.vocab:
        ranges[-1] = (shape.vocab - config.partition_rows, shape.vocab)
    return ranges


def _block(config: Config) -> int:
    return config.cols * config.rows * config.tile_m


def _padded_rows(rows: int, config: Config) -> int:
    b = _block(config)
    return -(-rows // b) * b


@dataclass
class HeadGroup(MultiLaunchGroup):
    """The LM head as one dispatch of partition launches, usable where a single design is expected."""

    shape: Shape = field(default_factory=lambda: Shape(1, 1))
    config: Config = field(default_factory=Config)
    ranges: list[tuple[int, int]] = field(default_factory=list)
    reads: list[tuple[int, int]] = field(default_factory=list)  # rows of W each launch reads (``launch_rows``)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec("x", (self.shape.m, self.shape.k)), TensorSpec("w", (self.shape.vocab, self.shape.k))]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("logits", (self.shape.m, self.shape.vocab))]

    @property
    def numerics(self) -> Numerics:
        return self.designs[0].numerics

    @property
    def device(self) -> Device:
        return self.designs[0].device

    def partition_inputs(self, inputs: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        """Each launch's own inputs: x, and its rows of W (a view; zero-padded copy only for a ragged last slice)."""
        x, w = inputs["x"], inputs["w"]
        out = []
        for d, (start, stop) in zip(self.designs, self.reads or self.ranges, strict=True):
            w_rows = d.tensor("w").shape[0]
            part = w[start:stop]
            if w_rows != stop - start:
                pad = torch.zeros((w_rows, w.shape[1]), dtype=w.dtype)
                pad[: stop - start] = part
                part = pad
            out.append({_x_name(d): x, "w": part})
        return out

    def group_inputs(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Inputs keyed ``<launch>.<tensor>`` for ``run_group_fast`` / ``run_group_tile``."""
        return {
            f"{d.name}.{k}": v
            for d, ins in zip(self.designs, self.partition_inputs(inputs), strict=True)
            for k, v in ins.items()
        }

    def assemble(self, per_launch: list[torch.Tensor]) -> torch.Tensor:
        """Concatenate the partitions' outputs (dropping padded rows) into logits [M, V]."""
        parts = [y[:, : stop - start] for y, (start, stop) in zip(per_launch, self.ranges, strict=True)]
        return torch.cat(parts, dim=1)

    def assemble_group_outputs(self, outputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.assemble([outputs[f"{d.name}.{_y_name(d)}"] for d in self.designs])

    def fast(self, inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        outs = [
            d.fast(ins, exact=exact)[_y_name(d)]
            for d, ins in zip(self.designs, self.partition_inputs(inputs), strict=True)
        ]
        return {"logits": self.assemble(outs)}


def _x_name(d: Design) -> str:
    """The activation's tensor name in a partition launch (GEMV "x", GEMM "a"; both call the weight "w")."""
    return "x" if d.meta.get("family") == "gemv" else "a"


def _y_name(d: Design) -> str:
    return "y" if d.meta.get("family") == "gemv" else "c"


def make_design(shape: Shape, config: Config | None = None, device: Device | None = None) -> HeadGroup:
    device = device or npu2()
    config = config or default_config(shape, device)
    if min(shape.vocab, shape.k, shape.m) < 1:
        raise _err(f"shape {shape} has an empty dimension")
    ranges = partitions(shape, config)
    reads = launch_rows(shape, config)
    designs: list[Design] = []
    for i, (start, stop) in enumerate(reads):
        rows = _padded_rows(stop - start, config)
        if shape.m <= gemv.MAX_TOKENS:
            d = gemv.make_design(gemv.Shape(rows, shape.k, shape.m), config.gemv_config(), device)
        else:
            gshape = gemm.Shape(shape.m, stop - start, shape.k)
            d = gemm.make_design(gshape, _gemm_config(gshape, device), device)
        d.name = f"lm_head_p{i}"
        d.meta = {**d.meta, "partition": i, "vocab_rows": list(ranges[i]), "head_family": FAMILY}
        designs.append(d)
    head = HeadGroup(
        name=f"lm_head_{shape.vocab}x{shape.k}_m{shape.m}",
        designs=designs,
        bindings=[],
        shape=shape,
        config=config,
        ranges=ranges,
        reads=reads,
    )
    head.meta = {
        "family": FAMILY,
        "shape": asdict(shape),
        "config": asdict(config),
        "partitions": [list(r) for r in ranges],
        "macs": sum(d.meta["macs"] for d in designs),
        "useful_macs": shape.m * shape.vocab * shape.k,
        "ddr_read_bytes": sum(d.meta["ddr_read_bytes"] for d in designs),
        "ddr_write_bytes": sum(d.meta["ddr_write_bytes"] for d in designs),
        "weight_bytes": 2 * shape.vocab * shape.k,
    }
    return head


def _gemm_config(gshape: Any, device: Device) -> Any:

    return gemm.default_config(gshape, device)


def reference(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """FP32 logits = x @ W^T from the (bf16) inputs (oracle ``linear``)."""

    return {"logits": linear(inputs["x"], inputs["w"])}


# ----------------------------------------------------------------------------------------------------------------------
# per-partition checking
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PartitionCheck:
    """One partition's agreement with the FP32 reference on its own vocabulary rows."""

    index: int
    start: int
    stop: int
    pearson: float
    max_abs: float
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def partition_report(
    head: HeadGroup,
    inputs: dict[str, torch.Tensor],
    logits: torch.Tensor,
    reference_logits: torch.Tensor | None = None,
    min_pearson: float | None = None,
) -> list[PartitionCheck]:
    """Per-partition Pearson and max abs error of ``logits`` against the reference (phase-1 matrix bound).

    Checking each slice on its own is what finds "one partition wrong": the partition's own correlation
    collapses even when the whole vocabulary's correlation barely moves.
    """

    bound = min_correlation(FAMILY) if min_pearson is None else min_pearson
    ref = reference(inputs)["logits"] if reference_logits is None else reference_logits
    out = []
    for i, (start, stop) in enumerate(head.ranges):
        r, t = ref[:, start:stop], logits[:, start:stop]
        p = pearson(r, t)
        out.append(PartitionCheck(i, start, stop, p, max_abs_err(r, t), bool(p >= bound)))
    return out


def bad_partitions(checks: list[PartitionCheck]) -> list[int]:
    return [c.index for c in checks if not c.ok]


# ----------------------------------------------------------------------------------------------------------------------
# configs
# ----------------------------------------------------------------------------------------------------------------------
def _from_gemv(partition_rows: int, g: gemv.Config) -> Config:
    return Config(partition_rows, g.cols, g.rows, g.tile_m, g.tile_k, g.variant, g.depth,
                  weight_channels=g.weight_channels, x_rides=g.x_rides)  # fmt: skip


def _legal(shape: Shape, config: Config, device: Device) -> bool:
    """Every partition (the padded last one included) tiles and fits tile memory with this GEMV tiling."""
    for start, stop in launch_rows(shape, config):
        gs = gemv.Shape(_padded_rows(stop - start, config), shape.k, min(shape.m, gemv.MAX_TOKENS))
        if not gemv.fits(gs, config.gemv_config(), device):
            return False
    return True


def candidate_configs(shape: Shape, device: Device | None = None) -> list[Config]:
    """Partition sizes x the GEMV tilings of a full partition, most promising first."""
    device = device or npu2()
    sizes = sorted(
        {min(p, shape.vocab) for p in PARTITION_CHOICES} | ({shape.vocab} if shape.vocab <= 65536 else set())
    )
    out: list[Config] = []
    seen: set[Config] = set()
    for g in gemv.candidate_configs(
        gemv.Shape(min(PARTITION_ROWS, shape.vocab), shape.k, min(shape.m, gemv.MAX_TOKENS)), device
    )[:48]:
        for rows in sorted(sizes, key=lambda s: abs(s - PARTITION_ROWS)):
            cfg = _from_gemv(rows, g)
            if cfg not in seen and _legal(shape, cfg, device):
                seen.add(cfg)
                out.append(cfg)
    return out


def default_config(shape: Shape, device: Device | None = None, partition_rows: int = PARTITION_ROWS) -> Config:
    """AIR's layout: 16384-row partitions (or ``partition_rows``), each the GEMV family's default tiling of a full
    partition."""
    device = device or npu2()
    rows = min(partition_rows, shape.vocab)
    g = gemv.default_config(gemv.Shape(_padded_rows_for_default(rows), shape.k, min(shape.m, gemv.MAX_TOKENS)), device)
    cfg = _from_gemv(rows, g)
    if not _legal(shape, cfg, device):
        raise _err(f"no LM-head tiling fits {shape}")
    return cfg


def complete_config(shape: Shape, config: dict[str, Any], device: Device | None = None) -> Config:
    """A partial config completed from the default tiling of a partition of the size it names (so a plan can state
    only a deployment's partitioning, e.g. AIR's 8192-row partitions for a 151936-word vocabulary, and keep a
    tiling that fits the shape); an illegal result is the validator's error, never a silent fallback."""
    device = device or npu2()
    if "partition_rows" in config and config["partition_rows"] < 1:
        raise _err(f"partition_rows must be positive, got {config['partition_rows']}")
    base = default_config(shape, device, config.get("partition_rows", PARTITION_ROWS))
    cfg = replace(base, **config)
    if not _legal(shape, cfg, device):
        raise _err(f"LM-head config {config} does not fit {shape}")
    return cfg


def _padded_rows_for_default(rows: int) -> int:
    """A partition's rows rounded up to the GEMV default's largest block (8 columns x 16 rows per call), so a small
    or ragged vocabulary still gets the default tiling (its last partition is zero-padded)."""
    return -(-rows // 128) * 128
