"""The frozen constants are the fit ``calibrate --fit`` chose (issue 11): their objectives equal the frozen record.

Fast: only the probe rows are timed (every row of the cheap tables and the GEMMs up to 2**31 MACs, ~100 rows); the
full check (every row, the end-to-end loss) runs in ``tilepilot calibrate``. The attention efficiency and the
end-to-end-only constants (``launch_in_group_s``, host copy / sync / CPU rate) have no probe row: the full check
covers them.
"""

from __future__ import annotations

import dataclasses

import pytest

from tilepilot.calibrate import frozen
from tilepilot.calibrate import harness as ca
from tilepilot.calibrate.crossval import FIT_CHOICES, FROZEN_CHOICE
from tilepilot.npu.calibration import CALIBRATION, FROZEN_FIT


@pytest.fixture(scope="module")
def rows():
    return ca.kernel_rows()


def test_the_record_names_a_fit_choice_and_every_table():
    assert FROZEN_FIT.choice == FROZEN_CHOICE and FROZEN_FIT.choice in {c.name for c in FIT_CHOICES}
    tables = dict(FROZEN_FIT.table_losses)
    assert set(tables) == set(ca.load_reference("npu2_kernel_measurements")) & set(tables) and len(tables) == 7
    assert FROZEN_FIT.kernel_loss == pytest.approx(sum(tables.values()) / len(tables), rel=1e-12)
    assert 0 < FROZEN_FIT.kernel_loss < FROZEN_FIT.cv_loss  # in sample beats held out
    assert FROZEN_FIT.e2e_loss > 0


def test_the_frozen_constants_reach_the_recorded_probe_losses(rows):
    probe = frozen.probe_rows(rows)
    assert set(probe) == set(dict(FROZEN_FIT.probe_losses)) and len(probe["gemm"]) >= 10
    assert frozen.check_probe(rows) == []


@pytest.mark.parametrize(
    "edit",
    [
        {"dispatch_overhead_s": CALIBRATION.dispatch_overhead_s * 1.01},
        {"tile_config_s": CALIBRATION.tile_config_s * 1.05},
        {"ddr_bytes_per_s": CALIBRATION.ddr_bytes_per_s * 0.99},
        {"shim_channel_bytes_per_s": CALIBRATION.shim_channel_bytes_per_s * 1.01},
        {"eff:gemm": CALIBRATION.efficiency("gemm") * 0.99},
        {"eff:gemv": CALIBRATION.efficiency("gemv") * 1.01},
        {"eff:rmsnorm": CALIBRATION.efficiency("rmsnorm") * 1.01},
    ],
)
def test_a_hand_edited_constant_fails_the_check(rows, edit):
    ((name, value),) = edit.items()
    cal = CALIBRATION.with_efficiency(name[4:], value) if name.startswith("eff:") else CALIBRATION.tuned(**edit)
    mism = frozen.check_probe(rows, cal)
    assert mism and all("probe loss" in str(m) for m in mism)


def test_the_full_check_reports_what_moved():
    recorded = dict(FROZEN_FIT.table_losses)
    assert frozen.check_full(recorded, FROZEN_FIT.e2e_loss) == []
    moved = {**recorded, "gemm": recorded["gemm"] * 1.001}
    (m,) = frozen.check_full(moved, FROZEN_FIT.e2e_loss)
    assert m.what == "in-sample loss gemm" and m.recorded == recorded["gemm"]
    (m,) = frozen.check_full(recorded, FROZEN_FIT.e2e_loss * 1.001)
    assert m.what == "end-to-end loss"
    # a report limited to some tables is checked on those only
    assert frozen.check_full({"gemv": recorded["gemv"]}, None, tables=["gemv"]) == []


def test_a_mismatch_fails_the_report():
    figs = {"gemv": [ca.Figure("gemv/x", "gemv", "x", 1e-4, 1.1e-4)]}
    report = ca.CalibrationReport(figs, [])
    frozen.attach(report)
    assert report.frozen_fit["matches"] is False and not report.passed
    assert any("not the recorded fit" in f for f in report.failures())
    other = ca.CalibrationReport(figs, [], calibration=dataclasses.replace(CALIBRATION, host_alloc_s=1e-3))
    frozen.attach(other)  # timed under other constants: says nothing about the frozen ones
    assert other.frozen_fit is None
