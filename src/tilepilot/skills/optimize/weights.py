"""Which kernel a quantized deployment's prefill multiplies with: the packed quantized GEMM, or bf16 GEMMs over the
dequantized weights.

A quantized plan's prefill starts on ``qgemm`` (``plan.with_weights``): it streams the packed blocks, 0.28x of the
bf16 bytes at 4 bits, and decodes them in the compute tile on every kernel call. Prefill GEMMs at long prompts are
compute-bound, so the decoding can cost more than the bytes save; AIR's Q4NX prefill dequantizes once and runs bf16
GEMMs (reference/xdna2.md). Both compute the same deployed weights (``QuantTensor.deployed``), so only the modeled
time decides: the proposal is kept only if the prefill is strictly faster and the gate passes.
"""

from __future__ import annotations

from collections.abc import Iterator

from tilepilot.skills.base import SkillInput
from tilepilot.skills.optimize.common import PlanOptimization, Proposal, clone
from tilepilot.skills.optimize.host import _GATE


class DequantizedPrefill(PlanOptimization):
    name = "dequantized-prefill"
    description = (
        "Switches a quantized deployment's prefill projections from the packed quantized GEMM to bf16 GEMMs over the "
        "dequantized weights (the same deployed values), as AIR's Q4NX prefill does. Use when the plan deploys a "
        "block format and its prefill still runs qgemm."
    )
    purpose = (
        "Keeps TTFT at least as fast as bf16 when decoding packed weights in every prefill call costs more than the "
        "bytes it saves."
    )
    commands = ("tilepilot skills run dequantized-prefill WORKSPACE --json",)
    gate_text = _GATE
    inputs = (SkillInput("workspace", "a deployment workspace whose full-model gate passed (phase 3)"),)
    failure_modes = (
        "At short prompts the packed GEMM is weight-bound and faster: the proposal is rejected as not faster.",
    )
    stages = ("prefill",)

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        new = clone(ctx.plan)
        switched = 0
        for g in new.stage(stage).groups():
            for c in g.calls:
                if c.family == "qgemm":
                    c.family, c.config = "gemm", {}
                    switched += 1
        if switched:
            yield Proposal(new, f"{stage}: {switched} projection(s) as bf16 GEMMs over the dequantized weights")
