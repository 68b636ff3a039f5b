"""Tile tuner: only validator + timing model, never slower than the default, rows written, second tune a lookup."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from kernel_checks import zoo_specs

from tilepilot.kernels import gemm, gemv, lm_head
from tilepilot.kernels.registry import Registry
from tilepilot.kernels.tuning import modeled_seconds, timing_key, tune
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.npu.validate import validate


def _matrix_shapes() -> list[tuple[str, object]]:
    """Every GEMM (prefill, 2048 tokens as published) and GEMV (decode) projection shape of the nine models."""
    out: dict[tuple, tuple[str, object]] = {}
    for spec in zoo_specs():
        h, q, kv, f = spec.hidden, spec.q_dim, spec.kv_dim, spec.intermediate
        for n, k in ((q, h), (kv, h), (h, q), (f, h), (h, f)):
            out.setdefault(("gemv", n, k), ("gemv", gemv.Shape(n, k)))
            out.setdefault(("gemm", n, k), ("gemm", gemm.Shape(2048, n, k)))
    return sorted(out.values(), key=lambda x: (x[0], str(x[1])))


SHAPES = _matrix_shapes()
REPORT: list[str] = []


@pytest.mark.parametrize(("fam", "shape"), SHAPES, ids=[f"{f}-{s}" for f, s in SHAPES])
def test_tuned_config_is_valid_and_never_slower_than_the_default(fam, shape):
    reg = Registry()
    budget = 24 if fam == "gemv" else 6  # GEMM designs at M=2048 are big to build; the first few are the best guesses
    res = tune(fam, shape, reg, max_candidates=budget)
    mod = gemv if fam == "gemv" else gemm
    design = mod.make_design(shape, res.config)
    assert validate(design) == []
    assert res.default_s is not None and res.modeled_s <= res.default_s
    assert res.modeled_s == pytest.approx(modeled_seconds(design))
    assert res.valid >= 1 and len(reg) == res.valid
    assert all(r.source == "tune" and r.timing_key == timing_key() for r in reg.rows())
    if res.improved:
        REPORT.append(f"{fam} {shape}: {res.default_s * 1e6:.0f} -> {res.modeled_s * 1e6:.0f} us modeled")


def test_second_tune_of_a_known_shape_is_a_registry_lookup():
    shape = gemv.Shape(2048, 8192)
    reg = Registry()
    first = tune("gemv", shape, reg, max_candidates=40)
    second = tune("gemv", shape, reg, max_candidates=40)
    assert second.from_registry and not first.from_registry
    assert second.config == first.config and second.modeled_s == first.modeled_s
    assert second.default_s == first.default_s and second.candidates == 0
    assert second.wall_s < first.wall_s / 5


def test_a_registry_timed_under_other_constants_is_not_trusted():
    shape = gemv.Shape(1024, 1024)
    reg = Registry()
    tune("gemv", shape, reg, max_candidates=10)
    slower_ddr = dataclasses.replace(CALIBRATION, ddr_bytes_per_s=CALIBRATION.ddr_bytes_per_s / 2)
    again = tune("gemv", shape, reg, cal=slower_ddr, max_candidates=10)
    assert not again.from_registry
    # the rows now carry the constants they were last timed with, and a lookup under them works
    assert {r.timing_key for r in reg.rows()} == {timing_key(slower_ddr)}
    assert tune("gemv", shape, reg, cal=slower_ddr, max_candidates=10).from_registry


def test_illegal_candidates_are_rejected_with_their_codes_and_tuning_prefers_the_fast_legal_one():
    shape = lm_head.Shape(vocab=4096, k=512)
    res = tune("lm_head", shape, Registry(), max_candidates=12)
    assert res.valid >= 1 and res.modeled_s <= res.default_s
    head = lm_head.make_design(shape, res.config)
    assert modeled_seconds(head) == pytest.approx(res.modeled_s)


def test_zz_report_where_tuning_improved():
    """Where tuning improved goes to the test log (`pytest -o log_cli=true`), not to the suite's stdout."""
    logging.getLogger(__name__).info(
        "[tuning] improved %d of %d shapes:\n  %s", len(REPORT), len(SHAPES), "\n  ".join(REPORT)
    )


def test_a_registry_tuned_under_other_kernel_code_is_not_trusted(monkeypatch):
    """A family whose code changed may offer configs the old rows never saw: its rows stop answering."""
    from tilepilot.kernels import tuning

    shape = gemv.Shape(1024, 1024)
    reg = Registry()
    tune("gemv", shape, reg, max_candidates=10)
    assert tune("gemv", shape, reg, max_candidates=10).from_registry
    before, claims_key = timing_key(), tuning.calibration_key()
    monkeypatch.setattr(tuning, "_code_digest", lambda: "kernel code of another revision")
    assert timing_key() != before
    # performance claims stay tied to the constants alone, so the evaluator still checks them strictly
    assert tuning.calibration_key() == claims_key
    assert not tune("gemv", shape, reg, max_candidates=10).from_registry
