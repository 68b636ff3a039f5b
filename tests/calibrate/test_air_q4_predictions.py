"""AIR's Q4NX Llama-3.2-1B figures are shown by `calibrate` beside the air-q4 plan's modeled ones, as predictions."""

from __future__ import annotations

from tilepilot.calibrate.air_q4 import AIR_Q4NX, PROFILE_CONTEXT, STAIRCASE_CONTEXT, air_q4_figures
from tilepilot.calibrate.harness import CalibrationReport


def test_air_q4nx_figures_are_timed_on_the_air_q4_variants_and_never_checked():
    figs = air_q4_figures()
    assert [f.key for f in figs] == [k for k, *_ in AIR_Q4NX]
    assert all(not f.checked and f.note.startswith("prediction (not in the fit)") for f in figs)
    assert all(f.label.endswith("(prediction)") for f in figs)  # what the calibrate table shows
    assert all(f.modeled and f.modeled > 0 for f in figs)
    by = {f.key: f for f in figs}
    assert by["air_q4/prefill"].published == 0.93
    assert abs(by["air_q4/decode_2ch_windowed"].published - 1 / 58.6) < 1e-12  # seconds per token
    # the variants are different plans: the windowed readback moves fewer KV bytes at the modeled context
    assert by["air_q4/decode_2ch_windowed"].modeled < by["air_q4/decode_2ch_padded"].modeled
    # each at the context it was measured at: make profile's short prompt, the staircase's 300 tokens from empty
    assert f"context {PROFILE_CONTEXT}" in by["air_q4/decode_1ch"].note
    assert f"context {STAIRCASE_CONTEXT}" in by["air_q4/decode_2ch_windowed"].note
    # predictions never fail a calibration run, however far off they are
    report = CalibrationReport(kernels={}, end_to_end=figs)
    assert report.failures() == []
