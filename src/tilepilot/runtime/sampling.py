"""Next-token sampling: greedy, temperature, top-k, top-p (nucleus), with a seeded generator.

Sampling runs on the host in fp32 over one row of logits. A seed makes a run reproducible; the
generator is owned by the sampler (no global RNG state is touched).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tilepilot.errors import InputError


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` means greedy; ``top_k == 0`` and ``top_p == 1`` disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise InputError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise InputError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise InputError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Sampler:
    """Draws token ids from logits according to ``SamplingParams``."""

    def __init__(self, params: SamplingParams | None = None):
        self.params = params or SamplingParams()
        self._gen = torch.Generator()
        if self.params.seed is not None:
            self._gen.manual_seed(self.params.seed)
        else:
            self._gen.seed()

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The filtered next-token distribution of one row of logits (for tests and inspection)."""
        p = self.params
        x = logits.detach().reshape(-1).float()
        if p.greedy:
            out = torch.zeros_like(x)
            out[int(torch.argmax(x))] = 1.0
            return out
        x = x / p.temperature
        if p.top_k and p.top_k < x.numel():
            kth = torch.topk(x, p.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_x, order = torch.sort(x, descending=True)
            cum = torch.softmax(sorted_x, dim=-1).cumsum(-1)
            # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
            drop = (cum - torch.softmax(sorted_x, dim=-1)) >= p.top_p
            sorted_x = sorted_x.masked_fill(drop, float("-inf"))
            x = torch.full_like(x, float("-inf")).scatter(0, order, sorted_x)
        return torch.softmax(x, dim=-1)

    def sample(self, logits: torch.Tensor) -> int:
        if self.params.greedy:
            return int(torch.argmax(logits.detach().reshape(-1)))
        probs = self.probs(logits)
        return int(torch.multinomial(probs, 1, generator=self._gen))
