"""The cascade dataflow (``Config.kv_stages`` > 1): AIR's registry FlashAttention structure as a design option.

Each query tile's key blocks are split in contiguous segments over the stages of a column, the partial softmax
states merge down the column, one head's K/V stream feeds ``share_cols`` columns, and with ``rounds`` every unit is
one sequential launch iteration (its own task group)."""

from dataclasses import replace

import pytest
import torch
from kernel_checks import bf16_ulps, check_attention_paths, qkv

from tilepilot.kernels import attention as at
from tilepilot.npu.execute import run_fast
from tilepilot.npu.timing import time_design
from tilepilot.npu.validate import DesignError, validate

C = at.Config
SMALL = [
    # 4 stages, one column per unit, sequential rounds; causal with masked-block skipping
    (at.Shape(32, 32, 2, 1, 16), C(cols=2, heads_per_col=1, tile_q=4, tile_k=8, kv_stages=4, rounds=True)),
    # K/V shared by 2 columns through the memory-tile split (fewer columns than stages)
    (at.Shape(32, 32, 2, 1, 16), C(cols=4, heads_per_col=1, tile_q=4, tile_k=8, kv_stages=4, share_cols=2)),
    # non-causal, one stream per stage from its own column's shim (as many columns as stages)
    (
        at.Shape(32, 32, 2, 2, 16, causal=False),
        C(cols=4, heads_per_col=1, tile_q=8, tile_k=8, kv_stages=2, rounds=True, share_cols=4),
    ),
    # causal, every block computed (later stages see rows with no visible key yet: the empty state merges exactly)
    (at.Shape(32, 32, 4, 2, 16), C(cols=4, heads_per_col=1, tile_q=8, tile_k=8, kv_stages=4, skip_masked=False)),
    # a chunk after a cache, kv padded to whole segments
    (at.Shape(8, 20, 4, 2, 16), C(cols=2, heads_per_col=1, tile_q=4, tile_k=8, kv_stages=2, share_cols=2)),
]


@pytest.mark.parametrize(("shape", "config"), SMALL)
def test_cascade_tile_path_equals_exact_and_production_within_an_ulp(shape, config):
    check_attention_paths(shape, config, seed=11)


def test_cascade_merge_is_the_stages_arithmetic_not_the_single_pass():
    """Splitting the keys changes where p is rounded to bf16 (against each stage's own running max): the cascade's
    exact path differs from the one-pass design on some elements, and its production path follows the cascade."""
    shape = at.Shape(64, 64, 4, 2, 64, causal=False)
    one = at.make_design(shape, C(cols=4, heads_per_col=1, tile_q=16, tile_k=16))
    cas = at.make_design(shape, C(cols=4, heads_per_col=1, tile_q=16, tile_k=16, kv_stages=4, share_cols=4))
    ins = at.prepare_inputs(one, *qkv(shape, seed=2))
    o_one, o_cas = run_fast(one, ins, exact=True)["o"], run_fast(cas, ins, exact=True)["o"]
    assert not torch.equal(o_one, o_cas)
    assert int(bf16_ulps(o_cas, run_fast(cas, ins, exact=False)["o"]).max()) <= 2


def test_cascade_rules_are_shape_errors():
    shape = at.Shape(32, 32, 2, 1, 16)
    for bad in (
        C(cols=2, heads_per_col=2, tile_q=4, tile_k=8, kv_stages=2),  # a cascade unit is one head
        C(cols=2, heads_per_col=1, tile_q=4, tile_k=8, q_tiles_per_col=2, kv_stages=2),  # and one tile per column
        C(cols=2, heads_per_col=1, tile_q=4, tile_k=8, kv_stages=1, share_cols=2),  # sharing needs stages
        C(cols=3, heads_per_col=1, tile_q=4, tile_k=8, kv_stages=2, share_cols=2),  # groups of whole columns
        C(cols=2, heads_per_col=1, tile_q=4, tile_k=8, kv_stages=5),  # 4 compute rows
    ):
        with pytest.raises(DesignError):
            at.make_design(shape, bad)


def _registry_like(shape: at.Shape) -> at.Config:
    return at.cascade_configs(shape)[0]


def test_cascade_configs_are_legal_and_air_like():
    for shape in (at.Shape(2048, 2048, 32, 8, 64), at.Shape(512, 512, 32, 8, 128)):
        cfg = _registry_like(shape)
        assert (cfg.kv_stages, cfg.rounds, cfg.skip_masked, cfg.share_cols, cfg.cols) == (4, True, False, 4, 8)
        d = at.make_design(shape, cfg)
        assert validate(d) == [] and len(d.workers) == 32


def test_shared_kv_stream_is_read_once_per_unit():
    """One head's K/V feeds share_cols columns: the design reads K/V from DDR share_cols times less."""
    shape = at.Shape(512, 512, 2, 2, 64, causal=False)
    shared = _registry_like(shape)
    alone = replace(shared, share_cols=1)
    q_bytes = 2 * shape.q_len * shape.q_dim  # q in (o out is written, not read)
    kv_shared = at.make_design(shape, shared).meta["ddr_read_bytes"] - q_bytes
    kv_alone = at.make_design(shape, alone).meta["ddr_read_bytes"] - q_bytes
    assert kv_alone == shared.share_cols * kv_shared


def test_time_per_flop_falls_with_sequence_length_because_round_costs_amortize():
    """Every round (unit) pays the pipeline fill/drain and the merge chain once, whatever its key count; its block
    work grows with the keys. So at fixed heads the modeled time per FLOP falls as the sequence grows, and the
    structure shows why: the rounds' fixed calls (merge + pass on / finish per unit) are a shrinking share."""
    per_flop, fixed_share = [], []
    for n in (256, 1024, 4096):
        shape = at.Shape(n, n, 2, 2, 64, causal=False)
        d = at.make_design(shape, _registry_like(shape))
        t = time_design(d)
        per_flop.append(t.seconds / (2 * d.meta["useful_macs"]))
        assert d.meta["task_groups"] == max(d.meta["units_per_col"])  # one task group per unit: the rounds
        last = next(w for w in d.workers if w.name.endswith(f"_{d.meta['kv_stages'] - 1}"))
        units = d.meta["units_per_col"][0]
        fixed_share.append(2 * units / last.calls_per_iteration)  # merge + finish calls per unit, of all calls
    assert per_flop[0] > per_flop[1] > per_flop[2]
    assert fixed_share[0] > fixed_share[1] > fixed_share[2]


def test_rounds_pay_a_fill_and_drain_per_unit():
    shape = at.Shape(1024, 1024, 4, 4, 64, causal=False)
    cfg = _registry_like(shape)
    with_rounds, streaming = at.make_design(shape, cfg), at.make_design(shape, replace(cfg, rounds=False))
    assert with_rounds.meta["task_groups"] > streaming.meta["task_groups"]
    t_r, t_s = time_design(with_rounds), time_design(streaming)
    bubbles = (with_rounds.meta["task_groups"] - streaming.meta["task_groups"]) * (t_r.fill_cycles + t_r.drain_cycles)
    assert t_r.cycles - t_s.cycles == pytest.approx(bubbles, rel=1e-9)


def test_skipping_masked_blocks_saves_time_at_a_long_causal_sequence_in_both_dataflows():
    long = at.Shape(4096, 4096, 8, 8, 64)
    for cfg in (at.default_config(long), _registry_like(long)):
        skip = time_design(at.make_design(long, replace(cfg, skip_masked=True))).seconds
        every = time_design(at.make_design(long, replace(cfg, skip_masked=False))).seconds
        assert skip < every
    # the cascade's contiguous key segments leave the first stage a full segment on every late tile: skipping
    # saves far less than in the one-pass dataflow, whose workers each take half the triangle
    one = at.default_config(long)
    cas = _registry_like(long)
    ratio_one = (
        time_design(at.make_design(long, one)).seconds
        / time_design(at.make_design(long, replace(one, skip_masked=False))).seconds
    )
    ratio_cas = (
        time_design(at.make_design(long, replace(cas, skip_masked=True))).seconds
        / time_design(at.make_design(long, cas)).seconds
    )
    assert ratio_one < 0.7 < ratio_cas < 1.0
