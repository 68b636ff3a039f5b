"""Grouped-query attention, causal or not: prefill flash attention and decode attention over the KV cache.

One family, one dataflow: ``q_len`` queries at absolute positions ``kv_len - q_len ..`` attend to
``kv_len`` keys (prefill without a cache: q_len == kv_len; decode: q_len == 1, kv_len = context).
Query head h reads KV head h // (n_heads / n_kv_heads), as transformers' ``repeat_kv`` does.
``Shape.causal`` (default True, what a decoder runs) hides every key after its query; a non-causal shape (an
encoder, or AIR's non-causal registry rows) lets every query see all ``kv_len`` keys. ``Config.skip_masked``
(default True) is the design choice of whether a causal unit streams and computes only the key blocks its last
query can see, or every block (masked scores computed and discarded, as a kernel without block skipping does):
same numbers, different time.

Tensors (seq-first, as the projections write them; no host transposes):
- ``q`` [q_len, n_heads * head_dim] (after RoPE), ``o`` [q_len, n_heads * head_dim];
- ``kv`` [kv_pad, 2 * kv_dim]: row p = [k_p | v_p], the KV-cache layout this family reads (one DDR stream
  brings a key block and its value block together). ``kv_pad`` rounds kv_len up to whole key blocks;
  the padding rows must be finite (``prepare_inputs`` zero-fills them) and are masked by causality,
  since every query sits before them. A quantized cache (``Shape.kv_format`` "q8_0" or "q4_0", ``deploy
  --kv-cache``) stores each row as GGUF blocks of 32 values (uint8; a KV head's K or V part is whole blocks in whole
  32-bit words, so head_dim % 64 == 0): every fifo, tap and L1 figure below counts those bytes, and each streamed
  block is decoded in the tile (``key_block``: the values ``model.quant.kv_values`` gives every path and the oracle)
  before the arithmetic, which is then the bf16 cache's. The decode is the quantized GEMV's block decode, timed at
  that family's efficiency (``TileKernel.borrowed_ops``).

Dataflow. A unit of work is (a chunk of ``heads_per_col`` consecutive query heads, a batch of
``q_tiles_per_col`` consecutive tiles of ``tile_q`` queries). Units are dealt to ``cols`` columns (longest
first, to balance the causal triangle); inside a column, worker s * q_tiles_per_col + a (compute row 2 + that
index) computes head s of the chunk on query tile a of the batch, so all the column's workers on one KV head
need the same key/value blocks. Two ways to fill the rows, combinable: several heads of a GQA group
(heads_per_col must divide or be a multiple of the group), or several query tiles of the same heads, which
works for any grouping (a group of 7 has no useful head split over 4 rows):
- q: the unit's [heads, q_tiles_per_col * tile_q, head_dim] block through the shim into the column's memory
  tile, split into one [tile_q, head_dim] object per worker (straight to the worker when it is alone);
- kv: per key block, [tile_k, 2, head_dim] of the KV head, broadcast to the column's workers; when a
  chunk spans several KV heads (heads_per_col > group), the block carries them all and the memory tile
  splits it per KV head, each part broadcast to that head's workers;
- o: each worker's [tile_q, head_dim] result joined in the memory tile and drained to o.
Three DDR streams per column (q, kv in; o out) fit the shim's 2 + 2 channels on all 8 columns. A unit
only streams the key blocks its last query can see (causal skipping). With several query tiles per unit
that is what the batch's last tile needs: every worker acquires and releases every streamed block (a
broadcast fifo is read by all its consumers), but calls its kernel only on the blocks its own tile can see,
so the extra blocks cost DMA time (modeled per call) and no compute. Runtime tasks are grouped so a shim
never holds more BDs than it has.

Cascade dataflow (``Config.kv_stages`` > 1; AIR's registry kernel, ``attn_npu2.py``, ``cascade_configs``). A unit
is one head and a batch of ``share_cols`` query tiles on as many neighbouring columns; in each column
``kv_stages`` workers (one per row) split the tile's key blocks into contiguous segments of ``stage_blocks``, each
runs the online softmax over its segment, and the partial states (fp32 [tile_q, head_dim + 2]) merge down the
column through shared memory, stage after stage; the last stage finishes and writes o. One K/V stream per stage
feeds that stage in every column of the group (horizontal broadcast). With ``rounds`` every unit is one iteration
of a sequential launch loop (its own task group), as AIR's outer ``launch`` over query chunks and heads is. The
merge changes the numbers (p is rounded to bf16 against each stage's own running max), so the exact and the
production paths follow the stages (tested bit for bit against the tile path, within a bf16 ulp in production).
Timing charges each stage the merges on its critical path (stage s waits for the s - 1 before its own).

Flash-decoding (``Config.group_rows``, ``decode_cascade_configs``): the cascade for a decode step. A unit is one KV
head and its query tile's rows are the GQA group's query heads, so the stages split that head's keys and each
computes the whole group at once: every KV head is streamed once (the one-pass dataflow broadcasts one stream per
column, and each of its workers reads the whole key range of its head) and the MMUL's 4 rows hold 4 heads rather
than one query padded to 4. Numbers are the per-head cascade's (same stages, same keys; tested). With
``kv_channels`` = 2 the stages' K/V streams use both shim MM2S channels of the column and q rides the first
(``ObjectFifo.rides_with``), the same feed choice as the quantized GEMV's weights. With one K/V channel q rides it
too: q is one [group, head_dim] object per unit, and a channel of its own would idle the column's second MM2S
channel for the whole launch, the channel a resident pass's weight prefetch (``npu/prefetch.py``) can use while
attention computes (q's bytes queue ahead of the first key block: the launch is slower by q's transfer at most).

Numerics (flash attention with online softmax, fp32 state, bf16 in and out), per key block:
    s   = (q . k) exact sum of bf16 products -> fp32, times 1/sqrt(d) (fp32); masked (key after query) -> -inf
    m'  = max(m, rowmax s);  p = exp(s - m');  c = exp(m - m')            (fp32)
    l   = l * c + rowsum p                                                   (sum exact -> fp32)
    acc = acc * c + bf16(p) . v      (p rounded to bf16 for the MMUL; exact sum -> fp32)
    o   = bf16(acc / l) after the last block.
The tile path and ``fast(exact=True)`` evaluate exp in fp64 rounded to fp32 and sums exactly (fp64)
rounded to fp32, block by block, so they agree bit for bit. ``fast(exact=False)`` (production) computes
every block of a query chunk at once in fp32 and combines the blocks in closed form
(sum_b exp(m_b - m_last) x block_b instead of rescaling block after block): the same value up to fp32
rounding, so outputs differ from the exact path by a bf16 ulp on a small fraction of elements (tested).
AIR's measured kernel keeps the running statistics in bf16; this family keeps them in fp32 and pays for it
in tile memory (smaller tiles at head_dim 128).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace

import torch

from tilepilot.errors import ConfigError
from tilepilot.kernels._stream import shape_error
from tilepilot.kernels.qgemv import DEQUANT_OPS
from tilepilot.model.quant import kv_unit, kv_values, pack_kv_rows
from tilepilot.model.spec import ModelSpec
from tilepilot.npu import numerics as nx
from tilepilot.npu.design import (
    Acquire,
    Call,
    Design,
    ObjectFifo,
    Release,
    Runtime,
    TensorSpec,
    Tile,
    TileKernel,
    Worker,
    dtype_bytes,
    join,
    split,
)
from tilepilot.npu.device import FIRST_COMPUTE_ROW, MEM_ROW, SHIM_ROW, Device, npu2
from tilepilot.npu.timing import time_design
from tilepilot.npu.validate import CORE_STACK_BYTES, legal_taps, validate
from tilepilot.oracle import ops

FAMILY = "attention"
VARIANTS = ("vector", "scalar")
MMUL_M = 4  # bf16 MMUL 4x8x8 (mlir-aie _MM_MAC_DIMS["aie2p"]): query rows are computed in groups of 4
MMUL_KN = 8
# ESTIMATES of fp32 vector operations: per score (scale, mask select, running max, subtract, exp ~6 ops on
# an AIE without a native fp32 exp, row sum, bf16 convert of p), per accumulator element (rescale
# multiply and add), per query row and block (max merge, exp of the correction, l update, reduction trees).
OPS_PER_SCORE = 12
OPS_PER_ACC = 2
OPS_PER_ROW = 24
OPS_PER_OUTPUT = 3  # final divide by l and bf16 convert, per output element (once per unit)
FAST_CHUNK_ROWS = 256  # production fast path: queries per chunk (bounds host memory of the score matrix)
# ESTIMATES, cascade merge of two partial states (m, l, acc) per query row: per accumulator element two multiplies
# and an add (acc_a * c_a + acc_b * c_b); per row the same row work as a block's statistics (max, two exps, l).
OPS_PER_MERGE_ACC = 3
STATE_BYTES = 4  # a partial state passed between cascade stages: fp32 [tile_q, head_dim + 2] (acc | m | l)
# Call steps of a cascade stage's kernel besides key blocks (block calls use step = the key block's index).
_MERGE, _SEND, _FINISH = -1, -2, -3
AIR_Q_TILES = 4  # attn_npu2.py num_q_tiles: columns one head's K/V stream feeds (horizontal broadcast)


@dataclass(frozen=True)
class Shape:
    q_len: int
    kv_len: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    causal: bool = True
    kv_format: str = "bf16"  # how the cache stores its rows (``model.quant.KV_FORMATS``): bf16, or q8_0 blocks

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def q_start(self) -> int:
        """Absolute position of the first query."""
        return self.kv_len - self.q_len

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


@dataclass(frozen=True)
class Config:
    cols: int = 8
    heads_per_col: int = 4
    tile_q: int = 32
    tile_k: int = 64
    depth: int = 2  # depth of the key/value fifos (q and o are held per unit, depth 1)
    variant: str = "vector"
    q_tiles_per_col: int = 1  # consecutive query tiles of the same heads per unit, one per worker
    skip_masked: bool = True  # causal: stream/compute only the key blocks a unit can see (False: every block)
    # Cascade over the keys (AIR's registry kernel, ``num_cascade_stages``): this many workers of a column each take
    # one contiguous segment of a query tile's key blocks and the partial softmax states merge down the column.
    kv_stages: int = 1
    # Units run as sequential launch iterations (AIR's outer ``launch`` loop): each unit of a column is its own
    # runtime task group, so nothing overlaps across units and every unit pays the pipeline fill and drain.
    rounds: bool = False
    # Cascade: columns that share one unit's key/value stream (broadcast across them), each computing one query
    # tile of the unit's batch (AIR's ``num_q_tiles``: one K/V stream per head feeds 4 columns).
    share_cols: int = 1
    # Cascade decode (flash-decoding): a unit is one KV head, and the rows of its query tile are the GQA group's
    # query heads (tile_q queries x group heads), so the stages split that KV head's keys and each computes every
    # head of the group at once: the KV head is streamed once, in parts, and the MMUL's 4 rows hold 4 heads instead
    # of one query padded to 4.
    group_rows: bool = False
    # Shim MM2S channels carrying a cascade column's K/V: with 2 the stages' segments split over both channels of
    # the column's shim, and q rides the first (``ObjectFifo.rides_with``), as the quantized GEMV's weights do; with 1
    # q rides it under flash-decoding (the column's other channel left free).
    kv_channels: int = 1
    # Flash-decoding across columns (``group_rows`` only): a KV head's ``kv_stages`` stages laid over this many
    # neighbouring columns, ``kv_stages / kv_cols`` per column, the partial state passed up one column's compute rows
    # and back down the next (a snake: every hand-off between orthogonal neighbours, east at a turn, so through shared
    # memory on the tile both cores reach, ``npu.resources.shared_buffer_tile``). Each column feeds its own stages
    # from its own shim, so a model with few KV heads streams its cache over more shim channels than one column per
    # KV head has; q goes to every column of the unit, o leaves from the last.
    kv_cols: int = 1
    # The cache format the design reads (the shape's, ``Shape.kv_format``): data, not a tuning choice; the plan sets
    # it from its KV-cache format and every candidate carries the shape's.
    kv_format: str = "bf16"

    @property
    def workers_per_col(self) -> int:
        return self.heads_per_col * self.q_tiles_per_col * self.kv_stages // self.kv_cols

    @property
    def unit_cols(self) -> int:
        """Neighbouring columns one unit occupies: its shared query tiles', or its key segments' (``kv_cols``)."""
        return self.share_cols * self.kv_cols


def tile_rows(shape: Shape, config: Config) -> int:
    """Rows of one worker's query tile: ``tile_q`` queries, times the GQA group when its heads are rows."""
    return config.tile_q * (shape.group if config.group_rows else 1)


def shape_for(spec: ModelSpec, q_len: int, kv_len: int | None = None) -> Shape:
    """Prefill (kv_len None: no cache before the prompt) or decode/chunked-prefill attention of ``spec``."""
    return Shape(q_len, q_len if kv_len is None else kv_len, spec.n_heads, spec.n_kv_heads, spec.head_dim)


def kv_rows(shape: Shape, config: Config) -> int:
    """Rows of the kv tensor the design reads: kv_len rounded up to whole key blocks (to whole blocks per cascade
    stage when the keys are split over stages)."""
    step = config.tile_k * config.kv_stages
    return -(-shape.kv_len // step) * step


def stage_blocks(shape: Shape, config: Config) -> int:
    """Key blocks in each cascade stage's contiguous segment (fixed by the cache length, as AIR's
    ``chunks_per_stage = lk / lkp / num_cascade_stages``)."""
    return kv_rows(shape, config) // config.tile_k // config.kv_stages


def blocks_needed(shape: Shape, config: Config, q_tile: int) -> int:
    """Key blocks query tile ``q_tile`` computes: causal with skipping, up to the block holding its last query's
    position; otherwise every block of the (padded) cache."""
    if not shape.causal or not config.skip_masked:
        return kv_rows(shape, config) // config.tile_k
    last = shape.q_start + (q_tile + 1) * config.tile_q - 1
    return last // config.tile_k + 1


def unit_blocks(shape: Shape, config: Config, batch: int) -> list[int]:
    """Key blocks each query tile of batch ``batch`` sees; the column streams the last (largest) count."""
    qpc = config.q_tiles_per_col
    return [blocks_needed(shape, config, batch * qpc + a) for a in range(qpc)]


def kv_head_unit(shape: Shape) -> tuple[int, str]:
    """(stored elements, dtype) of one KV head's K (or V) part of a cache row: head_dim bf16 values, or the bytes of
    their q8_0 blocks. A q8_0 cache's key block reaches the tile packed; the tile decodes it in vector registers and
    keeps no decoded copy (as the quantized GEMV does with its weights), so L1 holds the packed bytes."""
    try:
        return kv_unit(shape.kv_format, shape.head_dim)
    except ConfigError as e:
        raise shape_error(FAMILY, str(e)) from None


def kv_row_unit(shape: Shape) -> int:
    """Stored elements of one cache row's K (or V) part, every KV head."""
    return kv_unit(shape.kv_format, shape.kv_dim)[0]


def l1_bytes(shape: Shape, config: Config) -> int:
    tq, tk, d = tile_rows(shape, config), config.tile_k, shape.head_dim
    e, dt = kv_head_unit(shape)
    fifos = 2 * tq * d * 2 + config.depth * tk * 2 * e * dtype_bytes(dt)
    if config.kv_stages > 1:  # the partial state in from the previous stage and out to the next
        fifos += 2 * STATE_BYTES * tq * (d + 2)
    return fifos + _local(shape, config) + CORE_STACK_BYTES


def _local(shape: Shape, config: Config) -> int:
    tq, tk, d = tile_rows(shape, config), config.tile_k, shape.head_dim
    return 4 * (tq * d + tq * tk + 2 * tq)  # fp32 accumulator, scores, running max and denominator


# ----------------------------------------------------------------------------------------------------------------------
# Arithmetic shared by the tile path and the fast paths
# ----------------------------------------------------------------------------------------------------------------------
def _exp(x: torch.Tensor, exact: bool) -> torch.Tensor:
    return torch.exp(x.to(torch.float64)).to(torch.float32) if exact else torch.exp(x)


def _dot(a: torch.Tensor, b: torch.Tensor, exact: bool) -> torch.Tensor:
    """a @ b of bf16 operands with an fp32 result: exact sum rounded once (exact) or an fp32 matmul."""
    if exact:
        return torch.matmul(a.to(torch.float64), b.to(torch.float64)).to(torch.float32)
    return torch.matmul(a.to(torch.float32), b.to(torch.float32))


def block_update(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    masked: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    scale: float,
    exact: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One key block of the online softmax. q [..., n, d], k/v [..., tk, d] (bf16), masked [n, tk] (True = hidden).

    ``state`` = (m [..., n], l [..., n], acc [..., n, d]) in fp32; returns the new state.
    """
    m, l, acc = state
    s = _dot(q, k.transpose(-1, -2), exact) * scale
    s = s.masked_fill(masked, float("-inf"))
    m_new = torch.maximum(m, s.amax(-1))
    # a row that has seen no key yet (only in a later cascade stage) keeps m = -inf, l = 0, acc = 0; finite rows
    # are untouched by the guard
    m_ref = _finite(m_new)
    p = _exp(s - m_ref[..., None], exact)
    corr = _exp(m - m_ref, exact)
    rowsum = p.to(torch.float64).sum(-1).to(torch.float32) if exact else p.sum(-1)
    l_new = l * corr + rowsum
    acc_new = acc * corr[..., None] + _dot(nx.round_bf16(p), v, exact)
    return m_new, l_new, acc_new


def _finite(m: torch.Tensor) -> torch.Tensor:
    """The running max with -inf (no key seen) replaced by 0, so exp(-inf - m) is 0 instead of NaN."""
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def merge_states(
    a: tuple[torch.Tensor, torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cascade's merge of two partial states over disjoint key sets (a's keys first): fp32, exps as the
    exact path evaluates them. Either side may be empty (m = -inf, l = 0, acc = 0)."""
    (ma, la, acca), (mb, lb, accb) = a, b
    m = torch.maximum(ma, mb)
    ref = _finite(m)
    ca, cb = _exp(ma - ref, True), _exp(mb - ref, True)
    return m, la * ca + lb * cb, acca * ca[..., None] + accb * cb[..., None]


def pack_state(state: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """(m, l, acc) of one query tile -> the fp32 [tile_q, head_dim + 2] object a stage passes on (acc | m | l)."""
    m, l, acc = state
    return torch.cat([acc, m[:, None], l[:, None]], dim=1)


def unpack_state(obj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d = obj.shape[1] - 2
    return obj[:, d].clone(), obj[:, d + 1].clone(), obj[:, :d].clone()


def initial_state(lead: tuple[int, ...], n: int, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.full((*lead, n), float("-inf"), dtype=torch.float32),
        torch.zeros((*lead, n), dtype=torch.float32),
        torch.zeros((*lead, n, d), dtype=torch.float32),
    )


def finish(state: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    _, l, acc = state
    return nx.round_bf16(acc / l[..., None])


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """True where the key comes after the query (hidden)."""
    return k_pos[None, :] > q_pos[:, None]


def hidden(shape: Shape, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """True where a query must not see a key: after it (causal), or a padding row beyond ``kv_len`` (always)."""
    pad = (k_pos >= shape.kv_len)[None, :].expand(len(q_pos), len(k_pos))
    return causal_mask(q_pos, k_pos) | pad if shape.causal else pad


def _split_kv(kv: torch.Tensor, shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
    """kv [rows, 2 * kv_dim] -> k, v [n_kv_heads, rows, head_dim] (views, no copy)."""
    rows = kv.shape[0]
    both = kv.reshape(rows, 2, shape.n_kv_heads, shape.head_dim)
    return both[:, 0].permute(1, 0, 2), both[:, 1].permute(1, 0, 2)


def attend_exact(q: torch.Tensor, kv: torch.Tensor, shape: Shape, tile_k: int) -> torch.Tensor:
    """The tile path's arithmetic at tensor level, block after block (bit-identical to it)."""
    t, d, g = shape.q_len, shape.head_dim, shape.group
    scale = 1.0 / math.sqrt(d)
    k, v = _split_kv(kv, shape)  # [KV, S, d]
    qh = q.reshape(t, shape.n_kv_heads, g, d).permute(1, 2, 0, 3)  # [KV, g, T, d]
    m, l, acc = initial_state((shape.n_kv_heads, g), t, d)
    q_pos = torch.arange(shape.q_start, shape.kv_len)
    for b in range(kv.shape[0] // tile_k):
        k0 = b * tile_k
        # causal: earlier queries see nothing of this block (an exact no-op for them, so skipping it or not is the
        # same number); non-causal: every query sees every block
        r0 = max(0, k0 - shape.q_start) if shape.causal else 0
        if r0 >= t:
            break
        masked = hidden(shape, q_pos[r0:], torch.arange(k0, k0 + tile_k))
        kb, vb = k[:, None, k0 : k0 + tile_k], v[:, None, k0 : k0 + tile_k]
        part = (m[..., r0:], l[..., r0:], acc[..., r0:, :])
        m[..., r0:], l[..., r0:], acc[..., r0:, :] = block_update(qh[..., r0:, :], kb, vb, masked, part, scale, True)
    return finish((m, l, acc)).permute(2, 0, 1, 3).reshape(t, shape.q_dim)


def attend_cascade_exact(q: torch.Tensor, kv: torch.Tensor, shape: Shape, config: Config) -> torch.Tensor:
    """A cascade design's arithmetic at tensor level (bit-identical to its tile path): per query tile, every stage
    runs the online softmax over the blocks of its key segment the tile computes, then the states merge in stage
    order."""
    t, d, g, tq, tk = shape.q_len, shape.head_dim, shape.group, config.tile_q, config.tile_k
    scale, segment = 1.0 / math.sqrt(d), stage_blocks(shape, config)
    k, v = _split_kv(kv, shape)
    qh = q.reshape(t, shape.n_kv_heads, g, d).permute(1, 2, 0, 3)  # [KV, g, T, d]
    out = torch.empty(shape.n_kv_heads, g, t, d, dtype=torch.bfloat16)
    for i in range(t // tq):
        own, rows = blocks_needed(shape, config, i), slice(i * tq, (i + 1) * tq)
        q_pos = torch.arange(shape.q_start + i * tq, shape.q_start + (i + 1) * tq)
        chain = None
        for s in range(config.kv_stages):
            state = initial_state((shape.n_kv_heads, g), tq, d)
            for b in range(s * segment, min((s + 1) * segment, own)):
                kb, vb = k[:, None, b * tk : (b + 1) * tk], v[:, None, b * tk : (b + 1) * tk]
                masked = hidden(shape, q_pos, torch.arange(b * tk, (b + 1) * tk))
                state = block_update(qh[..., rows, :], kb, vb, masked, state, scale, True)
            chain = state if chain is None else merge_states(chain, state)
        out[..., rows, :] = finish(chain)
    return out.permute(2, 0, 1, 3).reshape(t, shape.q_dim)


def attend_fast(
    q: torch.Tensor, kv: torch.Tensor, shape: Shape, tile_k: int, segment: int | None = None
) -> torch.Tensor:
    """Production path: per query chunk, all its key blocks at once in fp32, combined in closed form.

    ``segment`` (a cascade design: key blocks per stage): the closed form runs per segment of that many blocks,
    each against its own running max (p is rounded to bf16 against it, as the stage does), and the segments'
    states merge in order."""
    t, d, g = shape.q_len, shape.head_dim, shape.group
    scale = 1.0 / math.sqrt(d)
    k, v = _split_kv(kv, shape)
    qh = q.reshape(t, shape.n_kv_heads, g, d).permute(1, 2, 0, 3).to(torch.float32)
    out = torch.empty(shape.n_kv_heads, g, t, d, dtype=torch.bfloat16)
    for r0 in range(0, t, FAST_CHUNK_ROWS):
        r1 = min(t, r0 + FAST_CHUNK_ROWS)
        q_pos = torch.arange(shape.q_start + r0, shape.q_start + r1)
        nb = (shape.q_start + r1 - 1) // tile_k + 1 if shape.causal else kv.shape[0] // tile_k
        keys = nb * tile_k
        kb = k[:, :keys].to(torch.float32)  # [KV, keys, d]
        vb = v[:, :keys].to(torch.float32).reshape(shape.n_kv_heads, nb, tile_k, d)
        s = torch.einsum("kgnd,ksd->kgns", qh[..., r0:r1, :], kb) * scale
        s = s.masked_fill(hidden(shape, q_pos, torch.arange(keys)), float("-inf"))
        s = s.reshape(*s.shape[:-1], nb, tile_k)
        if segment is not None:
            out[..., r0:r1, :] = finish(_segments_closed_form(s, vb, segment))
            continue
        m_run = torch.cummax(s.amax(-1), dim=-1).values  # running max after each block [KV, g, n, nb]
        p = torch.exp(s - m_run[..., None])
        weight = torch.exp(m_run - m_run[..., -1:])  # brings block b to the final max
        l = (p.sum(-1) * weight).sum(-1)
        pv = torch.einsum("kgnbt,kbtd->kgnbd", nx.round_bf16(p).to(torch.float32), vb)
        acc = (pv * weight[..., None]).sum(-2)
        out[..., r0:r1, :] = nx.round_bf16(acc / l[..., None])
    return out.permute(2, 0, 1, 3).reshape(t, shape.q_dim)


def _segments_closed_form(
    s: torch.Tensor, vb: torch.Tensor, segment: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scores s [KV, g, n, nb, tk] (masked: -inf) and values vb [KV, nb, tk, d] -> the merged state of the
    segments of ``segment`` blocks, each in closed form against its own running max (rows that see no key of a
    segment contribute nothing)."""
    kvh, g, n, nb, tk = s.shape
    nseg = -(-nb // segment)
    pad = nseg * segment - nb
    if pad:  # whole masked blocks: no contribution
        s = torch.cat([s, s.new_full((kvh, g, n, pad, tk), float("-inf"))], dim=-2)
        vb = torch.cat([vb, vb.new_zeros((kvh, pad, tk, vb.shape[-1]))], dim=1)
    s = s.reshape(kvh, g, n, nseg, segment, tk)
    vb = vb.reshape(kvh, nseg, segment, tk, vb.shape[-1])
    m_run = torch.cummax(s.amax(-1), dim=-1).values  # running max inside each segment [KV, g, n, nseg, segment]
    p = torch.exp(s - _finite(m_run)[..., None])
    m_end = m_run[..., -1:]
    weight = torch.where(torch.isneginf(m_run), torch.zeros_like(m_run), torch.exp(m_run - _finite(m_end)))
    l = (p.sum(-1) * weight).sum(-1)  # [KV, g, n, nseg]
    pv = torch.einsum("kgnjbt,kjbtd->kgnjbd", nx.round_bf16(p).to(torch.float32), vb)
    acc = (pv * weight[..., None]).sum(-2)  # [KV, g, n, nseg, d]
    state = (m_end[..., 0, 0], l[..., 0], acc[..., 0, :])
    for j in range(1, nseg):
        state = merge_states(state, (m_end[..., j, 0], l[..., j], acc[..., j, :]))
    return state


# ----------------------------------------------------------------------------------------------------------------------
# Design
# ----------------------------------------------------------------------------------------------------------------------
def _check(shape: Shape, config: Config, device: Device) -> None:
    if config.variant not in VARIANTS:
        raise shape_error(FAMILY, f"variant {config.variant!r} is unknown; use one of {VARIANTS}")
    kv_head_unit(shape)  # a cache format the heads cannot be stored in is refused in one sentence
    if config.kv_format != shape.kv_format:
        raise shape_error(
            FAMILY, f"the config reads a {config.kv_format} KV cache but the cache is {shape.kv_format}; set kv_format"
        )
    if min(shape.q_len, shape.kv_len, shape.n_heads, shape.n_kv_heads, shape.head_dim) < 1:
        raise shape_error(FAMILY, f"shape {shape} has an empty dimension")
    if shape.n_heads % shape.n_kv_heads:
        raise shape_error(FAMILY, f"{shape.n_heads} query heads do not group over {shape.n_kv_heads} KV heads")
    if shape.q_len > shape.kv_len:
        raise shape_error(FAMILY, f"{shape.q_len} queries need at least as many keys, got kv_len {shape.kv_len}")
    if shape.head_dim % MMUL_KN or config.tile_k % MMUL_KN or config.tile_k < 1:
        raise shape_error(
            FAMILY, f"head_dim {shape.head_dim} and tile_k {config.tile_k} must be multiples of the MMUL's {MMUL_KN}"
        )
    if config.tile_q < 1 or shape.q_len % config.tile_q:
        raise shape_error(FAMILY, f"q_len {shape.q_len} is not a whole number of {config.tile_q}-query tiles")
    hpc, qpc, g = config.heads_per_col, config.q_tiles_per_col, shape.group
    if not 1 <= hpc <= device.compute_rows or shape.n_heads % hpc or (g % hpc and hpc % g):
        raise shape_error(
            FAMILY,
            f"{hpc} heads per column must be 1..{device.compute_rows}, divide {shape.n_heads} heads, and divide "
            f"or be a multiple of the GQA group {g}",
        )
    q_tiles = shape.q_len // config.tile_q
    if config.kv_stages < 1 or (config.kv_stages > 1 and (hpc != 1 or qpc != 1)):
        raise shape_error(
            FAMILY,
            f"{config.kv_stages} cascade stages need one head and one query tile per column (got {hpc} heads, "
            f"{qpc} query tiles)",
        )
    if config.group_rows and (
        config.kv_stages < 2 or hpc != 1 or qpc != 1 or config.share_cols != 1 or config.tile_q != shape.q_len
    ):
        raise shape_error(
            FAMILY,
            "a unit with its GQA group's heads as rows (group_rows) needs cascade stages, one query tile holding "
            f"every query (tile_q = q_len = {shape.q_len}), one head and one tile per column, and no shared columns",
        )
    if config.kv_channels not in (1, 2) or (
        config.kv_channels == 2 and (config.kv_stages % 2 or config.share_cols != 1)
    ):
        raise shape_error(
            FAMILY,
            f"{config.kv_channels} K/V channels: use 1, or 2 with an even number of cascade stages (got "
            f"{config.kv_stages}) on columns that do not share a stream (share_cols {config.share_cols})",
        )
    kc = config.kv_cols
    if kc < 1 or (kc > 1 and (not config.group_rows or config.kv_stages % kc or config.cols % kc)):
        raise shape_error(
            FAMILY,
            f"{kc} columns per KV head (kv_cols) need flash-decoding (group_rows), a whole number of its "
            f"{config.kv_stages} cascade stages per column and whole units of {kc} among the {config.cols} columns",
        )
    if kc > 1 and config.kv_channels == 2 and (config.kv_stages // kc) % 2:
        raise shape_error(
            FAMILY,
            f"2 K/V channels need an even number of cascade stages per column (got {config.kv_stages // kc} on each "
            f"of {kc} columns)",
        )
    sc = config.share_cols
    if sc < 1 or (sc > 1 and config.kv_stages == 1) or config.cols % sc or q_tiles % sc:
        raise shape_error(
            FAMILY,
            f"{sc} columns sharing a key/value stream need cascade stages and must divide the {config.cols} "
            f"columns and the {q_tiles} query tiles",
        )
    if qpc < 1 or config.workers_per_col > device.compute_rows or q_tiles % qpc:
        raise shape_error(
            FAMILY,
            f"{qpc} query tiles per column times {hpc} heads per column must fit the {device.compute_rows} compute "
            f"rows, and {qpc} must divide the {q_tiles} query tiles",
        )
    units = _head_units(shape, config) * (q_tiles // qpc // sc)
    if not 1 <= config.cols // config.unit_cols <= units or config.cols > device.columns:
        raise shape_error(FAMILY, f"{config.cols} columns cannot share {units} units of work on {device.name}")
    if config.depth < 1:
        raise shape_error(FAMILY, f"fifo depth {config.depth} is not positive")


def _head_units(shape: Shape, config: Config) -> int:
    """Head chunks a unit can take: chunks of ``heads_per_col`` query heads, or whole KV heads (``group_rows``)."""
    return shape.n_kv_heads if config.group_rows else shape.n_heads // config.heads_per_col


def assign_units(shape: Shape, config: Config) -> list[list[tuple[int, int]]]:
    """(head chunk, q-tile batch) units per column (per group of ``share_cols`` columns): longest first onto the
    least loaded column, then sorted.

    A unit weighs the key blocks its column streams (its last query tile's), which its slowest worker computes.
    """
    batches = shape.q_len // config.tile_q // config.q_tiles_per_col // config.share_cols
    units = [(c, i) for c in range(_head_units(shape, config)) for i in range(batches)]
    weight = {i: unit_blocks(shape, config, i)[-1] for i in range(batches)}
    if config.kv_stages > 1:  # cascade: a batch of share_cols tiles; its slowest stage is the first segment's
        last = {i: blocks_needed(shape, config, (i + 1) * config.share_cols - 1) for i in range(batches)}
        weight = {i: min(stage_blocks(shape, config), nb) for i, nb in last.items()}
    n = config.cols // config.unit_cols  # column groups (a cascade unit spans share_cols x kv_cols columns)
    load = [0] * n
    cols: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for c, i in sorted(units, key=lambda u: (-weight[u[1]], u)):
        col = load.index(min(load))
        cols[col].append((c, i))
        load[col] += weight[i]
    return [sorted(u) for u in cols]


def _kernel(shape: Shape, config: Config, tiles_of: dict[str, list[int]]) -> TileKernel:
    tq, tk, d, n = config.tile_q, config.tile_k, shape.head_dim, tile_rows(shape, config)
    scale = 1.0 / math.sqrt(d)

    def attention_tile(ins: list[torch.Tensor], outs: list[torch.Tensor], ctx) -> None:
        q, kv = ins[0], key_block(ins[1], shape)
        sc = ctx.scratch
        if ctx.first:
            sc["state"] = initial_state((), tq, d)
        q0 = shape.q_start + tiles_of[ctx.worker][ctx.iteration] * tq
        masked = hidden(shape, torch.arange(q0, q0 + tq), torch.arange(ctx.step * tk, (ctx.step + 1) * tk))
        sc["state"] = block_update(q, kv[:, 0], kv[:, 1], masked, sc["state"], scale, True)
        if ctx.last:
            outs[0].copy_(finish(sc["state"]))

    rows = -(-n // MMUL_M) * MMUL_M
    e, dt = kv_head_unit(shape)
    # a q8_0 block's decode is the quantized GEMV's inner loop (unpack, convert, scale): timed at that family's
    # efficiency (``TileKernel.borrowed_ops``), not at the softmax loop's
    decode = () if shape.kv_format == "bf16" else (("qgemv", DEQUANT_OPS[shape.kv_format] * 2 * tk * d),)
    return TileKernel(
        name=f"flash_attn_{config.variant}_{n}x{tk}x{d}" + ("" if shape.kv_format == "bf16" else f"_{shape.kv_format}"),
        fn=attention_tile,
        variant=config.variant,
        macs_per_call=2 * rows * tk * d,
        vector_ops_per_call=n * tk * OPS_PER_SCORE + n * d * OPS_PER_ACC + n * OPS_PER_ROW,
        bytes_per_call=2 * n * d + 2 * tk * e * dtype_bytes(dt) + 4 * (n * tk + n * d),
        params={"tile_q": tq, "tile_k": tk, "head_dim": d},
        borrowed_ops=decode,
    )


def key_block(kv: torch.Tensor, shape: Shape) -> torch.Tensor:
    """A streamed [tile_k, 2, head_dim] key/value block as the MMUL reads it: the object itself, or its q8_0 blocks
    decoded (``model.quant.kv_values``: the values every executor path and the oracle compute with)."""
    if shape.kv_format == "bf16":
        return kv
    return kv_values(kv, shape.kv_format)


def _program(q_fifo: str, kv_fifo: str, o_fifo: str, blocks: list[tuple[int, int]]):
    """Per unit: hold q and o, take every streamed key block, compute on the ``own`` first ones it can see."""

    def program(worker: Worker) -> Iterator:
        for u, (own, streamed) in enumerate(blocks):
            (q,) = yield Acquire(q_fifo, 1)
            (o,) = yield Acquire(o_fifo, 1)
            for b in range(streamed):
                (kv,) = yield Acquire(kv_fifo, 1)
                if b < own:
                    yield Call((q, kv), (o,), u, b, own)
                yield Release(kv_fifo, 1)
            yield Release(q_fifo, 1)
            yield Release(o_fifo, 1)

    return program


def _stage_kernel(shape: Shape, config: Config, tiles: list[int], stage: int, owns: list[int]) -> TileKernel:
    """Stage ``stage`` of a cascade column: online softmax over its key segment, then merge / pass on / finish.

    Its per-call figures are the stage's totals over its units spread over its calls (the timing model charges
    calls x per-call): every block it computes, and the merge chain on its critical path - the merges of stages
    1..stage run one after another (each needs the previous one's state), so stage s finishes a unit ``s`` merges
    after the blocks; the last stage also divides by l and converts (OPS_PER_OUTPUT per output element)."""
    tq, tk, d, nst, n = config.tile_q, config.tile_k, shape.head_dim, config.kv_stages, tile_rows(shape, config)
    scale = 1.0 / math.sqrt(d)
    per_block = _kernel(shape, config, {})
    merge_ops = n * d * OPS_PER_MERGE_ACC + n * OPS_PER_ROW
    state_bytes = STATE_BYTES * n * (d + 2)
    heads = n // tq  # rows per query: the group's heads when they are rows (query-major: row r is query r // heads)
    segment = stage_blocks(shape, config)
    blocks = sum(max(0, min(segment, own - stage * segment)) for own in owns)
    units = len(owns)
    calls = blocks + units * ((1 if stage else 0) + 1)
    vops = blocks * per_block.vector_ops_per_call + units * stage * merge_ops
    nbytes = blocks * per_block.bytes_per_call + units * 2 * state_bytes
    if stage == nst - 1:
        vops += units * n * d * OPS_PER_OUTPUT
    macs = blocks * per_block.macs_per_call

    def stage_tile(ins: list[torch.Tensor], outs: list[torch.Tensor], ctx) -> None:
        sc = ctx.scratch
        if sc.get("unit") != ctx.iteration:
            sc["unit"], sc["state"] = ctx.iteration, initial_state((), n, d)
        if ctx.step >= 0:
            q, kv = ins[0], key_block(ins[1], shape)
            q0 = shape.q_start + tiles[ctx.iteration] * tq
            q_pos = torch.arange(q0, q0 + tq).repeat_interleave(heads)
            masked = hidden(shape, q_pos, torch.arange(ctx.step * tk, (ctx.step + 1) * tk))
            sc["state"] = block_update(q, kv[:, 0], kv[:, 1], masked, sc["state"], scale, True)
        elif ctx.step == _MERGE:
            sc["state"] = merge_states(unpack_state(ins[0]), sc["state"])  # earlier keys' chain first
        elif ctx.step == _SEND:
            outs[0].copy_(pack_state(sc["state"]))
        else:
            outs[0].copy_(finish(sc["state"]))

    return TileKernel(
        name=f"flash_attn_cascade_{config.variant}_{n}x{tk}x{d}_s{stage}",
        fn=stage_tile,
        variant=config.variant,
        macs_per_call=-(-macs // max(calls, 1)),
        vector_ops_per_call=-(-vops // max(calls, 1)),
        bytes_per_call=-(-nbytes // max(calls, 1)),
        params={"tile_q": tq, "tile_k": tk, "head_dim": d, "stage": stage},
        borrowed_ops=tuple((f, -(-blocks * ops // max(calls, 1))) for f, ops in per_block.borrowed_ops),
    )


def _stage_program(
    fifos: tuple[str, str, str | None, str], stage: int, last: bool, segment: int, units: list[tuple[int, int]]
):
    """Per unit (blocks the unit's tile computes, objects streamed): hold q, take every streamed key object (one
    block per stage), compute the blocks of its own segment the tile sees, then merge the previous stage's state
    (stage > 0) and pass the result on (or finish it: the last stage)."""
    q_f, kv_f, in_f, out_f = fifos

    def program(worker: Worker) -> Iterator:
        for u, (own, streamed) in enumerate(units):
            (q,) = yield Acquire(q_f, 1)
            for j in range(streamed):
                (kv,) = yield Acquire(kv_f, 1)
                b = stage * segment + j
                if b < own:
                    yield Call((q, kv), (), u, b, own)
                yield Release(kv_f, 1)
            yield Release(q_f, 1)
            if in_f is not None:
                (st,) = yield Acquire(in_f, 1)
                yield Call((st,), (), u, _MERGE, 0)
                yield Release(in_f, 1)
            (out,) = yield Acquire(out_f, 1)
            yield Call((), (out,), u, _FINISH if last else _SEND, 0)
            yield Release(out_f, 1)

    return program


def _cascade_parts(shape: Shape, config: Config, device: Device):
    """Fifos, links, workers and per-unit tasks of a cascade design (``kv_stages`` > 1; one head per unit, a batch
    of ``share_cols`` query tiles on as many neighbouring columns, one tile each). Per column, q from its shim,
    broadcast to its stages; per stage, the blocks of its key segment broadcast to that stage in every column of
    the group (one K/V stream per unit and stage): from the shim of the group's column of that index when the group
    has a column per stage, else as one [stages * tile_k, 2, d] object per step from the group's first shim, split
    by its memory tile (with two K/V channels: half the stages per channel; one stage per channel goes straight from
    the shim; q rides the column's first feed under flash-decoding or with two channels); the partial state passed
    stage to stage through shared memory
    (neighbouring rows, no DMA); o from each column's last stage to its shim. ``group_rows``: a unit is a KV head and
    q / o move its group's heads side by side ([tile_q, group * head_dim] of the row). ``kv_cols`` > 1: the stages
    snake over that many columns (along the first's compute rows, back along the next's, ...), each column's stages
    fed from its own shim as one column's are, q filled into every column of the unit, o drained from the column of
    the last stage."""
    tq, tk, d, g, nst, sc = (config.tile_q, config.tile_k, shape.head_dim, shape.group, config.kv_stages,
                             config.share_cols)  # fmt: skip
    kc = config.kv_cols
    rows = nst // kc  # stages per column
    qd, s_pad = shape.q_dim, kv_rows(shape, config)
    (e, kdt), kvd = kv_head_unit(shape), kv_row_unit(shape)  # a KV head's and a row's K (or V) part, as stored
    q_shape, kv_shape = (shape.q_len, qd), (s_pad, 2 * kvd)
    n = tile_rows(shape, config)
    q_width = n // tq * d  # elements of one query's row a tile takes: one head, or the group's heads side by side
    segment = stage_blocks(shape, config)
    ch = config.kv_channels
    per_feed = rows // ch  # stages one shim K/V stream feeds
    fifos: list[ObjectFifo] = []
    links = []
    workers: list[Worker] = []
    group_tasks: list[list[list[tuple[str, str, str, object]]]] = []
    for grp, units in enumerate(assign_units(shape, config)):
        c0 = grp * config.unit_cols
        parts = [f"kv_{c0}_{s}" for s in range(nst)]
        direct = sc >= nst  # one stream per stage segment, each from its own column's shim (AIR's QKIn_s / VIn_s)
        if direct:
            fifos += [
                ObjectFifo(f, (tk, 2, e), kdt, config.depth, shim_placement=Tile(c0 + s, SHIM_ROW))
                for s, f in enumerate(parts)
            ]
            feeds = []
        elif per_feed == 1:  # one stage per channel: each stage's stream straight from its column's shim
            fifos += [ObjectFifo(f, (tk, 2, e), kdt, config.depth, shim_placement=Tile(c0 + s // rows, SHIM_ROW))
                      for s, f in enumerate(parts)]  # fmt: skip
            feeds = parts
        else:  # per channel, one [stages * tile_k, 2, d] object per step, split by the memory tile to its stages
            # feed J (in stage order) is channel J % ch of the unit's column J // ch
            feeds = [f"kv_{c0 + j // ch}" if ch == 1 else f"kv_{c0 + j // ch}_in{j % ch}" for j in range(ch * kc)]
            offsets = [s * tk * 2 * e for s in range(per_feed)]
            fifos += [ObjectFifo(f, (per_feed * tk, 2, e), kdt, config.depth,
                                 shim_placement=Tile(c0 + j // ch, SHIM_ROW)) for j, f in enumerate(feeds)]  # fmt: skip
            fifos += [ObjectFifo(f, (tk, 2, e), kdt, config.depth) for f in parts]
            for j, feed in enumerate(feeds):
                col = c0 + j // ch
                name = f"kv_split_{col}" + (f"_{j % ch}" if ch > 1 else "")
                links.append(split(name, feed, parts[j * per_feed : (j + 1) * per_feed], offsets, Tile(col, MEM_ROW)))
        # per unit: the blocks each column's tile computes; the group streams what its last tile needs
        owns = {c: [blocks_needed(shape, config, i * sc + c) for _, i in units] for c in range(sc)}
        streamed = [min(segment, max(owns[c][u] for c in range(sc))) for u in range(len(units))]
        per_unit = []
        for u, (h, i) in enumerate(units):
            kv_head = h if config.group_rows else h // g
            # q in and o out cover the same [tile_q, q_width] of each column's query tile
            q_taps = [legal_taps(q_shape, (i * sc + c) * tq * qd + h * q_width, [tq, q_width], [qd, 1])
                      for c in range(sc)]  # fmt: skip
            # q into every column of the unit (kv_cols > 1: the same query tile into each column of the snake)
            tasks = [("fill", f"q_{c0 + c + j}", "q", tap) for c in range(sc) for j in range(kc) for tap in q_taps[c]]
            if direct:
                for st, f in enumerate(parts):
                    off = st * segment * tk * 2 * kvd + kv_head * e
                    sizes, strides = [streamed[u], tk, 2, e], [tk * 2 * kvd, 2 * kvd, kvd, 1]
                    tasks += [("fill", f, "kv", tap) for tap in legal_taps(kv_shape, off, sizes, strides, kdt)]
            else:
                for j, feed in enumerate(feeds):
                    off = j * per_feed * segment * tk * 2 * kvd + kv_head * e
                    sizes = [streamed[u], per_feed, tk, 2, e]
                    strides = [tk * 2 * kvd, segment * tk * 2 * kvd, 2 * kvd, kvd, 1]
                    tasks += [("fill", feed, "kv", tap) for tap in legal_taps(kv_shape, off, sizes, strides, kdt)]
            tasks += [("drain", f"o_{c0 + c + kc - 1}", "o", tap) for c in range(sc) for tap in q_taps[c]]
            per_unit.append(tasks)
        group_tasks.append(per_unit)
        for c in range(sc):
            col = c0 + c  # the unit's first column (kv_cols > 1: sc is 1 and the unit's stages snake from here)
            q_ins, o_out = [f"q_{col + j}" for j in range(kc)], f"o_{col + kc - 1}"
            states = [f"st_{col}_{s}" for s in range(nst - 1)]
            # q rides the column's first K/V feed, ahead of it (flash-decoding: with one K/V channel too, leaving the
            # column's other channel free). feeds are in stage order, ch per column in either branch (one stage per
            # channel: a column's rows == ch)
            q_rides = ch == 2 or config.group_rows
            assert len(feeds) == ch * kc or not q_rides
            for j, q_in in enumerate(q_ins):
                rides = feeds[j * ch] if q_rides else None
                fifos += [ObjectFifo(q_in, (n, d), "bf16", 1, shim_placement=Tile(col + j, SHIM_ROW), rides_with=rides)]
            fifos += [ObjectFifo(f, (n, d + 2), "fp32", 1) for f in states]
            fifos += [ObjectFifo(o_out, (n, d), "bf16", 1, shim_placement=Tile(col + kc - 1, SHIM_ROW))]
            tiles = [i * sc + c for _, i in units]
            for s in range(nst):
                st_in = states[s - 1] if s else None
                out = states[s] if s < nst - 1 else o_out
                j, r = divmod(s, rows)  # column of the snake, and the stage's place in it (along the rows, then back)
                tile = Tile(col + j, FIRST_COMPUTE_ROW + (r if j % 2 == 0 else rows - 1 - r))
                q_in = q_ins[j]
                n_blocks = sum(max(0, min(segment, own - s * segment)) for own in owns[c])
                workers.append(
                    Worker(
                        name=f"attn_{col}_{s}",
                        kernel=_stage_kernel(shape, config, tiles, s, owns[c]),
                        inputs=(q_in, parts[s]) + ((st_in,) if st_in else ()),
                        outputs=(out,),
                        iterations=1,
                        placement=tile,
                        local_bytes=_local(shape, config),
                        acquires={q_in: len(units), parts[s]: sum(streamed), out: len(units)}
                        | ({st_in: len(units)} if st_in else {}),
                        calls_per_iteration=max(1, n_blocks + len(units) * ((1 if s else 0) + 1)),
                        program=_stage_program(
                            (q_in, parts[s], st_in, out),
                            s,
                            s == nst - 1,
                            segment,
                            list(zip(owns[c], streamed, strict=True)),
                        ),
                    )
                )
    return fifos, links, workers, group_tasks


def make_design(shape: Shape, config: Config | None = None, device: Device | None = None) -> Design:
    device = device or npu2()
    config = config or default_config(shape, device)
    _check(shape, config, device)
    if config.kv_stages > 1:
        return _assemble(shape, config, device, *_cascade_parts(shape, config, device))
    hpc, tq, tk, d, g = config.heads_per_col, config.tile_q, config.tile_k, shape.head_dim, shape.group
    qpc, nw = config.q_tiles_per_col, config.workers_per_col
    kvh = max(1, hpc // g)  # KV heads one unit needs
    qd, s_pad = shape.q_dim, kv_rows(shape, config)
    (e, kdt), kvd = kv_head_unit(shape), kv_row_unit(shape)  # a KV head's and a row's K (or V) part, as stored
    q_shape, kv_shape = (shape.q_len, qd), (s_pad, 2 * kvd)
    assignment = assign_units(shape, config)

    # worker w = s * qpc + a: head s of the chunk, query tile a of the batch
    tiles_of = {
        f"attn_{col}_{w}": [i * qpc + w % qpc for _, i in units]
        for col, units in enumerate(assignment)
        for w in range(nw)
    }
    kernel = _kernel(shape, config, tiles_of)
    fifos: list[ObjectFifo] = []
    links = []
    workers: list[Worker] = []
    col_tasks: list[list[list[tuple[str, str, object]]]] = []  # per column, per unit: (kind, fifo, tap)
    for col, units in enumerate(assignment):
        shim, mem = Tile(col, SHIM_ROW), Tile(col, MEM_ROW)
        own = [unit_blocks(shape, config, i) for _, i in units]  # per unit, per query tile of its batch
        streamed = [nbs[-1] for nbs in own]
        q_in, kv_in, o_out = f"q_{col}", f"kv_{col}", f"o_{col}"
        if nw == 1:
            fifos += [ObjectFifo(q_in, (tq, d), "bf16", 1, shim_placement=shim)]
            fifos += [ObjectFifo(o_out, (tq, d), "bf16", 1, shim_placement=shim)]
            q_slot, o_slot = [q_in], [o_out]
        else:
            q_slot = [f"q_{col}_{w}" for w in range(nw)]
            o_slot = [f"o_{col}_{w}" for w in range(nw)]
            fifos += [ObjectFifo(q_in, (nw * tq, d), "bf16", 1, shim_placement=shim)]
            fifos += [ObjectFifo(o_out, (nw * tq, d), "bf16", 1, shim_placement=shim)]
            fifos += [ObjectFifo(f, (tq, d), "bf16", 1) for f in q_slot + o_slot]
            links.append(split(f"q_split_{col}", q_in, q_slot, [w * tq * d for w in range(nw)], mem))
            links.append(join(f"o_join_{col}", o_slot, o_out, [w * tq * d for w in range(nw)], mem))
        if kvh == 1:
            fifos += [ObjectFifo(kv_in, (tk, 2, e), kdt, config.depth, shim_placement=shim)]
            kv_slot = [kv_in] * nw
        else:
            parts = [f"kv_{col}_{j}" for j in range(kvh)]
            fifos += [ObjectFifo(kv_in, (kvh * tk, 2, e), kdt, config.depth, shim_placement=shim)]
            fifos += [ObjectFifo(f, (tk, 2, e), kdt, config.depth) for f in parts]
            links.append(split(f"kv_split_{col}", kv_in, parts, [j * tk * 2 * e for j in range(kvh)], mem))
            kv_slot = [parts[(w // qpc) // g] for w in range(nw)]
        per_unit = []
        for (c, i), nb in zip(units, streamed, strict=True):
            h0, j0 = c * hpc, c * hpc // g
            tasks = []
            q_off = i * qpc * tq * qd + h0 * d
            for tap in legal_taps(q_shape, q_off, [hpc, qpc * tq, d], [d, qd, 1]):
                tasks.append(("fill", q_in, "q", tap))
            kv_sizes, kv_strides = [nb, kvh, tk, 2, e], [tk * 2 * kvd, e, 2 * kvd, kvd, 1]
            for tap in legal_taps(kv_shape, j0 * e, kv_sizes, kv_strides, kdt):
                tasks.append(("fill", kv_in, "kv", tap))
            for tap in legal_taps(q_shape, q_off, [hpc, qpc * tq, d], [d, qd, 1]):
                tasks.append(("drain", o_out, "o", tap))
            per_unit.append(tasks)
        col_tasks.append(per_unit)
        for w in range(nw):
            blocks = [(nbs[w % qpc], nbs[-1]) for nbs in own]  # (blocks it computes, blocks streamed) per unit
            workers.append(
                Worker(
                    name=f"attn_{col}_{w}",
                    kernel=kernel,
                    inputs=(q_slot[w], kv_slot[w]),
                    outputs=(o_slot[w],),
                    iterations=1,
                    placement=Tile(col, FIRST_COMPUTE_ROW + w),
                    local_bytes=_local(shape, config),
                    acquires={q_slot[w]: len(units), kv_slot[w]: sum(streamed), o_slot[w]: len(units)},
                    calls_per_iteration=max(1, sum(b for b, _ in blocks)),
                    program=_program(q_slot[w], kv_slot[w], o_slot[w], blocks),
                )
            )
    return _assemble(shape, config, device, fifos, links, workers, col_tasks)


def _assemble(
    shape: Shape,
    config: Config,
    device: Device,
    fifos: list[ObjectFifo],
    links: list,
    workers: list[Worker],
    col_tasks: list[list[list[tuple[str, str, str, object]]]],
) -> Design:
    tk, d, s_pad = config.tile_k, shape.head_dim, kv_rows(shape, config)
    q_shape, kv_shape = (shape.q_len, shape.q_dim), (s_pad, 2 * kv_row_unit(shape))
    design = Design(
        name=f"attention_{shape.q_len}x{shape.kv_len}_h{shape.n_heads}_kv{shape.n_kv_heads}_d{d}"
        + ("" if shape.causal else "_noncausal")
        + ("" if config.skip_masked or not shape.causal else "_noskip")
        + (f"_cascade{config.kv_stages}" if config.kv_stages > 1 else "")
        + ("_grouprows" if config.group_rows else "")
        + (f"_kv{config.kv_channels}ch" if config.kv_channels > 1 else "")
        + (f"_kvcols{config.kv_cols}" if config.kv_cols > 1 else "")
        + ("_rounds" if config.rounds else "")
        + ("" if shape.kv_format == "bf16" else f"_kv{shape.kv_format}"),
        device=device,
        inputs=[TensorSpec("q", q_shape), TensorSpec("kv", kv_shape, kv_head_unit(shape)[1])],
        outputs=[TensorSpec("o", q_shape)],
        fifos=fifos,
        links=links,
        workers=workers,
        runtime=Runtime.packed(col_tasks, device.shim.bds, {f.name: f.shim_placement for f in fifos}, config.rounds),
        numerics=nx.Numerics(
            "bf16",
            "fp32",
            tk,
            "bf16",
            (() if shape.kv_format == "bf16" else (f"kv:{shape.kv_format}->bf16",))
            + ("scores:exact->fp32", "softmax:fp32", "p:bf16", "pv:exact->fp32", "acc:fp32", "output:bf16"),
        ),
        fast=_fast(shape, config),
    )
    groups = len({t.group for t in design.runtime.tasks})
    seen = shape.q_start + (shape.q_len + 1) / 2 if shape.causal else shape.kv_len  # keys per query, on average
    useful = 2 * shape.q_len * shape.n_heads * d * seen
    design.meta = {
        "family": FAMILY,
        "shape": asdict(shape),
        "config": asdict(config),
        "logical_shape": asdict(shape),
        "kv_rows": s_pad,
        "units_per_col": [len(u) for u in col_tasks],
        "task_groups": groups,
        "kv_stages": config.kv_stages,
        "macs": design.total_macs(),
        "useful_macs": int(useful),
        "ddr_read_bytes": design.ddr_read_bytes(),
        "ddr_write_bytes": design.ddr_write_bytes(),
    }
    return design


def _fast(shape: Shape, config: Config):
    def fast(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        kv = kv_values(inputs["kv"], shape.kv_format)  # decoded as the tile decodes each block: the same values
        if exact and config.kv_stages > 1:
            return {"o": attend_cascade_exact(inputs["q"], kv, shape, config)}
        if config.kv_stages > 1:
            return {"o": attend_fast(inputs["q"], kv, shape, config.tile_k, stage_blocks(shape, config))}
        run = attend_exact if exact else attend_fast
        return {"o": run(inputs["q"], kv, shape, config.tile_k)}

    return fast


# ----------------------------------------------------------------------------------------------------------------------
# Inputs, reference, configs
# ----------------------------------------------------------------------------------------------------------------------
def pack_kv(k: torch.Tensor, v: torch.Tensor, rows: int | None = None, kv_format: str = "bf16") -> torch.Tensor:
    """[k | v] rows, zero-padded to ``rows``, stored as ``kv_format`` (``model.quant.pack_kv_rows``): the kv tensor
    this family reads. Zero padding rows decode to zeros in every format."""
    if k.shape != v.shape or k.dim() != 2:
        raise ConfigError(f"k and v must both be [positions, kv_dim], got {tuple(k.shape)} and {tuple(v.shape)}.")
    stored = pack_kv_rows(torch.cat((k.to(torch.bfloat16), v.to(torch.bfloat16)), dim=1), kv_format)
    n = k.shape[0] if rows is None else rows
    out = torch.zeros(n, stored.shape[1], dtype=stored.dtype)
    out[: k.shape[0]] = stored
    return out


def prepare_inputs(design: Design, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
    """q [q_len, q_dim], k and v [kv_len, kv_dim] -> the design's q and padded kv rows in the design's cache
    format."""
    fmt = design.meta["shape"]["kv_format"]
    return {"q": q.to(torch.bfloat16), "kv": pack_kv(k, v, design.meta["kv_rows"], fmt)}


def reference(inputs: dict[str, torch.Tensor], shape: Shape | None = None) -> dict[str, torch.Tensor]:
    """FP32 GQA attention on the unpacked kv rows: the oracle's (``oracle.ops.attention``) when causal; a plain
    softmax over every key otherwise."""
    if shape is None:
        raise ConfigError("attention.reference needs the shape (heads, head_dim, lengths); pass shape=Shape(...).")
    kv = kv_values(inputs["kv"][: shape.kv_len], shape.kv_format)
    k, v = kv[:, : shape.kv_dim], kv[:, shape.kv_dim :]
    d = shape.head_dim
    if not shape.causal:
        qh = inputs["q"].float().reshape(shape.q_len, shape.n_kv_heads, shape.group, d)
        kh, vh = k.float().reshape(-1, shape.n_kv_heads, d), v.float().reshape(-1, shape.n_kv_heads, d)
        p = torch.softmax(torch.einsum("tkgd,skd->kgts", qh, kh) / math.sqrt(d), dim=-1)
        return {"o": torch.einsum("kgts,skd->tkgd", p, vh).reshape(shape.q_len, shape.q_dim)}
    o = ops.attention(
        inputs["q"].reshape(shape.q_len, shape.n_heads, d),
        k.reshape(shape.kv_len, shape.n_kv_heads, d),
        v.reshape(shape.kv_len, shape.n_kv_heads, d),
        q_start=shape.q_start,
    )
    return {"o": o.reshape(shape.q_len, shape.q_dim)}


def mem_tile_channels(shape: Shape, config: Config) -> tuple[int, int]:
    """(S2MM, MM2S) a column's memory tile needs: q split, o join, and the kv split when a unit spans KV heads."""
    nw = config.workers_per_col
    if nw == 1:
        return 0, 0
    kvh = max(1, config.heads_per_col // shape.group)
    return 1 + nw + (1 if kvh > 1 else 0), nw + 1 + (kvh if kvh > 1 else 0)


def _heads_per_col(shape: Shape, device: Device) -> list[int]:
    g = shape.group
    return [
        h for h in range(min(4, device.compute_rows), 0, -1) if shape.n_heads % h == 0 and (g % h == 0 or h % g == 0)
    ]


def candidate_configs(shape: Shape, device: Device | None = None) -> list[Config]:
    """Most tiles busy first, then less MMUL padding and bigger tiles, then fewer query tiles per column; only
    tilings that fit tile memory and the memory tiles' DMA channels. A decode step's attention (one query) is also
    offered on half the columns: slower alone, but a resident pass (``plan/resident.py``) can then give whole
    columns to the launches beside it."""
    device = device or npu2()
    out: list[tuple[tuple, Config]] = []
    for hpc in _heads_per_col(shape, device):
        for tq in [t for t in (64, 32, 16, 8, 4, 2, 1) if shape.q_len % t == 0][:3]:
            q_tiles = shape.q_len // tq
            for qpc in [n for n in range(1, device.compute_rows // hpc + 1) if q_tiles % n == 0]:
                units = (shape.n_heads // hpc) * (q_tiles // qpc)
                waste = -(-tq // MMUL_M) * MMUL_M / tq
                widths = [min(device.columns, units)]
                if shape.q_len == 1 and units >= device.columns:  # a decode step: also on half the columns
                    widths.append(device.columns // 2)
                for cols, tk in ((c, t) for c in widths for t in (128, 64, 32, 16)):
                    cfg = Config(cols, hpc, tq, tk, 2, "vector", qpc)
                    s2mm, mm2s = mem_tile_channels(shape, cfg)
                    if l1_bytes(shape, cfg) > device.compute.memory_bytes:
                        continue
                    if s2mm > device.mem.s2mm_channels or mm2s > device.mem.mm2s_channels:
                        continue
                    pad = kv_rows(shape, cfg) - shape.kv_len
                    # several heads per column before several query tiles: no key blocks streamed beyond need
                    out.append(((-cols * hpc * qpc, waste, pad > 0, -min(tq, 32) * tk, -tq, qpc), cfg))
    out.sort(key=lambda x: x[0])
    cands = [c for _, c in out]
    cands += decode_cascade_configs(shape, device)
    cands = [replace(c, kv_format=shape.kv_format) for c in cands]
    return cands + [replace(cands[0], variant="scalar")] if cands else []


def keeps_kv_heads_whole(op: str, config: dict) -> bool:
    """An ``allowed`` rule for a plan search (``plan.resident.fit_resident``): refuses the flash-decoding tilings
    (``group_rows``: a KV head's keys split over cascade stages, ``decode_cascade_configs``), passes everything else.
    For a plan that must keep every KV head's keys on one compute unit, as AIR's fused decode does."""
    return not config.get("group_rows")


def decode_cascade_configs(shape: Shape, device: Device | None = None) -> list[Config]:
    """Flash-decoding tilings of a decode step (one query): a unit per KV head, its group's heads as the tile's rows
    (``group_rows``), the stages of a column splitting its keys, K/V over one or both shim channels, on as many
    columns as KV heads (at most the array's) or half of them, or a KV head's stages over several columns
    (``kv_cols`` 2, 4, 8) when the array has that many columns for every KV head. Offered after the one-pass tilings,
    so they change no default; a tuner or a resident pass takes them when they are faster."""
    device = device or npu2()
    if shape.q_len != 1:
        return []
    full = min(device.columns, shape.n_kv_heads)
    # (columns, columns per KV head): one column per KV head on as many columns as there are KV heads (at most the
    # array's) or half of them; then, for a model with fewer KV heads than columns, each KV head's stages over 2, 4,
    # ... columns (``kv_cols``) while the array has them, so its cache streams over every column's shim
    widths = [(full, 1)] + ([(full // 2, 1)] if full == device.columns else [])
    widths += [(shape.n_kv_heads * kc, kc) for kc in (2, 4, 8) if shape.n_kv_heads * kc <= device.columns]
    out = []
    for cols, kc in widths:
        # every compute row a stage, or two stages (one per K/V channel: one stream each, no memory-tile split,
        # and half the rows left to the launches beside it in a resident pass)
        for rows in sorted({device.compute_rows, 2}, reverse=True):
            for ch in (2, 1):
                for tk in (64, 32, 16):
                    cfg = Config(cols=cols, heads_per_col=1, tile_q=1, tile_k=tk, kv_stages=rows * kc,
                                 group_rows=True, kv_channels=ch, kv_cols=kc, kv_format=shape.kv_format)  # fmt: skip
                    if l1_bytes(shape, cfg) <= device.compute.memory_bytes:
                        out.append(cfg)
    return out


def cascade_configs(shape: Shape, device: Device | None = None, stages: int = 4) -> list[Config]:
    """Legal cascade tilings (``stages`` workers per column splitting the keys, units as sequential launch
    iterations, every key block computed): AIR's registry FlashAttention dataflow (``attn_npu2.py``: one head and
    one 64-query tile per column, ``num_cascade_stages`` = 4 rows, the outer launch over query chunks, head pairs
    and value chunks run in sequence, ``causal_skip`` off). Largest query tile first, then largest key block; our
    fp32 softmax state makes the tiles smaller than AIR's 64 x 64."""
    device = device or npu2()
    out = []
    for tq in [t for t in (64, 32, 16, 8) if shape.q_len % t == 0]:
        q_tiles = shape.q_len // tq
        share = next(n for n in (AIR_Q_TILES, 2, 1) if q_tiles % n == 0 and device.columns % n == 0)
        groups = min(device.columns // share, shape.n_heads * q_tiles // share)
        for tk in (64, 32, 16):
            cfg = Config(
                groups * share, 1, tq, tk, 2, "vector", 1, False, stages, True, share, kv_format=shape.kv_format
            )
            if l1_bytes(shape, cfg) <= device.compute.memory_bytes and stages <= device.compute_rows:
                out.append(cfg)
    return out


def default_config(shape: Shape, device: Device | None = None) -> Config:
    """The fastest by the timing model of the ranking's first ``DEFAULT_TIMED`` one-pass tilings
    (``candidate_configs``' order breaks ties; a tiling the validator refuses, or with more than
    ``DEFAULT_TIMED_Q_TILES`` query tiles per head, is not timed; none left: the ranking's first).

    Why not the ranking's first: its rule of thumb (most tiles busy, less MMUL padding, then bigger tiles) cannot see
    how a tile's per-call costs trade against its shape. At head_dim 128 tile memory leaves a 32 x 16 or a 16 x 32
    query x key tile, and the wider key block is about 20 % faster (Qwen3, Qwen2.5-1.5B/3B and Llama-3.2-3B prefill);
    a quantized cache decodes every key block once per call, so its cost per query falls as the query tile grows.
    A plan names no attention tiling by default, so every prompt length gets its own; the tile tuner cannot fix one
    for all lengths (a tile_q tiling 2048 queries does not tile the gate's 24). Remembered per shape and device: a
    function of the shape, the code and the constants, as every modeled figure is."""
    return _timed_default(shape, device or npu2())


DEFAULT_TIMED = 12  # the best was within the ranking's first 9 one-pass tilings on every seed shape checked
# Tilings with more query tiles per head are not timed for the default (the ranking's first is taken when none is
# left): a long prompt in tiny tiles is a design of tens of thousands of tasks, seconds to build (6004 queries in
# 4-query tiles), and the prompt is padded to whole larger tiles when that is faster (``kernels.bind._attn_q_len``).
DEFAULT_TIMED_Q_TILES = 512


@functools.lru_cache(maxsize=1024)
def _timed_default(shape: Shape, device: Device) -> Config:
    cands = candidate_configs(shape, device)
    if not cands:
        raise shape_error(FAMILY, f"no attention tiling fits {shape}; head_dim must be a multiple of {MMUL_KN}")
    best: tuple[float, Config] | None = None
    ranked = [c for c in cands if not c.group_rows and c.variant == "vector"][:DEFAULT_TIMED]
    for config in [c for c in ranked if shape.q_len // c.tile_q <= DEFAULT_TIMED_Q_TILES]:
        design = make_design(shape, config, device)
        if validate(design):
            continue
        seconds = time_design(design).seconds
        if best is None or seconds < best[0]:
            best = (seconds, config)
    return best[1] if best is not None else cands[0]


def complete_config(shape: Shape, partial: dict, device: Device | None = None) -> Config:
    """A plan's config that names only some fields (e.g. ``skip_masked``: how a baseline's kernel treats masked
    blocks) completed by the default tiling for the shape, so one plan serves any prompt length and model."""
    return replace(default_config(shape, device), **partial)
