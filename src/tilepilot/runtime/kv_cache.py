"""The KV cache: per-layer K and V rows in the seq-first, packed layout the kernels read.

Row ``p`` of a layer is ``[k_p | v_p]`` (``2 * kv_heads * head_dim`` bf16), exactly what the K/V
projections (after RoPE on K) write and what the attention family streams, so a write is a row copy
and attention reads the cache in place: no transpose, no packing copy. Storage grows by doubling up to
the model's context so a short chat does not reserve the full context of a 128k-position model.

``fmt`` "q8_0" or "q4_0" (``model.quant.KV_FORMATS``) stores each row as GGUF blocks of 32 values (uint8, 34 or 18
bytes per 32, against 64 in bf16): ``write`` quantizes on the host (a CPU group's write), ``write_stored`` takes rows a
``kvquant`` launch already packed, ``packed`` hands attention the stored rows as they are, and ``keys``/``values``
decode them (the host attention path).
"""

from __future__ import annotations

import torch

from tilepilot.errors import InputError
from tilepilot.model.quant import check_kv_format, kv_unit, kv_values, pack_kv_rows


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
        fmt: str = "bf16",
    ):
        check_kv_format(fmt, None if fmt == "bf16" else kv_dim)
        self.n_layers = n_layers
        self.kv_dim = kv_dim
        self.max_positions = max_positions
        self.fmt = fmt
        # a stored row: [k | v] in ``dtype``, or the uint8 bytes of its blocks
        self.row_width = 2 * kv_dim if fmt == "bf16" else kv_unit(fmt, 2 * kv_dim)[0]
        self.dtype = dtype if fmt == "bf16" else torch.uint8
        self.device = torch.device(device)  # "meta" for dry runs: shapes and lengths only, no storage
        self.length = 0
        self._capacity = 0
        self._rows: list[torch.Tensor] = []
        self._grow(min(max(1, initial_capacity), max_positions))

    @property
    def capacity(self) -> int:
        return self._capacity

    def nbytes(self) -> int:
        return self.n_layers * self._capacity * self.row_width * self.dtype.itemsize

    def _grow(self, needed: int, limit: int | None = None) -> None:
        if needed <= self._capacity:
            return
        limit = self.max_positions if limit is None else limit
        if needed > limit:
            raise InputError(
                f"the KV cache needs {needed} positions but the model's context is {self.max_positions}; "
                "shorten the prompt or generate fewer tokens"
            )
        cap = max(needed, min(limit, max(1, self._capacity) * 2))
        new = []
        for i in range(self.n_layers):
            rows = torch.zeros(cap, self.row_width, dtype=self.dtype, device=self.device)
            if self._rows:
                # Every stored row moves, not only the committed ones: a pass writes its new rows layer by layer
                # before ``advance`` commits them, and a later layer's kernel may grow the cache (a key block
                # padded past the capacity) while earlier layers' new rows are still uncommitted.
                rows[: self._capacity] = self._rows[i]
            new.append(rows)
        self._rows, self._capacity = new, cap

    def reserve(self, n_new: int) -> None:
        """Make room for ``n_new`` more positions (one reallocation at most)."""
        self._grow(self.length + n_new)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store rows for positions ``[length, length + T)`` of one layer (committed by ``advance``)."""
        t = k.shape[0]
        if self.fmt != "bf16":
            rows = torch.cat((k.reshape(t, self.kv_dim), v.reshape(t, self.kv_dim)), dim=1)
            self.write_stored(layer, pack_kv_rows(rows, self.fmt))
            return
        self._grow(self.length + t)
        rows = self._rows[layer][self.length : self.length + t]
        rows[:, : self.kv_dim].copy_(k.reshape(t, self.kv_dim))
        rows[:, self.kv_dim :].copy_(v.reshape(t, self.kv_dim))

    def write_stored(self, layer: int, stored: torch.Tensor) -> None:
        """Store rows already in the cache's format (a ``kvquant`` launch's output) for the next positions."""
        t = stored.shape[0]
        self._grow(self.length + t)
        self._rows[layer][self.length : self.length + t].copy_(stored.reshape(t, self.row_width))

    def _decoded(self, layer: int, n_new: int, half: int) -> torch.Tensor:
        """Half ``half`` (0: K, 1: V) of rows ``[0, length + n_new)`` of a quantized cache, decoded: its blocks are
        whole (a row's K part is a whole number of blocks), so only that half's bytes are decoded."""
        b = self.row_width // 2
        return kv_values(self._rows[layer][: self.length + n_new, half * b : (half + 1) * b], self.fmt)

    def keys(self, layer: int, n_new: int = 0) -> torch.Tensor:
        """K rows ``[0, length + n_new)`` of a layer (a strided view, no copy; decoded rows of a quantized cache)."""
        if self.fmt != "bf16":
            return self._decoded(layer, n_new, 0)
        return self._rows[layer][: self.length + n_new, : self.kv_dim]

    def values(self, layer: int, n_new: int = 0) -> torch.Tensor:
        if self.fmt != "bf16":
            return self._decoded(layer, n_new, 1)
        return self._rows[layer][: self.length + n_new, self.kv_dim :]

    def packed(self, layer: int, rows: int) -> torch.Tensor:
        """The first ``rows`` packed ``[k | v]`` rows of a layer as stored (bf16, or the blocks' bytes), in place.
        Rows past the cached positions (a kernel's padding to whole key blocks) hold finite values (zero blocks
        decode to zeros) and are masked by causality."""
        self._grow(rows, limit=max(rows, self.max_positions))
        return self._rows[layer][:rows]

    def advance(self, t: int) -> None:
        self.length += t

    def reset(self) -> None:
        self.length = 0

    def seek(self, length: int) -> None:
        """Pretend ``length`` positions are cached (dry runs time a decode step at a chosen context)."""
        self._grow(length)
        self.length = length
