"""Phase 6's generate check reads the oracle's cached greedy and replays the runner only up to a divergence."""

from __future__ import annotations

from dataclasses import replace

from tilepilot.harness.model_gate import gate_prompts
from tilepilot.runtime import runner as npu_runner
from tilepilot.skills.phases.finalize import GENERATE_TOKENS, FinalizeAndLearn


def test_generate_matches_the_cached_reference(fresh_ctx):
    ctx = fresh_ctx(greedy_steps=GENERATE_TOKENS)
    result = FinalizeAndLearn().run(ctx)
    assert result.ok, result.summary
    ref = ctx.reference(*gate_prompts(ctx))
    assert result.evidence["generated_tokens"] == ref.greedy_tokens[:GENERATE_TOKENS]


def test_a_wrong_generated_token_fails_the_phase(fresh_ctx, monkeypatch):
    ctx = fresh_ctx(greedy_steps=GENERATE_TOKENS)
    ref = ctx.reference(*gate_prompts(ctx))
    bad = next(t for t in range(ctx.spec.vocab) if t not in ref.greedy_top5[3])
    original = npu_runner.NpuRunner.generate

    def wrong_fourth_token(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        return replace(out, tokens=[*out.tokens[:3], bad, *out.tokens[4:]])

    monkeypatch.setattr(npu_runner.NpuRunner, "generate", wrong_fourth_token)
    result = FinalizeAndLearn().run(ctx)
    assert not result.ok and "diverge at step 3" in result.evidence["greedy_check"]
