"""The failure-signature classifier on synthetic evidence: each signature, precedence, and no match."""

from __future__ import annotations

import pytest

from tilepilot.skills import classify as C

GOOD = 0.9995


@pytest.mark.parametrize(
    ("evidence", "signature"),
    [
        ({"validator_codes": ["L1_OVERFLOW"]}, C.TILE_MEMORY_OVERFLOW),
        ({"validator_codes": ["GROUP_BINDING"]}, C.MERGED_LAUNCH_ARGUMENT_MISMATCH),
        ({"nonfinite": 12, "layer_cosine": [float("nan")] * 2}, C.NAN_INF),
        ({"call_cosine": [GOOD, 0.42]}, C.STALE_AFTER_FIRST_CALL),
        ({"partition_cosine": [GOOD, GOOD, 0.748, GOOD]}, C.ONE_PARTITION_WRONG),
        ({"rope_position_cosine": [1.0, 0.3, 0.2, 0.1]}, C.ROPE_LAYOUT_MISMATCH),
        ({"position_cosine": [GOOD] * 8 + [0.9] * 8}, C.LATE_POSITIONS_ONLY),
        ({"rope_position_cosine": [1.0] * 8 + [GOOD, 0.95] * 4}, C.LATE_POSITIONS_ONLY),  # bf16 RoPE angles
        ({"layer_cosine": [0.999, 0.99, 0.97, 0.93]}, C.ERROR_GROWS_WITH_DEPTH),
        # a trained model: whole-output cosine held up by its massive activations, the lowest token cosine falls
        (
            {
                "layer_cosine": [0.9971, 0.9959, 0.9984, 0.9979],
                "layer_position_cosine": [0.9956, 0.9917, 0.9877, 0.981],
            },
            C.ERROR_GROWS_WITH_DEPTH,
        ),
        (
            {
                "layer_position_cosine": [1.0, 1.0, 1.0, 0.89],  # a cliff also falls "steadily": rows rule first
                "massive_row_cosine": [
                    {"call": "prefill/attn_norm", "rows": [0], "massive_min": 0.0, "others_min": GOOD}
                ],
            },
            C.MASSIVE_ACTIVATION_ROWS,
        ),
    ],
)
def test_each_signature(evidence, signature):
    d = C.classify(evidence)
    assert d.signature == signature and d.reasons


def test_precedence_validator_then_nan_then_stale():
    ev = {
        "validator_codes": ["L1_OVERFLOW"],
        "nonfinite": 3,
        "call_cosine": [GOOD, 0.1],
        "layer_cosine": [0.999, 0.5],
    }
    assert C.classify(ev).signature == C.TILE_MEMORY_OVERFLOW
    ev.pop("validator_codes")
    assert C.classify(ev).signature == C.NAN_INF
    ev.pop("nonfinite")
    assert C.classify(ev).signature == C.STALE_AFTER_FIRST_CALL


@pytest.mark.parametrize(
    "evidence",
    [
        {},
        {"layer_cosine": [0.5, 0.5, 0.5]},  # wrong from the first layer: not growth with depth
        {"partition_cosine": [0.5, 0.5, 0.5, 0.5]},  # every partition wrong: not one partition
        {"position_cosine": [0.5] * 16},  # wrong from position 0
        {"position_cosine": [GOOD] * 15 + [0.98]},  # a single outlier position: not a positional fault
        {"call_cosine": [0.5, 0.5]},  # first call already wrong: not staleness
        {"rope_position_cosine": [1.0, GOOD, GOOD]},  # RoPE fine
        {"validator_codes": ["TAP_LIMIT"]},  # a validator error no skill repairs
        # a call wrong on every row, massive or not: not a massive-activation fault
        {"massive_row_cosine": [{"call": "prefill/ffn_norm", "rows": [0], "massive_min": 0.0, "others_min": 0.0}]},
        {"massive_row_cosine": [{"call": "prefill/resid1", "rows": [0], "massive_min": GOOD, "others_min": GOOD}]},
        {"layer_position_cosine": [0.98, 0.97, 0.96]},  # lowest token already wrong at layer 0
    ],
)
def test_unmatched(evidence):
    d = C.classify(evidence)
    assert d.signature is None and not d.matched


def test_every_signature_has_exactly_one_debug_skill():
    from tilepilot.skills import registry

    sigs = [d.signature for d in registry.debuggers()]
    assert sorted(sigs) == sorted(C.SIGNATURES)
