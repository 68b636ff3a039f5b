"""Gates: named thresholds over measurements, and the JSON report a phase writes.

A gate passes only if every threshold holds on a measured, finite value. A threshold whose metric
was not measured fails (a gate never passes by omission), and so does a NaN. Reports keep every
measurement, every threshold with its source and one sentence per failure, so a reader (or the
independent evaluator) can re-check the verdict and see whether a threshold was loosened.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilepilot.errors import InputError
from tilepilot.files import write_text_atomic

Measurement = float | int | bool

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,  # for "strictly lower/higher than before" (phases 4-5)
    "<": operator.lt,
}


def _upper(op: str) -> bool:
    """Whether ``op`` bounds from above (``<=``, ``<``) rather than from below."""
    return op.startswith("<")


def _fmt(x: float) -> str:
    return f"{x:.6g}"


@dataclass(frozen=True)
class Threshold:
    """``metric op value``, with ``source`` naming where the bound comes from."""

    metric: str
    op: str
    value: float
    source: str

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise InputError(f"threshold operator {self.op!r} is not one of {', '.join(_OPS)}")
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)) or not math.isfinite(self.value):
            raise InputError(f"threshold on {self.metric} needs a finite number as its bound, got {self.value!r}")
        if not self.source:
            raise InputError(f"threshold on {self.metric} has no source; every bound must say where it comes from")

    def describe(self) -> str:
        return f"{self.metric} {self.op} {_fmt(self.value)}"

    def failure(self, measured: Any) -> str | None:
        """One sentence saying why ``measured`` violates this threshold, or None if it holds."""
        rule = f"{self.describe()} ({self.source})"
        if measured is None:
            return f"{self.metric} was not measured, so {rule} cannot be shown to hold"
        if isinstance(measured, bool):
            measured = float(measured)
        if not isinstance(measured, (int, float)):
            return f"{self.metric} is {measured!r}, not a number, so {rule} fails"
        if math.isnan(measured):
            return f"{self.metric} is NaN (non-finite values in the compared data), so {rule} fails"
        if not _OPS[self.op](float(measured), float(self.value)):
            return f"{self.metric} = {_fmt(measured)} violates {rule}"
        return None

    def at_least_as_strict_as(self, other: Threshold) -> bool:
        """True if every value passing ``self`` also passes ``other`` (same metric and direction)."""
        if self.metric != other.metric:
            return False
        if other.op in (">=", ">"):
            if self.op not in (">=", ">"):
                return False
            return self.value > other.value or (self.value == other.value and (self.op == ">" or other.op == ">="))
        if self.op not in ("<=", "<"):
            return False
        return self.value < other.value or (self.value == other.value and (self.op == "<" or other.op == "<="))

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "op": self.op, "value": self.value, "source": self.source}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Threshold:
        return cls(metric=d["metric"], op=d["op"], value=d["value"], source=d["source"])


# ---- JSON with non-finite numbers -----------------------------------------------------------
# Strict JSON has no NaN/Infinity; such values are written as these strings and read back.
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _encode(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    if isinstance(x, Mapping):
        return {str(k): _encode(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_encode(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # numpy / torch scalars
        return _encode(x.item())
    return x


def _decode(x: Any) -> Any:
    if isinstance(x, str) and x in _NONFINITE:
        return _NONFINITE[x]
    if isinstance(x, dict):
        return {k: _decode(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_decode(v) for v in x]
    return x


@dataclass
class GateReport:
    """The verdict of one gate with everything needed to re-check it."""

    name: str
    passed: bool
    measurements: dict[str, Measurement]
    thresholds: list[Threshold]
    failures: list[str]
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"

    def summary(self) -> str:
        """One line for logs and the journal."""
        if self.passed:
            return f"gate {self.name}: PASS ({len(self.thresholds)} thresholds hold)"
        return f"gate {self.name}: FAIL ({len(self.failures)} of {len(self.thresholds)}): " + "; ".join(self.failures)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "passed": self.passed,
            "measurements": _encode(self.measurements),
            "thresholds": [t.to_dict() for t in self.thresholds],
            "failures": list(self.failures),
            "details": _encode(self.details),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GateReport:
        try:
            return cls(
                name=d["name"],
                passed=bool(d["passed"]),
                measurements=_decode(dict(d["measurements"])),
                thresholds=[Threshold.from_dict(t) for t in d["thresholds"]],
                failures=list(d["failures"]),
                details=_decode(dict(d.get("details", {}))),
            )
        except (KeyError, TypeError) as e:
            raise InputError(f"gate report is missing or has a malformed field ({e}); regenerate it") from None

    @classmethod
    def from_json(cls, text: str) -> GateReport:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"gate report is not valid JSON ({e.msg} at line {e.lineno}); regenerate it") from None
        if not isinstance(d, dict):
            raise InputError("gate report JSON must be an object; regenerate it")
        return cls.from_dict(d)

    def write(self, path: str | Path) -> Path:
        """Write the report as JSON atomically (never a half-written file)."""
        return write_text_atomic(path, self.to_json() + "\n")

    @classmethod
    def read(cls, path: str | Path) -> GateReport:
        p = Path(path)
        if not p.is_file():
            raise InputError(f"gate report {p} does not exist; run the phase that writes it")
        return cls.from_json(p.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Gate:
    """A named set of thresholds; ``evaluate`` turns measurements into a ``GateReport``."""

    name: str
    thresholds: tuple[Threshold, ...]

    def __init__(self, name: str, thresholds: Iterable[Threshold]):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "thresholds", tuple(thresholds))
        if not self.thresholds:
            raise InputError(f"gate {name} has no thresholds; a gate must check something")

    def evaluate(self, measurements: Mapping[str, Measurement], details: Mapping[str, Any] | None = None) -> GateReport:
        """Check every threshold; extra measurements are recorded, missing ones fail."""
        failures = [f for t in self.thresholds if (f := t.failure(measurements.get(t.metric))) is not None]
        return GateReport(
            name=self.name,
            passed=not failures,
            measurements=dict(measurements),
            thresholds=list(self.thresholds),
            failures=failures,
            details=dict(details or {}),
        )

    def audit(self, report: GateReport) -> list[str]:
        """Problems with a report claimed for this gate: missing or loosened thresholds, or a verdict
        its own measurements do not support. Empty means the report is consistent with this gate.
        """
        problems: list[str] = []
        if report.name != self.name:
            problems.append(f"report is for gate {report.name!r}, not {self.name!r}")
        for want in self.thresholds:
            same = [t for t in report.thresholds if t.metric == want.metric and _upper(t.op) == _upper(want.op)]
            if not same:
                problems.append(f"report lacks the threshold {want.describe()} ({want.source})")
            elif not any(t.at_least_as_strict_as(want) for t in same):
                looser = ", ".join(t.describe() for t in same)
                problems.append(f"report uses {looser}, looser than the required {want.describe()} ({want.source})")
        recheck = self.evaluate(report.measurements)
        if report.passed and not recheck.passed:
            problems.append("report says PASS but its own measurements fail: " + "; ".join(recheck.failures))
        return problems
