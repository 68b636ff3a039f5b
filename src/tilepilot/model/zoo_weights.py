"""Random weights for zoo checkpoints: reproducible tensor by tensor, with a greedy path that means something.

Plain random weights make a poor test model. With an O(1) embedding and a tied LM head the model just
repeats its input token; with a small embedding its next-token distribution is a draw from ~N random
logits whose top-1/top-2 gap is so small that bf16 rounding (relative error ~1e-2 in activations)
flips the greedy token every few dozen steps, so a bf16 deployment could never reproduce 32 FP32
greedy tokens. The zoo therefore plants one small circuit in layer 0 of otherwise random weights:

* **A previous-token head.** Every live embedding row shares one direction ``u``. Query head 0 and KV
  head 0 of layer 0 read only ``u`` (so their q and k are the same for every token) and are shaped so
  that, after RoPE, the score peaks at relative offset 1 (``q . conj(k) = A e^{-i theta_j}`` on the
  six fastest rotary pairs). The head attends ~99% to the previous position at any context length up
  to ~2k, and its value/output path copies a projection of the previous token's embedding.
* **A successor memory in layer 0's FFN.** For every live token id ``p`` one intermediate neuron has
  gate and up rows along what the head writes for ``p``, and a down column equal to the embedding of
  ``succ(p)`` (a random single-cycle permutation of the ordinary tokens). The residual then carries
  ``bigram * E[succ(previous token)]`` and the tied LM head scores that token well above the rest.

So the greedy token is ``succ(token two positions back)`` with a wide margin: it survives bf16 noise,
the walk does not repeat, and it depends on attention, RoPE positions and the KV cache being right
(a stale or shifted cache changes the tokens). Everything else (the other heads, every other FFN
neuron, all later layers) is plain scaled-normal with a ``1/sqrt(2 * n_layers)`` output scale so the
residual stays O(1); it makes ranks 2..k and the probabilities depend on the whole context, which is
what the logit, cosine and top-k gates compare. Norm weights are ~1; rows of ids no token maps to
(reserved ids between the BPE vocab and the model vocab) are small, as in real checkpoints.

Every tensor comes from generators seeded by (seed, tensor name[, part]), so a tensor's values do not
depend on the order of writing and any tensor can be regenerated alone. docs/zoo.md has the numbers.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tilepilot.model.spec import ModelSpec

EMBED_NAME = "model.embed_tokens.weight"
L0 = "model.layers.0."
# Embedding rows are generated in blocks with their own seeds, so the rows of a few token ids can be
# regenerated (for the memory) without generating a 150k-row matrix.
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

    embed_std: float = 1.0  # token-specific part of live rows
    unused_embed_std: float = 0.02  # rows of ids no token maps to ...
    unused_shift: float = 2.0  # ... which also point along -u (this times the live rows' u-part): low logits
    shared: float = 1.0  # live rows = embed_std * (z + shared * sqrt(hidden) * u): the position head's handle
    in_gain: float = 1.0  # q/k/v/gate/up: std = in_gain / sqrt(fan_in)
    attn_out_gain: float = 1.5  # o_proj: std = attn_out_gain / sqrt(fan_in * 2 * n_layers)
    ffn_out_gain: float = 1.5  # down_proj: std = ffn_out_gain / sqrt(fan_in * 2 * n_layers)
    norm_spread: float = 0.05  # RMSNorm weights ~ 1 + norm_spread * N(0, 1)
    logit_scale: float = 12.0  # final norm weights ~ logit_scale / hidden: sets the softmax temperature
    bias_std: float = 0.1  # Qwen2 q/k/v biases
    bigram: float = 3.0  # |E[succ(prev)] written by the memory| / |E[current token]|; 0 = no circuit
    key_gain: float = 5.0  # gate/up pre-activation of the memory neuron of the previous token
    prev_heads: int = 4  # KV heads (and the first query head of each) that attend to the previous token
    prev_pairs: int = 6  # fastest RoPE pairs the previous-token heads use
    prev_gap: float = 8.0  # its attention-score lead of offset 1 over offsets 0 and 2 (nats)
    prev_out: float = 1.0  # rms of what the previous-token head writes


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


# ---- embedding ---------------------------------------------------------------------------------


def shared_direction(hidden: int, seed: int) -> torch.Tensor:
    """The unit vector u every live embedding row contains (lets a head see positions, not tokens)."""
    gen = torch.Generator().manual_seed(tensor_seed(seed, "zoo.shared_direction"))
    return F.normalize(torch.randn(hidden, generator=gen), dim=0)


def _fill_block(rows: torch.Tensor, b: int, seed: int, live: LiveVocab, s: WeightScheme) -> torch.Tensor:
    """Fill embedding row block ``b`` in place: N(0, 1) from the block's own seed, scaled per row."""
    gen = torch.Generator().manual_seed(tensor_seed(seed, f"{EMBED_NAME}#rows{b}"))
    rows.normal_(generator=gen)
    start, hidden = b * ROW_BLOCK, rows.shape[1]
    keep = [i - start for i in live.all if start <= i < start + rows.shape[0]]
    live_values = None
    u = shared_direction(hidden, seed)
    if keep:
        # token part: orthogonal to u with norm exactly sqrt(hidden), so every live row has the same
        # u-component and the same norm, and the previous-token head's q and k are the same for every token
        z = rows[keep]
        z -= torch.outer(z @ u, u)
        z *= math.sqrt(hidden) / z.norm(dim=1, keepdim=True)
        live_values = (z + s.shared * math.sqrt(hidden) * u) * s.embed_std
    # Unused ids: small rows pointing away from u. The residual always carries +u (every live row has it),
    # so their logits sit well below the live tokens', as a trained model's never-seen tokens do, instead of
    # 150k logits near 0 holding most of the softmax mass.
    rows.mul_(s.unused_embed_std).add_(u, alpha=-s.unused_shift * s.shared * math.sqrt(hidden) * s.embed_std)
    if live_values is not None:
        rows[keep] = live_values
    return rows


def embedding_rows(spec: ModelSpec, ids: list[int], seed: int, live: LiveVocab, scheme: WeightScheme) -> torch.Tensor:
    """Rows ``ids`` of the embedding, regenerated from their row blocks only."""
    out = torch.empty(len(ids), spec.hidden)
    blocks: dict[int, torch.Tensor] = {}
    for k, i in enumerate(ids):
        b = i // ROW_BLOCK
        if b not in blocks:
            n = min(ROW_BLOCK, spec.vocab - b * ROW_BLOCK)
            blocks[b] = _fill_block(torch.empty(n, spec.hidden), b, seed, live, scheme)
        out[k] = blocks[b][i - b * ROW_BLOCK]
    return out


def _embedding(spec: ModelSpec, seed: int, live: LiveVocab, s: WeightScheme) -> torch.Tensor:
    out = torch.empty(spec.vocab, spec.hidden)
    for b in range(math.ceil(spec.vocab / ROW_BLOCK)):
        _fill_block(out[b * ROW_BLOCK : (b + 1) * ROW_BLOCK], b, seed, live, s)
    return out


# ---- the previous-token head -----------------------------------------------------------------------


def rope_inv_freq(spec: ModelSpec) -> torch.Tensor:
    """Rotary inverse frequencies as Hugging Face computes them, including llama3 scaling."""
    hd = spec.head_dim
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = spec.rope_scaling
    if rs is None:
        return inv
    wavelen = 2 * math.pi / inv
    low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
    high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
    scaled = torch.where(wavelen > low_wavelen, inv / rs.factor, inv)
    smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
        rs.high_freq_factor - rs.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def prev_heads(spec: ModelSpec, s: WeightScheme) -> tuple[list[int], list[int]]:
    """(query heads, KV heads) of the previous-token circuit: KV heads 0..m-1 and the first query head of each.

    Several heads, because the memory can only tell tokens apart by what the heads copy: m heads copy an
    (m * head_dim)-dimensional image of the previous token, and crosstalk between tokens shrinks with it.
    """
    m = max(1, min(s.prev_heads, spec.n_kv_heads))
    return [j * spec.group_size for j in range(m)], list(range(m))


def _rows(heads: list[int], hd: int) -> torch.Tensor:
    return torch.cat([torch.arange(h * hd, (h + 1) * hd) for h in heads])


def _pairs(spec: ModelSpec, s: WeightScheme) -> int:
    return max(1, min(s.prev_pairs, spec.head_dim // 4))


def prev_head_qk(spec: ModelSpec, s: WeightScheme) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Constant q and k (length head_dim) whose RoPE score peaks at relative offset 1.

    In the rotate-half layout dims (j, j + hd/2) form a complex number rotated by position * theta_j, so
    the score is Re(q conj(k) e^{i theta_j (m - n)}) summed over pairs. With k_j = kappa and
    q_j = kappa e^{-i theta_j} it is kappa^2 sum_j cos(theta_j (delta - 1)) / sqrt(hd): largest at
    delta = 1. kappa is set so that offsets 0 and 2 score ``prev_gap`` below offset 1.
    """
    hd, h, p = spec.head_dim, spec.head_dim // 2, _pairs(spec, s)
    theta = rope_inv_freq(spec)[:p]
    kappa = math.sqrt(s.prev_gap * math.sqrt(hd) / float((1 - theta.cos()).sum()))
    q = torch.zeros(hd, dtype=torch.float64)
    k = torch.zeros(hd, dtype=torch.float64)
    k[:p] = kappa
    q[:p] = kappa * theta.cos()
    q[h : h + p] = -kappa * theta.sin()
    return q.float(), k.float(), kappa


def _plant_prev_head_qk(spec: ModelSpec, name: str, x: torch.Tensor, seed: int, s: WeightScheme) -> None:
    q, k, _ = prev_head_qk(spec, s)
    target = q if ".q_proj." in name else k
    # rmsnorm(E) has a u-component of shared * sqrt(hidden) / sqrt(1 + shared^2) for every live token
    along_u = s.shared * math.sqrt(spec.hidden) / math.sqrt(1 + s.shared**2)
    q_heads, kv_heads = prev_heads(spec, s)
    rows = _rows(q_heads if ".q_proj." in name else kv_heads, spec.head_dim)
    x[rows] = torch.outer(target, shared_direction(spec.hidden, seed) / along_u).repeat(len(q_heads), 1)


def _qk_norm_gain(spec: ModelSpec, w: torch.Tensor, s: WeightScheme) -> None:
    """Qwen3 RMS-normalises q and k per head; scale the designed dims back to the designed magnitude."""
    _, _, kappa = prev_head_qk(spec, s)
    hd, h, p = spec.head_dim, spec.head_dim // 2, _pairs(spec, s)
    gain = kappa / math.sqrt(hd / p)  # a vector with energy p * kappa^2 normalises to entries * sqrt(hd/p)/kappa
    w[:p] *= gain
    w[h : h + p] *= gain


# ---- the successor memory ----------------------------------------------------------------------------


def successors(live: LiveVocab, seed: int) -> dict[int, int]:
    """succ(t) for every live id: one random cycle through the ordinary ids; specials -> random ordinary ids.

    A single cycle has no fixed points and no short loops, so greedy walks do not repeat; specials are
    never successors, so a greedy walk does not stop at an end-of-sequence token.
    """
    gen = torch.Generator().manual_seed(tensor_seed(seed, "zoo.bigram.successors"))
    ords = list(live.ordinary)
    n = len(ords)
    perm = torch.randperm(n, generator=gen).tolist()
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


def memory_keys(spec: ModelSpec, ids: list[int], seed: int, live: LiveVocab, s: WeightScheme) -> torch.Tensor:
    """Gate/up rows: the direction of what the previous-token head writes for each id, at a common scale.

    The head writes OV(rmsnorm(E[p])); centred over the live ids (the shared part is the same for all)
    that is c_p. A row k_p = unit(c_p) * rms(x) / mean|c| responds ~1 when x holds c_p once. Rows are
    unit directions on purpose: scaling each row by 1/|c_p| would equalise the matches but let a token
    with a small c_p fire for its neighbours (crosstalk grows as 1/|c_p|).
    """
    rows = embedding_rows(spec, list(live.all), seed, live, s)
    norm_w = generate_tensor(spec, L0 + "input_layernorm.weight", seed, s, live)
    n = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + spec.rms_eps) * norm_w
    q_heads, kv_heads = prev_heads(spec, s)
    wv = generate_tensor(spec, L0 + "self_attn.v_proj.weight", seed, s, live)
    wo = generate_tensor(spec, L0 + "self_attn.o_proj.weight", seed, s, live)
    bv = generate_tensor(spec, L0 + "self_attn.v_proj.bias", seed, s, live) if spec.qkv_bias else None
    ov = torch.zeros(len(live.all), spec.hidden)
    for qh, kvh in zip(q_heads, kv_heads, strict=True):
        v = n @ wv[_rows([kvh], spec.head_dim)].T
        if bv is not None:
            v += bv[_rows([kvh], spec.head_dim)]
        ov += v @ wo[:, _rows([qh], spec.head_dim)].T
    # rms of the residual the FFN normalises: E[t] + what the head writes + the other heads' output
    rms_x = math.sqrt(float(rows.pow(2).mean()) + float(ov.pow(2).mean()) + s.attn_out_gain**2 / (2 * spec.n_layers))
    ov -= ov.mean(0, keepdim=True)
    index = {t: i for i, t in enumerate(live.all)}
    c = ov[[index[t] for t in ids]]
    return c * (rms_x / c.pow(2).sum(1, keepdim=True))


def _plant_memory(spec: ModelSpec, name: str, x: torch.Tensor, seed: int, s: WeightScheme, live: LiveVocab) -> None:
    """Overwrite the memory neurons' gate/up rows or down columns of layer 0."""
    neurons = memory_neurons(spec, live, seed)
    ids = list(neurons)
    slots = torch.tensor([neurons[i] for i in ids])
    if name.endswith(("gate_proj.weight", "up_proj.weight")):
        x[slots] = memory_keys(spec, ids, seed, live, s) * s.key_gain
    else:  # down_proj: write the successor's token-specific embedding, bigram times |E[t]|
        succ = successors(live, seed)
        values = embedding_rows(spec, [succ[i] for i in ids], seed, live, s)
        values -= s.shared * math.sqrt(spec.hidden) * shared_direction(spec.hidden, seed) * s.embed_std
        fired = float(F.silu(torch.tensor(s.key_gain))) * s.key_gain  # silu(gate) * up at full match
        x[:, slots] = (values * (s.bigram / fired)).T


# ---- one tensor ---------------------------------------------------------------------------------


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
    dimensions in tests) still gets the circuit. ``scheme.bigram = 0`` gives plain random weights.
    """
    s = scheme or WeightScheme()
    if live is None:
        live = default_live_vocab(spec)
    circuit = s.bigram > 0 and len(live.all) <= spec.intermediate
    if name in (EMBED_NAME, "lm_head.weight"):
        return _embedding(spec, seed if name == EMBED_NAME else seed + 1, live, s)
    shape = _shape(spec, name)
    x = _normal(shape, torch.Generator().manual_seed(tensor_seed(seed, name)))
    if name.endswith("norm.weight"):
        x.mul_(s.norm_spread).add_(1.0)
        if name == "model.norm.weight":
            # tied head: logits ~ final_norm * |E|^2 / rms(x) ~ hidden; 1/hidden gives every size one temperature
            x.mul_(s.logit_scale / spec.hidden)
        elif circuit and name.startswith(L0) and name.endswith(("q_norm.weight", "k_norm.weight")):
            _qk_norm_gain(spec, x, s)
        return x
    if name.endswith(".bias"):
        x.mul_(s.bias_std)
        if circuit and name.startswith(L0) and not name.endswith("v_proj.bias"):
            q_heads, kv_heads = prev_heads(spec, s)
            x[_rows(q_heads if ".q_proj." in name else kv_heads, spec.head_dim)] = 0.0  # token- and offset-free
        return x
    fan_in = shape[1]
    if name.endswith("o_proj.weight"):
        x.mul_(s.attn_out_gain / math.sqrt(fan_in * 2 * spec.n_layers))
        if circuit and name.startswith(L0):
            q_heads, _ = prev_heads(spec, s)
            cols = _rows(q_heads, spec.head_dim)
            gen = torch.Generator().manual_seed(tensor_seed(seed, name + "#prev"))
            x[:, cols] = torch.randn(spec.hidden, len(cols), generator=gen) * (s.prev_out / math.sqrt(len(cols)))
        return x
    if name.endswith("down_proj.weight"):
        x.mul_(s.ffn_out_gain / math.sqrt(fan_in * 2 * spec.n_layers))
    else:
        x.mul_(s.in_gain / math.sqrt(fan_in))
    if circuit and name in (L0 + "self_attn.q_proj.weight", L0 + "self_attn.k_proj.weight"):
        _plant_prev_head_qk(spec, name, x, seed, s)
    if circuit and name.startswith(L0 + "mlp."):
        _plant_memory(spec, name, x, seed, s, live)
    return x


def _shape(spec: ModelSpec, name: str) -> tuple[int, ...]:
    if name.startswith("model.layers."):
        return spec.layer_tensor_shapes(int(name.split(".")[2]))[name]
    return spec.tensor_shapes()[name]
