"""Trace: events carry their clock, totals do not double count, and the Chrome file is valid trace JSON."""

from __future__ import annotations

import json

import pytest

from tilepilot.errors import InputError, WorkspaceError
from tilepilot.npu.trace import KINDS, Trace, TraceEvent, on_modeled_timeline


def _sample_trace() -> Trace:
    t = Trace()
    t.add("cpu", "sync inputs", 0.0002, group="host_sync", stage="prefill", bytes=4096)
    d = t.add("dispatch", "rms_gemms_rope", 0.0073, group="rms_gemms_rope", layer=0, stage="prefill", macs=10**9)
    t.record(TraceEvent("dma A", "dma", d.start_s, d.start_s + 0.001, "modeled", group="rms_gemms_rope", bytes=1 << 20))
    t.add("dispatch", "rms_gemms_rope", 0.0073, group="rms_gemms_rope", layer=1, stage="prefill", macs=10**9)
    t.add("sync", "sync weights", 0.0001, group="host_sync", stage="decode", bytes=1 << 16)
    t.add("cpu", "attention", 0.0003, group="cpu_attention", layer=1, stage="decode")
    return t


def test_add_places_events_back_to_back_and_defaults_clock_by_kind():
    t = _sample_trace()
    top = t.top_level()
    for a, b in zip(top, top[1:], strict=False):
        assert b.start_s == pytest.approx(a.end_s)
    assert all(e.clock == "modeled" for e in t.events if e.kind in ("dispatch", "dma", "sync"))
    assert all(e.clock == "measured" for e in t.events if e.kind == "cpu")  # unless a CPU group says modeled


def test_cpu_work_has_one_kind_and_only_the_modeled_cpu_groups_enter_modeled_figures():
    t = Trace()
    t.add("cpu", "embed", 0.004, stage="decode")  # a CPU step outside the plan: measured
    t.add("dispatch", "block", 0.002, group="block", layer=0, stage="decode")
    t.add("cpu", "attention", 0.0005, clock="modeled", measured_s=0.0009, group="attention", layer=0, stage="decode")
    assert "host" not in KINDS and "cpu" in KINDS
    assert sum(e.duration_s for e in t.events if on_modeled_timeline(e)) == pytest.approx(0.0025)
    lanes = {(e["cat"], e["tid"]) for e in t.to_chrome_dict()["traceEvents"] if e.get("ph") == "X"}
    assert len({tid for cat, tid in lanes if cat == "cpu"}) == 2  # measured steps and modeled groups: two lanes
    with pytest.raises(InputError):
        t.add("host", "old kind", 0.001)


def test_dma_inside_a_dispatch_is_not_counted_twice():
    t = _sample_trace()
    assert t.total_s("modeled") == pytest.approx(2 * 0.0073 + 0.0001)
    assert t.total_s("measured") == pytest.approx(0.0002 + 0.0003)
    assert t.count("dispatch") == 2
    assert t.count("dispatch", stage="decode") == 0


def test_summary_per_group_counts_totals_and_shares():
    rows = {(r.group, r.clock): r for r in _sample_trace().summary()}
    g = rows[("rms_gemms_rope", "modeled")]
    assert g.count == 2
    assert g.total_ms == pytest.approx(14.6)
    assert sum(r.share for r in rows.values()) == pytest.approx(1.0)
    assert rows[("cpu_attention", "measured")].count == 1
    text = _sample_trace().format_summary()
    assert "modeled" in text and "measured" in text


def test_chrome_file_is_valid_trace_json(tmp_path):
    path = _sample_trace().to_chrome(tmp_path / "sub" / "run.json")
    data = json.loads(path.read_text())
    assert isinstance(data["traceEvents"], list)
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 6
    for e in xs:
        assert isinstance(e["name"], str) and isinstance(e["cat"], str)
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
        assert e["dur"] >= 0 and e["ts"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert e["args"]["clock"] in ("modeled", "measured")
    # NPU and host live in different process lanes
    assert {e["pid"] for e in xs if e["cat"] == "dispatch"} != {e["pid"] for e in xs if e["cat"] == "cpu"}
    names = {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert any("modeled" in n for n in names) and any("measured" in n for n in names)
    # microseconds in the file
    disp = next(e for e in xs if e["cat"] == "dispatch")
    assert disp["dur"] == pytest.approx(7300.0)
    assert not list(tmp_path.joinpath("sub").glob("*.tmp"))


def test_round_trip_through_the_chrome_file(tmp_path):
    t = _sample_trace()
    back = Trace.from_chrome(t.to_chrome(tmp_path / "t.json"))
    assert back.count("dispatch") == t.count("dispatch")
    assert back.total_s("modeled") == pytest.approx(t.total_s("modeled"))
    assert [e.clock for e in back.events] == [e.clock for e in sorted(t.events, key=lambda e: e.start_s)]


def test_bad_events_and_bad_files_are_user_errors(tmp_path):
    with pytest.raises(InputError):
        TraceEvent("x", "teleport", 0, 1, "modeled")
    with pytest.raises(InputError):
        TraceEvent("x", "dispatch", 0, 1, "guessed")
    with pytest.raises(InputError):
        TraceEvent("x", "dispatch", 2, 1, "modeled")
    with pytest.raises(InputError):
        Trace().add("dispatch", "x", -1.0)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(WorkspaceError):
        Trace.from_chrome(bad)


def test_add_dispatch_lays_out_launches_inside_the_dispatch():
    from tilepilot.kernels import eltwise
    from tilepilot.npu.timing import time_group

    designs = [eltwise.make_design(eltwise.Shape(1 << 16, "add"), eltwise.Config(tiles=8, chunk=1024)) for _ in "ab"]
    designs[1].name = "second"
    g = time_group(designs)
    t = Trace()
    t.add("cpu", "prep", 0.001)
    d = t.add_dispatch(g, group="resid", layer=3, stage="decode")
    assert d.duration_s == pytest.approx(g.seconds) and d.start_s == pytest.approx(0.001)
    launches = [e for e in t.events if e.kind == "launch"]
    assert [e.name for e in launches] == [designs[0].name, "second"]
    assert all(d.start_s <= e.start_s <= e.end_s <= d.end_s + 1e-12 for e in launches)
    assert launches[0].end_s <= launches[1].start_s
    assert t.count("dma") == 2 and t.total_s("modeled") == pytest.approx(g.seconds)  # no double counting
    assert d.macs == g.macs and d.bytes == g.ddr_bytes and d.layer == 3 and d.stage == "decode"
    assert t.cursor_s == pytest.approx(d.end_s)
