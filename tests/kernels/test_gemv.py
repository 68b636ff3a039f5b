"""GEMV family: legal designs, tile path == fast path, the phase-1 gate on reduced and on all nine zoo shapes."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import bf16_ulps, kernel_gate, rand_bf16, zoo_specs

from tilepilot.kernels import gemv
from tilepilot.npu.design import Runtime
from tilepilot.npu.execute import run_fast, run_tile
from tilepilot.npu.timing import time_dispatch
from tilepilot.npu.validate import DesignError, tap_problems, validate

SMALL = [
    (gemv.Shape(64, 64, 1), gemv.Config(cols=2, rows=1, tile_m=8, tile_k=32)),
    (gemv.Shape(128, 96, 3), gemv.Config(cols=2, rows=2, tile_m=4, tile_k=32)),
    (gemv.Shape(64, 128, 1), gemv.Config(cols=4, rows=1, tile_m=8, tile_k=128, depth=1)),
    (gemv.Shape(96, 64, 2), gemv.Config(cols=3, rows=4, tile_m=2, tile_k=64)),
    (gemv.Shape(64, 64, 1), gemv.Config(cols=2, rows=1, tile_m=8, tile_k=32, variant="bfp16")),
    (gemv.Shape(32, 64, 1), gemv.Config(cols=2, rows=1, tile_m=4, tile_k=32, variant="scalar")),
    # weights on both shim channels of a column, joined in its memory tile (x on the free column 2's shim)
    (gemv.Shape(64, 64, 1), gemv.Config(cols=2, rows=1, tile_m=8, tile_k=32, weight_channels=2)),
    # ... split over 2 compute rows, and with x resident in every worker, riding column 0's first weight channel
    (gemv.Shape(128, 96, 2), gemv.Config(cols=2, rows=2, tile_m=4, tile_k=32, weight_channels=2)),
    (gemv.Shape(128, 64, 1), gemv.Config(cols=8, rows=2, tile_m=4, tile_k=32, weight_channels=2, x_rides=True)),
]


def _inputs(shape: gemv.Shape, seed: int = 0) -> dict[str, torch.Tensor]:
    return {"x": rand_bf16(shape.m, shape.k, seed=seed), "w": rand_bf16(shape.n, shape.k, seed=seed + 1, scale=0.05)}


@pytest.mark.parametrize(("shape", "config"), SMALL, ids=lambda v: str(v))
def test_small_designs_validate_and_both_paths_agree_bit_for_bit(shape, config):
    design = gemv.make_design(shape, config)
    assert validate(design) == []
    ins = _inputs(shape)
    tile = run_tile(design, ins)["y"]
    exact = run_fast(design, ins, exact=True)["y"]
    assert tile.dtype == torch.bfloat16 and tile.shape == (shape.m, shape.n)
    assert torch.equal(tile, exact)
    kernel_gate("gemv", gemv.reference(ins)["y"], exact, tile=tile)


def test_production_fast_path_is_within_one_bf16_ulp_of_exact():
    shape, config = gemv.Shape(256, 512, 2), gemv.Config(cols=4, rows=1, tile_m=8, tile_k=128)
    design = gemv.make_design(shape, config)
    ins = _inputs(shape, seed=3)
    exact = run_fast(design, ins, exact=True)["y"]
    prod = run_fast(design, ins)["y"]
    ulps = bf16_ulps(exact, prod)
    assert int(ulps.max()) <= 1
    assert float((ulps > 0).float().mean()) < 0.05


def test_bfp16_variant_costs_measurable_accuracy_but_passes_the_gate():
    shape = gemv.Shape(256, 1024, 1)
    ins = _inputs(shape, seed=5)
    ref = gemv.reference(ins)["y"]
    errs = {}
    for variant in ("vector", "bfp16"):
        cfg = gemv.Config(cols=8, rows=1, tile_m=8, tile_k=512, variant=variant)
        out = run_fast(gemv.make_design(shape, cfg), ins)["y"]
        errs[variant] = kernel_gate("gemv", ref, out)["max_abs_err"]
    assert errs["bfp16"] > 1.5 * errs["vector"]


def test_shapes_that_do_not_tile_are_refused_with_shape_not_tiling():
    with pytest.raises(DesignError) as e:
        gemv.make_design(gemv.Shape(100, 64), gemv.Config(cols=8, tile_m=8, tile_k=32))
    assert e.value.codes == ["SHAPE_NOT_TILING"]
    with pytest.raises(DesignError):
        gemv.make_design(gemv.Shape(64, 100), gemv.Config(cols=2, tile_m=8, tile_k=50))
    with pytest.raises(DesignError):
        gemv.make_design(gemv.Shape(64, 64, gemv.MAX_TOKENS + 1), gemv.Config(cols=2, tile_m=8, tile_k=32))


def test_a_tile_too_big_for_l1_is_a_validator_error_and_not_a_candidate():
    shape = gemv.Shape(2048, 2048)
    cfg = gemv.Config(cols=8, rows=1, tile_m=32, tile_k=2048, depth=2)  # 2 x 128 KiB of weights per tile
    codes = {v.code for v in validate(gemv.make_design(shape, cfg))}
    assert "L1_OVERFLOW" in codes
    assert cfg not in gemv.candidate_configs(shape)
    assert all(gemv.l1_bytes(shape, c) <= 64 * 1024 for c in gemv.candidate_configs(shape))


def test_stream_patterns_are_legal_and_cover_each_weight_once():
    shape = gemv.Shape(2048, 1024)  # 128 blocks per column: two runs of <= 64 repeats, one task group
    design = gemv.make_design(shape, gemv.Config(cols=8, rows=1, tile_m=2, tile_k=512))
    assert len({t.group for t in design.runtime.tasks}) == 1
    w_tasks = [t for t in design.runtime.tasks if t.tensor == "w"]
    assert len([t for t in w_tasks if t.fifo == "w_0_0"]) == 2
    assert all(not tap_problems(t.tap) for t in design.runtime.tasks)
    idx = torch.cat([torch.from_numpy(t.tap.indices()) for t in w_tasks])
    assert idx.numel() == shape.n * shape.k
    assert torch.equal(torch.sort(idx).values, torch.arange(shape.n * shape.k))


def test_air_tiles_map_to_legal_configs():
    for n, k, tile in [(2048, 2048, "8/8/8"), (1536, 8960, "8/2/2"), (2048, 11008, "8/2/1"), (896, 896, "8/16/16")]:
        shape = gemv.Shape(n, k)
        cfg = gemv.from_air_tile(shape, tile)
        assert cfg.cols == 8 and cfg.tile_m == int(tile.split("/")[2])
        assert validate(gemv.make_design(shape, cfg)) == []


def _decode_shapes() -> list[tuple[str, gemv.Shape]]:
    out: dict[tuple[int, int], str] = {}
    for spec in zoo_specs():
        h, q, kv, f = spec.hidden, spec.q_dim, spec.kv_dim, spec.intermediate
        for op, (n, k) in {"q": (q, h), "kv": (kv, h), "o": (h, q), "gate_up": (f, h), "down": (h, f)}.items():
            out.setdefault((n, k), f"{spec.name}:{op}")
    return [(name, gemv.Shape(n, k)) for (n, k), name in out.items()]


@pytest.mark.parametrize(("name", "shape"), _decode_shapes(), ids=lambda v: v if isinstance(v, str) else "")
def test_zoo_decode_shapes_pass_the_gate_on_the_fast_path(name, shape):
    design = gemv.make_design(shape, gemv.default_config(shape))
    assert validate(design) == []
    ins = _inputs(shape, seed=shape.n + shape.k)
    kernel_gate("gemv", gemv.reference(ins)["y"], run_fast(design, ins, validate=False)["y"])
    t = time_dispatch(design)
    # a weight stream cannot beat the usable DDR bandwidth (modeled)
    assert t.seconds > 2 * shape.n * shape.k / 120e9


@pytest.mark.parametrize(
    ("shape", "config"),
    [
        (gemv.Shape(96, 128, 1, (64, 32)), gemv.Config(2, 2, 8, 64)),
        (gemv.Shape(128, 64, 2, (64, 32, 32)), gemv.Config(2, 1, 16, 64, "bfp16", 1)),
    ],
    ids=str,
)
def test_a_multi_matrix_gemv_is_the_separate_launches_bit_for_bit(shape, config):
    """The dataflow gemv and qgemv share (``gemv.matvec_dataflow``) serves several matrices over one x stream."""
    design = gemv.make_design(shape, config)
    assert validate(design) == []
    x = rand_bf16(shape.m, shape.k, seed=5)
    ins = {"x": x, **{f"w{j}": rand_bf16(nj, shape.k, seed=20 + j) for j, nj in enumerate(shape.parts)}}
    tile, exact = run_tile(design, ins), run_fast(design, ins, exact=True)
    for j, nj in enumerate(shape.parts):
        one = gemv.make_design(gemv.Shape(nj, shape.k, shape.m), config)
        y = run_fast(one, {"x": x, "w": ins[f"w{j}"]}, exact=True)["y"]
        assert torch.equal(tile[f"y{j}"], y) and torch.equal(exact[f"y{j}"], y)
    assert set(gemv.reference(ins)) == set(exact)


def test_two_weight_channels_per_column_lift_the_shim_bound_and_are_a_tuner_choice():
    """A bf16 decode GEMV (Llama-3.2-1B's down projection) on one shim channel per column is bound by those 8
    channels; feeding the weights on both channels of every column (x resident, riding column 0's first) reaches the
    DDR bound, and the tuner's first candidates hold it (same timing model). The feed's rules are shape errors."""
    shape = gemv.Shape(2048, 8192, 1)
    one = gemv.make_design(shape, gemv.Config(8, 4, 2, 128))
    two = gemv.make_design(shape, gemv.Config(8, 4, 2, 128, weight_channels=2, x_rides=True))
    assert validate(one) == [] and validate(two) == []
    t_one, t_two = time_dispatch(one).designs[0], time_dispatch(two).designs[0]
    assert t_one.limiter.startswith("shim") and t_two.limiter == "ddr" and t_two.seconds < 0.8 * t_one.seconds
    assert {c.weight_channels for c in gemv.candidate_configs(shape)[:64]} == {1, 2}
    for bad in (
        gemv.Config(8, 1, 8, 128, weight_channels=2),  # no free column's shim for x
        gemv.Config(4, 1, 8, 128, weight_channels=3),  # a shim has 2 MM2S channels
        gemv.Config(4, 1, 8, 128, x_rides=True),  # x rides only a dual-channel feed
        gemv.Config(4, 3, 2, 128, weight_channels=2),  # 3 compute rows on 2 channels
    ):
        with pytest.raises(DesignError):
            gemv.make_design(shape, bad)


def test_runs_share_task_groups_until_a_shim_runs_out_of_buffer_descriptors():
    """Every group boundary drains the pipeline (a fill and a drain in the timing model), so runs of output blocks
    share a group while every shim's 16 BDs hold their tasks, and start a new one only when some shim's would not."""
    shape = gemv.Shape(16 * 64 * 8, 1024)  # 8 runs of 64 blocks per column: more tasks than one shim's BDs
    design = gemv.make_design(shape, gemv.Config(cols=8, rows=1, tile_m=2, tile_k=512))
    shim_of = {f.name: f.shim_placement for f in design.fifos}
    per_group_shim: dict[tuple, int] = {}
    for t in design.runtime.tasks:
        key = (t.group, shim_of[t.fifo])
        per_group_shim[key] = per_group_shim.get(key, 0) + 1
    groups = {t.group for t in design.runtime.tasks}
    assert 1 < len(groups) < 8
    assert max(per_group_shim.values()) <= design.device.shim.bds
    assert not [v for v in validate(design) if v.code == "BD_LIMIT"]
    # a fifo without a shim would be counted against no shim's BDs: the packer refuses it rather than guess
    tasks = [[("fill", t.fifo, t.tensor, t.tap)] for t in design.runtime.tasks]
    unplaced = dict(shim_of, **{design.runtime.tasks[0].fifo: None})
    with pytest.raises(ValueError, match="no shim placement"):
        Runtime.packed([tasks], design.device.shim.bds, unplaced)


def test_runs_in_one_task_group_still_compute_the_exact_product():
    """Two runs of 64 blocks per column in one group: their tasks on a fifo go in order, the tile path runs them."""
    shape, config = gemv.Shape(16 * 64 * 2, 64), gemv.Config(cols=8, rows=1, tile_m=2, tile_k=64)
    design = gemv.make_design(shape, config)
    assert len({t.group for t in design.runtime.tasks}) == 1 and validate(design) == []
    ins = _inputs(shape)
    assert torch.equal(run_tile(design, ins)["y"], run_fast(design, ins, exact=True)["y"])
