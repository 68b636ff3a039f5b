"""Phases 4/5 gate proposals with a short greedy; a change that breaks only later tokens must still be caught and
rejected by name when the phase's full gate fails."""

from __future__ import annotations

from dataclasses import replace

import torch

from tilepilot.runtime import runner as npu_runner
from tilepilot.skills.phases.optimization import PrefillOptimization


def test_a_change_breaking_late_tokens_is_rejected_on_the_phase_retry(fresh_ctx, monkeypatch):
    ctx = fresh_ctx(greedy_steps=8, proposal_greedy_steps=3)
    original = npu_runner.NpuRunner.decode

    def late_fault(self, token_id, capture_layers=False):
        step = original(self, token_id, capture_layers)
        self._decodes = getattr(self, "_decodes", 0) + 1
        if self.plan.host.skip_unchanged_writes and self._decodes >= 4:  # beyond a 3-token check
            logits = step.logits.clone()
            logits[..., int(torch.argmin(logits[-1]))] = 1e4
            return replace(step, logits=logits)
        return step

    monkeypatch.setattr(npu_runner.NpuRunner, "decode", late_fault)
    result = PrefillOptimization().run(ctx)
    assert result.ok, result.summary
    assert not ctx.plan.host.skip_unchanged_writes
    # the change is rejected by name: on the phase retry when only the full gate sees the fault, or already at its
    # proposal when the proposal gate's teacher-forced KL steps (40 decodes) reach the faulty positions
    retried = [row for s in result.evidence["skills"] for row in s.get("applied", [])]
    assert retried and all("unchanged inputs" not in row["change"] for row in retried)
    traj = (ctx.root / "perf_opt_traj.md").read_text()
    assert "rejected: gate failed" in traj
