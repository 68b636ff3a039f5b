"""Whole-array GEMM: tile path == exact fast path bit for bit, numerics are real, shapes and configs are checked."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tilepilot.kernels import gemm
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.npu.device import partition
from tilepilot.npu.execute import run_fast, run_tile
from tilepilot.npu.timing import time_design
from tilepilot.npu.validate import DesignError, validate

CASES = [
    # (M, N, K), config: cover split links (rows > cols), broadcast rows, every variant and accumulator, padding
    ((32, 64, 48), gemm.Config(rows=2, cols=2, tile_m=16, tile_k=16, tile_n=16)),
    ((32, 32, 64), gemm.Config(rows=4, cols=2, tile_m=8, tile_k=16, tile_n=16, acc="bf16")),
    ((24, 16, 32), gemm.Config(rows=3, cols=2, tile_m=8, tile_k=8, tile_n=8)),
    ((16, 64, 32), gemm.Config(rows=2, cols=4, tile_m=8, tile_k=16, tile_n=8, variant="bfp16")),
    ((8, 16, 12), gemm.Config(rows=1, cols=2, tile_m=4, tile_k=4, tile_n=4, variant="scalar", depth=1)),
    ((1, 40, 36), gemm.Config(rows=1, cols=4, tile_m=4, tile_k=8, tile_n=8, pad=True)),
    # AIR's orientation (herd [herd_m, herd_n]: columns split M, rows split N), split W links, 3- and 6-tile herds
    ((64, 32, 32), gemm.Config(rows=2, cols=4, tile_m=16, tile_k=16, tile_n=16, orient="m_cols")),
    ((48, 96, 32), gemm.Config(rows=4, cols=3, tile_m=16, tile_k=16, tile_n=8, orient="m_cols", acc="bf16")),
    ((96, 24, 16), gemm.Config(rows=3, cols=6, tile_m=8, tile_k=8, tile_n=8, orient="m_cols")),
    ((40, 20, 16), gemm.Config(rows=1, cols=6, tile_m=4, tile_k=8, tile_n=8, orient="m_cols", pad=True)),
    # AIR's f32-output kernels: C in fp32, accumulated in place (also for the in-buffer "direct" accumulator)
    ((32, 32, 64), gemm.Config(rows=2, cols=2, tile_m=16, tile_k=16, tile_n=16, out_dtype="fp32")),
    ((32, 32, 64), gemm.Config(rows=2, cols=2, tile_m=16, tile_k=16, tile_n=16, acc="bf16", out_dtype="fp32")),
]


def test_herd_is_tiles_along_m_then_n_in_either_orientation():
    assert gemm.herd(gemm.Config(rows=4, cols=8)) == (4, 8)
    assert gemm.herd(gemm.Config(rows=4, cols=8, orient="m_cols")) == (8, 4)
    p = gemm.padded_shape(gemm.Shape(500, 500, 64), gemm.Config(rows=4, cols=8, tile_n=128, orient="m_cols", pad=True))
    assert (p.m, p.n) == (512, 512)
    with pytest.raises(DesignError, match="orientation"):
        gemm.make_design(gemm.Shape(64, 64, 64), gemm.Config(rows=1, cols=1, orient="sideways"))


def _inputs(m, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).bfloat16(), (torch.randn(n, k, generator=g) / k**0.5).bfloat16()


@pytest.mark.parametrize(("mnk", "config"), CASES)
def test_tile_path_equals_exact_fast_path_bit_for_bit(mnk, config):
    shape = gemm.Shape(*mnk)
    d = gemm.make_design(shape, config)
    assert validate(d) == []
    a, w = _inputs(*mnk)
    ins = gemm.prepare_inputs(d, a, w)
    tile = run_tile(d, ins)["c"]
    fast = run_fast(d, ins, exact=True)["c"]
    assert torch.equal(tile, fast)
    out = gemm.crop_outputs(d, {"c": tile})["c"]
    ref = gemm.reference({"a": a, "w": w})["c"]
    assert out.shape == ref.shape and not out.isnan().any()
    r = torch.corrcoef(torch.stack([out.float().flatten(), ref.flatten()]))[0, 1]
    assert r > (0.99 if config.variant == "bfp16" else 0.999)


def test_bf16_partial_sums_differ_measurably_from_fp32_accumulation():
    shape = gemm.Shape(16, 16, 512)
    a, w = _inputs(16, 16, 512, seed=3)
    ref = gemm.reference({"a": a, "w": w})["c"]
    errs = {}
    for acc in ("fp32", "bf16"):
        cfg = gemm.Config(rows=1, cols=2, tile_m=16, tile_k=16, tile_n=8, acc=acc)
        d = gemm.make_design(shape, cfg)
        tile = run_tile(d, {"a": a, "w": w})["c"]
        assert torch.equal(tile, run_fast(d, {"a": a, "w": w}, exact=True)["c"])
        errs[acc] = (tile.float() - ref).abs().mean().item()
    assert errs["bf16"] > 3 * errs["fp32"]
    assert (
        gemm.make_design(
            shape, gemm.Config(acc="bf16", rows=1, cols=2, tile_m=16, tile_k=16, tile_n=8)
        ).numerics.rounding_points[0]
        == "partial_sum:bf16"
    )


def test_production_fast_path_stays_within_one_ulp_mostly():
    shape = gemm.Shape(64, 128, 1024)
    d = gemm.make_design(shape, gemm.Config(rows=2, cols=4, tile_m=32, tile_k=64, tile_n=32))
    a, w = _inputs(64, 128, 1024, seed=5)
    exact = run_fast(d, {"a": a, "w": w}, exact=True)["c"].float()
    prod = run_fast(d, {"a": a, "w": w})["c"].float()
    assert (exact != prod).float().mean() < 0.01
    ulp = torch.ldexp(torch.ones_like(exact), torch.frexp(torch.maximum(exact.abs(), prod.abs()))[1] - 8)
    assert ((exact - prod).abs() > ulp).float().mean() < 0.001


def test_meta_counts_match_the_dataflow():
    shape = gemm.Shape(64, 128, 96)
    cfg = gemm.Config(rows=2, cols=4, tile_m=16, tile_k=32, tile_n=16)
    d = gemm.make_design(shape, cfg)
    mb, nb = 64 // 32, 128 // 64
    assert d.meta["macs"] == d.total_macs() == 64 * 128 * 96
    assert d.meta["ddr_read_bytes"] == d.ddr_read_bytes() == 2 * (64 * 96 * nb + 128 * 96 * mb)
    assert d.meta["ddr_write_bytes"] == 2 * 64 * 128
    assert d.meta["family"] == "gemm" and d.meta["config"]["tile_k"] == 32
    assert d.numerics.k_chunk == 32 and d.numerics.accumulate == "fp32"
    assert len(d.workers) == 8 and {w.placement.row for w in d.workers} == {2, 3}


def test_shape_rules():
    with pytest.raises(DesignError) as e:
        gemm.make_design(gemm.Shape(30, 64, 64), gemm.Config(rows=2, cols=2, tile_m=16, tile_k=16, tile_n=16))
    assert e.value.codes == ["SHAPE_NOT_TILING"]
    with pytest.raises(DesignError):
        gemm.make_design(gemm.Shape(32, 64, 64), gemm.Config(rows=2, cols=2, tile_m=6, tile_k=16, tile_n=16))
    with pytest.raises(DesignError):
        gemm.make_design(gemm.Shape(32, 64, 64), gemm.Config(rows=5, cols=2, tile_m=8, tile_k=16, tile_n=16))
    with pytest.raises(DesignError):
        gemm.make_design(gemm.Shape(32, 64, 64), gemm.Config(rows=1, cols=4), partition(2))
    padded = gemm.make_design(
        gemm.Shape(30, 60, 50), gemm.Config(rows=2, cols=2, tile_m=16, tile_k=16, tile_n=16, pad=True)
    )
    assert padded.tensor("a").shape == (32, 64) and padded.tensor("w").shape == (64, 64)
    assert padded.meta["logical_shape"] == {"m": 30, "n": 60, "k": 50}


def test_oversized_tiles_overflow_l1():
    d = gemm.make_design(gemm.Shape(128, 128, 128), gemm.Config(rows=1, cols=1, tile_m=64, tile_k=64, tile_n=64))
    assert {v.code for v in validate(d)} == {"L1_OVERFLOW"}
    assert gemm.l1_bytes(gemm.Config(tile_m=64, tile_k=64, tile_n=64)) > 65536


@pytest.mark.parametrize(
    "mnk",
    [
        (2048, 2048, 2048),
        (2048, 8192, 2048),
        (2048, 2048, 8192),
        (2048, 896, 4864),
        (1, 2048, 2048),
        (2048, 128256, 2048),
        (1, 151936, 896),
    ],
)
def test_default_configs_for_llm_shapes_are_legal(mnk):
    d = gemm.make_design(gemm.Shape(*mnk))
    assert validate(d) == []
    assert d.meta["useful_macs"] == mnk[0] * mnk[1] * mnk[2] <= d.meta["macs"] <= 4 * d.meta["useful_macs"]


def test_candidates_prefiltered_consistently_with_the_validator():
    shape = gemm.Shape(256, 512, 256)
    cands = gemm.candidate_configs(shape)
    assert cands[0] == gemm.default_config(shape) and len(cands) > 20
    for cfg in cands[:: max(1, len(cands) // 25)]:
        assert validate(gemm.make_design(shape, cfg)) == [], cfg


def test_direct_partial_sums_round_trip_once_per_l2_k_tile():
    """AIR's `direct` method: bf16 partial sums leave and re-enter each worker once per L2 K tile but the last; the
    modeled launch grows by that many serial round trips, and fp32 accumulation (drain) has none."""
    shape = gemm.Shape(512, 512, 1024)
    base = gemm.Config(rows=4, cols=8, tile_m=32, tile_k=32, tile_n=32, acc="bf16", orient="m_cols")
    plain, tiled = gemm.make_design(shape, base), gemm.make_design(shape, replace(base, tile_k_l2=256))
    assert tuple(tiled.meta["spill"]) == (3, 2 * 32 * 32)
    trip = 2 * (CALIBRATION.dma_hop_latency_cycles + 2 * 32 * 32 / plain.device.stream_bytes_per_cycle)
    w_plain, w_tiled = time_design(plain).workers[0], time_design(tiled).workers[0]
    assert w_tiled.iteration_cycles - w_plain.iteration_cycles == pytest.approx(3 * trip)
    assert time_design(tiled).seconds > time_design(plain).seconds
    drain = gemm.make_design(shape, replace(base, acc="fp32", tile_k_l2=256))
    assert tuple(drain.meta["spill"]) == (0, 0)
    with pytest.raises(DesignError, match="L2 K tile"):
        gemm.make_design(shape, replace(base, tile_k_l2=48))


def test_fp32_output_moves_four_bytes_per_element_and_accumulates_in_its_buffer():
    """An f32-output GEMM (AIR's `external` / f32 `direct` rows) drains 4 B per C element, holds one fp32 C buffer
    per worker instead of a bf16 C pair plus a separate fp32 accumulator, returns fp32, and times slower than the
    same tiling with bf16 output when the drain matters."""
    shape = gemm.Shape(256, 512, 64)
    base = gemm.Config(rows=4, cols=8, tile_m=32, tile_k=32, tile_n=64, orient="m_cols")
    bf, f32 = gemm.make_design(shape, base), gemm.make_design(shape, replace(base, out_dtype="fp32"))
    assert validate(f32) == []
    assert f32.ddr_write_bytes() == 2 * bf.ddr_write_bytes() == 4 * 256 * 512
    assert f32.ddr_read_bytes() == bf.ddr_read_bytes()
    tm, tn = 32, 64
    # bf16: a double-buffered bf16 C (2 x 2 B) plus the fp32 accumulator (4 B); fp32: one fp32 C buffer (4 B)
    assert gemm.l1_bytes(base) - gemm.l1_bytes(replace(base, out_dtype="fp32")) == (2 * 2 + 4 - 4) * tm * tn
    a, w = _inputs(256, 512, 64)
    out = run_fast(f32, gemm.prepare_inputs(f32, a, w), exact=True)["c"]
    assert out.dtype == torch.float32
    assert time_design(f32).seconds > time_design(bf).seconds
    spill = gemm.make_design(gemm.Shape(256, 512, 512), replace(base, acc="bf16", tile_k_l2=256, out_dtype="fp32"))
    assert tuple(spill.meta["spill"]) == (1, 4 * tm * tn)
    with pytest.raises(DesignError, match="output dtype"):
        gemm.make_design(shape, replace(base, out_dtype="int8"))
