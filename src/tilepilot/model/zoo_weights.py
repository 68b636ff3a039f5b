"""Random weights for zoo checkpoints: reproducible tensor by tensor, and with a stable greedy path.

Plain random weights make a poor test model. With an O(1) embedding and tied LM head the model just
repeats its input token; with a small embedding its next-token distribution is a draw from ~N random
logits, whose top-1/top-2 gap is so small that bf16 rounding (relative error ~1e-2 in the activations)
changes the greedy token every few dozen steps, and a bf16 deployment could never reproduce 32 FP32
greedy tokens. The zoo therefore plants one deliberate structure in otherwise random weights:

* **A bigram memory in layer 0's FFN.** For every token id the tokenizer can produce, one intermediate
  neuron has gate and up rows along that token's embedding (so it fires only when that token is the
  current input) and a down column equal to the embedding of a successor token, ``succ(t)``, drawn as a
  random derangement of the ordinary tokens. The residual stream then carries ``bigram * E[succ(t)]``
  and the tied LM head scores ``succ(t)`` far above everything else: top-1 has a wide margin, the
  greedy walk is a long permutation cycle rather than a repetition, and it survives bf16 noise.
* **Everything else is plain scaled-normal.** Attention and the FFNs of all other layers are random
  with a ``1/sqrt(2 * n_layers)`` output scale, so the residual stays O(1) at any depth; they make the
  rest of the distribution (ranks 2..k, the probabilities) depend on the context, which is what the
  logit, cosine and top-k gates compare. Norm weights are ~1; rows of ids the tokenizer never produces
  (reserved ids between the BPE vocab and the model vocab) are small, as in real checkpoints.

Every tensor comes from generators seeded by (seed, tensor name[, row block]), so values do not depend
on the order of writing, and a tensor can be regenerated alone.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tilepilot.model.spec import ModelSpec

EMBED_NAME = "model.embed_tokens.weight"
# Embedding rows are generated in blocks with their own seeds, so the rows of a few token ids can be
# regenerated (for the bigram memory) without generating a 150k-row matrix.
ROW_BLOCK = 1024
# Other tensors are filled in chunks of about this many elements (bounded temporary memory).
_CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class LiveVocab:
    """The token ids the tokenizer can emit: ordinary BPE tokens and special tokens."""

    ordinary: tuple[int, ...]
    special: tuple[int, ...]

    @property
    def all(self) -> tuple[int, ...]:
        return self.ordinary + self.special


@dataclass(frozen=True)
class WeightScheme:
    """Scales of the zoo weights. Defaults are the zoo's, chosen by the measurements in docs/zoo.md."""

    embed_std: float = 1.0  # rows of live token ids
    unused_embed_std: float = 0.02  # rows of ids no token maps to
    in_gain: float = 1.0  # q/k/v/gate/up: std = in_gain / sqrt(fan_in)
    attn_out_gain: float = 1.5  # o_proj: std = attn_out_gain / sqrt(fan_in * 2 * n_layers)
    ffn_out_gain: float = 1.5  # down_proj: std = ffn_out_gain / sqrt(fan_in * 2 * n_layers)
    norm_spread: float = 0.05  # RMSNorm weights ~ 1 + norm_spread * N(0, 1)
    logit_scale: float = 16.0  # final norm weights ~ logit_scale / hidden: sets the softmax temperature
    bias_std: float = 0.1  # Qwen2 q/k/v biases
    bigram: float = 2.0  # |succ(t) component| / |E[t]| written by the layer-0 memory
    key_gain: float = 4.0  # gate/up pre-activation of the memory neuron of the current token


def tensor_seed(seed: int, name: str) -> int:
    """A stable 63-bit seed for one tensor (crc32 is stable across runs and platforms, unlike hash())."""
    return (seed * 0x9E3779B1 + zlib.crc32(name.encode("utf-8"))) & 0x7FFF_FFFF_FFFF_FFFF


def _normal(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    out = torch.empty(shape, dtype=torch.float32)
    flat = out.view(shape[0], -1) if len(shape) > 1 else out.view(1, -1)
    rows = max(1, _CHUNK_ELEMENTS // max(1, flat.shape[1]))
    for r in range(0, flat.shape[0], rows):
        flat[r : r + rows].normal_(generator=gen)
    return out


def default_live_vocab(spec: ModelSpec) -> LiveVocab:
    """Live ids when no tokenizer says otherwise: as many leading ids as layer 0 has memory neurons."""
    return LiveVocab(ordinary=tuple(range(min(spec.vocab, spec.intermediate))), special=())


def _live_rows(block_start: int, n: int, live: LiveVocab) -> list[int]:
    return [i - block_start for i in live.all if block_start <= i < block_start + n]


def embedding_rows(spec: ModelSpec, ids: list[int], seed: int, live: LiveVocab, scheme: WeightScheme) -> torch.Tensor:
    """Rows ``ids`` of the embedding, regenerated from their row blocks only."""
    out = torch.empty(len(ids), spec.hidden)
    blocks: dict[int, torch.Tensor] = {}
    for k, i in enumerate(ids):
        b = i // ROW_BLOCK
        if b not in blocks:
            start = b * ROW_BLOCK
            blocks[b] = _fill_block(torch.empty(min(ROW_BLOCK, spec.vocab - start), spec.hidden), b, seed, live, scheme)
        out[k] = blocks[b][i - b * ROW_BLOCK]
    return out


def _fill_block(rows: torch.Tensor, b: int, seed: int, live: LiveVocab, s: WeightScheme) -> torch.Tensor:
    """Fill embedding row block ``b`` in place: N(0, 1) from the block's own seed, scaled per row."""
    gen = torch.Generator().manual_seed(tensor_seed(seed, f"{EMBED_NAME}#rows{b}"))
    rows.normal_(generator=gen)
    keep = _live_rows(b * ROW_BLOCK, rows.shape[0], live)
    live_values = rows[keep] * s.embed_std if keep else None
    rows.mul_(s.unused_embed_std)
    if live_values is not None:
        rows[keep] = live_values
    return rows


def _embedding(spec: ModelSpec, seed: int, live: LiveVocab, s: WeightScheme) -> torch.Tensor:
    out = torch.empty(spec.vocab, spec.hidden)
    for b in range(math.ceil(spec.vocab / ROW_BLOCK)):
        _fill_block(out[b * ROW_BLOCK : (b + 1) * ROW_BLOCK], b, seed, live, s)
    return out


def successors(live: LiveVocab, seed: int) -> dict[int, int]:
    """succ(t) for every live id: a derangement of the ordinary ids (no t -> t), specials -> random ordinary ids.

    Specials are never successors, so a greedy walk does not stop at an end-of-sequence token.
    """
    gen = torch.Generator().manual_seed(tensor_seed(seed, "zoo.bigram.successors"))
    ords = list(live.ordinary)
    n = len(ords)
    perm = torch.randperm(n, generator=gen).tolist()
    # A single random cycle through a random order is a derangement with one long cycle: greedy walks
    # from any token visit every ordinary token before repeating.
    succ = {ords[perm[k]]: ords[perm[(k + 1) % n]] for k in range(n)}
    picks = torch.randint(0, n, (len(live.special),), generator=gen).tolist()
    for sid, p in zip(live.special, picks, strict=True):
        succ[sid] = ords[p]
    return succ


def memory_neurons(spec: ModelSpec, live: LiveVocab, seed: int) -> dict[int, int]:
    """Which layer-0 intermediate neuron remembers which live token (spread over the whole width)."""
    gen = torch.Generator().manual_seed(tensor_seed(seed, "zoo.bigram.neurons"))
    slots = torch.randperm(spec.intermediate, generator=gen)[: len(live.all)].tolist()
    return dict(zip(live.all, slots, strict=True))


def generate_tensor(
    spec: ModelSpec,
    name: str,
    seed: int,
    scheme: WeightScheme | None = None,
    live: LiveVocab | None = None,
) -> torch.Tensor:
    """The float32 value of tensor ``name`` of a zoo model with ``spec``.

    ``live`` names the token ids a tokenizer can produce (the zoo passes its tokenizer's ids). Without
    it, ids ``0 .. min(vocab, intermediate) - 1`` are live, so a model without a tokenizer (toy
    dimensions in tests) still gets a memory neuron per live id. ``scheme.bigram = 0`` plants no memory.
    """
    s = scheme or WeightScheme()
    if live is None:
        live = default_live_vocab(spec)
    if name in (EMBED_NAME, "lm_head.weight"):
        return _embedding(spec, seed if name == EMBED_NAME else seed + 1, live, s)
    shape = _shape(spec, name)
    gen = torch.Generator().manual_seed(tensor_seed(seed, name))
    x = _normal(shape, gen)
    if name.endswith("norm.weight"):
        # Tied head: the successor's logit is ~ final_norm * bigram * hidden / rms(x); 1/hidden makes the
        # temperature the same for every hidden size.
        scale = s.logit_scale / spec.hidden if name == "model.norm.weight" else 1.0
        return x.mul_(s.norm_spread).add_(1.0).mul_(scale)
    if name.endswith(".bias"):
        return x.mul_(s.bias_std)
    fan_in = shape[1]
    if name.endswith("o_proj.weight"):
        return x.mul_(s.attn_out_gain / math.sqrt(fan_in * 2 * spec.n_layers))
    if name.endswith("down_proj.weight"):
        x.mul_(s.ffn_out_gain / math.sqrt(fan_in * 2 * spec.n_layers))
    else:
        x.mul_(s.in_gain / math.sqrt(fan_in))
    if s.bigram > 0 and name.startswith("model.layers.0.mlp.") and len(live.all) <= spec.intermediate:
        _plant_memory(spec, name, x, seed, s, live)
    return x


def _plant_memory(spec: ModelSpec, name: str, x: torch.Tensor, seed: int, s: WeightScheme, live: LiveVocab) -> None:
    """Overwrite the memory neurons' gate/up rows or down columns of layer 0 (see the module docstring)."""
    neurons = memory_neurons(spec, live, seed)
    ids = list(neurons)
    slots = torch.tensor([neurons[i] for i in ids])
    if name.endswith(("gate_proj.weight", "up_proj.weight")):
        # The FFN input is RMS-normalised (|n| ~ sqrt(hidden)), so a row key_gain * unit(E[t]) / sqrt(hidden)
        # gives a pre-activation of ~key_gain when the current token is t, and ~key_gain/sqrt(hidden) otherwise.
        keys = F.normalize(embedding_rows(spec, ids, seed, live, s), dim=1)
        x[slots] = keys * (s.key_gain / math.sqrt(spec.hidden))
    elif name.endswith("down_proj.weight"):
        succ = successors(live, seed)
        values = embedding_rows(spec, [succ[i] for i in ids], seed, live, s)
        fired = F.silu(torch.tensor(s.key_gain)) * s.key_gain  # the memory neuron's activation at full match
        x[:, slots] = (values * (s.bigram / fired)).T


def _shape(spec: ModelSpec, name: str) -> tuple[int, ...]:
    if name.startswith("model.layers."):
        return spec.layer_tensor_shapes(int(name.split(".")[2]))[name]
    return spec.tensor_shapes()[name]
