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
from tilepilot.model.quant import WeightFormat, deployment_weights
from tilepilot.model.spec import ModelSpec
from tilepilot.model.tokenizer import Tokenizer
from tilepilot.model.weights import WeightSource
from tilepilot.oracle.model import Oracle

# (prefix ids, n greedy tokens) -> a guess of the oracle's greedy continuation (a wrong guess only costs time)
Draft = Callable[[list[int], int], list[int]]


class ModelReference:
    """The model deployed from ``model_dir`` in ``fmt``, its FP32 oracle and tokenizer, and the oracle's cached gate
    answers.

    ``weights`` and ``oracle`` are the *deployed* model: for a block format the dequantized weights the NPU
    multiplies, so every gate compares the NPU with exactly the model being deployed. ``checkpoint`` and
    ``source_oracle`` are the bf16 original (phase 0 checks the oracle's code against transformers on it, and the
    quantization-error report compares the deployment with it); for bf16 the two are the same objects.
    """

    def __init__(self, model_dir: Path, fmt: WeightFormat, greedy_steps: int, draft: Draft | None = None):
        self.model_dir = Path(model_dir)
        self.format = fmt
        self.greedy_steps = greedy_steps
        self.draft = draft
        self.cache: dict[tuple, Any] = {}

    @cached_property
    def checkpoint(self) -> Checkpoint:
        return load_checkpoint(self.model_dir)

    @cached_property
    def weights(self) -> WeightSource:
        """The deployed weights (packed once per run: every runner of the deployment's format shares them)."""
        return deployment_weights(self.checkpoint, self.format)

    def weights_for(self, fmt: WeightFormat) -> WeightSource:
        """The weights a plan of format ``fmt`` runs over (the deployed ones when it is the deployment's)."""
        if fmt == self.format:
            return self.weights
        return deployment_weights(self.checkpoint, fmt)

    @property
    def spec(self) -> ModelSpec:
        return self.checkpoint.spec

    @cached_property
    def oracle(self) -> Oracle:
        return Oracle(self.weights, kv_cache=self.format.kv_cache)

    @cached_property
    def source_oracle(self) -> Oracle:
        """The FP32 oracle of the bf16 checkpoint with a bf16 KV cache (the deployed oracle itself when nothing is
        packed or quantized)."""
        original = not self.format.quantized and self.format.kv_cache == "bf16"
        return self.oracle if original else Oracle(self.checkpoint)

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
