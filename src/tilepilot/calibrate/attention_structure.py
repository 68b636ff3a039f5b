"""Judge a way of timing AIR's FlashAttention rows on rows the fit never saw (``python -m
tilepilot.calibrate.attention_structure [FILE]``, JSON).

The registry rows can be timed with our own attention dataflow ("ours", what the frozen fit uses) or with AIR's
structure ("cascade": keys split over 4 stages, K/V shared by 4 columns, sequential launch iterations, every block
computed; ``kernels.attention.cascade_configs``). Changing the structure changes what the attention efficiency
must absorb, so each structure is judged after refitting that efficiency alone on the fitted FlashAttention rows
(the fit's grid, 2**(-i/4); every other constant as frozen: the attention rows inform only this one), then timing
the held-out file with it. Nothing here reads the held-out rows' latencies before the efficiency is fixed.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from tilepilot.calibrate.harness import kernel_rows, table_loss, time_row, worst_ratio
from tilepilot.npu.calibration import CALIBRATION, Calibration

HELD_OUT = Path("benchmarks/data/flash_attention_more_rows.json")
EFFICIENCY_GRID = tuple(2 ** (-i / 4) for i in range(41))  # crossval's absolute efficiency grid, 1 .. ~0.001


def _figures(rows: list, cal: Calibration) -> list:
    return [time_row(r, cal) for r in rows]


def judge(structure: str, held_out: dict[str, Any], cal: Calibration = CALIBRATION) -> dict[str, Any]:
    """Refit the attention efficiency on the fitted rows under ``structure``; report in-sample and held-out."""
    fitted = kernel_rows(tables=["flash_attention"], attention=structure)["flash_attention"]
    held = kernel_rows(tables=["flash_attention"], data=held_out, attention=structure)["flash_attention"]
    losses = {e: table_loss(_figures(fitted, cal.with_efficiency("attention", e))) for e in EFFICIENCY_GRID}
    eff = min(losses, key=lambda e: (losses[e], -e))
    tuned = cal.with_efficiency("attention", eff)

    def report(figs: list) -> dict[str, Any]:
        ratios = [f.ratio for f in figs]
        return {
            "median_abs_err": statistics.median(abs(r - 1) for r in ratios),
            "worst_ratio": worst_ratio(ratios),
            "loss": table_loss(figs),
            "rows": {f.key: {"measured": f.published, "modeled": f.modeled, "ratio": f.ratio} for f in figs},
        }

    return {
        "structure": structure,
        "attention_efficiency": eff,
        "frozen_attention_efficiency": cal.efficiency("attention"),
        "in_sample": report(_figures(fitted, tuned)),
        "held_out": report(_figures(held, tuned)),
    }


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else HELD_OUT
    held_out = json.loads(path.read_text(encoding="utf-8"))
    print(json.dumps({s: judge(s, held_out) for s in ("ours", "cascade")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
