"""FP32 key/value cache of the oracle, one growable buffer per layer.

Keys are stored after RoPE (as every runtime stores them), so a decode step only rotates its own
token. Buffers grow by doubling instead of being sized for ``max_positions`` (131072 for Llama-3.2
would be gigabytes), and a forward pass commits its tokens only after every layer has written them,
so a pass that raises leaves the cache as it was.

``fmt`` (``model.quant.KV_FORMATS``): the cache format of the deployment; under "q8_0" (or "q4_0") every K and V
row goes through its blocks and back (``model.quant.kv_deployed``) as it is written, so the oracle runs the model
being deployed, cache included.
"""

from __future__ import annotations

import torch

from tilepilot.model.quant import check_kv_format, kv_deployed

_INITIAL_CAPACITY = 64


class KVCache:
    """Per-layer FP32 K and V of shape [capacity, n_kv_heads, head_dim]; ``length`` rows are valid."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, fmt: str = "bf16"):
        check_kv_format(fmt, None if fmt == "bf16" else head_dim)
        self.fmt = fmt
        self.n_layers = n_layers
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.length = 0
        self._k: list[torch.Tensor] = [self._empty(0) for _ in range(n_layers)]
        self._v: list[torch.Tensor] = [self._empty(0) for _ in range(n_layers)]

    def _empty(self, rows: int) -> torch.Tensor:
        return torch.zeros(rows, self.n_kv_heads, self.head_dim, dtype=torch.float32)

    def _reserve(self, layer: int, rows: int) -> None:
        cap = self._k[layer].shape[0]
        if rows <= cap:
            return
        new_cap = max(_INITIAL_CAPACITY, cap)
        while new_cap < rows:
            new_cap *= 2
        for store in (self._k, self._v):
            grown = self._empty(new_cap)
            grown[: self.length] = store[layer][: self.length]
            store[layer] = grown

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this call's ``k``/``v`` [T, n_kv, d] after the committed rows; return all rows so far."""
        t = k.shape[0]
        end = self.length + t
        self._reserve(layer, end)
        if self.fmt != "bf16":
            # rows of heads: the blocks never cross a head, so K and V quantize apart. The deployment writes bf16
            # K and V (its projections' and RoPE's outputs) into the cache, so the rows are rounded to bf16 first:
            # the blocks then hold the same codes the NPU's quantizer picks from the same values
            k = kv_deployed(k.reshape(t, -1).bfloat16(), self.fmt).to(k.dtype).reshape(k.shape)
            v = kv_deployed(v.reshape(t, -1).bfloat16(), self.fmt).to(v.dtype).reshape(v.shape)
        self._k[layer][self.length : end] = k
        self._v[layer][self.length : end] = v
        return self._k[layer][:end], self._v[layer][:end]

    def commit(self, t: int) -> None:
        """Make the ``t`` rows every layer just appended part of the cache."""
        self.length += t

    def keys(self, layer: int) -> torch.Tensor:
        return self._k[layer][: self.length]

    def values(self, layer: int) -> torch.Tensor:
        return self._v[layer][: self.length]

    def reset(self) -> None:
        """Forget all tokens and release the buffers."""
        self.length = 0
        self._k = [self._empty(0) for _ in range(self.n_layers)]
        self._v = [self._empty(0) for _ in range(self.n_layers)]
