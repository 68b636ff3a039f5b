"""Config and meta code the row-wise families share (bias, rope, rmsnorm, swiglu, eltwise).

The five families stream independent rows (or chunks) through up to ``tiles`` compute tiles, one per column
first (``kernels/_stream.py`` builds the dataflow of four of them; eltwise builds its own). What they also share,
and keep here once: the config of a row-streaming design (tiles, rows per kernel call, fifo depth, variant), the
check of a config's named choices, the candidate search (more tiles first, then bigger calls, the scalar variant of
the best tiling last), the default (the first candidate) and the ``design.meta`` every row-wise design carries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

import torch

from tilepilot.kernels._stream import shape_error
from tilepilot.npu import numerics as nx
from tilepilot.npu.design import Design
from tilepilot.npu.device import Device

VARIANTS = ("vector", "scalar")
# Worker counts the candidates try, most first: 8 = one per column of npu2; 16 only where the shims can feed them.
TILE_CHOICES = (8, 4, 2, 1, 16)
ROWS_PER_CALL_CHOICES = (16, 8, 4, 2, 1)
# The type a row-wise kernel rounds its fp32 result to before writing it (``store``). "bf16" is the design every
# default and candidate uses. The others are the mistakes a kernel written for another type makes: "fp16" keeps
# three more mantissa bits but overflows to Inf above 65504 (the large activations of trained models, T5-style
# fp16 FFN overflow); "fp8_e4m3" (saturating at 448) and "fp8_e5m2" keep three and two mantissa bits, so every
# write loses 2-5 % and a residual stream kept in them drifts further from the model at every layer. The kernel
# rounds to bf16 first, then converts. The DDR buffer stays bf16 (the value it holds is the narrower one widened
# back), so the variants change numbers, never bytes or modeled time.
STORES = ("bf16", "fp16", "fp8_e4m3", "fp8_e5m2")
_NARROW = {"fp16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}

C = TypeVar("C")


@dataclass(frozen=True)
class RowConfig:
    """A row-streaming design: ``tiles`` workers, ``rows_per_call`` rows per kernel call, fifos ``depth`` deep."""

    tiles: int = 8
    rows_per_call: int = 1
    depth: int = 2
    variant: str = "vector"


def check_choice(family: str, what: str, value: Any, choices: Sequence[Any]) -> None:
    """A config or shape field outside its named choices is a SHAPE_NOT_TILING error naming the choices."""
    if value not in choices:
        raise shape_error(family, f"{what} {value!r} is unknown; use one of {tuple(choices)}")


def first_candidate(family: str, candidates: Sequence[C], why: str) -> C:
    """The family default: its best-ranked candidate, or an error saying why there is none."""
    if not candidates:
        raise shape_error(family, why)
    return candidates[0]


def with_scalar(candidates: list[C]) -> list[C]:
    """The candidates, then the scalar variant of the best one (timed too, so the tuner sees what vectors buy)."""
    return candidates + [replace(candidates[0], variant="scalar")] if candidates else []  # type: ignore[type-var]


def row_candidates(
    rows: int, device: Device, l1_bytes: Callable[[Any], int], make: Callable[..., C] = RowConfig
) -> list[C]:
    """Configs of ``make(tiles, rows_per_call, 2, "vector")`` over ``rows`` work rows that fit tile memory, more
    tiles first (up to one per column; more only if the shims allow it), then more rows per call; then the scalar
    variant of the best."""
    out: list[tuple[tuple, C]] = []
    for tiles in TILE_CHOICES:
        if tiles > device.n_compute_tiles:
            continue
        for rpc in ROWS_PER_CALL_CHOICES:
            if rows % rpc or rows // rpc < tiles:
                continue
            cfg = make(tiles, rpc, 2, "vector")
            if l1_bytes(cfg) <= device.compute.memory_bytes:
                out.append(((tiles > device.columns, -tiles, -rpc), cfg))
    out.sort(key=lambda x: x[0])
    return with_scalar([c for _, c in out])


def store(y: torch.Tensor, kind: str = "bf16") -> torch.Tensor:
    """The fp32 result ``y`` as the kernel writes it: rounded (RNE) to bf16, then, for a narrow store, converted
    (RNE) to ``kind`` and held in bf16 again."""
    return narrow(nx.round_bf16(y), kind)


def narrow(y: torch.Tensor, kind: str = "bf16") -> torch.Tensor:
    """A bf16 result written as ``kind`` (fp16 overflows to Inf above 65504; fp8 saturates), held in bf16."""
    if kind == "bf16":
        return y
    return y.to(_NARROW[kind]).to(torch.bfloat16)


def with_store(fast: Callable, kind: str) -> Callable:
    """A design's fast path whose bf16 outputs are written as ``kind`` (``fast`` itself when ``kind`` is bf16)."""
    if kind == "bf16":
        return fast

    def stored(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        return {k: narrow(v, kind) for k, v in fast(inputs, exact=exact).items()}

    return stored


def store_point(kind: str) -> tuple[str, ...]:
    """The rounding points the output store adds to a design's declared numerics."""
    return ("output:bf16",) if kind == "bf16" else (f"store:{kind}", "output:bf16")


def design_meta(
    design: Design, family: str, shape: Any, config: Any, elements: int, padded_shape: dict | None = None
) -> dict[str, Any]:
    """The ``meta`` of a row-wise design: what it computes, how, and the DDR bytes it moves (no MACs)."""
    meta: dict[str, Any] = {
        "family": family,
        "shape": asdict(shape),
        "config": asdict(config),
        "logical_shape": asdict(shape),
    }
    if padded_shape is not None:
        meta["padded_shape"] = padded_shape
    meta.update(
        macs=0,
        elements=elements,
        ddr_read_bytes=design.ddr_read_bytes(),
        ddr_write_bytes=design.ddr_write_bytes(),
    )
    return meta
