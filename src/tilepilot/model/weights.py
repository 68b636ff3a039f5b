"""The weights contract every consumer (oracle, runner, evaluator) reads through.

A source of weights hands out one decoder layer at a time in the checkpoint's own dtype, so a
full-size model can be walked layer by layer without a second copy (and never an FP32 copy) of the
whole model. ``Checkpoint`` (safetensors on disk) and ``StateDictWeights`` (tensors already in
memory, e.g. a transformers model in a test) are the two sources.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Protocol

import torch

from tilepilot.errors import CheckpointError
from tilepilot.model.spec import ModelSpec

# LayerWeights field -> Hugging Face name suffix under "model.layers.{i}."
LAYER_TENSOR_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "bq": "self_attn.q_proj.bias",
    "bk": "self_attn.k_proj.bias",
    "bv": "self_attn.v_proj.bias",
    "bo": "self_attn.o_proj.bias",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}


@dataclass
class LayerWeights:
    """One decoder layer's tensors in Hugging Face orientation (``[out, in]`` for projections)."""

    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    ffn_norm: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor
    bq: torch.Tensor | None = None
    bk: torch.Tensor | None = None
    bv: torch.Tensor | None = None
    bo: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The present tensors by field name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


class WeightSource(Protocol):
    """What the oracle and the runner need from a checkpoint."""

    spec: ModelSpec

    def layer(self, i: int) -> LayerWeights: ...

    def embed(self) -> torch.Tensor: ...

    def final_norm(self) -> torch.Tensor: ...

    def lm_head(self) -> torch.Tensor: ...


def layer_from_lookup(spec: ModelSpec, i: int, get) -> LayerWeights:
    """Assemble LayerWeights for layer ``i`` from ``get(hf_name) -> Tensor`` using the spec's tensor list."""
    if not 0 <= i < spec.n_layers:
        raise IndexError(f"layer {i} is out of range for a {spec.n_layers}-layer model")
    expected = spec.layer_tensor_shapes(i)
    prefix = f"model.layers.{i}."
    kwargs = {}
    for field_name, suffix in LAYER_TENSOR_NAMES.items():
        name = prefix + suffix
        if name in expected:
            kwargs[field_name] = get(name)
    return LayerWeights(**kwargs)


class StateDictWeights:
    """Weights from an in-memory mapping of Hugging Face names to tensors (tests, transformers models)."""

    def __init__(self, spec: ModelSpec, state: Mapping[str, torch.Tensor]):
        self.spec = spec
        self._state = state

    def _get(self, name: str) -> torch.Tensor:
        if name not in self._state:
            raise CheckpointError(f"tensor {name} is missing from the weights; the checkpoint is incomplete")
        return self._state[name]

    def layer(self, i: int) -> LayerWeights:
        return layer_from_lookup(self.spec, i, self._get)

    def embed(self) -> torch.Tensor:
        return self._get("model.embed_tokens.weight")

    def final_norm(self) -> torch.Tensor:
        return self._get("model.norm.weight")

    def lm_head(self) -> torch.Tensor:
        if self.spec.tied_embeddings or "lm_head.weight" not in self._state:
            return self.embed()
        return self._get("lm_head.weight")
