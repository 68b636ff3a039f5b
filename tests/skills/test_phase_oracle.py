"""Phase 0 against transformers: passes on a correct oracle, fails on a subtly wrong one, and hands its
reference to the model gate so later phases compare against exactly what was certified."""

from __future__ import annotations

import pytest

from tilepilot.harness.model_gate import gate_prompts
from tilepilot.oracle import model as oracle_model
from tilepilot.skills.phases.oracle import BuildCpuOracle


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_phase0_passes_and_shares_its_reference(fresh_ctx, family):
    ctx = fresh_ctx(family)
    result = BuildCpuOracle().run(ctx)
    assert result.ok, result.summary
    ev = result.evidence
    assert ev["reference"] == "transformers" and len(ev["greedy"]) == ctx.settings.greedy_steps
    ref = ctx.reference(*gate_prompts(ctx))
    assert ref.greedy_tokens == ev["greedy"]
    assert ctx.reference(*gate_prompts(ctx)) is ref  # computed once per deployment


def test_phase0_fails_when_the_oracle_rope_is_off(fresh_ctx, monkeypatch):
    """RoPE frequencies 10 % too high: the kind of modeling gap only an independent reference catches."""
    original = oracle_model.inv_freq_for
    monkeypatch.setattr(oracle_model, "inv_freq_for", lambda spec: original(spec) * 1.1)
    result = BuildCpuOracle().run(fresh_ctx("llama"))
    assert not result.ok
    assert any(f.startswith("logits.") for f in result.gate["failures"]), result.gate["failures"]


def test_phase0_fails_when_the_loader_alters_a_tensor(fresh_ctx, monkeypatch):
    """The oracle and transformers share the loader's tensors; an altered tensor must still fail phase 0."""
    import pytest

    from tilepilot.errors import CheckpointError
    from tilepilot.model.checkpoint import Checkpoint

    original = Checkpoint.get

    def scaled(self, name):
        t = original(self, name)
        return t * 1.5 if name == "model.layers.0.mlp.down_proj.weight" else t

    monkeypatch.setattr(Checkpoint, "get", scaled)
    with pytest.raises(CheckpointError, match="down_proj.*differs from the one stored"):
        BuildCpuOracle().run(fresh_ctx("llama"))
