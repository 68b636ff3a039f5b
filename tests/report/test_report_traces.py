"""Chrome trace-event files (ui.perfetto.dev) from deploy, bench and generate follow the format's rules."""

from __future__ import annotations

import copy
import json

import pytest
from chrome_format import problems, thread_names

from tilepilot.cli import main
from tilepilot.npu.trace import Trace


def _load(path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _tracks_are_laid_out(doc: dict, memory_tiles: bool = True) -> None:
    """``memory_tiles``: the run holds designs that route data through memory tiles (the GEMMs of a prefill do; a
    decode of row-wise kernels and GEMVs streaming from the shim straight into compute tiles may hold none)."""
    names = set(thread_names(doc).values())
    assert any(n.startswith("column ") and n.endswith(" compute") for n in names), names
    if memory_tiles:
        assert any(n.startswith("memory tile ") for n in names), names
    assert any(n.startswith("shim ") and " mm2s " in n for n in names), names
    assert {"cpu steps outside the plan (measured)", "buffer sync (modeled)", "dispatches (modeled)"} <= names
    procs = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert all("modeled" in p or "measured" in p for p in procs), procs
    placed = [e for e in doc["traceEvents"] if e.get("cat") == "placement"]
    assert any(e["args"]["macs"] > 0 for e in placed) and any(e["args"]["bytes"] > 0 for e in placed)
    assert all(e["args"]["clock"] == "modeled" for e in placed)


def test_deploy_writes_prefill_and_decode_traces(deployed):
    for phase in ("prefill", "decode"):
        path = deployed.workspace / "trace" / f"{phase}.json"
        doc = _load(path)
        assert problems(doc) == []
        _tracks_are_laid_out(doc, memory_tiles=phase == "prefill")
        events = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "placement"]
        assert events and {e["args"]["stage"] for e in events} == {phase}
        assert min(e["ts"] for e in events) == 0.0
        # read back: the placement copies are not events of the run, so counts are those of the run
        back = Trace.from_chrome(path)
        assert back.count("dispatch") == sum(e["cat"] == "dispatch" for e in events) > 0
        assert back.count("launch") == sum(e["cat"] == "launch" for e in events)


def test_placed_column_macs_add_up_to_the_launch(deployed):
    doc = _load(deployed.workspace / "trace" / "prefill.json")
    by_event: dict[int, int] = {}
    launches = {}
    for e in doc["traceEvents"]:
        if e.get("cat") == "launch":
            launches[e["args"]["event"]] = e["args"]["macs"]
        if e.get("cat") == "placement" and e["pid"] == 2:  # compute columns
            by_event[e["args"]["event"]] = by_event.get(e["args"]["event"], 0) + e["args"]["macs"]
    assert launches and set(by_event) <= set(launches)
    assert all(by_event[i] == launches[i] for i in by_event)


@pytest.mark.parametrize(
    "break_it, expect",
    [
        (lambda d: d["traceEvents"].append({"ph": "Q", "pid": 1, "tid": 1, "ts": 0}), "unknown phase"),
        (lambda d: _first(d, "dispatch").update(dur=-1.0), "dur -1.0"),
        (lambda d: _first(d, "dispatch").update(ts="0"), "ts '0'"),
        (lambda d: _first(d, "launch")["args"].pop("bytes"), "args.bytes missing"),
        (lambda d: _first(d, "dma")["args"].pop("macs"), "args.macs missing"),
        (lambda d: d["traceEvents"].append({"ph": "B", "name": "x", "pid": 1, "tid": 1, "ts": 1.0}), "B without E"),
        (lambda d: d["traceEvents"].append({"ph": "E", "pid": 1, "tid": 2, "ts": 1.0}), "E without a matching B"),
        (lambda d: _first(d, "dispatch").update(tid=77), "tid 77 has no thread_name"),
    ],
)
def test_the_format_check_catches_broken_traces(deployed, break_it, expect):
    doc = _load(deployed.workspace / "trace" / "decode.json")
    bad = copy.deepcopy(doc)
    break_it(bad)
    found = problems(bad)
    assert any(expect in p for p in found), found


def _first(doc: dict, cat: str) -> dict:
    return next(e for e in doc["traceEvents"] if e.get("cat") == cat)


def test_bench_trace(deployed, tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = ["bench", str(deployed.workspace), "--prompt-len", "64", "--decode-tokens", "2", "--json", "--trace"]
    assert main([*args, str(out)]) == 0
    res = json.loads(capsys.readouterr().out)
    doc = _load(out)
    assert problems(doc) == []
    _tracks_are_laid_out(doc)
    assert sum(e.get("cat") == "dispatch" for e in doc["traceEvents"]) == res["functional_run"]["dispatches_traced"]


def test_generate_trace(zoo_model, tmp_path, capsys):
    from tilepilot.runtime.workspace import make_workspace

    ws = make_workspace(zoo_model("qwen2.5-0.5b", layers=1), "paper-like", tmp_path / "ws").path
    out = tmp_path / "gen.json"
    assert main(["generate", str(ws), "--prompt", "Hello", "--max-new-tokens", "3", "--trace", str(out)]) == 0
    assert "Chrome trace" in capsys.readouterr().out
    doc = _load(out)
    assert problems(doc) == []
    _tracks_are_laid_out(doc)
    phases = {e["args"].get("stage") for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert {"prefill", "decode"} <= phases


def test_a_launch_is_placed_only_on_the_layout_whose_macs_match():
    from tilepilot.npu.trace import LaunchLayout, TraceEvent

    a = LaunchLayout(columns=((0, 100), (1, 100)), mem_tiles=(), shim_channels=(("shim 0 mm2s 0", 64),))
    b = LaunchLayout(columns=((2, 150), (3, 150)), mem_tiles=(), shim_channels=(("shim 2 mm2s 0", 64),))
    c = LaunchLayout(columns=((4, 200),), mem_tiles=(), shim_channels=())
    t = Trace()
    t.record(TraceEvent("k", "launch", 0.0, 1e-3, "modeled", bytes=64, macs=300))
    t.record(TraceEvent("ddr k", "dma", 0.0, 1e-3, "modeled", bytes=64))
    cols = lambda d: {e["tid"] for e in d["traceEvents"] if e.get("cat") == "placement" and e["pid"] == 2}  # noqa: E731
    assert cols(t.to_chrome_dict({"k": (a, b)})) == {3, 4}  # b's columns 2 and 3 (tid = column + 1)
    assert cols(t.to_chrome_dict({"k": (b, c)})) == {3, 4}
    ambiguous = LaunchLayout(columns=((5, 300),), mem_tiles=(), shim_channels=())
    doc = t.to_chrome_dict({"k": (b, ambiguous)})
    assert not [e for e in doc["traceEvents"] if e.get("cat") == "placement"]
    assert problems(doc) == []
