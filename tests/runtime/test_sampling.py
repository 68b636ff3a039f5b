from __future__ import annotations

import pytest
import torch

from tilepilot.errors import InputError
from tilepilot.runtime.sampling import Sampler, SamplingParams


def test_greedy_is_argmax():
    logits = torch.tensor([0.1, 3.0, -1.0, 2.9])
    assert Sampler(SamplingParams()).sample(logits) == 1


def test_top_k_and_top_p_filter_the_distribution():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = Sampler(SamplingParams(temperature=1.0, top_k=2)).probs(logits)
    assert torch.allclose(p, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=1e-6)
    # nucleus 0.8 keeps {0.5, 0.3}: the mass before the third token (0.8) reaches top_p
    p = Sampler(SamplingParams(temperature=1.0, top_p=0.8)).probs(logits)
    assert torch.allclose(p, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=1e-6)
    # top_p smaller than the first token's mass still keeps that token
    p = Sampler(SamplingParams(temperature=1.0, top_p=0.1)).probs(logits)
    assert p[0] == 1.0


def test_temperature_sharpens_and_seed_reproduces():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    cold = Sampler(SamplingParams(temperature=0.1)).probs(logits)
    hot = Sampler(SamplingParams(temperature=2.0)).probs(logits)
    assert cold.max() > hot.max()
    draws = [Sampler(SamplingParams(temperature=1.0, seed=7)).sample(logits) for _ in range(3)]
    assert len(set(draws)) == 1
    s = Sampler(SamplingParams(temperature=1.0, seed=7))
    seq = [s.sample(logits) for _ in range(20)]
    assert len(set(seq)) > 1  # really random within a run


def test_sampling_frequencies_follow_probabilities():
    logits = torch.log(torch.tensor([0.7, 0.2, 0.1]))
    s = Sampler(SamplingParams(temperature=1.0, seed=1))
    counts = torch.bincount(torch.tensor([s.sample(logits) for _ in range(2000)]), minlength=3).float() / 2000
    assert torch.allclose(counts, torch.tensor([0.7, 0.2, 0.1]), atol=0.04)


@pytest.mark.parametrize("kw", [{"temperature": -1.0}, {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_bad_params_are_input_errors(kw):
    with pytest.raises(InputError):
        SamplingParams(**kw)
