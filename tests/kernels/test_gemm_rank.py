"""The GEMM families' closed-form modeled time (``modeled_estimate``): equal to the timing model of the design.

Every time here is modeled (the timing model, deterministic).
"""

from __future__ import annotations

import pytest

from tilepilot.kernels import gemm, qgemm
from tilepilot.kernels.tuning import modeled_seconds

# configs the candidates never hold (other orientation, single buffers, L2 K tiles, fp32 out, odd herds) as well
ESTIMATE_CASES = [
    ((300, 512, 1024), gemm.Config(4, 8, 64, 32, 64, pad=True)),
    ((1025, 576, 576), gemm.Config(4, 8, 64, 32, 64, pad=True)),
    ((1028, 256, 128), gemm.Config(1, 8, 4, 64, 32)),
    ((96, 24, 16), gemm.Config(rows=3, cols=6, tile_m=8, tile_k=8, tile_n=8, orient="m_cols")),
    ((40, 20, 16), gemm.Config(rows=1, cols=6, tile_m=4, tile_k=8, tile_n=8, orient="m_cols", pad=True)),
    ((8, 16, 12), gemm.Config(rows=1, cols=2, tile_m=4, tile_k=4, tile_n=4, variant="scalar", depth=1)),
    ((64, 128, 256), gemm.Config(2, 4, 16, 16, 16, variant="bfp16", acc="bf16")),
    ((512, 512, 1024), gemm.Config(4, 8, 32, 32, 32, acc="bf16", orient="m_cols", tile_k_l2=256)),
    ((32, 32, 64), gemm.Config(rows=2, cols=2, tile_m=16, tile_k=16, tile_n=16, acc="bf16", out_dtype="fp32")),
]


@pytest.mark.parametrize(("mnk", "config"), ESTIMATE_CASES)
def test_the_estimate_is_the_timing_model_of_the_design(mnk, config):
    """``modeled_estimate`` ranks configs without building them; it must be the timing model's figure exactly."""
    shape = gemm.Shape(*mnk)
    design = gemm.make_design(shape, config)
    assert gemm.modeled_estimate(shape, config) == pytest.approx(modeled_seconds(design), rel=1e-12, abs=0)


def test_the_estimate_matches_across_the_ranked_candidates():
    shape = gemm.Shape(200, 576, 1536)
    cands = gemm.candidate_configs(shape)
    for cfg in cands[:8] + cands[8 :: len(cands) // 12]:
        assert gemm.modeled_estimate(shape, cfg) == pytest.approx(
            modeled_seconds(gemm.make_design(shape, cfg)), rel=1e-12, abs=0
        ), cfg


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
def test_the_quantized_estimate_is_the_timing_model_of_its_design(fmt):
    """Packed weight objects and the decode work per call: qgemm ranks by its own design's time."""
    shape = qgemm.Shape(300, 256, 512, fmt)
    cands = qgemm.candidate_configs(shape)
    assert cands[0] == qgemm.default_config(shape)
    for cfg in cands[:3] + cands[3 :: len(cands) // 6]:
        design = qgemm.make_design(shape, cfg)
        assert qgemm.modeled_estimate(shape, cfg) == pytest.approx(modeled_seconds(design), rel=1e-12, abs=0), cfg
