"""Gate evaluation, failure sentences, JSON reports (atomic writes) and the audit against loosening."""

from __future__ import annotations

import json
import math

import pytest

from tilepilot.errors import InputError
from tilepilot.gates.gate import Gate, GateReport, Threshold

SRC = "test source"


def _gate() -> Gate:
    return Gate(
        "demo",
        [
            Threshold("cosine", ">=", 0.99, SRC),
            Threshold("max_rel_err", "<=", 1e-3, SRC),
            Threshold("token_ok", ">=", 1, SRC),
        ],
    )


def test_passing_measurements_pass_and_extras_are_recorded():
    r = _gate().evaluate({"cosine": 0.995, "max_rel_err": 5e-4, "token_ok": True, "kl": 0.01})
    assert r.passed and r.verdict == "PASS" and r.failures == []
    assert r.measurements["kl"] == 0.01


def test_failure_sentence_names_metric_value_and_bound():
    r = _gate().evaluate({"cosine": 0.9, "max_rel_err": 5e-4, "token_ok": True})
    assert not r.passed and len(r.failures) == 1
    assert "cosine = 0.9 violates cosine >= 0.99 (test source)" == r.failures[0]


def test_missing_measurement_fails():
    r = _gate().evaluate({"cosine": 0.999, "token_ok": True})
    assert not r.passed
    assert r.failures == ["max_rel_err was not measured, so max_rel_err <= 0.001 (test source) cannot be shown to hold"]


@pytest.mark.parametrize("metric", ["cosine", "max_rel_err"])
def test_nan_measurement_fails_both_directions(metric):
    m = {"cosine": 0.999, "max_rel_err": 1e-4, "token_ok": True, metric: math.nan}
    r = _gate().evaluate(m)
    assert not r.passed and "NaN" in r.failures[0] and metric in r.failures[0]


def test_bool_and_non_numeric_measurements():
    assert not _gate().evaluate({"cosine": 1.0, "max_rel_err": 0.0, "token_ok": False}).passed
    r = _gate().evaluate({"cosine": "high", "max_rel_err": 0.0, "token_ok": True})
    assert not r.passed and "not a number" in r.failures[0]


def test_strict_operators():
    g = Gate("t", [Threshold("ms", "<", 10.0, SRC)])
    assert g.evaluate({"ms": 9.99}).passed
    assert not g.evaluate({"ms": 10.0}).passed


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(metric="x", op="==", value=1.0, source=SRC),
        dict(metric="x", op=">=", value=math.nan, source=SRC),
        dict(metric="x", op=">=", value=math.inf, source=SRC),
        dict(metric="x", op=">=", value=1.0, source=""),
    ],
)
def test_bad_thresholds_are_refused(kwargs):
    with pytest.raises(InputError):
        Threshold(**kwargs)


def test_empty_gate_is_refused():
    with pytest.raises(InputError):
        Gate("nothing", [])


def test_json_roundtrip_is_strict_json_with_nonfinite_values():
    r = _gate().evaluate({"cosine": math.nan, "max_rel_err": math.inf, "token_ok": True}, details={"layers": [1.0]})
    text = r.to_json()

    def refuse(c):
        raise AssertionError(f"non-standard JSON constant {c}")

    d = json.loads(text, parse_constant=refuse)
    assert d["verdict"] == "FAIL" and d["measurements"]["cosine"] == "NaN"
    back = GateReport.from_json(text)
    assert math.isnan(back.measurements["cosine"]) and back.measurements["max_rel_err"] == math.inf
    assert back.thresholds == r.thresholds and back.failures == r.failures and back.details == {"layers": [1.0]}
    assert back.passed is False


def test_write_is_atomic(tmp_path):
    path = tmp_path / "gates" / "phase.json"
    good = _gate().evaluate({"cosine": 1.0, "max_rel_err": 0.0, "token_ok": True})
    good.write(path)
    assert GateReport.read(path).passed
    bad = _gate().evaluate({"cosine": 1.0, "max_rel_err": 0.0, "token_ok": True}, details={"x": object()})
    with pytest.raises(TypeError):
        bad.write(path)
    assert GateReport.read(path).passed  # the earlier file is intact
    assert [p.name for p in path.parent.iterdir()] == ["phase.json"]  # no temp file left behind


def test_malformed_report_json_is_an_input_error(tmp_path):
    with pytest.raises(InputError):
        GateReport.from_json("{not json")
    with pytest.raises(InputError):
        GateReport.from_json('{"name": "x"}')
    with pytest.raises(InputError):
        GateReport.read(tmp_path / "missing.json")


def test_strictness_order():
    base = Threshold("c", ">=", 0.99, SRC)
    assert Threshold("c", ">=", 0.995, SRC).at_least_as_strict_as(base)
    assert Threshold("c", ">", 0.99, SRC).at_least_as_strict_as(base)
    assert not Threshold("c", ">=", 0.95, SRC).at_least_as_strict_as(base)
    assert not Threshold("c", "<=", 0.99, SRC).at_least_as_strict_as(base)
    upper = Threshold("e", "<=", 1e-4, SRC)
    assert Threshold("e", "<", 1e-5, SRC).at_least_as_strict_as(upper)
    assert not Threshold("e", "<=", 1e-3, SRC).at_least_as_strict_as(upper)


def test_audit_detects_loosened_thresholds_and_forged_verdicts():
    gate = _gate()
    honest = gate.evaluate({"cosine": 0.995, "max_rel_err": 1e-4, "token_ok": True})
    assert gate.audit(honest) == []

    loose_gate = Gate("demo", [Threshold("cosine", ">=", 0.9, SRC), *gate.thresholds[1:]])
    loosened = loose_gate.evaluate({"cosine": 0.95, "max_rel_err": 1e-4, "token_ok": True})
    assert loosened.passed
    problems = gate.audit(loosened)
    assert any("looser than the required cosine >= 0.99" in p for p in problems)
    assert any("report says PASS but its own measurements fail" in p for p in problems)

    dropped = Gate("demo", gate.thresholds[:2]).evaluate({"cosine": 0.995, "max_rel_err": 1e-4})
    assert any("lacks the threshold token_ok >= 1" in p for p in gate.audit(dropped))

    forged = GateReport.from_dict({**honest.to_dict(), "passed": True, "measurements": {"cosine": 0.5}})
    assert any("report says PASS" in p for p in gate.audit(forged))
