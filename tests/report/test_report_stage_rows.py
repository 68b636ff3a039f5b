"""The report's per-stage rows: a decode stage run as one dispatch per pass is its own row, not head time."""

from __future__ import annotations

import pytest

from tilepilot.model.zoo import get_zoo_model
from tilepilot.plan.air_q4 import fused_stage
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.report.data import stage_rows
from tilepilot.report.figures import _per_layer_bars
from tilepilot.runtime.timing import time_plan


@pytest.fixture(scope="module")
def timed():
    spec = get_zoo_model("llama-3.2-1b").spec()
    base = paper_like_plan(spec)
    return spec, time_plan(base, spec, prompt_len=64), time_plan(fused_stage(base), spec, prompt_len=64)


def test_one_dispatch_decode_is_its_own_row_and_the_rows_add_up(timed):
    spec, per_group, fused = timed
    rows = stage_rows(fused.stage_groups("decode"))
    assert rows["one_dispatch_ms"] is not None and rows["one_dispatch_ms"] > 0
    assert all(g["dispatch_ms"] == 0 for g in rows["block"])  # the layers' launches are inside the pass
    assert rows["head_ms"] < 0.1 * rows["one_dispatch_ms"]  # the head is no longer charged the whole step
    calls = {g.name: g.calls for g in fused.stage_groups("decode")}
    block_ms = sum(g["per_layer_ms"] * calls[g["name"]] for g in rows["block"])  # syncs of the layers, if any
    total = rows["one_dispatch_ms"] + rows["head_ms"] + block_ms
    assert total == pytest.approx(fused.decode_s_per_token * 1e3, rel=1e-9)
    bars = _per_layer_bars(rows, spec.n_layers)
    assert bars[:-1] == rows["block"]
    assert bars[-1]["per_layer_ms"] == pytest.approx(rows["one_dispatch_ms"] / spec.n_layers, rel=1e-12)


def test_a_stage_dispatching_per_group_has_no_one_dispatch_row(timed):
    spec, per_group, _ = timed
    for stage in ("prefill", "decode"):
        rows = stage_rows(per_group.stage_groups(stage))
        assert rows["one_dispatch_ms"] is None and any(g["dispatch_ms"] > 0 for g in rows["block"])
        assert _per_layer_bars(rows, spec.n_layers) == rows["block"]
