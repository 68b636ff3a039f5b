"""The op graph of one decoder block (and of the head), built from a ModelSpec alone.

There is one general graph for every family: optional nodes (QKV bias, O bias, per-head Q/K norm)
appear only when the spec says the model has them. Each node names the values it reads and writes
(a value is named after the op that produced it, plus the layer input ``x`` and the ``kv_cache``
state), so a plan's op order can be checked against real data dependencies and the runner can
execute any grouping of the nodes without knowing the family.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tilepilot.model.spec import ModelSpec

# semantic op kind -> kernel families that may implement it on the NPU. "cpu" marks a call run on the host CPU.
KIND_FAMILIES: dict[str, tuple[str, ...]] = {
    "rmsnorm": ("rmsnorm",),
    "linear": ("gemm", "gemv", "qgemv", "qgemm"),  # qgemv/qgemm: packed quantized weights (model/quant.py)
    "bias": ("bias",),
    "head_norm": ("rmsnorm",),
    "rope": ("rope",),
    # kv_write has no kernel for a bf16 cache: on the NPU the producer's drain lands in the cache buffer (a DMA);
    # on the host it is a copy into the cache. "kv_cache" names that runtime operation. A q8_0 cache is written by
    # a launch that quantizes the rows ("kvquant", ``kernels/kvquant.py``).
    "kv_write": ("kv_cache", "kvquant"),
    "attention": ("attention",),
    "add": ("eltwise",),
    "swiglu": ("swiglu",),
    "lm_head": ("lm_head", "gemv", "gemm", "qgemv"),
}

# Op kinds a GEMV launch serves when small ops fold into it (``kernels.bind.FoldedLinear``), and the kinds that fold:
# the RMSNorm its ops read (a prologue), the residual add or SwiGLU of their outputs (an epilogue); a per-head
# norm, which folds into the RoPE launch that reads it (``kernels.bind.NormedRope``); and a quantized cache's write,
# which folds into the RoPE launch that rotates K (``kernels.bind.CachedRope``).
LINEAR_KINDS = ("linear", "lm_head")
EPILOGUE_KINDS = ("add", "swiglu")
FOLDED_KINDS = ("rmsnorm", "head_norm", *EPILOGUE_KINDS, "kv_write")


def folded_kinds(kinds: Sequence[str]) -> list[str]:
    """The kinds folded into a merged run's launch, in their order of first appearance: ``FOLDED_KINDS``, and RoPE
    after linear ops (the RoPE epilogue of a GEMV launch, ``kernels.bind.FoldedLinear``; a run of RoPE ops alone is
    one RoPE launch, nothing folded)."""
    folded = [k for k in kinds if k in FOLDED_KINDS or (k == "rope" and kinds[0] in LINEAR_KINDS)]
    return list(dict.fromkeys(folded))


CPU_FAMILY = "cpu"
# plans saved before CPU calls were named "cpu" called them "host"; they load as CPU_FAMILY
LEGACY_CPU_FAMILY = "host"
KV_FAMILY = "kv_cache"
LAYER_INPUT = "x"
KV_STATE = "kv_cache"
BLOCK_OUTPUT = "resid2"


@dataclass(frozen=True)
class OpNode:
    """One node: what it computes (kind), what it reads and writes, and which weights it needs.

    ``weights`` are ``LayerWeights`` field names for block ops, and ``final_norm`` / ``lm_head`` for
    the head. ``width`` is the size of the output's last dimension (per token).
    """

    op: str
    kind: str
    inputs: tuple[str, ...]
    weights: tuple[str, ...]
    width: int

    @property
    def output(self) -> str:
        """The value this node writes: its own name, except the KV write, which updates the cache."""
        return KV_STATE if self.kind == "kv_write" else self.op


@dataclass(frozen=True)
class BlockGraph:
    """Nodes of one block and of the head, in a valid execution order."""

    block: tuple[OpNode, ...]
    head: tuple[OpNode, ...]

    def node(self, op: str) -> OpNode:
        for n in self.block + self.head:
            if n.op == op:
                return n
        raise KeyError(op)

    def readers(self, value: str) -> tuple[str, ...]:
        """The ops of the block and the head that read ``value``."""
        return tuple(n.op for n in self.block + self.head if value in n.inputs)

    @property
    def block_ops(self) -> tuple[str, ...]:
        return tuple(n.op for n in self.block)

    @property
    def head_ops(self) -> tuple[str, ...]:
        return tuple(n.op for n in self.head)

    def value_width(self, value: str, spec: ModelSpec) -> int:
        """Per-token width of a value (``x`` is the hidden state; ``kv_cache`` holds K and V rows)."""
        if value == LAYER_INPUT:
            return spec.hidden
        if value == KV_STATE:
            return 2 * spec.kv_dim
        return self.node(value).width


def block_graph(spec: ModelSpec) -> BlockGraph:
    """The block and head graph of ``spec``; the only place that decides which optional ops exist."""
    h, q, kv, f = spec.hidden, spec.q_dim, spec.kv_dim, spec.intermediate
    nodes: list[OpNode] = [
        OpNode("attn_norm", "rmsnorm", (LAYER_INPUT,), ("attn_norm",), h),
        OpNode("q_proj", "linear", ("attn_norm",), ("wq",), q),
        OpNode("k_proj", "linear", ("attn_norm",), ("wk",), kv),
        OpNode("v_proj", "linear", ("attn_norm",), ("wv",), kv),
    ]
    cur = {"q": "q_proj", "k": "k_proj", "v": "v_proj"}
    if spec.qkv_bias:
        for name, width in (("q", q), ("k", kv), ("v", kv)):
            nodes.append(OpNode(f"{name}_bias", "bias", (cur[name],), (f"b{name}",), width))
            cur[name] = f"{name}_bias"
    if spec.qk_norm:
        for name, width in (("q", q), ("k", kv)):
            nodes.append(OpNode(f"{name}_norm", "head_norm", (cur[name],), (f"{name}_norm",), width))
            cur[name] = f"{name}_norm"
    nodes += [
        OpNode("rope_q", "rope", (cur["q"],), (), q),
        OpNode("rope_k", "rope", (cur["k"],), (), kv),
        OpNode("kv_write", "kv_write", ("rope_k", cur["v"]), (), 2 * kv),
        OpNode("attention", "attention", ("rope_q", KV_STATE), (), q),
        OpNode("o_proj", "linear", ("attention",), ("wo",), h),
    ]
    o = "o_proj"
    if spec.o_bias:
        nodes.append(OpNode("o_bias", "bias", ("o_proj",), ("bo",), h))
        o = "o_bias"
    nodes += [
        OpNode("resid1", "add", (LAYER_INPUT, o), (), h),
        OpNode("ffn_norm", "rmsnorm", ("resid1",), ("ffn_norm",), h),
        OpNode("gate_proj", "linear", ("ffn_norm",), ("w_gate",), f),
        OpNode("up_proj", "linear", ("ffn_norm",), ("w_up",), f),
        OpNode("swiglu", "swiglu", ("gate_proj", "up_proj"), (), f),
        OpNode("down_proj", "linear", ("swiglu",), ("w_down",), h),
        OpNode("resid2", "add", ("resid1", "down_proj"), (), h),
    ]
    head = (
        OpNode("final_norm", "rmsnorm", (LAYER_INPUT,), ("final_norm",), h),
        OpNode("lm_head", "lm_head", ("final_norm",), ("lm_head",), spec.vocab),
    )
    return BlockGraph(block=tuple(nodes), head=head)


def weight_shape(spec: ModelSpec, name: str) -> tuple[int, ...]:
    """Shape of a weight named as in ``OpNode.weights`` (HF orientation ``[out, in]``)."""
    h, q, kv, f = spec.hidden, spec.q_dim, spec.kv_dim, spec.intermediate
    shapes = {
        "attn_norm": (h,),
        "ffn_norm": (h,),
        "final_norm": (h,),
        "wq": (q, h),
        "wk": (kv, h),
        "wv": (kv, h),
        "wo": (h, q),
        "w_gate": (f, h),
        "w_up": (f, h),
        "w_down": (h, f),
        "bq": (q,),
        "bk": (kv,),
        "bv": (kv,),
        "bo": (h,),
        "q_norm": (spec.head_dim,),
        "k_norm": (spec.head_dim,),
        "lm_head": (spec.vocab, h),
    }
    return shapes[name]
