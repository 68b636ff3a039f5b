"""The FP32 CPU oracle: the whole decoder with a KV cache, walked one layer at a time.

Everything the NPU deployment produces is judged against this. It reads weights through a
``WeightSource`` in the checkpoint's dtype and upcasts one layer at a time, so a full-size model runs
without an FP32 copy of all its weights; small models (FP32 size below ``FP32_CACHE_LIMIT_BYTES``)
keep their FP32 layers for speed. The LM head is applied in vocabulary chunks for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tilepilot.errors import CheckpointError, InputError
from tilepilot.model.spec import ModelSpec
from tilepilot.model.weights import LAYER_TENSOR_NAMES, LayerWeights, WeightSource
from tilepilot.oracle import ops
from tilepilot.oracle.capture import CaptureSet, capture_name
from tilepilot.oracle.kv_cache import KVCache
from tilepilot.oracle.layers import Recorder, decoder_layer
from tilepilot.oracle.rope import inv_freq_for

# cache_fp32=None caches FP32 layers only below this whole-model FP32 size (brief H2: 2 GiB), which
# covers test models and sub-0.5B models while keeping 1B+ models at one layer of FP32 at a time.
FP32_CACHE_LIMIT_BYTES = 2 * 1024**3

# LM-head rows upcast at once when the head is not cached: 16384 x hidden fp32 (128 MiB at 2048).
LM_HEAD_CHUNK_ROWS = 16384

TOP_K_RECORDED = 5

# Draft-and-verify rounds of ``greedy(draft=...)`` before it falls back to decoding token by token.
DRAFT_ROUNDS = 3


@dataclass
class OracleStep:
    """The result of one oracle call: FP32 logits [T, vocab] and the requested intermediates."""

    logits: torch.Tensor
    captures: dict[str, torch.Tensor] = field(default_factory=dict)
    start: int = 0  # absolute position of the first token of this call


@dataclass
class GreedyResult:
    """A greedy continuation: the new tokens and, per step, the top-5 ids and log-probabilities."""

    prompt: list[int]
    tokens: list[int]
    top5_per_step: list[list[int]]
    top5_logprobs: list[list[float]]
    logits_per_step: torch.Tensor | None = None  # [n_steps, vocab] FP32 when requested


def _recorder(want: CaptureSet, captures: dict[str, torch.Tensor], layer: int) -> Recorder:
    """A recorder that stores the requested points of ``layer`` into ``captures``."""

    def record(point: str, value: torch.Tensor) -> None:
        name = capture_name(layer, point)
        if want.wants(name):
            captures[name] = value

    return record


def _to_fp32_layer(w: LayerWeights) -> LayerWeights:
    return LayerWeights(**{name: t.to(torch.float32) for name, t in w.tensors().items()})


class Oracle:
    """FP32 reference forward of a decoder-only model with an FP32 KV cache."""

    def __init__(self, weights: WeightSource, *, cache_fp32: bool | None = None, kv_cache: str = "bf16"):
        self.weights = weights
        self.spec: ModelSpec = weights.spec
        fp32_bytes = self.spec.n_params * 4
        self.cache_fp32 = fp32_bytes < FP32_CACHE_LIMIT_BYTES if cache_fp32 is None else bool(cache_fp32)
        self._inv_freq = inv_freq_for(self.spec)
        self._kv = KVCache(self.spec.n_layers, self.spec.n_kv_heads, self.spec.head_dim, kv_cache)
        self._layers: dict[int, LayerWeights] = {}
        self._head: torch.Tensor | None = None
        # Uncached path: FP32 staging buffers reused by every layer and every call (one layer + one head chunk).
        self._stage: dict[str, torch.Tensor] = {}

    # ---- state -----------------------------------------------------------------------------
    @property
    def position(self) -> int:
        """Number of tokens held in the KV cache (the position the next token gets)."""
        return self._kv.length

    def reset(self) -> None:
        """Start a new sequence: empty the KV cache (cached FP32 weights are kept)."""
        self._kv.reset()

    # ---- public forward calls --------------------------------------------------------------
    def prefill(self, token_ids: Sequence[int], capture: bool | Iterable[str] = False) -> OracleStep:
        """Start a new sequence with ``token_ids``; logits [T, vocab] for every prompt position."""
        self.reset()
        return self.extend(token_ids, capture)

    def extend(self, token_ids: Sequence[int], capture: bool | Iterable[str] = False) -> OracleStep:
        """Append ``token_ids`` after the cached tokens (chunked prefill); logits [T, vocab]."""
        return self._forward(self._check_ids(token_ids), capture)

    def decode(self, token_id: int, capture: bool | Iterable[str] = False) -> OracleStep:
        """Append one token; logits [1, vocab] for the next position."""
        if self.position == 0:
            raise InputError("decode() needs a prefilled sequence; call prefill() with the prompt first")
        return self._forward(self._check_ids([token_id]), capture)

    def greedy(
        self,
        prompt_ids: Sequence[int],
        n_new: int,
        *,
        keep_logits: bool = False,
        stop_ids: Iterable[int] = (),
        draft: Callable[[list[int], int], Sequence[int]] | None = None,
    ) -> GreedyResult:
        """Greedy (argmax) continuation of ``prompt_ids`` by ``n_new`` tokens, from an empty cache.

        Stops early only at a token in ``stop_ids`` (none by default, so gates always compare
        ``n_new`` steps). Ties go to the lowest token id, as ``torch.argmax`` and transformers do.

        ``draft(prefix, n)`` may propose the continuation (e.g. the bf16 production runner's greedy): each
        proposal is verified in one FP32 pass (``score_continuation``) and accepted up to and including the
        oracle's own token at the first mismatch, so the result is the oracle's greedy whatever the draft says
        (up to FP32 summation order: a pass over many positions against step-by-step decoding). A good draft
        turns ``n_new`` passes over the weights into one or two; a bad one costs at most ``DRAFT_ROUNDS`` passes
        before the remaining tokens are decoded one by one.
        """
        if n_new < 1:
            raise InputError(f"n_new must be at least 1, got {n_new}")
        stops = set(stop_ids)
        prompt = [int(t) for t in prompt_ids]
        tokens: list[int] = []
        top_ids: list[list[int]] = []
        top_lp: list[list[float]] = []
        if draft is not None and not keep_logits and not stops:
            tokens, top_ids, top_lp = self._verified_draft(prompt, n_new, draft)
            if len(tokens) == n_new:
                return GreedyResult(prompt=prompt, tokens=tokens, top5_per_step=top_ids, top5_logprobs=top_lp)
        step = self.prefill(prompt + tokens)
        kept: list[torch.Tensor] = []
        while True:
            last = step.logits[-1]
            if keep_logits:
                kept.append(last.clone())
            logprobs = torch.log_softmax(last, dim=-1)
            top = torch.topk(logprobs, min(TOP_K_RECORDED, self.spec.vocab))
            top_ids.append(top.indices.tolist())
            top_lp.append(top.values.tolist())
            token = int(torch.argmax(last))
            tokens.append(token)
            if len(tokens) == n_new or token in stops:
                break
            step = self.decode(token)
        return GreedyResult(
            prompt=prompt,
            tokens=tokens,
            top5_per_step=top_ids,
            top5_logprobs=top_lp,
            logits_per_step=torch.stack(kept) if keep_logits else None,
        )

    def _verified_draft(
        self, prompt: list[int], n_new: int, draft: Callable[[list[int], int], Sequence[int]]
    ) -> tuple[list[int], list[list[int]], list[list[float]]]:
        """The longest greedy prefix the draft's proposals let one FP32 pass per round establish."""
        tokens: list[int] = []
        top_ids: list[list[int]] = []
        top_lp: list[list[float]] = []
        for _ in range(DRAFT_ROUNDS):
            remaining = n_new - len(tokens)
            if remaining == 0:
                break
            try:
                proposal = [int(t) for t in draft(prompt + tokens, remaining)][:remaining]
            except Exception:  # a draft is only a guess: whatever stops it, decode the rest the plain way
                break
            if not proposal or not all(0 <= t < self.spec.vocab for t in proposal):
                break
            _, scored = self.score_continuation(prompt + tokens, proposal)
            for i, token in enumerate(scored.tokens):
                tokens.append(token)
                top_ids.append(scored.top5_per_step[i])
                top_lp.append(scored.top5_logprobs[i])
                if token != proposal[i]:
                    break
        return tokens, top_ids, top_lp

    def score_continuation(
        self, prompt_ids: Sequence[int], tokens: Sequence[int], capture: bool | Iterable[str] = False
    ) -> tuple[OracleStep, GreedyResult]:
        """The oracle's own greedy choice at each step of a given continuation, from one prefill.

        One pass over ``prompt_ids + tokens[:-1]`` yields, at step ``i``, the oracle's argmax and top-5 given
        the prompt and ``tokens[:i]``. Up to and including the first step where that argmax differs from
        ``tokens[i]``, the contexts are the oracle's own greedy ones, so the result equals ``greedy()`` there;
        that is all a greedy token-set check reads (it stops at the first divergence). It costs one pass over
        the weights instead of one per token, which is what makes checking a full-size model's continuation
        affordable. Returns the prompt's part of the pass (logits and captures of the prompt positions only)
        and the per-step choices.
        """
        prompt, cont = [int(t) for t in prompt_ids], [int(t) for t in tokens]
        if not prompt or not cont:
            raise InputError("score_continuation needs a non-empty prompt and at least one continuation token")
        n = len(prompt)
        step = self.prefill(prompt + cont[:-1], capture)
        logits = step.logits
        choices = logits[n - 1 :]
        logprobs = torch.log_softmax(choices, dim=-1)
        top = torch.topk(logprobs, min(TOP_K_RECORDED, self.spec.vocab), dim=-1)
        result = GreedyResult(
            prompt=prompt,
            tokens=[int(t) for t in torch.argmax(choices, dim=-1)],
            top5_per_step=top.indices.tolist(),
            top5_logprobs=top.values.tolist(),
        )
        captures = {k: v[:n] for k, v in step.captures.items()}  # every capture is [positions, ...]
        return OracleStep(logits=logits[:n], captures=captures, start=0), result

    # ---- internals -------------------------------------------------------------------------
    def _check_ids(self, token_ids: Sequence[int]) -> torch.Tensor:
        try:
            ids = torch.as_tensor(list(token_ids) if not isinstance(token_ids, torch.Tensor) else token_ids)
        except (TypeError, ValueError):
            raise InputError("token ids must be a sequence of integers") from None
        if ids.dim() != 1 or ids.numel() == 0:
            raise InputError("token ids must be a non-empty 1-D sequence of integers")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise InputError(f"token ids must be integers, got dtype {ids.dtype}")
        ids = ids.to(torch.long)
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.spec.vocab:
            bad = lo if lo < 0 else hi
            raise InputError(f"token id {bad} is outside the vocabulary [0, {self.spec.vocab}); check the tokenizer")
        end = self.position + ids.numel()
        if end > self.spec.max_positions:
            raise InputError(
                f"the sequence would reach {end} tokens, beyond the model's {self.spec.max_positions} positions; "
                "use a shorter prompt or fewer new tokens"
            )
        return ids

    def _layer(self, i: int) -> LayerWeights:
        if i in self._layers:
            return self._layers[i]
        w = self.weights.layer(i)
        self._check_layer(i, w)
        if self.cache_fp32:
            w = _to_fp32_layer(w)
            self._layers[i] = w
            return w
        return LayerWeights(**{name: self._staged(name, t) for name, t in w.tensors().items()})

    def _staged(self, key: str, t: torch.Tensor) -> torch.Tensor:
        """``t`` in FP32, copied into a buffer reused from layer to layer (valid until the next layer is staged).

        Why not ``t.float()``: a fresh FP32 tensor per weight per call is fresh memory the kernel must fault in
        and zero, which cost 5x the conversion itself (a 64 MiB weight: 137 ms vs 28 ms into a reused buffer)
        and the uncached oracle pays it for every weight of every layer of every greedy step.
        """
        if t.dtype == torch.float32:
            return t
        buf = self._stage.get(key)
        if buf is None or buf.shape != t.shape:
            buf = self._stage[key] = torch.empty(t.shape, dtype=torch.float32)
        return buf.copy_(t)

    def _check_layer(self, i: int, w: LayerWeights) -> None:
        expected = self.spec.layer_tensor_shapes(i)
        prefix = f"model.layers.{i}."
        for name, tensor in w.tensors().items():
            hf_name = prefix + LAYER_TENSOR_NAMES[name]
            want = expected.get(hf_name)
            if want is None:
                raise CheckpointError(f"{hf_name} is present but the config does not use it; check config.json")
            if tuple(tensor.shape) != want:
                raise CheckpointError(
                    f"{hf_name} has shape {tuple(tensor.shape)} but the config implies {want}; "
                    "the checkpoint does not match config.json"
                )

    def _lm_head_weight(self) -> torch.Tensor:
        if self._head is not None:
            return self._head
        head = self.weights.lm_head()
        if tuple(head.shape) != (self.spec.vocab, self.spec.hidden):
            raise CheckpointError(
                f"the LM head has shape {tuple(head.shape)} but the config implies "
                f"{(self.spec.vocab, self.spec.hidden)}; the checkpoint does not match config.json"
            )
        if self.cache_fp32:
            self._head = head.to(torch.float32)
            return self._head
        return head

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        head = self._lm_head_weight()
        if head.dtype == torch.float32:
            return F.linear(h, head)
        out = torch.empty(h.shape[0], self.spec.vocab, dtype=torch.float32)
        for lo in range(0, self.spec.vocab, LM_HEAD_CHUNK_ROWS):
            hi = min(self.spec.vocab, lo + LM_HEAD_CHUNK_ROWS)
            buf = self._stage.get("lm_head")
            if buf is None or buf.shape[1] != self.spec.hidden:
                buf = self._stage["lm_head"] = torch.empty(LM_HEAD_CHUNK_ROWS, self.spec.hidden, dtype=torch.float32)
            out[:, lo:hi] = F.linear(h, buf[: hi - lo].copy_(head[lo:hi]))
        return out

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        table = self.weights.embed()
        if tuple(table.shape) != (self.spec.vocab, self.spec.hidden):
            raise CheckpointError(
                f"the embedding has shape {tuple(table.shape)} but the config implies "
                f"{(self.spec.vocab, self.spec.hidden)}; the checkpoint does not match config.json"
            )
        return table[ids].to(torch.float32)

    @torch.no_grad()
    def _forward(self, ids: torch.Tensor, capture: bool | Iterable[str]) -> OracleStep:
        spec = self.spec
        want = CaptureSet(capture, spec.n_layers)
        captures: dict[str, torch.Tensor] = {}
        start = self.position
        t = ids.numel()
        cos, sin = ops.rope_tables(torch.arange(start, start + t), self._inv_freq)

        x = self._embed(ids)
        for i in range(spec.n_layers):
            record = _recorder(want, captures, i) if want.wants_layer(i) else None
            x = decoder_layer(x, self._layer(i), spec, cos, sin, self._kv, i, record)

        final_norm = self.weights.final_norm()
        if tuple(final_norm.shape) != (spec.hidden,):
            raise CheckpointError(
                f"model.norm.weight has shape {tuple(final_norm.shape)} but the config implies ({spec.hidden},)"
            )
        h = ops.rmsnorm(x, final_norm, spec.rms_eps)
        if want.wants("final_norm"):
            captures["final_norm"] = h
        logits = self._logits(h)
        if want.wants("logits"):
            captures["logits"] = logits
        self._kv.commit(t)
        return OracleStep(logits=logits, captures=captures, start=start)
