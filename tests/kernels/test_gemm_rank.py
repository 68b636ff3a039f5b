"""How the GEMM families rank their configs: by the modeled time of the design, not by padding first.

Padding first picked one row of 4-row tiles whenever M = 4 mod 8 (the only exact tiling) or M was one past a
multiple of 4 (the least padding), ~35-60x slower per token than 4 x 8 tiles of 64 rows at a thousand tokens; fused
Llama-3.2-1B prefill groups then outlived the driver's watchdog at thousands of lengths. Every time here is modeled
(the timing model, deterministic); designs are validated before they are timed.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tilepilot.kernels import gemm, qgemm
from tilepilot.kernels.tuning import modeled_seconds
from tilepilot.model.graph import block_graph, weight_shape
from tilepilot.model.zoo import ZOO
from tilepilot.npu.validate import validate

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


def _per_token_s(m: int, n: int, k: int) -> float:
    shape = gemm.Shape(m, n, k)
    design = gemm.make_design(shape, gemm.default_config(shape))
    assert validate(design) == []  # legal before it is timed
    return modeled_seconds(design) / m


@pytest.mark.parametrize(("nk", "base"), [((2048, 2048), 1024), ((8192, 2048), 2048), ((576, 576), 1024)])
def test_awkward_lengths_are_not_much_slower_per_token(nk, base):
    """M = 1..4 mod 8 against the multiple of 8 below: padding first made these 35-60x slower per token (one row of
    4-row tiles); the default now pads to 64-row tiles when that is faster, at most the padding's cost."""
    ref = _per_token_s(base, *nk)
    for m in range(base + 1, base + 5):
        assert _per_token_s(m, *nk) < 1.5 * ref, m


def test_an_exact_tiling_yields_only_to_a_much_faster_padded_one():
    # M = 1028 = 4 x 257: the only exact tiling is one row of 4-row tiles, ~35x slower than 4 x 8 x 64 padded
    shape = gemm.Shape(1028, 2048, 2048)
    exact = gemm.Config(1, 8, 4, 8, 64)
    default = gemm.default_config(shape)
    assert default.pad and default.rows * default.cols == 32
    assert gemm.modeled_estimate(shape, exact) > gemm.EXACT_SLACK * gemm.modeled_estimate(shape, default)
    # 2048 tokens tile exactly at the full array, as before
    assert gemm.default_config(gemm.Shape(2048, 2048, 2048)) == gemm.Config(4, 8, 64, 32, 64)
    # the candidates lead with the default and keep the other numerics behind it
    cands = gemm.candidate_configs(shape)
    assert cands[0] == default
    first_other = next(i for i, c in enumerate(cands) if (c.variant, c.acc) != ("vector", "fp32"))
    assert all((c.variant, c.acc) != ("vector", "fp32") for c in cands[first_other:])


def test_the_gate_prompt_keeps_exact_tilings_for_every_seed_shape():
    """At the gate prompt (24 tokens) a padded launch would not bind into the fused groups the kernel gate checks
    (GROUP_BINDING), and ``fix-merged-launch-arguments`` resets configs to defaults expecting no padding."""
    shapes = {
        weight_shape(spec, node.weights[0])
        for spec in (z.spec(layers=1) for z in ZOO.values())
        for node in (block_graph(spec).node(op) for op in block_graph(spec).block_ops)
        if node.kind == "linear"
    }
    padded = [(n, k) for n, k in sorted(shapes) if gemm.default_config(gemm.Shape(24, n, k)).pad]
    assert padded == []


def test_candidates_and_defaults_are_cached_copies():
    shape = gemm.Shape(1025, 2048, 2048)
    first = gemm.candidate_configs(shape)
    first.clear()  # a caller's list is its own
    assert gemm.candidate_configs(shape)[0] == gemm.default_config(shape) == replace(gemm.Config(), pad=True)


def test_fused_llama_prefill_at_7777_tokens_stays_within_the_dispatch_watchdog():
    """Llama-3.2-1B's fused o_ffn prefill dispatch at 7777 tokens was modeled at 4.9 s (one row of 4-row tiles for
    its GEMMs), beyond the driver's 4 s watchdog: DISPATCH_WATCHDOG in the paper-like and air-q4 plans (air-q4's
    prefill o_ffn group is the paper-like one, same calls and configs; building air-q4 takes ~9 s, so only this one
    is built here). Shape-only: designs built, validated and timed as ``time_plan`` does (``KernelLibrary``)."""
    from tilepilot.kernels.bind import binding
    from tilepilot.plan.builtin import paper_like_plan
    from tilepilot.runtime.dispatcher import KernelLibrary

    spec = ZOO["llama-3.2-1b"].spec(layers=1)
    graph = block_graph(spec)
    group = next(g for g in paper_like_plan(spec).stage("prefill").block if g.name == "o_ffn")
    library = KernelLibrary()  # validates every design, checks the dispatch against the watchdog
    keys = []
    for call in group.calls:
        node = graph.node(call.op)
        shape = binding(node, call.family).shape(node, spec, 7777, 7777, call.config)
        keys.append(library.design(call.family, shape, call.config)[0])
    assert library.dispatch_time("o_ffn", keys).seconds < 0.5
