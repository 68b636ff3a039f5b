"""Numerical gates: metrics between reference and test tensors, thresholds per phase, JSON reports."""

from tilepilot.gates.gate import Gate, GateReport, Threshold
from tilepilot.gates.measure import measure_model
from tilepilot.gates.metrics import TokenSetCheck, compare, greedy_token_set_check

__all__ = ["Gate", "GateReport", "Threshold", "TokenSetCheck", "compare", "greedy_token_set_check", "measure_model"]
