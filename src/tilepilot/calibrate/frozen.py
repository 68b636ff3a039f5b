"""Is ``CALIBRATION`` the fit ``calibrate --fit`` chose? Its objectives, recomputed, against the frozen record.

``npu/calibration.FROZEN_FIT`` records the fit choice and the objective values the frozen constants reach (the
per-table in-sample losses over all rows and over the probe rows, their mean, the end-to-end stage's loss), as
``calibrate --fit --json`` printed them (``record``). ``check`` recomputes them under the constants in force: a
constant edited by hand, or a change to the model's physics not followed by a refit, moves a loss and is reported.
Every time is modeled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tilepilot.calibrate.harness import (
    CalibrationReport,
    KernelRow,
    e2e_loss,
    end_to_end_figures,
    table_loss,
    time_row,
)
from tilepilot.npu.calibration import CALIBRATION, FROZEN_FIT, Calibration, FrozenFit

# Recomputed losses must equal the recorded ones to this relative difference (float summation order is fixed, so
# only the last printed digits may differ).
REL_TOL = 1e-9
# Probe rows: a GEMM whose M*N*K is at most this builds in well under a second; the two 2048x2048 FlashAttention
# rows take seconds each and are no probe. Every row of the other tables is cheap.
PROBE_GEMM_WORK = 2**31
NO_PROBE_TABLES = ("flash_attention",)


def _gemm_work(row: KernelRow) -> int:
    m, k, n = (int(x) for x in row.key.split("/")[1].split("x"))
    return m * k * n


def probe_rows(rows: dict[str, list[KernelRow]]) -> dict[str, list[KernelRow]]:
    """The rows a fast test can time: every table's cheap rows (tables with none are left out)."""
    out = {}
    for table, rs in rows.items():
        if table in NO_PROBE_TABLES:
            continue
        keep = [r for r in rs if r.build is not None and (table != "gemm" or _gemm_work(r) <= PROBE_GEMM_WORK)]
        if keep:
            out[table] = keep
    return out


def table_losses(rows: dict[str, list[KernelRow]], cal: Calibration = CALIBRATION) -> dict[str, float]:
    return {t: table_loss([time_row(r, cal) for r in rs]) for t, rs in rows.items() if any(r.build for r in rs)}


def record(
    rows: dict[str, list[KernelRow]], cal: Calibration, *, choice: str, cv_loss: float, end_to_end: bool = True
) -> FrozenFit:
    """The frozen record of ``cal`` fitted with ``choice`` (what ``calibrate --fit`` prints to freeze)."""
    full = table_losses(rows, cal)
    probe = table_losses(probe_rows(rows), cal)
    return FrozenFit(
        choice=choice,
        cv_loss=cv_loss,
        kernel_loss=sum(full.values()) / max(len(full), 1),
        e2e_loss=e2e_loss(end_to_end_figures(cal)) if end_to_end else math.nan,
        table_losses=tuple(sorted(full.items())),
        probe_losses=tuple(sorted(probe.items())),
    )


@dataclass(frozen=True)
class Mismatch:
    what: str
    recorded: float | None
    recomputed: float

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "recorded": self.recorded, "recomputed": self.recomputed}

    def __str__(self) -> str:
        rec = "none" if self.recorded is None else f"{self.recorded:.12g}"
        return f"{self.what}: recorded {rec}, recomputed {self.recomputed:.12g}"


def _same(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0)


def compare(recomputed: dict[str, float], recorded: dict[str, float], prefix: str) -> list[Mismatch]:
    out = [
        Mismatch(f"{prefix} {t}", recorded.get(t), v) for t, v in recomputed.items() if not _same(recorded.get(t), v)
    ]
    return out


def check_probe(rows: dict[str, list[KernelRow]], cal: Calibration = CALIBRATION, frozen: FrozenFit = FROZEN_FIT):
    """Mismatches of the probe rows' losses under ``cal`` against ``frozen`` (fast: the cheap rows only)."""
    probe = probe_rows(rows)
    recorded = dict(frozen.probe_losses)
    out = compare(table_losses(probe, cal), recorded, "probe loss")
    out += [Mismatch(f"probe loss {t}", v, math.nan) for t, v in recorded.items() if t not in probe]
    return out


def check_full(
    figures_losses: dict[str, float], e2e: float | None, frozen: FrozenFit = FROZEN_FIT, tables: Sequence[str] = ()
) -> list[Mismatch]:
    """Mismatches of a full report's per-table in-sample losses (and the end-to-end loss, when timed) against
    ``frozen``; ``tables`` limits the check to the tables the report timed."""
    recorded = dict(frozen.table_losses)
    got = {t: v for t, v in figures_losses.items() if not tables or t in tables}
    out = compare(got, recorded, "in-sample loss")
    if e2e is not None and not _same(frozen.e2e_loss, e2e):
        out.append(Mismatch("end-to-end loss", frozen.e2e_loss, e2e))
    return out


def attach(report: CalibrationReport, *, tables: Sequence[str] | None = None, frozen: FrozenFit = FROZEN_FIT) -> None:
    """Check ``report`` (timed under the frozen constants) against ``frozen``: the per-table in-sample losses of the
    tables it timed and, when it timed them, the end-to-end stage's loss; the result goes into the report."""
    if report.calibration != CALIBRATION:
        return  # a report under other constants says nothing about the frozen ones
    losses = {t: table_loss(figs) for t, figs in report.kernels.items() if any(f.ratio is not None for f in figs)}
    e2e = e2e_loss(report.end_to_end) if report.end_to_end else None
    mism = check_full(losses, e2e, frozen, tables or ())
    report.frozen_fit = {"recorded": frozen.to_dict(), "mismatches": [str(m) for m in mism], "matches": not mism}
