"""Cross-validation of the kernel fit (issue 11 item 3): every row's cross-validated figure comes from constants fitted
without its fold, the folds are deterministic, and the fit choice is the one with the lowest cross-validated loss.
Small problems (two streaming tables, few free constants, short searches); the full run is `tilepilot calibrate`."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tilepilot.calibrate import crossval as cv
from tilepilot.calibrate import harness as ca
from tilepilot.npu.calibration import PRIOR

TABLES = ["eltwise_add", "silu_mul"]
CHOICE = cv.FitChoice("small", ("dispatch_overhead_s", "ddr_bytes_per_s", "eff:*"), "test choice")


@pytest.fixture(scope="module")
def rows() -> dict[str, list[ca.KernelRow]]:
    rows = ca.kernel_rows(tables=TABLES)
    for rs in rows.values():
        for r in rs:
            r.profile()
    return rows


def _scaled(rows: dict[str, list[ca.KernelRow]], keys: set[str], factor: float) -> dict[str, list[ca.KernelRow]]:
    """The same rows (same designs) with the measured latency of ``keys`` multiplied by ``factor``."""
    return {
        t: [dataclasses.replace(r, published=r.published * factor) if r.key in keys else r for r in rs]
        for t, rs in rows.items()
    }


def test_a_held_out_row_does_not_inform_its_own_prediction(rows):
    """Change the measurements of fold 0's rows: their cross-validated figures stay bit-identical (the fold's fit never
    saw them), while the other folds' fits - which train on them - and an in-sample fit do move. A CV that fitted on
    the held-out rows would fail the first assertion."""
    base = cv.cross_validate(rows, CHOICE, folds=3, rounds=2)
    held = {k for k, f in base.fold.items() if f == 0}
    assert held and len(held) < sum(len(rs) for rs in rows.values())
    moved = cv.cross_validate(_scaled(rows, held, 3.0), CHOICE, folds=3, rounds=2)
    for t in rows:
        for a, b in zip(base.figures[t], moved.figures[t], strict=True):
            if a.key in held:
                assert a.modeled == b.modeled, a.key
                assert b.published == pytest.approx(3.0 * a.published)
    pairs = [p for t in rows for p in zip(base.figures[t], moved.figures[t], strict=True)]
    others = [(a.modeled, b.modeled) for a, b in pairs if a.key not in held]
    assert any(x != y for x, y in others), "the other folds train on fold 0's rows, so their fits must move"
    params = CHOICE.expand(rows)
    in_sample = ca.fit(rows, PRIOR, rounds=2, params=params).calibration
    in_sample_moved = ca.fit(_scaled(rows, held, 3.0), PRIOR, rounds=2, params=params).calibration
    assert in_sample != in_sample_moved


def test_folds_are_deterministic_and_spread_every_table(rows):
    a, b = cv.fold_of(rows, 3), cv.fold_of(ca.kernel_rows(tables=TABLES), 3)
    assert a == b
    for rs in rows.values():
        assert {a[r.key] for r in rs} == {0, 1, 2}
    with pytest.raises(Exception, match="at least 2 folds"):
        cv.fold_of(rows, 1)


def test_the_fit_choice_is_the_lowest_cross_validated_loss(rows):
    frozen_ddr = cv.FitChoice("no-ddr", ("dispatch_overhead_s",), "DDR held at the prior: cannot fit the streams")
    best, results = cv.choose(rows, [frozen_ddr, CHOICE], folds=3, rounds=2)
    assert [r.choice.name for r in results] == ["no-ddr", "small"]
    assert best.loss == min(r.loss for r in results)
    assert best.choice.name == "small"  # the streaming rows need their bandwidth and efficiencies free


def test_report_carries_in_sample_and_cross_validated_errors_per_family(rows):
    report = ca.run(rows=rows, end_to_end=False)
    cv.attach(report, rows, cv.cross_validate(rows, CHOICE, folds=3, rounds=2))
    d = json.loads(json.dumps(report.to_dict()))
    assert d["cross_validation"]["folds"] == 3 and d["cross_validation"]["choice"] == "small"
    for table in TABLES:
        fam = d["kernels"][table]
        assert fam["median_abs_err"] is not None and fam["cv_median_abs_err"] is not None
        assert all(f["cv_modeled"] > 0 and f["cv_ratio"] == pytest.approx(f["cv_modeled"] / f["published"])
                   for f in fam["figures"])  # fmt: skip
