"""The KV cache: per-layer K and V rows in the seq-first layout the projections produce.

Rows are ``[position, kv_heads * head_dim]`` in bf16, exactly what the K/V projection (after RoPE on
K) writes, so a write is a row copy and never a transpose. Storage grows by doubling up to the
model's context so a short chat does not reserve the full context of a 128k-position model.
"""

from __future__ import annotations

import torch

from tilepilot.errors import InputError


class KVCache:
    """K/V rows of every layer; ``length`` counts positions committed by ``advance``."""

    def __init__(
        self,
        n_layers: int,
        kv_dim: int,
        max_positions: int,
        initial_capacity: int = 256,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ):
        self.n_layers = n_layers
        self.kv_dim = kv_dim
        self.max_positions = max_positions
        self.dtype = dtype
        self.device = torch.device(device)  # "meta" for dry runs: shapes and lengths only, no storage
        self.length = 0
        self._capacity = 0
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self._grow(min(max(1, initial_capacity), max_positions))

    @property
    def capacity(self) -> int:
        return self._capacity

    def nbytes(self) -> int:
        return 2 * self.n_layers * self._capacity * self.kv_dim * torch.finfo(self.dtype).bits // 8

    def _grow(self, needed: int) -> None:
        if needed <= self._capacity:
            return
        if needed > self.max_positions:
            raise InputError(
                f"the KV cache needs {needed} positions but the model's context is {self.max_positions}; "
                "shorten the prompt or generate fewer tokens"
            )
        cap = max(needed, min(self.max_positions, max(1, self._capacity) * 2))
        new_k, new_v = [], []
        for i in range(self.n_layers):
            k = torch.zeros(cap, self.kv_dim, dtype=self.dtype, device=self.device)
            v = torch.zeros(cap, self.kv_dim, dtype=self.dtype, device=self.device)
            if self._k:
                k[: self.length] = self._k[i][: self.length]
                v[: self.length] = self._v[i][: self.length]
            new_k.append(k)
            new_v.append(v)
        self._k, self._v, self._capacity = new_k, new_v, cap

    def reserve(self, n_new: int) -> None:
        """Make room for ``n_new`` more positions (one reallocation at most)."""
        self._grow(self.length + n_new)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store rows for positions ``[length, length + T)`` of one layer (committed by ``advance``)."""
        t = k.shape[0]
        self._grow(self.length + t)
        self._k[layer][self.length : self.length + t].copy_(k.reshape(t, self.kv_dim))
        self._v[layer][self.length : self.length + t].copy_(v.reshape(t, self.kv_dim))

    def keys(self, layer: int, n_new: int = 0) -> torch.Tensor:
        """K rows ``[0, length + n_new)`` of a layer (a view, no copy)."""
        return self._k[layer][: self.length + n_new]

    def values(self, layer: int, n_new: int = 0) -> torch.Tensor:
        return self._v[layer][: self.length + n_new]

    def advance(self, t: int) -> None:
        self.length += t

    def reset(self) -> None:
        self.length = 0

    def seek(self, length: int) -> None:
        """Pretend ``length`` positions are cached (dry runs time a decode step at a chosen context)."""
        self._grow(length)
        self.length = length
