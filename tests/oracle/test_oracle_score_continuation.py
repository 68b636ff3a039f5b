"""``score_continuation``: one pass over a given continuation must report what ``greedy`` would have chosen."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny, prompt_ids

from tilepilot.errors import InputError
from tilepilot.oracle import model as oracle_model
from tilepilot.oracle.model import Oracle


@pytest.fixture(scope="module")
def oracle():
    return Oracle(build_tiny("llama3").weights)


def test_own_greedy_is_scored_as_itself_with_equal_top5(oracle):
    ids = prompt_ids(9)
    g = oracle.greedy(ids, 12)
    step, scored = oracle.score_continuation(ids, g.tokens, capture=["layer0.out", "layer1.out"])
    assert scored.tokens == g.tokens
    assert scored.top5_per_step == g.top5_per_step
    assert torch.allclose(torch.tensor(scored.top5_logprobs), torch.tensor(g.top5_logprobs), atol=1e-4)
    # the prompt part equals a prefill of the prompt alone (captures cut to the prompt's rows)
    alone = oracle.prefill(ids, capture=["layer1.out"])
    assert step.logits.shape == alone.logits.shape
    assert torch.allclose(step.logits, alone.logits, rtol=0, atol=1e-4)
    assert step.captures["layer1.out"].shape == alone.captures["layer1.out"].shape


def test_a_wrong_token_shows_as_the_first_divergence(oracle):
    """Replace greedy token 4: steps 0-4 keep the oracle's own choices, step 4's choice is the true token."""
    ids = prompt_ids(9)
    g = oracle.greedy(ids, 10)
    wrong = list(g.tokens)
    wrong[4] = (wrong[4] + 1) % oracle.spec.vocab
    _, scored = oracle.score_continuation(ids, wrong)
    assert scored.tokens[:5] == g.tokens[:5]
    assert scored.top5_per_step[:5] == g.top5_per_step[:5]
    assert scored.tokens[4] != wrong[4]


def test_empty_continuation_is_refused(oracle):
    with pytest.raises(InputError, match="continuation"):
        oracle.score_continuation(prompt_ids(5), [])


def _counting(oracle, monkeypatch):
    calls = []
    original = oracle.score_continuation

    def counted(*a, **k):
        calls.append(1)
        return original(*a, **k)

    monkeypatch.setattr(oracle, "score_continuation", counted)
    return calls


def test_a_perfect_draft_is_verified_in_one_pass(oracle, monkeypatch):
    ids = prompt_ids(9)
    plain = oracle.greedy(ids, 12)
    calls = _counting(oracle, monkeypatch)
    drafted = oracle.greedy(ids, 12, draft=lambda prefix, n: plain.tokens[len(prefix) - len(ids) :][:n])
    assert drafted.tokens == plain.tokens and drafted.top5_per_step == plain.top5_per_step
    assert len(calls) == 1


@pytest.mark.parametrize(
    "draft",
    [
        lambda prefix, n: [0] * n,  # wrong almost everywhere
        lambda prefix, n: [10**9] * n,  # outside the vocabulary
        lambda prefix, n: 1 / 0,  # a draft that fails
        lambda prefix, n: [],  # no proposal
    ],
    ids=["wrong", "out-of-vocab", "raises", "empty"],
)
def test_any_draft_gives_the_oracle_greedy(oracle, monkeypatch, draft):
    ids = prompt_ids(9)
    plain = oracle.greedy(ids, 12)
    calls = _counting(oracle, monkeypatch)
    drafted = oracle.greedy(ids, 12, draft=draft)
    assert drafted.tokens == plain.tokens and drafted.top5_per_step == plain.top5_per_step
    assert len(calls) <= oracle_model.DRAFT_ROUNDS
