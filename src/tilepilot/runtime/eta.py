"""eta_scale: how well a deployment sustains the efficiency of tilepilot's own Llama-3.2-1B deployment.

The paper reports eta_scale per model without defining it, so tilepilot uses its own definition
(DESIGN.md section 6) and says so wherever it prints one. Two sustained throughputs per deployment:

- **prefill**: model FLOPs of a ``prompt_len``-token prefill (2048 by default) divided by TTFT.
- **decode**: bytes of weights read for one decoded token divided by the decode latency per token.

Each is divided by the same figure for the reference deployment (Llama-3.2-1B deployed by tilepilot),
and eta_scale is the geometric mean of the two ratios. A model that is twice as big and takes twice as
long scores 1.0: the NPU was kept equally busy. Scoring above 1.0 is possible (bigger matrices tile the
array better).

**Model FLOPs of a T-token prefill** (one multiply-add = 2 FLOPs; what the model needs, not what a
particular kernel does, so padding or recomputation never inflates it):

- projections: ``2 * T * P_layers`` where ``P_layers`` = the weights of every decoder layer that enter
  a matrix multiply (q, k, v, o, gate, up, down; ``n_layers * (h*q + 2*h*kv + q*h + 3*h*f)``);
- attention, causal: query position ``i`` (0-based) scores ``i + 1`` keys, so a layer costs
  ``n_heads * 4 * head_dim * T*(T+1)/2`` (2 for Q.K^T and 2 for P.V per key and head dimension);
  GQA does not reduce it (every query head still scores every key);
- LM head: ``2 * hidden * vocab`` for the last position only, because TTFT (``plan.timing``) computes
  only the last position's logits, as real deployments do.

Norms, RoPE, SiLU, softmax, biases and residual adds are left out: they are O(T * hidden) against
O(T * hidden^2) and no published FLOP count includes them.

**Weight bytes read per decoded token**: every weight a decode step touches, once, in the checkpoint's
dtype (bf16: 2 bytes): all decoder-layer tensors (projections, norms, biases, Q/K norms), the final
norm, the LM-head matrix (``vocab * hidden``; for tied embeddings that is the embedding matrix) and one
embedding row for the token's lookup. The KV cache is not a weight and is not counted.

Every TTFT and decode latency fed in here is *modeled* (the NPU time of ``plan.timing``); eta_scale
inherits that label.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tilepilot.model.graph import block_graph, weight_shape
from tilepilot.model.quant import WeightFormat, bits_per_weight, kv_unit
from tilepilot.model.spec import ModelSpec

# The deployment every eta_scale is relative to (DESIGN.md section 6), and the prompt length of its TTFT.
REFERENCE_MODEL = "llama-3.2-1b"
PREFILL_TOKENS = 2048
# issue 7 goal: the paper's best autonomously deployed models reached eta_scale 0.94 or more.
ETA_GOAL = 0.94


def _prod(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def matmul_params_per_layer(spec: ModelSpec) -> int:
    """Weights of one decoder layer that enter a matrix multiply (q, k, v, o, gate, up, down)."""
    h, q, kv, f = spec.hidden, spec.q_dim, spec.kv_dim, spec.intermediate
    return h * q + 2 * h * kv + q * h + 3 * h * f


def attention_flops(spec: ModelSpec, tokens: int) -> int:
    """Causal self-attention FLOPs of a ``tokens``-long prefill over all layers (Q.K^T and P.V)."""
    pairs = tokens * (tokens + 1) // 2
    return spec.n_layers * spec.n_heads * 4 * spec.head_dim * pairs


def prefill_flops(spec: ModelSpec, tokens: int = PREFILL_TOKENS) -> int:
    """Model FLOPs of a ``tokens``-long prefill from an empty cache, last-position LM head included."""
    if tokens < 1:
        raise ValueError(f"a prefill needs at least one token, got {tokens}")
    projections = 2 * tokens * spec.n_layers * matmul_params_per_layer(spec)
    lm_head = 2 * spec.hidden * spec.vocab
    return projections + attention_flops(spec, tokens) + lm_head


def decode_weight_bytes(spec: ModelSpec, bytes_per_value: int = 2) -> int:
    """Bytes of weights one decode step reads: every layer tensor, final norm, LM head, one embedding row."""
    layer_values = sum(_prod(s) for i in range(spec.n_layers) for s in spec.layer_tensor_shapes(i).values())
    values = layer_values + spec.hidden + spec.vocab * spec.hidden + spec.hidden
    return values * bytes_per_value


def decode_streamed_bytes(spec: ModelSpec, fmt: WeightFormat) -> int:
    """Bytes of weights one decode step streams as deployed in ``fmt``: the layer projections in the format (bf16
    where it keeps them), norms in bf16, the LM head packed when the format packs it, else bf16, and the final norm.
    Over the usable DDR bandwidth this is the plan's weight-streaming bound (``weight_streaming_bound_tok_s``)."""
    total = 0.0
    for name in {w for n in block_graph(spec).block for w in n.weights}:
        bits = bits_per_weight(fmt.format, fmt.block) if fmt.packs(name) else 16.0
        total += math.prod(weight_shape(spec, name)) * bits / 8
    total *= spec.n_layers
    head_bits = bits_per_weight(fmt.format, fmt.block) if fmt.packs_head else 16.0
    total += spec.vocab * spec.hidden * head_bits / 8 + 2 * spec.hidden  # LM head + final norm
    return int(total)


def weight_streaming_bound_tok_s(spec: ModelSpec, fmt: WeightFormat, ddr_bytes_per_s: float) -> float:
    """Decode tokens per second if a step did nothing but stream its weights at ``ddr_bytes_per_s``: no plan timed
    by the same model can be faster, so a plan's decode over it says how much of the step is not weight streaming."""
    return ddr_bytes_per_s / decode_streamed_bytes(spec, fmt)


def decode_kv_bytes(spec: ModelSpec, rows: int, kv_cache: str = "bf16") -> int:
    """Bytes of KV cache one decode step reads when every layer's attention streams ``rows`` cached positions
    (``StagePlan.kv_readback``): K and V of every KV head, as the cache stores them (bf16, or its blocks)."""
    return spec.n_layers * rows * kv_unit(kv_cache, 2 * spec.kv_dim)[0] * (2 if kv_cache == "bf16" else 1)


def ddr_floor_tok_s(spec: ModelSpec, fmt: WeightFormat, kv_rows: int, ddr_bytes_per_s: float) -> float:
    """Decode tokens per second if a step did nothing but read its weights and its KV readback at
    ``ddr_bytes_per_s``. The weight-streaming bound leaves the KV out; this does not, so it is the tighter of the two
    and shows how much of the gap to that bound no plan can close at this context."""
    return ddr_bytes_per_s / (decode_streamed_bytes(spec, fmt) + decode_kv_bytes(spec, kv_rows, fmt.kv_cache))


@dataclass(frozen=True)
class Throughput:
    """Sustained throughputs of one deployment (modeled when its times are modeled)."""

    model: str
    prefill_flops_per_s: float
    decode_bytes_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "prefill_tflops": self.prefill_flops_per_s / 1e12,
            "decode_gb_per_s": self.decode_bytes_per_s / 1e9,
        }


def sustained(
    spec: ModelSpec, ttft_s: float, decode_s_per_token: float, prompt_len: int = PREFILL_TOKENS
) -> Throughput:
    """Sustained prefill FLOP/s and decode weight-bytes/s from a TTFT and a per-token decode latency."""
    if not (ttft_s > 0 and math.isfinite(ttft_s)):
        raise ValueError(f"TTFT must be a positive finite time, got {ttft_s}")
    if not (decode_s_per_token > 0 and math.isfinite(decode_s_per_token)):
        raise ValueError(f"decode latency must be a positive finite time, got {decode_s_per_token}")
    return Throughput(
        model=spec.name or spec.architecture,
        prefill_flops_per_s=prefill_flops(spec, prompt_len) / ttft_s,
        decode_bytes_per_s=decode_weight_bytes(spec) / decode_s_per_token,
    )


@dataclass(frozen=True)
class EtaScale:
    """Prefill and decode efficiency relative to the reference deployment, and their geometric mean."""

    prefill: float
    decode: float
    reference: str = REFERENCE_MODEL

    @property
    def combined(self) -> float:
        return math.sqrt(self.prefill * self.decode)

    @property
    def meets_goal(self) -> bool:
        return self.combined >= ETA_GOAL

    def to_dict(self) -> dict[str, Any]:
        return {
            "prefill": self.prefill,
            "decode": self.decode,
            "combined": self.combined,
            "reference": self.reference,
            "goal": ETA_GOAL,
            "meets_goal": self.meets_goal,
        }


def eta_scale(model: Throughput, reference: Throughput) -> EtaScale:
    """eta_scale of ``model`` against ``reference`` (the reference against itself is exactly 1.0)."""
    return EtaScale(
        prefill=model.prefill_flops_per_s / reference.prefill_flops_per_s,
        decode=model.decode_bytes_per_s / reference.decode_bytes_per_s,
        reference=reference.model,
    )
