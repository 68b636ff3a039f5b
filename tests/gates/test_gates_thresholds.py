"""Phase gates: the bounds of DESIGN.md / xdna2.md, and gates failing on perturbed inputs."""

from __future__ import annotations

import pytest
import torch

from tilepilot.gates import thresholds as th
from tilepilot.gates.measure import measure_model
from tilepilot.gates.metrics import compare, greedy_token_set_check, prefixed


def _logits(rows: int = 8, vocab: int = 256, seed: int = 0) -> torch.Tensor:
    return 4.0 * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))


def _layers(n: int = 4, seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(8, 64, generator=gen) for _ in range(n)]


def _randn(*shape: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _greedy(logits: torch.Tensor) -> tuple[list[int], list[list[int]]]:
    return logits.argmax(-1).tolist(), logits.topk(5, dim=-1).indices.tolist()


def _noise(x: torch.Tensor, rel: float, seed: int = 7) -> torch.Tensor:
    return x + rel * x.abs().max() * torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))


def _phase3_measurements(ref_logits, test_logits, ref_layers, test_layers, test_tokens=None):
    rt, rk = _greedy(ref_logits)
    tt, tk = _greedy(test_logits)
    if test_tokens is not None:
        tt = test_tokens
    check = greedy_token_set_check(rt, tt, rk, tk)
    return measure_model(ref_logits, test_logits, ref_layers=ref_layers, test_layers=test_layers, token_check=check)


def test_published_bounds():
    assert [th.per_position_min_cosine(d) for d in (32, 64, 96, 128, 200, 256, 512)] == [
        0.99,
        0.99,
        0.98,
        0.98,
        0.98,
        0.97,
        0.97,
    ]
    assert th.min_correlation("GEMM") == th.min_correlation("gemv") == th.min_correlation("lm_head") == 0.999
    assert th.min_correlation("rmsnorm") == th.min_correlation("attention") == 0.99
    assert th.PHASE0_LOGITS_MAX_REL_ERR == 1e-4
    assert (th.PHASE3_LAYER_COSINE, th.PHASE3_MAX_LAYER_DROP, th.PAPER_PHASE3_LOGITS_COSINE) == (0.85, 0.05, 0.95)
    assert th.PHASE3_LOGITS_COSINE >= th.PAPER_PHASE3_LOGITS_COSINE  # never looser than the paper


def test_every_gate_threshold_has_a_source_and_a_nonfinite_check():
    gates = [
        th.phase0_gate(),
        th.phase1_gate("gemm"),
        th.phase2_gate(64),
        th.phase3_gate(),
        th.phase4_gate(100.0),
        th.phase5_gate(10.0),
    ]
    for gate in gates:
        assert all(t.source for t in gate.thresholds)
        assert any(t.metric == th.NONFINITE for t in gate.thresholds), gate.name
    assert th.phase3_gate(th.PAPER_PHASE3_LOGITS_COSINE).thresholds[0].value == 0.95


def test_phase0_passes_on_exact_match_and_fails_on_small_noise():
    ref, layers = _logits(), _layers()
    m, details = _phase3_measurements(ref, ref.clone(), layers, [x.clone() for x in layers])
    assert th.phase0_gate().evaluate(m, details).passed
    noisy = _noise(ref, 1e-3)
    m, _ = _phase3_measurements(ref, noisy, layers, layers)
    report = th.phase0_gate().evaluate(m)
    assert not report.passed
    assert any(f.startswith("logits.max_rel_err") for f in report.failures)


def test_phase1_pearson_by_kernel_family():
    ref = _randn(64, 64)
    slightly = _noise(ref, 0.02)  # pearson ~0.997: fine for RMSNorm, not for GEMM
    m = {**compare(ref, slightly), th.TILE_VS_FAST: 0.0}
    assert 0.99 < m["pearson"] < 0.999
    assert th.phase1_gate("rmsnorm").evaluate(m).passed
    assert not th.phase1_gate("gemm").evaluate(m).passed
    assert not th.phase1_gate("rmsnorm").evaluate({**m, th.TILE_VS_FAST: 1e-7}).passed
    assert not th.phase1_gate("rmsnorm").evaluate(compare(ref, slightly)).passed  # tile path not measured


def test_phase2_per_position_bound_catches_one_bad_position():
    ref = _randn(64, 128)
    test = ref.clone()
    test[-1] = _randn(128, seed=4)  # one late position wrong: whole-tensor cosine still ~0.985+
    m = compare(ref, test)
    report = th.phase2_gate(head_dim=64).evaluate(m)
    assert not report.passed
    assert any(f.startswith("min_position_cosine") for f in report.failures)
    assert th.phase2_gate(head_dim=64).evaluate(compare(ref, _noise(ref, 1e-3))).passed


def test_phase2_nan_fails():
    ref = _randn(16, 64)
    test = ref.clone()
    test[3, 5] = float("nan")
    report = th.phase2_gate(128).evaluate(compare(ref, test))
    assert not report.passed and len(report.failures) == 3  # cosine NaN, per-position NaN, nonfinite


def test_phase3_passes_bf16_like_noise():
    ref, layers = _logits(), _layers()
    test_layers = [_noise(x, 4e-3, seed=i) for i, x in enumerate(layers)]
    m, details = _phase3_measurements(ref, _noise(ref, 1e-3), layers, test_layers)
    report = th.phase3_gate().evaluate(m, details)
    assert report.passed, report.failures
    assert len(report.details["layer_cosines"]) == 4


@pytest.mark.parametrize(
    "fault, failing_metric",
    [
        ("logit_noise", th.LOGITS_COSINE),
        ("layer_cliff", th.LAYERS_MAX_DROP),
        ("token_swap", th.GREEDY_TOKEN_SET),
        ("nan", th.NONFINITE),
    ],
)
def test_phase3_fails_on_perturbed_inputs(fault, failing_metric):
    ref, layers = _logits(), _layers()
    test, test_layers, tokens = ref.clone(), [x.clone() for x in layers], None
    if fault == "logit_noise":
        test = _noise(ref, 0.5)
    elif fault == "layer_cliff":
        test_layers[2] = _noise(layers[2], 0.15)
    elif fault == "token_swap":
        tokens = ref.argmax(-1).tolist()
        tokens[3] = int(ref[3].argmin())  # a token outside the reference top-5
    elif fault == "nan":
        test_layers[1][0, 0] = float("nan")
    m, details = _phase3_measurements(ref, test, layers, test_layers, tokens)
    report = th.phase3_gate().evaluate(m, details)
    assert not report.passed
    assert any(f.startswith(failing_metric) for f in report.failures), report.failures


def test_phase4_requires_strictly_lower_time():
    ref, layers = _logits(), _layers()
    m, _ = _phase3_measurements(ref, ref.clone(), layers, layers)
    gate = th.phase4_gate(ttft_before_ms=1200.0)
    assert gate.evaluate({**m, th.TTFT_MODELED_MS: 1100.0}).passed
    assert not gate.evaluate({**m, th.TTFT_MODELED_MS: 1200.0}).passed
    assert not gate.evaluate(m).passed  # time not measured


def test_prefixed_names_match_gate_metrics():
    m = prefixed("logits", compare(_logits(), _logits(), logits=True))
    assert th.LOGITS_COSINE in m and th.LOGITS_TOP1 in m
