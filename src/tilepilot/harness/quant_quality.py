"""Quantization error: a quantized deployment against the bf16 original, a reported measure and never a gate.

Every phase gate compares the NPU with the oracle of the *deployed* (dequantized) weights, so the gates say the
deployment computes its model; how far that model is from the bf16 original is a separate question, answered
here on the shipped real text (``harness/prompts.py`` ``KL_TEXTS``, or seeded token ids when there is no
tokenizer): teacher-forced KL(original || deployment) per next-token distribution, top-1 agreement, both
perplexities of the text, and the first step at which the two greedy continuations of the text's opening differ.
The deployment side is the production runner (what a user gets); the original is the FP32 oracle on the bf16
checkpoint, so the figures hold the quantization error plus the NPU's bf16 arithmetic (a GGUF's own format deployed
as stored is its imported checkpoint: there only the arithmetic remains). Figures are measured on the host (CPU
arithmetic), not modeled NPU times.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tilepilot.gates import metrics as M
from tilepilot.harness.prompts import KL_TEXTS, kl_text_ids

QUALITY_TOKENS = 96  # tokens of shipped text scored (every position teacher-forced: one prefill per side)
GREEDY_PROMPT = 16  # tokens of the text's opening both sides continue greedily
GREEDY_STEPS = 32
LABEL = (
    "quantized deployment vs the bf16 original (FP32 oracle of the checkpoint): quantization plus the NPU's bf16 "
    "arithmetic; measured on the host, not a gate"
)


def perplexity(logits: torch.Tensor, ids: list[int]) -> float:
    """exp of the mean negative log-likelihood of ``ids[1:]`` under rows ``logits[:-1]`` (FP64)."""
    lp = torch.log_softmax(logits[:-1].double(), dim=-1)
    nll = -lp.gather(1, torch.as_tensor(ids[1:]).unsqueeze(1)).mean()
    return float(math.exp(float(nll)))


def quantization_quality(runner, original, tokenizer, *, tokens: int = QUALITY_TOKENS, seed: int = 0) -> dict[str, Any]:
    """The deployment (``runner``) against the original (``original``, an Oracle) on the shipped real text."""
    spec = original.spec
    ids, real = kl_text_ids(tokenizer, spec.vocab, tokens, seed, KL_TEXTS)
    dep = runner.prefill(ids).logits.float()
    ref = original.prefill(ids).logits.float()
    kl = M.teacher_forced_kl(ref[:-1], dep[:-1])
    prompt = ids[:GREEDY_PROMPT]
    dep_tokens = [int(t) for t in runner.generate(prompt, GREEDY_STEPS, stop_ids=()).tokens]
    ref_tokens = original.greedy(
        prompt, GREEDY_STEPS, draft=lambda prefix, n: dep_tokens[len(prefix) - len(prompt) :]
    ).tokens
    diverge = M.first_divergence(ref_tokens, dep_tokens)
    return {
        "label": LABEL,
        "text": "shipped real text (harness/prompts.py KL_TEXTS)" if real else "seeded token ids (no tokenizer)",
        "tokens": len(ids),
        "kl_mean": kl["mean"],
        "kl_p90": kl["p90"],
        "kl_max": kl["max"],
        "top1_agreement": M.top1_agreement(ref[:-1], dep[:-1]),
        "perplexity_deployed": perplexity(dep, ids),
        "perplexity_original": perplexity(ref, ids),
        "greedy_steps": GREEDY_STEPS,
        "first_greedy_divergence": diverge,  # None: the 32 greedy tokens are identical
    }


def render(q: dict[str, Any]) -> list[str]:
    """The measure as labelled lines (deploy summary, journal)."""
    div = q["first_greedy_divergence"]
    greedy = f"none in {q['greedy_steps']} tokens" if div is None else f"at step {div}"
    return [
        f"{q['label']}, on {q['tokens']} tokens of {q['text']}:",
        f"  teacher-forced KL mean {q['kl_mean']:.4g} / p90 {q['kl_p90']:.4g} / max {q['kl_max']:.4g} nats; "
        f"top-1 agreement {q['top1_agreement']:.3f}",
        f"  perplexity {q['perplexity_deployed']:.3f} deployed vs {q['perplexity_original']:.3f} original; "
        f"first greedy divergence {greedy}",
    ]
