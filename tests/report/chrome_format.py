"""The rules of the Chrome trace-event format that ui.perfetto.dev and chrome://tracing rely on, checked
independently of tilepilot's writer (a problem list, empty when the file is well formed)."""

from __future__ import annotations

from numbers import Real
from typing import Any

# Phase letters of the format (Trace Event Format document): duration, complete, instant, counter, async,
# flow, sample, object, metadata, memory dump, mark, clock sync, context.
PHASES = set("BEXiIPCbnesStfFNODMVvRcl(),") | {"T", "p"}
SIZED_CATS = ("launch", "dma", "placement")  # events that must carry bytes and MACs


def problems(doc: Any) -> list[str]:
    out: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["not a JSON object with a traceEvents list"]
    named_pids, named_tids, used = set(), set(), set()
    open_b: dict[tuple, list[str]] = {}
    for i, e in enumerate(doc["traceEvents"]):
        ph = e.get("ph")
        if ph not in PHASES:
            out.append(f"event {i}: unknown phase {ph!r}")
            continue
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            out.append(f"event {i}: pid/tid must be integers")
            continue
        if ph == "M":
            if e.get("name") == "process_name":
                named_pids.add(e["pid"])
            if e.get("name") == "thread_name":
                named_tids.add((e["pid"], e["tid"]))
            if not isinstance((e.get("args") or {}).get("name", (e.get("args") or {}).get("sort_index")), (str, int)):
                out.append(f"event {i}: metadata without a name / sort_index")
            continue
        used.add((e["pid"], e["tid"]))
        ts = e.get("ts")
        if not isinstance(ts, Real) or isinstance(ts, bool) or ts < 0:
            out.append(f"event {i}: ts {ts!r} is not a non-negative number of microseconds")
        if ph == "X":
            dur = e.get("dur")
            if not isinstance(dur, Real) or isinstance(dur, bool) or dur < 0:
                out.append(f"event {i}: dur {dur!r} is not a non-negative number of microseconds")
        if ph == "B":
            open_b.setdefault((e["pid"], e["tid"]), []).append(e.get("name"))
        if ph == "E":
            stack = open_b.get((e["pid"], e["tid"])) or []
            if not stack:
                out.append(f"event {i}: E without a matching B on its track")
            else:
                stack.pop()
        if e.get("cat") in SIZED_CATS:
            args = e.get("args") or {}
            for k in ("bytes", "macs"):
                if not isinstance(args.get(k), int) or args[k] < 0:
                    out.append(f"event {i} ({e.get('cat')} {e.get('name')}): args.{k} missing or negative")
    for track, stack in open_b.items():
        if stack:
            out.append(f"track {track}: B without E: {stack}")
    for pid, tid in sorted(used):
        if pid not in named_pids:
            out.append(f"pid {pid} has no process_name metadata")
        if (pid, tid) not in named_tids:
            out.append(f"pid {pid} tid {tid} has no thread_name metadata")
    return out


def thread_names(doc: dict) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
