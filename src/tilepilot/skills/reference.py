"""The model being deployed and the oracle's side of every gate, built lazily and once per run.

Every optimization attempt re-runs the full-model gate, and the oracle side of that comparison never changes
with the plan, so it is computed once per prompt pair and cached here. The checkpoint, the FP32 oracle and the
tokenizer load on first use: a phase that needs none of them never pays for them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

from tilepilot.errors import TokenizerError
from tilepilot.harness.model_gate import OracleReference, oracle_reference
from tilepilot.model.checkpoint import Checkpoint, load_checkpoint
from tilepilot.model.spec import ModelSpec
from tilepilot.model.tokenizer import Tokenizer
from tilepilot.oracle.model import Oracle

# (prefix ids, n greedy tokens) -> a guess of the oracle's greedy continuation (a wrong guess only costs time)
Draft = Callable[[list[int], int], list[int]]


class ModelReference:
    """The checkpoint of ``model_dir``, its FP32 oracle and tokenizer, and the oracle's cached gate answers."""

    def __init__(self, model_dir: Path, greedy_steps: int, draft: Draft | None = None):
        self.model_dir = Path(model_dir)
        self.greedy_steps = greedy_steps
        self.draft = draft
        self.cache: dict[tuple, Any] = {}

    @cached_property
    def weights(self) -> Checkpoint:
        return load_checkpoint(self.model_dir)

    @property
    def spec(self) -> ModelSpec:
        return self.weights.spec

    @cached_property
    def oracle(self) -> Oracle:
        return Oracle(self.weights)

    @cached_property
    def tokenizer(self) -> Tokenizer | None:
        """The checkpoint's tokenizer, or None when it has none (gates then use token ids only)."""
        try:
            return Tokenizer.from_dir(self.model_dir)
        except TokenizerError:
            return None

    def reference(self, prompt: list[int], second: list[int]) -> OracleReference:
        """The oracle's side of the model gate for these prompts (computed once per run; plans do not change it)."""
        key = (tuple(prompt), tuple(second), self.greedy_steps)
        if key not in self.cache:
            self.cache[key] = oracle_reference(self.oracle, prompt, second, self.greedy_steps, draft=self.draft)
        return self.cache[key]
