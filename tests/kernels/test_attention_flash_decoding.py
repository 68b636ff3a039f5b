"""Flash-decoding as a design option of decode attention: a unit per KV head whose query tile holds its GQA group's
heads as rows (``Config.group_rows``), the keys split over cascade stages, K/V over one or both shim MM2S channels
of a column (``Config.kv_channels``, q riding the first), the stages over one or several columns
(``Config.kv_cols``)."""

from dataclasses import replace

import pytest
import torch
from kernel_checks import check_attention_paths, qkv

from tilepilot.kernels import attention as at
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.npu.execute import run_tile
from tilepilot.npu.resources import shares_memory, uses_shared_memory
from tilepilot.npu.timing import time_design
from tilepilot.npu.validate import DesignError, validate

C = at.Config
FD = dict(heads_per_col=1, tile_q=1, kv_stages=4, group_rows=True)
SMALL = [
    # group 4, 4 stages, K/V on one channel split by the memory tile; 40 keys padded to whole segments
    (at.Shape(1, 40, 8, 2, 16), C(cols=2, tile_k=8, **FD)),
    # the same on both channels (two memory-tile splits, q riding the first)
    (at.Shape(1, 40, 8, 2, 16), C(cols=2, tile_k=8, **FD, kv_channels=2)),
    # 2 stages, one stream per channel straight to its stage; two KV heads on one column
    (at.Shape(1, 40, 8, 2, 16), C(cols=1, tile_k=8, **(FD | {"kv_stages": 2}), kv_channels=2)),
    # one K/V channel, two units (KV heads) on one column: q rides the K/V feed, both units' q ahead of their keys
    (at.Shape(1, 40, 8, 2, 16), C(cols=1, tile_k=8, **FD)),
    # one stage per column over two columns, one channel: q rides each column's own stage stream
    (at.Shape(1, 40, 8, 2, 16), C(cols=4, tile_k=8, **(FD | {"kv_stages": 2}), kv_cols=2)),
    # group 7 (Qwen2.5-0.5B's): 7 rows, the MMUL padded to 8
    (at.Shape(1, 33, 14, 2, 16), C(cols=2, tile_k=8, **FD, kv_channels=2)),
    # a KV head's 4 stages over 2 columns (2 each, one channel), and 8 over 2 (4 each, both channels)
    (at.Shape(1, 40, 8, 2, 16), C(cols=4, tile_k=8, **FD, kv_cols=2)),
    (at.Shape(1, 40, 8, 2, 16), C(cols=4, tile_k=8, **(FD | {"kv_stages": 8}), kv_cols=2, kv_channels=2)),
    # three KV heads (SmolLM2-135M's), each over 2 columns with one stage per channel; group 7 over 4 columns
    (at.Shape(1, 40, 9, 3, 16), C(cols=6, tile_k=8, **FD, kv_cols=2, kv_channels=2)),
    (at.Shape(1, 33, 14, 2, 16), C(cols=8, tile_k=8, **(FD | {"kv_stages": 8}), kv_cols=4, kv_channels=2)),
]


@pytest.mark.parametrize(("shape", "config"), SMALL)
def test_tile_path_equals_exact_and_production_within_an_ulp(shape, config):
    check_attention_paths(shape, config, seed=5)


def test_group_rows_is_the_cascade_of_one_head_per_unit_in_numbers():
    """Heads as rows change which tile computes a head, not its arithmetic: the same stages over the same keys give
    the same bits as the per-head cascade's exact path."""
    shape = at.Shape(1, 64, 8, 2, 16)
    cfg = C(cols=2, tile_k=8, **FD)
    rows = at.make_design(shape, cfg)
    ins = at.prepare_inputs(rows, *qkv(shape, seed=3))
    per_head = at.attend_cascade_exact(ins["q"], ins["kv"], shape, replace(cfg, group_rows=False))
    assert torch.equal(run_tile(rows, ins)["o"], per_head)


def test_each_kv_head_is_read_once():
    """A unit per KV head: the design reads q once and every KV head's keys once (the one-pass design with one head
    per column re-streams a KV head for every query head of its group)."""
    shape = at.Shape(1, 256, 8, 2, 64)
    cfg = C(cols=2, tile_k=64, **FD)
    d = at.make_design(shape, cfg)
    kv_bytes = at.kv_rows(shape, cfg) * 2 * shape.kv_dim * 2
    assert d.meta["ddr_read_bytes"] == 2 * shape.q_dim + kv_bytes
    one_head = at.make_design(shape, C(cols=2, heads_per_col=1, tile_q=1, tile_k=64))
    assert one_head.meta["ddr_read_bytes"] - 2 * shape.q_dim == shape.group * kv_bytes


def test_two_channels_carry_the_kv_and_q_rides_the_first():
    shape = at.Shape(1, 2048, 32, 8, 64)  # Llama-3.2-1B's decode step at context 2048
    two = at.make_design(shape, C(cols=8, tile_k=64, **FD, kv_channels=2))
    one = at.make_design(shape, C(cols=8, tile_k=64, **FD))
    q = {f.name: f for f in two.fifos}["q_0"]
    column_0_in = [f for f in two.fifos if f.shim_placement == q.shim_placement and f.name.startswith(("q_", "kv_"))]
    assert q.rides_with == "kv_0_in0" and {f.channel for f in column_0_in} == {"kv_0_in0", "kv_0_in1"}
    t_two, t_one = time_design(two), time_design(one)
    assert t_one.limiter.startswith("shim") and t_two.seconds < 0.9 * t_one.seconds


def test_with_one_kv_channel_q_rides_it_and_the_columns_second_channel_stays_free():
    """A column's K/V over one channel: q (one small object per unit) rides that channel too rather than idling a
    channel of its own, so the column's second MM2S channel is left to a resident pass's weight prefetch. Its bytes
    queue ahead of the keys on that channel: the launch is no faster, and slower only by q's transfer."""
    cases = [
        (at.Shape(1, 2048, 32, 8, 64, kv_format=f), C(cols=8, tile_k=64, **FD, kv_format=f)) for f in ("bf16", "q4_0")
    ]
    cases.append((at.Shape(1, 40, 8, 2, 16), C(cols=4, tile_k=8, **FD, kv_cols=2)))  # a KV head over two columns
    for shape, cfg in cases:
        d = at.make_design(shape, cfg)
        assert not validate(d)
        fifos = {f.name: f for f in d.fifos}
        qs = [f for f in d.fifos if f.name.startswith("q_")]
        assert len(qs) == cfg.cols
        for q in qs:
            assert q.rides_with == "kv_" + q.name[2:] and fifos[q.rides_with].shim_placement == q.shim_placement
            filled = {
                f.channel for f in d.fifos if f.shim_placement == q.shim_placement and not f.name.startswith("o_")
            }
            assert filled == {q.rides_with}
        alone = time_design(replace(d, fifos=[replace(f, rides_with=None) for f in d.fifos]))
        q_bytes = 2 * shape.group * shape.head_dim
        rate = min(d.device.stream_bytes_per_cycle * d.device.clock_hz, CALIBRATION.shim_channel_bytes_per_s)
        assert alone.seconds <= time_design(d).seconds <= alone.seconds + q_bytes / rate * (1 + 1e-9)


def test_flash_decoding_beats_the_one_pass_design_at_a_long_context():
    """At Llama-3.2-1B's decode shape the one-pass design's best tiling is bound by one shim channel per column;
    the flash-decoding candidates are offered after it (the default does not change) and the best of them is faster
    (same timing model)."""
    shape = at.Shape(1, 2048, 32, 8, 64)
    cands = at.candidate_configs(shape)
    fd = at.decode_cascade_configs(shape)
    assert fd and cands[-1 - len(fd) : -1] == fd and not at.default_config(shape).group_rows
    best_one_pass = min(time_design(at.make_design(shape, c)).seconds for c in cands if not c.group_rows)
    best_fd = min(time_design(at.make_design(shape, c)).seconds for c in fd)
    assert best_fd < 0.8 * best_one_pass
    assert at.decode_cascade_configs(at.Shape(64, 2048, 32, 8, 64)) == []  # prefill chunks: not offered


def test_a_kv_head_over_several_columns_snakes_through_shared_memory_and_feeds_each_column_from_its_shim():
    """``kv_cols``: the stages of a KV head go down one column and up the next, so every partial state passes between
    orthogonal neighbours (shared memory, no DMA; east at the turn), each column's stages read K/V from that column's
    shim, q goes into every column of the unit and o leaves from the column of the last stage."""
    shape = at.Shape(1, 64, 8, 2, 16)
    design = at.make_design(shape, C(cols=4, tile_k=8, **(FD | {"kv_stages": 8}), kv_cols=2, kv_channels=2))
    assert validate(design) == []
    workers = {w.name: w for w in design.workers}
    for unit in (0, 2):
        chain = [workers[f"attn_{unit}_{s}"].placement for s in range(8)]
        assert {t.col for t in chain} == {unit, unit + 1} and len(set(chain)) == 8
        assert all(shares_memory(a, b) for a, b in zip(chain, chain[1:], strict=False))
        assert chain[3].col == unit and chain[4].col == unit + 1 and chain[3].row == chain[4].row  # the turn, east
        states = [f for f in design.fifos if f.name.startswith(f"st_{unit}_")]
        assert len(states) == 7 and all(uses_shared_memory(design, f) for f in states)
    fifos = {f.name: f for f in design.fifos}
    for w in design.workers:  # each stage's K/V and q come from the shim of its own column
        kv = fifos[w.inputs[1]]
        feed = next((ln.srcs[0] for ln in design.links if kv.name in ln.dsts), kv.name)
        assert fifos[feed].shim_placement.col == w.placement.col == fifos[w.inputs[0]].shim_placement.col
    assert {f.shim_placement.col for n, f in fifos.items() if n.startswith("o_")} == {1, 3}


def test_more_columns_per_kv_head_beat_one_when_the_model_has_few_kv_heads():
    """SmolLM2-135M's decode step at context 2048 (3 KV heads): one column per KV head leaves 5 columns' shims idle
    and the best such tiling is bound by its shim channels; the same keys over 2 columns per KV head stream on twice
    the channels and reach the DDR bound (same timing model). Llama-3.2-1B (8 KV heads) fills the array already and is
    offered none."""
    shape = at.Shape(1, 2048, 9, 3, 64)
    fd = at.decode_cascade_configs(shape)
    one = [c for c in fd if c.kv_cols == 1]
    more = [c for c in fd if c.kv_cols > 1]
    assert one and more and {c.kv_cols for c in more} == {2} and all(c.cols == 6 for c in more)
    best_one = min((time_design(at.make_design(shape, c)) for c in one), key=lambda t: t.seconds)
    best_more = min((time_design(at.make_design(shape, c)) for c in more), key=lambda t: t.seconds)
    assert best_one.limiter.startswith("shim") and best_more.bound == "ddr"
    assert best_more.seconds < 0.7 * best_one.seconds
    assert all(c.kv_cols == 1 for c in at.decode_cascade_configs(at.Shape(1, 2048, 32, 8, 64)))


def test_rules_are_shape_errors():
    shape = at.Shape(1, 40, 8, 2, 16)
    for bad in (
        C(cols=2, heads_per_col=1, tile_q=1, tile_k=8, group_rows=True),  # needs cascade stages
        C(cols=2, heads_per_col=2, tile_q=1, tile_k=8, kv_stages=2, group_rows=True),  # one KV head per unit
        C(cols=2, tile_k=8, **(FD | {"kv_stages": 3}), kv_channels=2),  # stages split evenly over the channels
        C(cols=2, tile_k=8, **FD, kv_channels=3),  # a shim has 2 MM2S channels
        C(cols=4, tile_k=8, **FD),  # more columns than KV heads
        C(cols=4, heads_per_col=1, tile_q=1, tile_k=8, kv_stages=4, kv_cols=2),  # kv_cols needs group_rows
        C(cols=4, tile_k=8, **(FD | {"kv_stages": 6}), kv_cols=4),  # whole stages per column
        C(cols=4, tile_k=8, **(FD | {"kv_stages": 6}), kv_cols=2, kv_channels=2),  # 3 per column on 2 channels
        C(cols=3, tile_k=8, **FD, kv_cols=2),  # columns in whole units of 2
        C(cols=8, tile_k=8, **FD, kv_cols=2),  # 4 units of 2 columns for 2 KV heads
    ):
        with pytest.raises(DesignError):
            at.make_design(shape, bad)
    with pytest.raises(DesignError):  # all queries in one tile: a decode step (or a single-query chunk)
        at.make_design(at.Shape(2, 40, 8, 2, 16), C(cols=2, tile_k=8, **(FD | {"tile_q": 1})))
