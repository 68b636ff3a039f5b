"""Timing the real kernel designs (kernels.gemm, kernels.eltwise) and sanity ratios against NPU2 measurements.

The measured figures are rows of /work/shared/reference/npu2_kernel_measurements.json (AIR kernel
registry on Strix). These tests hold the default calibration near them; the full per-family comparison
is `tilepilot calibrate`.
"""

from __future__ import annotations

import pytest

from tilepilot.kernels import eltwise, gemm
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.npu.timing import time_design, time_dispatch, time_group
from tilepilot.npu.validate import validate


def _gemm(m, k, n, **cfg):
    return gemm.make_design(gemm.Shape(m, n, k), gemm.Config(**cfg))


@pytest.mark.parametrize("variant,peak", [("vector", 256), ("bfp16", 512)])
def test_gemm_design_respects_the_array_peak(variant, peak):
    d = _gemm(2048, 2048, 2048, tile_m=64, tile_k=32, tile_n=64, variant=variant)
    assert validate(d) == []
    t = time_design(d)
    dev = d.device
    assert t.macs == d.meta["macs"] == 2048**3
    assert t.ddr_read_bytes == d.meta["ddr_read_bytes"] and t.ddr_write_bytes == d.meta["ddr_write_bytes"]
    assert t.seconds >= t.macs / (peak * dev.n_compute_tiles * dev.clock_hz)
    # at twice the MAC rate the block-FP16 variant runs into data movement (shim channels / DDR) on this shape
    assert (t.bound == "compute") == (variant == "vector")


def test_gemm_variants_order_scalar_vector_bfp16():
    # a shape where the vector kernel is compute-bound (see the peak test above), so the faster MMUL shows
    shape = dict(tile_m=64, tile_k=32, tile_n=64)
    s, v, b = (time_design(_gemm(2048, 2048, 2048, variant=x, **shape)).seconds for x in ("scalar", "vector", "bfp16"))
    assert s > v > b


def test_gemm_double_buffering_never_slower():
    one = time_design(_gemm(1024, 1024, 1024, tile_m=32, tile_k=32, tile_n=32, depth=1))
    two = time_design(_gemm(1024, 1024, 1024, tile_m=32, tile_k=32, tile_n=32, depth=2))
    assert two.seconds <= one.seconds


def test_eltwise_add_is_ddr_bound_and_near_the_measured_row():
    # eltwise_add N=4194304 (2048x2048), config 8/1/2048: 437 us measured on NPU2.
    d = eltwise.make_design(eltwise.Shape(4194304, "add"), eltwise.Config(tiles=8, chunk=2048))
    t = time_dispatch(d)
    assert t.designs[0].bound == "ddr"
    assert t.seconds == pytest.approx(437e-6, rel=0.2)


def test_gemm_near_the_measured_row():
    # gemm 2048x2048x2048 bf16 "drain" (fp32 accumulate), tile 32x32x128, herd 8x4: 6025 GFLOP/s measured.
    d = _gemm(2048, 2048, 2048, tile_m=32, tile_k=32, tile_n=128, acc="fp32")
    measured = 2 * 2048**3 / 6025e9
    assert time_dispatch(d).seconds == pytest.approx(measured, rel=0.25)


def test_fused_group_of_real_kernels_is_faster_than_separate_dispatches():
    a = _gemm(256, 512, 512, tile_m=32, tile_k=32, tile_n=32)
    b = eltwise.make_design(eltwise.Shape(256 * 512, "add"), eltwise.Config(tiles=8, chunk=1024))
    fused = time_group([a, b], CALIBRATION).seconds
    assert fused < time_dispatch(a).seconds + time_dispatch(b).seconds
    assert fused > time_dispatch(a).seconds
