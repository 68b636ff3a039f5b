"""Each metric on cases whose value can be worked out by hand, plus NaN/Inf and dtype handling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tilepilot.errors import InputError
from tilepilot.gates.metrics import (
    compare,
    cosine,
    greedy_token_set_check,
    kl_divergence,
    layer_cosine_profile,
    max_abs_err,
    max_rel_err,
    mean_rel_err,
    min_position_cosine,
    nonfinite_count,
    pearson,
    per_position_cosine,
    top1_agreement,
    topk_agreement,
)


@pytest.fixture(autouse=True)
def _seed():
    """Deterministic random inputs for every test in this file."""
    torch.manual_seed(0)


ALL_PAIR_METRICS = [max_abs_err, max_rel_err, mean_rel_err, pearson, cosine, min_position_cosine, kl_divergence]


def test_error_metrics_by_hand():
    ref, test = [1.0, -2.0, 3.0], [1.0, -2.0, 3.5]
    assert max_abs_err(ref, test) == pytest.approx(0.5)
    assert max_rel_err(ref, test) == pytest.approx(0.5 / 3.0)
    assert mean_rel_err(ref, test) == pytest.approx((0.5 / 3) / (6.0 / 3))
    assert max_rel_err([0.0, 0.0], [0.0, 0.0]) == 0.0
    assert max_rel_err([0.0, 0.0], [0.0, 1.0]) == math.inf


def test_cosine_by_hand():
    assert cosine([1.0, 0.0], [0.0, 1.0]) == pytest.approx(0.0)
    assert cosine([1.0, 2.0], [2.0, 4.0]) == pytest.approx(1.0)
    assert cosine([1.0, 2.0], [-1.0, -2.0]) == pytest.approx(-1.0)
    assert cosine([1.0, 0.0], [1.0, 1.0]) == pytest.approx(1 / math.sqrt(2))
    assert cosine([0.0, 0.0], [0.0, 0.0]) == 1.0
    assert cosine([0.0, 0.0], [1.0, 0.0]) == 0.0


def test_pearson_by_hand():
    x = torch.linspace(-3, 5, 101)
    assert pearson(x, 3 * x + 2) == pytest.approx(1.0, abs=1e-12)
    assert pearson(x, -2 * x + 1) == pytest.approx(-1.0, abs=1e-12)
    # x = [1, 2, 3], y = [1, 3, 2]: centered (-1, 0, 1) . (-1, 1, 0) = 1, norms sqrt(2) each -> 0.5
    assert pearson([1.0, 2.0, 3.0], [1.0, 3.0, 2.0]) == pytest.approx(0.5)
    assert pearson([2.0, 2.0], [2.0, 2.0]) == 1.0
    assert pearson([1.0, 2.0], [2.0, 2.0]) == 0.0  # constant output where the reference varies


def test_per_position_cosine_rows():
    ref = torch.tensor([[1.0, 0.0], [0.0, 1.0], [3.0, 4.0]])
    test = torch.tensor([[2.0, 0.0], [1.0, 0.0], [3.0, 4.0]])
    assert per_position_cosine(ref, test).tolist() == pytest.approx([1.0, 0.0, 1.0])
    assert min_position_cosine(ref, test) == pytest.approx(0.0)
    # leading dims are flattened into positions
    assert per_position_cosine(ref.reshape(1, 3, 2), test.reshape(1, 3, 2)).shape == (3,)


def test_topk_and_top1_agreement_by_hand():
    ref = torch.tensor([[5.0, 4, 3, 2, 1, 0]])
    test = torch.tensor([[0.0, 1, 2, 3, 4, 5]])
    assert topk_agreement(ref, test, k=3) == 0.0  # {0,1,2} vs {3,4,5}
    assert topk_agreement(ref, test, k=4) == 0.5  # {0,1,2,3} vs {2,3,4,5}
    assert topk_agreement(ref, ref, k=5) == 1.0
    two = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert top1_agreement(two, torch.tensor([[1.0, 0.0], [1.0, 0.0]])) == 0.5


def test_kl_divergence_by_hand():
    logits = torch.randn(4, 10)
    assert kl_divergence(logits, logits) == 0.0
    assert kl_divergence(logits, logits + 7.0) == pytest.approx(0.0, abs=1e-12)  # softmax is shift-invariant
    p, q = torch.tensor([[0.5, 0.5]]), torch.tensor([[0.9, 0.1]])
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)  # 0.5108
    assert kl_divergence(p.log(), q.log()) == pytest.approx(expected, rel=1e-6)
    # mean over rows: a second, identical row halves it
    assert kl_divergence(torch.cat([p, p]).log(), torch.cat([q, p]).log()) == pytest.approx(expected / 2, rel=1e-6)


def test_low_precision_and_numpy_inputs_are_upcast():
    x = torch.randn(64, 32)
    assert cosine(x.to(torch.bfloat16), x) > 0.9999
    assert isinstance(cosine(x.numpy(), x.half()), float)
    assert pearson(np.arange(10.0), np.arange(10.0) * 2) == pytest.approx(1.0)


def test_cosine_is_accurate_on_vocabulary_sized_tensors():
    """FP32 dot products drift by ~1e-4 at this size; the metrics accumulate in FP64."""
    x = torch.randn(2_000_000) + 3.0
    assert abs(cosine(x, x) - 1.0) < 1e-9
    assert abs(pearson(x, x) - 1.0) < 1e-9
    assert abs(float(per_position_cosine(x.reshape(8, -1), x.reshape(8, -1)).min()) - 1.0) < 1e-9


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("side", ["ref", "test"])
def test_nonfinite_makes_every_metric_nan(bad, side):
    ref = torch.randn(4, 8)
    test = ref.clone()
    (ref if side == "ref" else test)[2, 3] = bad
    for metric in ALL_PAIR_METRICS:
        assert math.isnan(metric(ref, test)), metric.__name__
    assert math.isnan(topk_agreement(ref, test)) and math.isnan(top1_agreement(ref, test))
    rows = per_position_cosine(ref, test)
    assert math.isnan(float(rows[2])) and bool(torch.isfinite(rows[[0, 1, 3]]).all())
    assert nonfinite_count(ref) + nonfinite_count(test) == 1
    assert compare(ref, test, logits=True)["nonfinite"] == 1.0


def test_shape_mismatch_is_an_input_error():
    with pytest.raises(InputError, match="shape"):
        cosine(torch.zeros(3), torch.zeros(4))


def test_compare_standard_set():
    ref = torch.randn(6, 50)
    m = compare(ref, ref + 1e-3 * torch.randn(6, 50), logits=True)
    assert set(m) == {
        "max_abs_err",
        "max_rel_err",
        "mean_rel_err",
        "pearson",
        "cosine",
        "min_position_cosine",
        "nonfinite",
        "top1_agreement",
        "top5_agreement",
        "kl_divergence",
    }
    assert m["cosine"] > 0.9999 and m["nonfinite"] == 0.0 and m["max_abs_err"] > 0


# ---- greedy token-set check ---------------------------------------------------------------------
def _topk(tokens: list[int], extra: dict[int, list[int]] | None = None) -> list[list[int]]:
    """Top-5 lists whose first entry is the chosen token; ``extra`` overrides a step."""
    out = [[t, 900, 901, 902, 903] for t in tokens]
    for i, ids in (extra or {}).items():
        out[i] = ids
    return out


def test_token_check_identical():
    toks = [5, 6, 7, 8]
    r = greedy_token_set_check(toks, toks, _topk(toks), _topk(toks))
    assert r.passed and r.identical and r.divergence_index is None and r.n_compared == 4


def test_token_check_divergence_within_top5_passes_and_stops_comparing():
    ref = [5, 6, 7, 8, 9]
    test = [5, 6, 42, 1, 2]  # diverges at step 2; later steps differ freely
    ref_top = _topk(ref, {2: [7, 42, 1, 2, 3]})
    test_top = _topk(test, {2: [42, 7, 1, 2, 3]})
    r = greedy_token_set_check(ref, test, ref_top, test_top)
    assert r.passed and not r.identical
    assert (r.divergence_index, r.ref_token, r.test_token) == (2, 7, 42)


def test_token_check_swap_outside_top5_fails():
    ref = [5, 6, 7, 8]
    test = [5, 6, 300, 8]
    r = greedy_token_set_check(ref, test, _topk(ref), _topk(test))
    assert not r.passed and r.divergence_index == 2
    assert "reference or test top-5" in r.message


def test_token_check_one_sided_membership_fails():
    ref, test = [1, 2], [1, 3]
    ref_top = _topk(ref, {1: [2, 3, 9, 9, 9]})  # test's token is in ref's top-5
    test_top = _topk(test, {1: [3, 8, 9, 9, 9]})  # but ref's token is not in test's
    r = greedy_token_set_check(ref, test, ref_top, test_top)
    assert not r.passed and "test top-5" in r.message


def test_token_check_length_mismatch_fails_and_missing_topk_raises():
    r = greedy_token_set_check([1, 2, 3], [1, 2], _topk([1, 2, 3]), _topk([1, 2]))
    assert not r.passed and r.divergence_index is None
    with pytest.raises(InputError, match="top-5"):
        greedy_token_set_check([1, 2], [1, 3], [[1]], [[1]])


def test_layer_cosine_profile():
    p = layer_cosine_profile([0.99, 0.98, 0.90, 0.95])
    assert p["min_cosine"] == pytest.approx(0.90) and p["max_drop"] == pytest.approx(0.08)
    assert layer_cosine_profile([0.9, 0.95])["max_drop"] == 0.0
    assert math.isnan(layer_cosine_profile([0.99, float("nan")])["min_cosine"])
