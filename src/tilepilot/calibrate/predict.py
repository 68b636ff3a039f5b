"""``tilepilot calibrate --predict FILE``: the frozen timing model on measurement rows it was not fitted to.

Every row of a file in the reference format (``npu2_kernel_measurements.json``'s tables) is mapped to a design
with the same row builders the calibration uses and timed with the frozen constants: no fit. Per row: modeled,
measured, ratio, or "not expressible" with the reason; per family the same summary as ``calibrate --json``'s
``kernels`` section (``rows``, ``modeled_rows``, ``median_abs_err``, ``worst_ratio``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tilepilot.calibrate.harness import KERNEL_TABLES, kernel_rows, summarize, time_row
from tilepilot.errors import InputError
from tilepilot.npu.calibration import CALIBRATION, Calibration


def predict(path: Path, cal: Calibration = CALIBRATION) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{path} is not a readable measurements JSON ({e}); pass one in the reference format") from e
    known = [t for t, _ in KERNEL_TABLES if t in data]
    if not known:
        raise InputError(f"{path} has none of the tables {[t for t, _ in KERNEL_TABLES]}; nothing to predict")
    rows = kernel_rows(data=data)
    out_rows: list[dict[str, Any]] = []
    families: dict[str, Any] = {}
    not_expressible: list[dict[str, Any]] = []
    for table, rs in rows.items():
        figs = []
        for r in rs:
            try:
                f = time_row(r, cal)
            except Exception as e:  # noqa: BLE001 - a row no legal design of its family expresses
                reason = f"{type(e).__name__}: {e}"
                out_rows.append({"table": table, "key": r.key, "label": r.label, "measured": r.published,
                                 "modeled": None, "ratio": None, "expressible": False, "reason": reason})  # fmt: skip
                not_expressible.append({"table": table, "key": r.key, "reason": reason})
                continue
            figs.append(f)
            ok = f.modeled is not None
            entry = {"table": table, "key": f.key, "label": f.label, "measured": f.published, "modeled": f.modeled,
                     "ratio": f.ratio, "expressible": ok, "reason": None if ok else f.note}  # fmt: skip
            out_rows.append(entry)
            if not ok:
                not_expressible.append({"table": table, "key": f.key, "reason": f.note})
        s = summarize(table, figs).to_dict()
        s["rows"] = len(rs)  # every row of the file, expressible or not
        families[table] = s
    return {
        "file": str(path),
        "clock": "modeled with the frozen constants (no fit) vs the file's measured latencies, seconds",
        "kernels": families,
        "rows": out_rows,
        "not_expressible": not_expressible,
    }


def render(report: dict[str, Any]) -> str:
    lines = [f"tilepilot calibrate --predict {report['file']} (frozen constants, no fit; modeled vs measured)"]
    for fam, s in report["kernels"].items():
        med = "—" if s["median_abs_err"] is None else f"{s['median_abs_err']:.1%}"
        worst = "—" if s["worst_ratio"] is None else f"{s['worst_ratio']:.2f}"
        lines.append(
            f"  {fam:<16} rows {s['rows']:>3}  modeled {s['modeled_rows']:>3}  median |err| {med:>6}  worst {worst}"
        )
    for r in report["rows"]:
        if r["expressible"]:
            lines.append(f"  {r['key']:<40} modeled {r['modeled'] * 1e6:10.1f} us  measured "
                         f"{r['measured'] * 1e6:10.1f} us  ratio {r['ratio']:.2f}")  # fmt: skip
        else:
            lines.append(f"  {r['key']:<40} not expressible: {r['reason']}")
    return "\n".join(lines)
