"""The model gate's greedy check: a shortened gate is a prefix of the full one, and the evaluator's one-pass
scoring along the runner's continuation gives the oracle's own greedy."""

from __future__ import annotations

import pytest

from tilepilot.gates import thresholds as T
from tilepilot.harness.model_gate import gate_prompts, model_gate, oracle_reference
from tilepilot.oracle.model import Oracle


def test_short_gate_checks_a_prefix_of_the_reference(fresh_ctx):
    """A proposal's shortened gate (greedy and teacher-forced KL) checks the first steps of the full gate's own
    reference and text, so it can only miss a fault that shows late, never see a different one."""
    ctx = fresh_ctx(greedy_steps=8, proposal_greedy_steps=3, proposal_kl_steps=5)
    s = ctx.settings
    full_report, full = model_gate(ctx, ctx.plan)
    short_report, short = model_gate(ctx, ctx.plan, greedy_steps=s.proposal_greedy_steps, kl_steps=s.proposal_kl_steps)
    assert full_report.passed and short_report.passed
    assert (full["greedy_steps"], short["greedy_steps"]) == (8, 3)
    assert short["greedy"]["reference"] == full["greedy"]["reference"][:3]
    assert short["greedy"]["test"] == full["greedy"]["test"][:3]
    assert (full["kl_steps"], short["kl_steps"]) == (T.KL_STEPS, 5)
    assert short["kl_per_step"] == pytest.approx(full["kl_per_step"][:5], rel=1e-6, abs=1e-12)


def test_reference_scored_along_equals_the_greedy_reference(fresh_ctx):
    ctx = fresh_ctx(greedy_steps=8)
    a, b = gate_prompts(ctx)
    own = oracle_reference(Oracle(ctx.weights), a, b, 8)
    along = oracle_reference(Oracle(ctx.weights), a, b, 8, along=own.greedy_tokens)
    assert along.greedy_tokens == own.greedy_tokens and along.greedy_top5 == own.greedy_top5
    assert along.logits.shape == own.logits.shape and len(along.layers) == len(own.layers)
    assert (along.logits - own.logits).abs().max() <= 1e-4 * own.logits.abs().max()


def test_reference_along_stops_at_the_first_divergence(fresh_ctx):
    """The scored reference ends at the step the runner left the oracle's path (what the token-set check reads);
    too short a continuation is refused; a token outside the vocabulary fails the check instead of crashing it."""

    from tilepilot.errors import InputError
    from tilepilot.gates.metrics import greedy_token_set_check

    ctx = fresh_ctx(greedy_steps=8)
    a, b = gate_prompts(ctx)
    own = oracle_reference(Oracle(ctx.weights), a, b, 8)
    wrong = list(own.greedy_tokens)
    wrong[3] = next(t for t in range(ctx.spec.vocab) if t not in own.greedy_top5[3])
    along = oracle_reference(Oracle(ctx.weights), a, b, 8, along=wrong)
    assert along.greedy_tokens == own.greedy_tokens[:4] and along.greedy_top5 == own.greedy_top5[:4]
    with pytest.raises(InputError, match="greedy tokens"):
        oracle_reference(Oracle(ctx.weights), a, b, 8, along=own.greedy_tokens[:5])
    outside = [*own.greedy_tokens[:2], ctx.spec.vocab, *own.greedy_tokens[3:]]
    cut = oracle_reference(Oracle(ctx.weights), a, b, 8, along=outside)
    assert cut.greedy_tokens == own.greedy_tokens[:2]
    check = greedy_token_set_check(cut.greedy_tokens, outside, cut.greedy_top5, [[0] * 5] * 8)
    assert not check.passed
