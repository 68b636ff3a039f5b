"""The knobs of one deployment run (``Settings``) and the sizes every deployment is timed and tuned at."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tilepilot.model.quant import WeightFormat

# Figures every deployment is timed at: the paper's and IRON's published TTFT are at 2048 tokens
# (reference/xdna2.md, "Published LLM results"), and decode is timed at the same context.
TIMING_PROMPT_LEN = 2048

# Configs the tuner validates and times per new shape, taken from the family's own ranking (best guesses
# first). Validating one design of a 2048-token GEMM costs ~0.1-0.2 s of host time, so an exhaustive search
# of every GEMM shape (hundreds of candidates each) would dominate a deployment; 24 keeps the first
# deployment of a shape to seconds, and the registry makes later ones lookups.
TUNE_MAX_CANDIDATES = 24


@dataclass(frozen=True)
class Settings:
    """Knobs of a deployment run (sizes of the validation workloads, where shared knowledge lives).

    ``gate_prompt_len`` tokens are prefilled for the model gate and ``greedy_steps`` tokens generated:
    32 is the paper-era upstream gate (xdna2.md "Numerical gates": greedy 32 tokens). Each optimization proposal
    is gated with ``proposal_greedy_steps`` greedy tokens and the first ``proposal_kl_steps`` steps of the
    teacher-forced KL instead (plus every other check of the gate), because a full-size model pays one pass over all
    its weights per token and phases 4-5 gate a dozen proposals; the phase's own gate then runs all
    ``greedy_steps`` and the full KL (``gates.thresholds.KL_STEPS``) on the plan it keeps, and so does the
    evaluator; a kept plan that fails the full gate re-runs the phase with full checks for every proposal.
    ``knowledge_dir`` holds the kernel registry and lessons shared between deployments (None: no sharing).
    """

    gate_prompt_len: int = 24
    greedy_steps: int = 32
    proposal_greedy_steps: int = 8
    proposal_kl_steps: int = 8
    timing_prompt_len: int = TIMING_PROMPT_LEN
    kernel_tokens: int = 8
    seed: int = 0
    knowledge_dir: Path | None = None
    tune_max_candidates: int = TUNE_MAX_CANDIDATES
    # Block-FP16 trials are opt-in: the executor simulates bfp16 by re-quantizing the (static) weights on every
    # call, ~16 s for a 49k x 2k LM head on 2 cores, which makes every later gate and `generate` on the host
    # impractically slow even when the modeled NPU time is lower. The NPU result is unaffected by this choice.
    try_bfp16: bool = False
    # The weight format to deploy (model/quant.WeightFormat); None: bf16 for a new workspace, the recorded format
    # when resuming one. ``deployment.json`` records it under "weights" (skills/weights.py).
    weights: WeightFormat | None = None
    # Worker processes for a search's independent fits (``parallel.fork_map``); None: ``parallel.default_jobs()``
    # (TILEPILOT_JOBS, else the CPUs available). No result depends on it, only the wall-clock time of a deploy.
    jobs: int | None = None
