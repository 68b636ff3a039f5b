"""A resident pass (``npu/resident.py``): every launch of a dispatch packed into the array and configured once.

The sharing rule (launches of one buffer layout share it, others add up), the packing (a design that does not fit
beside the others is moved where it does, or the pass is an error with its validator code) and the timing (one
dispatch, each tile configured once, no design switch)."""

from __future__ import annotations

import pytest

from tilepilot.kernels import eltwise
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.npu.placer import SequentialPlacer
from tilepilot.npu.resident import pack, time_resident
from tilepilot.npu.resources import resource_use
from tilepilot.npu.timing import time_design, time_group
from tilepilot.npu.validate import DesignError, check


def _add(tiles: int, chunk: int, calls: int = 1):
    """An eltwise add on ``tiles`` tiles: 3 fifos x 2 buffers x ``chunk`` bf16 elements per tile (chunk 4096 fills
    48 KiB of a 64 KiB tile)."""
    cfg = eltwise.Config(tiles=tiles, chunk=chunk)
    return check(SequentialPlacer().place(eltwise.make_design(eltwise.Shape(n=tiles * chunk * calls), cfg)))


def test_launches_of_one_buffer_layout_share_it():
    a, b = _add(8, 4096), _add(8, 4096, calls=2)  # two shapes, one layout on every tile
    p = pack("pass", [a, b, a])
    assert p.problems == ()
    tile = a.workers[0].placement
    alone = resource_use(a)[tile]
    assert p.use[tile].memory == alone.memory and p.use[tile].locks == alone.locks  # one buffer set, not two
    assert p.moves[id(b)] == (0, 0)


def test_a_launch_that_does_not_fit_beside_the_others_is_moved_where_it_does():
    big, small = _add(8, 4096), _add(8, 2048)  # 48 KiB + 24 KiB on one tile would overflow its 64 KiB
    p = pack("pass", [big, small])
    assert p.problems == ()
    moved = p.placed[id(small)]
    assert p.moves[id(small)] != (0, 0)
    assert {w.placement for w in moved.workers}.isdisjoint({w.placement for w in big.workers})
    assert time_design(moved).seconds == time_design(small).seconds  # moving a design does not change its time


def test_a_pass_whose_launches_cannot_fit_together_is_an_error_with_its_code():
    # five launches of 8 tiles (two columns) and 36-48 KiB per tile: any two overflow a shared tile's 64 KiB, and
    # the array holds four such column pairs
    launches = [_add(8, chunk) for chunk in (4096, 3840, 3584, 3328, 3072)]
    assert pack("pass", launches[:4]).problems == ()
    p = pack("pass", launches)
    assert {v.code for v in p.problems} == {"L1_OVERFLOW"}
    assert "resident pass pass" in p.problems[0].message
    with pytest.raises(DesignError) as e:
        time_resident("pass", launches)
    assert "L1_OVERFLOW" in e.value.codes


def test_a_packing_asked_again_is_the_one_computed_and_names_the_pass_it_is_asked_for():
    launches = [_add(8, chunk) for chunk in (4096, 3840, 3584, 3328, 3072)]
    first = pack("first", launches)
    same = pack("second", launches + launches)  # the same distinct designs in the same order: remembered
    assert same.moves == first.moves and same.use is first.use  # not recomputed: the very demand computed first
    assert [v.code for v in same.problems] == [v.code for v in first.problems] and same.problems
    assert all("resident pass second" in v.message for v in same.problems)
    assert all("resident pass first" in v.message for v in first.problems)
    fresh = [_add(8, chunk) for chunk in (4096, 3840, 3584, 3328, 3072)]  # equal designs, other objects
    assert pack("third", fresh).moves == {id(f): first.moves[id(a)] for f, a in zip(fresh, launches, strict=True)}


def test_a_trial_demand_is_what_merging_the_design_in_would_hold():
    from tilepilot.npu.resident import Occupancy, summary_of

    held = [_add(8, 4096), _add(4, 2048), _add(2, 1024)]
    trial = _add(8, 3072)
    for move in ((0, 0), (2, 0), (4, 0)):
        occ = Occupancy.of((d, (0, 0)) for d in held)
        summary = summary_of(trial, move)
        asked = occ.use_with(summary)
        assert occ.use(detail=False) == Occupancy.of((d, (0, 0)) for d in held).use(detail=False)  # unchanged
        occ.merge(summary)
        merged = occ.use(asked, detail=False)
        assert asked == merged
        assert any(u.memory > 0 for u in asked.values())


def test_a_move_fits_exactly_when_its_trial_demand_keeps_every_budget_and_a_subset_occupancy_is_its_tiles():
    """``fits_with`` (the packer's question, tile by tile, first tile over ends it) answers what the whole trial
    demand does; an occupancy of a few tiles (a repair's trial) holds exactly the full one's demand there."""
    from tilepilot.npu.device import npu2
    from tilepilot.npu.resident import Occupancy, summary_of
    from tilepilot.npu.validate import within_budgets

    dev = npu2()
    held = [_add(8, 4096), _add(2, 1024)]
    answers = set()
    for chunk in (4096, 256):
        trial = _add(2, chunk)
        for move in ((0, 0), (2, 0), (4, 0)):
            occ = Occupancy.of((d, (0, 0)) for d in held)
            summary = summary_of(trial, move)
            fits = occ.fits_with(summary, dev)
            assert fits == within_budgets(dev, occ.use_with(summary))
            answers.add(fits)
    assert answers == {True, False}  # both answers are reached
    full = Occupancy.of((d, (0, 0)) for d in held)
    some = set(list(full.layouts)[:3])
    part = Occupancy.of(((d, (0, 0)) for d in held), some)
    assert set(part.layouts) == some and part.use(some) == full.use(some)


def test_a_packing_trial_and_the_validator_agree_on_every_budget():
    from tilepilot.npu.device import npu2
    from tilepilot.npu.resources import TileUse
    from tilepilot.npu.validate import budget_problems, within_budgets

    dev = npu2()
    tile = _add(8, 4096).workers[0].placement
    r = dev.resources(tile)
    legal = TileUse(memory=r.memory_bytes, s2mm=r.s2mm_channels, mm2s=r.mm2s_channels, bds=r.bds, locks=r.locks)
    assert within_budgets(dev, {tile: legal}) and budget_problems(dev, {tile: legal}) == []
    for field, code in (("memory", "L1_OVERFLOW"), ("s2mm", "DMA_CHANNELS"), ("mm2s", "DMA_CHANNELS"),
                        ("bds", "BD_LIMIT"), ("locks", "LOCK_LIMIT")):  # fmt: skip
        over = TileUse(**{**legal.__dict__, "parts": [], field: getattr(legal, field) + 1})
        assert not within_budgets(dev, {tile: over})
        assert [v.code for v in budget_problems(dev, {tile: over})] == [code]


def test_resident_time_is_one_dispatch_one_configuration_and_the_launches_without_switches():
    a, b = _add(8, 4096), _add(8, 4096, calls=2)
    cal = CALIBRATION
    t = time_resident("pass", [a, b, a], cal)
    launches = 2 * time_design(a, cal).seconds + time_design(b, cal).seconds
    tiles = 8 + len({lk.placement for lk in a.links})  # the union: a's tiles, which b shares
    assert t.seconds == pytest.approx(cal.dispatch_overhead_s + tiles * cal.tile_config_s + launches, rel=1e-12)
    assert t.launches == 3 and t.clock == "modeled"
    switched = time_group([a, b, a], cal)
    assert switched.seconds - t.seconds == pytest.approx(
        2 * cal.launch_in_group_s + 2 * tiles * cal.tile_config_s, rel=1e-9
    )
