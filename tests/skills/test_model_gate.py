"""The model gate's greedy check: a shortened gate is a prefix of the full one, and the evaluator's one-pass
scoring along the runner's continuation gives the oracle's own greedy."""

from __future__ import annotations

from tilepilot.oracle.model import Oracle
from tilepilot.skills.phases.model import gate_prompts, model_gate, oracle_reference


def test_short_gate_checks_a_prefix_of_the_reference(fresh_ctx):
    ctx = fresh_ctx(greedy_steps=8, proposal_greedy_steps=3)
    full_report, full = model_gate(ctx, ctx.plan)
    short_report, short = model_gate(ctx, ctx.plan, greedy_steps=ctx.settings.proposal_greedy_steps)
    assert full_report.passed and short_report.passed
    assert (full["greedy_steps"], short["greedy_steps"]) == (8, 3)
    assert short["greedy"]["reference"] == full["greedy"]["reference"][:3]
    assert short["greedy"]["test"] == full["greedy"]["test"][:3]


def test_reference_scored_along_equals_the_greedy_reference(fresh_ctx):
    ctx = fresh_ctx(greedy_steps=8)
    a, b = gate_prompts(ctx)
    own = oracle_reference(Oracle(ctx.weights), a, b, 8)
    along = oracle_reference(Oracle(ctx.weights), a, b, 8, along=own.greedy_tokens)
    assert along.greedy_tokens == own.greedy_tokens and along.greedy_top5 == own.greedy_top5
    assert along.logits.shape == own.logits.shape and len(along.layers) == len(own.layers)
    assert (along.logits - own.logits).abs().max() <= 1e-4 * own.logits.abs().max()
