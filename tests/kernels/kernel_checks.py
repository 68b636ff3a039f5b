"""Shared checks for the kernel-family tests: deterministic inputs, the phase-1 gate, the nine zoo specs."""

from __future__ import annotations

import torch

from tilepilot.gates import thresholds as th
from tilepilot.gates.metrics import max_abs_err, max_rel_err, nonfinite_count, pearson
from tilepilot.model.spec import ModelSpec
from tilepilot.model.zoo import ZOO


def rand_bf16(*shape: int, seed: int = 0, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale + offset).to(torch.bfloat16)


def qkv(shape, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention inputs (q, k, v) for ``shape`` (a ``kernels.attention.Shape``): q and k wide enough that the
    softmax is not flat."""
    q = rand_bf16(shape.q_len, shape.q_dim, seed=seed, scale=2.0)
    k = rand_bf16(shape.kv_len, shape.kv_dim, seed=seed + 1, scale=2.0)
    v = rand_bf16(shape.kv_len, shape.kv_dim, seed=seed + 2)
    return q, k, v


def zoo_specs() -> list[ModelSpec]:
    """The nine supported models at their published sizes (one layer: only per-layer shapes matter here)."""
    return [m.spec(layers=1) for m in ZOO.values()]


def kernel_gate(family: str, ref: torch.Tensor, test: torch.Tensor, tile: torch.Tensor | None = None) -> dict:
    """Evaluate the phase-1 gate of ``family`` (Pearson bound, no NaN/Inf, tile == fast) and assert it passes.

    Returns the measurements, max abs and rel errors included (recorded, not bounded).
    """
    m: dict[str, float] = {
        th.PEARSON: pearson(ref, test),
        th.NONFINITE: float(nonfinite_count(test)),
        "max_abs_err": max_abs_err(ref, test),
        "max_rel_err": max_rel_err(ref, test),
    }
    if tile is not None:
        m[th.TILE_VS_FAST] = max_abs_err(tile, test)
    report = th.phase1_gate(family, tile_path=tile is not None).evaluate(m)
    assert report.passed, report.failures
    return m


def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 ulps between two bf16 tensors of the same sign pattern (0 where equal)."""
    ia = a.view(torch.int16).to(torch.int32)
    ib = b.view(torch.int16).to(torch.int32)
    return (ia - ib).abs()


def check_attention_paths(shape, config, seed: int) -> None:
    """An attention design is legal, its tile path equals the exact fast path bit for bit, production is within 2
    bf16 ulps on under 5 % of elements, and both pass the kernel gate against the reference."""
    from tilepilot.kernels import attention as at  # lazy: keeps this module's import light for other families
    from tilepilot.npu.execute import run_fast, run_tile
    from tilepilot.npu.validate import validate

    d = at.make_design(shape, config)
    assert validate(d) == []
    ins = at.prepare_inputs(d, *qkv(shape, seed=seed))
    tile = run_tile(d, ins)["o"]
    exact = run_fast(d, ins, exact=True)["o"]
    assert torch.equal(tile, exact)
    ulps = bf16_ulps(exact, run_fast(d, ins, exact=False)["o"])
    assert int(ulps.max()) <= 2 and float((ulps > 0).float().mean()) < 0.05
    kernel_gate("attention", at.reference(ins, shape)["o"], exact, tile)
