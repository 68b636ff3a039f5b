"""Weight formats: bf16 and the block formats Q4_0, Q4_1 (Q4NX-style affine) and Q8_0, packed as GGUF stores them.

A quantized [N, K] weight is cut along K into blocks of ``block`` values (GGUF: 32). Every block is stored
as its own bytes, exactly the GGUF layout generalised to any even block size:

- ``q4_0``: fp16 scale d, then block/2 bytes of 4-bit codes q in 0..15; w = d * (q - 8) (signed 4-bit);
- ``q4_1``: fp16 scale d, fp16 min m, then block/2 bytes of codes; w = d * q + m (AIR's Q4NX encoding);
- ``q8_0``: fp16 scale d, then block int8 codes; w = d * q.

Nibbles are stored as GGUF does: byte j of a block holds element j in its low nibble and element
j + block/2 in its high nibble. ``QuantTensor.data`` is the packed uint8 array [N, K/block * block_bytes]
(what the NPU streams, byte for byte); ``dequantize`` computes fp32 values with the same operations, in
the same order, as ``gguf.quants.dequantize`` (bit-identical on GGUF blocks), and ``deployed`` rounds
them once to bf16: the weight the compute tile multiplies and the oracle runs.

Quantizing a bf16 weight is round-to-nearest per block (``quantize``): q4_0 and q8_0 take d = absmax /
-8 (signed code of largest magnitude, as llama.cpp) resp. absmax / 127; q4_1 takes d = (max - min) / 15 and
m = min. Errors are bounded by half a step plus fp16 rounding of d and m (``error_bound``).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from tilepilot.errors import ConfigError
from tilepilot.model.weights import LAYER_TENSOR_NAMES

FORMATS = ("bf16", "q4_0", "q4_1", "q8_0")
QUANT_FORMATS = ("q4_0", "q4_1", "q8_0")
GGUF_BLOCK = 32
KV_FORMATS = ("bf16", "q8_0", "q4_0")  # KV-cache formats (see ``pack_kv_rows`` at the end)
# Tensors kept in bf16 by default in a quantized deployment (the user may override): the embedding table is
# a row gather, not a GEMV, and the LM head decides every token (AIR's Q4NX keeps its head in bf16).
DEFAULT_BF16_TENSORS = ("embed", "lm_head")


def _check_fmt(fmt: str, block: int) -> None:
    if fmt not in QUANT_FORMATS:
        raise ConfigError(f"weight format {fmt!r} is not a block format; use one of {QUANT_FORMATS}")
    if block < 2 or block % 2:
        raise ConfigError(f"block size {block} must be an even number >= 2 (GGUF uses {GGUF_BLOCK})")


def header_bytes(fmt: str) -> int:
    """Bytes of per-block parameters: fp16 scale, plus fp16 min for q4_1."""
    return 4 if fmt == "q4_1" else 2


def code_bytes(fmt: str, block: int) -> int:
    return block if fmt == "q8_0" else block // 2


def block_bytes(fmt: str, block: int = GGUF_BLOCK) -> int:
    """Stored bytes of one block (GGUF, block 32: q4_0 18, q4_1 20, q8_0 34)."""
    _check_fmt(fmt, block)
    return header_bytes(fmt) + code_bytes(fmt, block)


def row_bytes(fmt: str, k: int, block: int = GGUF_BLOCK) -> int:
    if k % block:
        raise ConfigError(f"K={k} is not a whole number of {block}-value blocks; pick a block size dividing K")
    return k // block * block_bytes(fmt, block)


def bits_per_weight(fmt: str, block: int = GGUF_BLOCK) -> float:
    return 16.0 if fmt == "bf16" else 8.0 * block_bytes(fmt, block) / block


@dataclass
class QuantTensor:
    """A packed [n, k] weight: ``data`` uint8 [n, k / block * block_bytes] in the GGUF block layout."""

    fmt: str
    n: int
    k: int
    block: int
    data: torch.Tensor = field(repr=False)

    def __post_init__(self) -> None:
        _check_fmt(self.fmt, self.block)
        want = (self.n, row_bytes(self.fmt, self.k, self.block))
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != want:
            raise ConfigError(
                f"packed {self.fmt} weight [{self.n}, {self.k}] needs uint8 data of shape {list(want)}, got "
                f"{self.data.dtype} {list(self.data.shape)}"
            )

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())

    def dequantize(self) -> torch.Tensor:
        """fp32 [n, k], bit-identical to ``gguf.quants.dequantize`` on the same blocks."""
        return dequantize_packed(self.data, self.fmt, self.block).reshape(self.n, self.k)

    def deployed(self) -> torch.Tensor:
        """The bf16 weight the deployment computes with (dequantized, rounded once to nearest-even)."""
        return self.dequantize().to(torch.bfloat16)

    def rows(self, index: torch.Tensor | list[int]) -> QuantTensor:
        """A row permutation / selection (blocks run along K, so whole packed rows move)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        return QuantTensor(self.fmt, int(idx.numel()), self.k, self.block, self.data[idx].contiguous())


# ----------------------------------------------------------------------------------------------------------------------
# dequantization (the compute tile's and the oracle's; same operations as gguf-py)
# ----------------------------------------------------------------------------------------------------------------------
def _split(blocks: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(d fp32 [b,1], m fp32 [b,1] or None, code bytes [b, c]) of blocks uint8 [b, block_bytes]."""
    d = blocks[:, 0:2].contiguous().view(torch.float16).to(torch.float32)
    if fmt == "q4_1":
        m = blocks[:, 2:4].contiguous().view(torch.float16).to(torch.float32)
        return d, m, blocks[:, 4:]
    return d, None, blocks[:, 2:]


def unpack_codes(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """Integer codes per value of code bytes [b, c]: q4 -> 0..15 (low nibbles first, then high), q8 -> int8."""
    if fmt == "q8_0":
        return codes.contiguous().view(torch.int8).to(torch.int16)
    lo, hi = codes & 0x0F, codes >> 4
    return torch.cat((lo, hi), dim=1).to(torch.int16)


def dequantize_blocks(blocks: torch.Tensor, fmt: str) -> torch.Tensor:
    """fp32 [b, block] values of packed blocks uint8 [b, block_bytes] (gguf-py's order of operations)."""
    d, m, codes = _split(blocks, fmt)
    q = unpack_codes(codes, fmt)
    if fmt == "q4_0":
        return d * (q - 8).to(torch.float32)
    if fmt == "q4_1":
        return d * q.to(torch.float32) + m  # two roundings (no FMA), as numpy does
    return q.to(torch.float32) * d


def dequantize_packed(data: torch.Tensor, fmt: str, block: int) -> torch.Tensor:
    """fp32 values of packed rows uint8 [..., n_blocks * block_bytes], shape [..., n_blocks * block]."""
    bb = block_bytes(fmt, block)
    lead = data.shape[:-1]
    blocks = data.reshape(-1, bb)
    return dequantize_blocks(blocks, fmt).reshape(*lead, data.shape[-1] // bb * block)


class _DeployedCache:
    """The bf16 weights of packed tensors already dequantized, while those tensors live.

    Emulating the compute tile's dequantization means decoding every packed weight on every call of a kernel's
    fast path: a decode step of the trained SmolLM2-135M spent more than half its host time there. The packed
    tensor of a deployment lives as long as its runner, so its decoded bf16 copy is kept beside it (weakly keyed:
    an entry goes when its tensor does; an in-place write to the tensor bumps its version and misses). Memory:
    two bytes per weight on top of the packed ones, bounded by ``max_bytes`` (beyond it, decoding as before).
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: dict[int, tuple[weakref.ref, int, str, int, torch.Tensor]] = {}

    def get(self, data: torch.Tensor, fmt: str, block: int) -> torch.Tensor:
        key = id(data)
        hit = self._entries.get(key)
        if hit is not None and hit[0]() is data and hit[1:4] == (data._version, fmt, block):
            return hit[4]
        w = dequantize_packed(data, fmt, block).to(torch.bfloat16)
        if hit is not None:
            self._drop(key)
        if self.bytes + w.numel() * 2 <= self.max_bytes:
            self._entries[key] = (weakref.ref(data, lambda _, k=key: self._drop(k)), data._version, fmt, block, w)
            self.bytes += w.numel() * 2
        return w

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry[4].numel() * 2


DEPLOYED_CACHE_BYTES = 8 << 30  # the bf16 weights of a ~4B-parameter model
_deployed = _DeployedCache(DEPLOYED_CACHE_BYTES)


def deployed_packed(data: torch.Tensor, fmt: str, block: int) -> torch.Tensor:
    """The bf16 weight of packed rows (``dequantize_packed`` rounded once), decoded once per live packed tensor."""
    return _deployed.get(data, fmt, block)


# ----------------------------------------------------------------------------------------------------------------------
# quantization (round to nearest, per block)
# ----------------------------------------------------------------------------------------------------------------------
def _fp16_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).contiguous().view(torch.uint8).reshape(-1, 2)


def quantize(w: torch.Tensor, fmt: str, block: int = GGUF_BLOCK) -> QuantTensor:
    """Round-to-nearest block quantization of a 2-D weight [n, k] (any float dtype) into ``fmt``."""
    _check_fmt(fmt, block)
    if w.dim() != 2:
        raise ConfigError(f"only 2-D weights are quantized, got shape {list(w.shape)}")
    n, k = (int(s) for s in w.shape)
    row_bytes(fmt, k, block)
    x = w.to(torch.float32).reshape(-1, block)
    if fmt == "q4_1":
        lo, hi = x.min(dim=1, keepdim=True).values, x.max(dim=1, keepdim=True).values
        d16 = ((hi - lo) / 15).to(torch.float16)
        m16 = lo.to(torch.float16)
        d, m = d16.to(torch.float32), m16.to(torch.float32)
        inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
        q = torch.round((x - m) * inv).clamp(0, 15).to(torch.uint8)
        header = torch.cat((_fp16_bytes(d16), _fp16_bytes(m16)), dim=1)
    else:
        idx = x.abs().argmax(dim=1, keepdim=True)
        peak = x.gather(1, idx)  # signed value of largest magnitude
        if fmt == "q4_0":
            d16 = (peak / -8).to(torch.float16)
            d = d16.to(torch.float32)
            inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
            q = (torch.round(x * inv) + 8).clamp(0, 15).to(torch.uint8)
        else:
            d16 = (peak.abs() / 127).to(torch.float16)
            d = d16.to(torch.float32)
            inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
            q = torch.round(x * inv).clamp(-127, 127).to(torch.int8).view(torch.uint8)
        header = _fp16_bytes(d16)
    if fmt == "q8_0":
        codes = q
    else:
        half = block // 2
        codes = q[:, :half] | (q[:, half:] << 4)
    data = torch.cat((header, codes), dim=1).reshape(n, -1).contiguous()
    return QuantTensor(fmt, n, k, block, data)


def error_bound(w: torch.Tensor, fmt: str, block: int = GGUF_BLOCK) -> torch.Tensor:
    """Per-block bound on |dequantize(quantize(w)) - w| (fp32 [n*k/block, 1]): a full step (the fp16 scale may
    round up or down, so codes at the range's ends can miss by more than half a step) plus fp16 min rounding."""
    x = w.to(torch.float32).reshape(-1, block)
    if fmt == "q4_1":
        lo, hi = x.min(dim=1, keepdim=True).values, x.max(dim=1, keepdim=True).values
        return (hi - lo) / 15 * 1.01 + lo.abs() * 2.0**-10 + 1e-30
    amax = x.abs().max(dim=1, keepdim=True).values
    step = amax / (8 if fmt == "q4_0" else 127)
    return step * 1.01 + 1e-30


def deployed_weight(w: torch.Tensor, fmt: str, block: int = GGUF_BLOCK) -> torch.Tensor | QuantTensor:
    """bf16 stays bf16; a block format packs (quantize) the weight."""
    if fmt == "bf16":
        return w.to(torch.bfloat16)
    return quantize(w, fmt, block)


# ----------------------------------------------------------------------------------------------------------------------
# GGUF blocks as stored
# ----------------------------------------------------------------------------------------------------------------------
GGUF_TYPES = {"Q4_0": "q4_0", "Q4_1": "q4_1", "Q8_0": "q8_0"}


def from_gguf_blocks(raw: np.ndarray, type_name: str, n: int, k: int) -> QuantTensor:
    """A QuantTensor over a GGUF tensor's stored bytes (no dequantize-requantize round trip)."""
    if type_name not in GGUF_TYPES:
        raise ConfigError(f"GGUF type {type_name} is not kept packed; kept packed are {sorted(GGUF_TYPES)}")
    fmt = GGUF_TYPES[type_name]
    data = torch.from_numpy(np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, -1).copy())
    return QuantTensor(fmt, n, k, GGUF_BLOCK, data)


def as_numpy_blocks(qt: QuantTensor) -> np.ndarray:
    """The packed bytes as GGUF's [n_blocks, block_bytes] uint8 array (for gguf.quants.dequantize)."""
    return qt.data.numpy().reshape(-1, block_bytes(qt.fmt, qt.block))


# ----------------------------------------------------------------------------------------------------------------------
# a deployment's weights
# ----------------------------------------------------------------------------------------------------------------------
LINEAR_FIELDS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


@dataclass(frozen=True)
class WeightFormat:
    """What a plan deploys: ``format`` for the layers' projections, ``block`` values per block, and the tensors
    kept in bf16 (``bf16_tensors``: "embed", "lm_head" and/or LayerWeights field names)."""

    format: str = "bf16"
    block: int = GGUF_BLOCK
    bf16_tensors: tuple[str, ...] = DEFAULT_BF16_TENSORS
    # how the KV cache stores K and V (``KV_FORMATS``): a number format of the deployment, as the weights' is
    kv_cache: str = "bf16"

    def problems(self) -> list[str]:
        out = []
        if self.format not in FORMATS:
            out.append(f"weights.format is {self.format!r}; use one of {FORMATS}")
        elif self.format != "bf16" and (self.block < 2 or self.block % 2):
            out.append(f"weights.block is {self.block}; use an even block size (GGUF: {GGUF_BLOCK})")
        if self.kv_cache not in KV_FORMATS:
            out.append(f"weights.kv_cache is {self.kv_cache!r}; use one of {KV_FORMATS}")
        return out

    @property
    def quantized(self) -> bool:
        return self.format != "bf16"

    def packs(self, field_name: str) -> bool:
        return self.quantized and field_name in LINEAR_FIELDS and field_name not in self.bf16_tensors

    @property
    def packs_head(self) -> bool:
        """The LM head is packed too (``"lm_head"`` left out of ``bf16_tensors``); the embedding gather never is."""
        return self.quantized and "lm_head" not in self.bf16_tensors

    @classmethod
    def from_dict(cls, d: dict | None) -> WeightFormat:
        d = dict(d or {})
        if "bf16_tensors" in d:
            d["bf16_tensors"] = tuple(d["bf16_tensors"])
        return cls(**d)


class QuantizedWeights:
    """A WeightSource for the deployed model: every projection the format packs is a ``QuantTensor``
    (``packed(i, field)``) and ``layer(i)`` hands out its *deployed* bf16 values (dequantized, rounded once),
    so the oracle built on this source computes with exactly the weights the NPU multiplies.

    ``stored`` maps Hugging Face names to packed GGUF blocks (``packed_gguf_weights``): those are used as
    stored when their format is the deployment's; everything else is quantized round-to-nearest from bf16.
    """

    def __init__(self, source, fmt: WeightFormat, stored: Mapping[str, QuantTensor] | None = None):
        self.source = source
        self.spec = source.spec
        self.format = fmt
        self.stored = stored or {}
        self._packed: dict[tuple[int, str], QuantTensor] = {}
        self._head: QuantTensor | None = None
        self.used_stored = 0

    def packed(self, i: int, field_name: str) -> QuantTensor:
        key = (i, field_name)
        if key not in self._packed:
            hf = f"model.layers.{i}.{LAYER_TENSOR_NAMES[field_name]}"
            qt = self.stored.get(hf)
            if qt is not None and (qt.fmt, qt.block) == (self.format.format, self.format.block):
                self.used_stored += 1
            else:
                w = getattr(self.source.layer(i), field_name)
                if w.device.type == "meta":
                    n, k = w.shape
                    data = torch.empty(n, row_bytes(self.format.format, k, self.format.block), dtype=torch.uint8,
                                       device="meta")  # fmt: skip
                    qt = QuantTensor(self.format.format, n, k, self.format.block, data)
                else:
                    qt = quantize(w, self.format.format, self.format.block)
            self._packed[key] = qt
        return self._packed[key]

    def layer(self, i: int):
        lw = self.source.layer(i)
        if not self.format.quantized:
            return lw
        for f in LINEAR_FIELDS:
            w = getattr(lw, f)
            if self.format.packs(f) and w is not None and w.device.type != "meta":
                setattr(lw, f, self.packed(i, f).deployed())
        return lw

    def embed(self) -> torch.Tensor:
        return self.source.embed()

    def final_norm(self) -> torch.Tensor:
        return self.source.final_norm()

    def packed_head(self) -> QuantTensor:
        """The LM head packed in the deployment's format (round to nearest from the source's head, which for tied
        embeddings is the embedding table; the embedding gather itself stays bf16)."""
        if self._head is None:
            w = self.source.lm_head()
            if w.device.type == "meta":
                n, k = w.shape
                data = torch.empty(n, row_bytes(self.format.format, k, self.format.block), dtype=torch.uint8,
                                   device="meta")  # fmt: skip
                self._head = QuantTensor(self.format.format, n, k, self.format.block, data)
            else:
                self._head = quantize(w, self.format.format, self.format.block)
        return self._head

    def lm_head(self) -> torch.Tensor:
        """The head the deployment multiplies: the dequantized packed head when the format packs it."""
        if self.format.packs_head and self.source.lm_head().device.type != "meta":
            return self.packed_head().deployed()
        return self.source.lm_head()


def deployment_weights(source, fmt: WeightFormat | dict | None, stored: Mapping[str, QuantTensor] | None = None):
    """``source`` itself for bf16, else a ``QuantizedWeights`` over it (idempotent). Without ``stored``, the blocks
    the source's directory holds as its GGUF stored them (``Checkpoint.stored_blocks``) are used where they match."""
    fmt = fmt if isinstance(fmt, WeightFormat) else WeightFormat.from_dict(fmt)
    if not fmt.quantized or isinstance(source, QuantizedWeights):
        return source
    return QuantizedWeights(source, fmt, stored if stored is not None else getattr(source, "stored_blocks", None))


# ----------------------------------------------------------------------------------------------------------------------
# KV-cache formats: what the cache stores per position ([k | v] rows) and what attention computes with
# ----------------------------------------------------------------------------------------------------------------------
# "q8_0": every cached row cut into blocks of 32 values along the row (a KV head's 64 or 128 values are whole
# blocks), each stored as GGUF's Q8_0 block (fp16 scale, 32 int8 codes: 34 bytes for 64 of bf16), as llama.cpp's
# ``--cache-type-k/v q8_0``. Attention computes with the dequantized values rounded once to bf16, as the quantized
# GEMV does with its weights, and the oracle quantizes its own K and V the same way: a q8_0 cache is part of the
# model being deployed, and its error against a bf16 cache is reported, not hidden in a gate. "q4_0" is the same with
# Q4_0 blocks (18 bytes per 32 values; llama.cpp's ``--cache-type-k/v q4_0``): less to read back, more error.
def check_kv_format(fmt: str, width: int | None = None) -> None:
    """One sentence naming a KV-cache format this code cannot store, or a head width its blocks cannot hold in whole
    32-bit words (the DMA's unit)."""
    if fmt not in KV_FORMATS:
        raise ConfigError(f"KV-cache format {fmt!r} is unknown; use one of {KV_FORMATS}")
    if fmt != "bf16" and width is not None and (width % GGUF_BLOCK or row_bytes(fmt, width) % 4):
        raise ConfigError(
            f"a {fmt} KV cache stores blocks of {GGUF_BLOCK} values in whole 32-bit words per head (head_dim a "
            f"multiple of {2 * GGUF_BLOCK}), but a head holds {width} values; use a bf16 KV cache for this model"
        )


def kv_unit(fmt: str, values: int) -> tuple[int, str]:
    """(stored elements, their dtype) of ``values`` consecutive cached values: themselves in bf16, or the bytes of
    their blocks (a whole number of blocks)."""
    if fmt == "bf16":
        return values, "bf16"
    check_kv_format(fmt, values)
    return row_bytes(fmt, values), "uint8"


def pack_kv_rows(rows: torch.Tensor, fmt: str) -> torch.Tensor:
    """The stored form of cache rows [T, width]: bf16 as they are, or the format's blocks along each row (uint8)."""
    if fmt == "bf16":
        return rows.to(torch.bfloat16)
    check_kv_format(fmt, int(rows.shape[-1]))
    return quantize(rows.reshape(-1, rows.shape[-1]), fmt).data.reshape(*rows.shape[:-1], -1)


def kv_values(stored: torch.Tensor, fmt: str) -> torch.Tensor:
    """The bf16 values attention computes with, from stored cache rows: the rows, or their blocks dequantized
    and rounded once to bf16."""
    if fmt == "bf16":
        return stored
    check_kv_format(fmt)
    return dequantize_packed(stored, fmt, GGUF_BLOCK).to(torch.bfloat16)


def kv_deployed(rows: torch.Tensor, fmt: str) -> torch.Tensor:
    """What a cache of ``fmt`` gives back for rows written into it (the oracle's K and V under that cache), in the
    rows' own dtype: the rows themselves for bf16."""
    if fmt == "bf16":
        return rows
    return kv_values(pack_kv_rows(rows, fmt), fmt).to(rows.dtype)
