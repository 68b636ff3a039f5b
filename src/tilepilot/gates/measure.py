"""Turn a reference run and a test run of a whole model into the measurements the gates name.

Phases 0 and 3 (and the evaluator) compare the same things: final logits, each layer's output and
the greedy continuation. Doing it here once keeps their measurement names and definitions equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tilepilot.errors import InputError
from tilepilot.gates import thresholds as th
from tilepilot.gates.metrics import TokenSetCheck, compare, cosine, layer_cosine_profile, nonfinite_count, prefixed


def measure_model(
    ref_logits: Any,
    test_logits: Any,
    *,
    ref_layers: Sequence[Any] = (),
    test_layers: Sequence[Any] = (),
    token_check: TokenSetCheck | None = None,
) -> tuple[dict[str, float | bool], dict[str, Any]]:
    """Measurements (flat, gate-ready) and details (per-layer cosines, the token check) of one model run.

    ``ref_layers``/``test_layers`` are the per-layer outputs (capture ``layer{i}.out``) in layer order.
    """
    if len(ref_layers) != len(test_layers):
        raise InputError(
            f"{len(ref_layers)} reference layer outputs but {len(test_layers)} test ones; capture the same layers"
        )
    m: dict[str, float | bool] = dict(prefixed("logits", compare(ref_logits, test_logits, logits=True)))
    details: dict[str, Any] = {}
    nonfinite = int(m.pop("logits.nonfinite"))
    if ref_layers:
        cosines = [cosine(r, t) for r, t in zip(ref_layers, test_layers, strict=True)]
        profile = layer_cosine_profile(cosines)
        m[th.LAYERS_MIN_COSINE] = profile["min_cosine"]
        m[th.LAYERS_MAX_DROP] = profile["max_drop"]
        details["layer_cosines"] = cosines
        nonfinite += sum(nonfinite_count(r) + nonfinite_count(t) for r, t in zip(ref_layers, test_layers, strict=True))
    if token_check is not None:
        m[th.GREEDY_IDENTICAL] = token_check.identical
        m[th.GREEDY_TOKEN_SET] = token_check.passed
        details["token_check"] = token_check.to_dict()
    m[th.NONFINITE] = float(nonfinite)
    return m, details
