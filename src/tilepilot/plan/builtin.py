"""The built-in plans, derived from any ModelSpec through the general block graph.

- ``default``: the starting point of a new deployment: one op per group, unfused, weights synced per
  call, host transposes, and the ops that are hardest to get right on the array (decode attention,
  LM head) on the CPU. Correct first; the optimization skills take it from there.
- ``iron-like``: how ``reference/xdna2.md`` describes the IRON baseline: one dispatch per op, weights
  synced on every call, decode attention on the CPU, host transposes, KV cache managed by the host.
- ``paper-like``: how the paper deployed the model (``plan.paper_deployments``, one row per model of
  ``reference/xdna2.md``): rms+QKV(+bias, +Q/K norm)+RoPE | flash attention | O+FFN in one to five dispatches in
  prefill; in decode the fused O+FFN cascade or standalone GEMVs with the M=1 glue on the CPU; decode attention and
  the final RMSNorm on the CPU; the KV-cache writes on the host; host seq<->head transposes around head-first
  (head_dim 128) attention; static (preloaded) weights, skipped redundant writes of static inputs, activations handed
  from dispatch to dispatch through the host (``handoff="host"``: each ELF its own buffers, ``profile.md``'s BO Write /
  BO Read), LM head on the NPU. The reference deployment (Llama-3.2-1B: 3 / 2
  dispatches) for a model the paper did not deploy.
"""

from __future__ import annotations

from collections.abc import Callable

from tilepilot.errors import ConfigError
from tilepilot.kernels.lm_head import PARTITION_ROWS
from tilepilot.model.graph import CPU_FAMILY, BlockGraph, OpNode, block_graph
from tilepilot.model.spec import ModelSpec
from tilepilot.plan.air_q4 import air_q4_plan
from tilepilot.plan.paper_deployments import REFERENCE, paper_deployment
from tilepilot.plan.plan import DeploymentPlan, HostPolicy, KernelCall, KernelGroup, StagePlan, check_plan, npu_family


def _call(node: OpNode, stage: str, where: str) -> KernelCall:
    return KernelCall(op=node.op, family=CPU_FAMILY if where == "cpu" else npu_family(node, stage))


def _group(name: str, nodes: list[OpNode], stage: str, where: str = "npu") -> KernelGroup:
    return KernelGroup(name=name, calls=[_call(n, stage, where) for n in nodes], where=where)


def _one_per_op(graph: BlockGraph, stage: str, on_cpu: Callable[[OpNode], bool]) -> StagePlan:
    def groups(nodes: tuple[OpNode, ...]) -> list[KernelGroup]:
        return [_group(n.op, [n], stage, "cpu" if on_cpu(n) else "npu") for n in nodes]

    return StagePlan(block=groups(graph.block), head=groups(graph.head))


def default_plan(spec: ModelSpec) -> DeploymentPlan:
    graph = block_graph(spec)

    def cpu_ops(stage: str) -> Callable[[OpNode], bool]:
        def on_cpu(n: OpNode) -> bool:
            return n.kind in ("kv_write", "lm_head") or (n.kind == "attention" and stage == "decode")

        return on_cpu

    plan = DeploymentPlan(
        name="default",
        spec=spec.to_dict(),
        prefill=_one_per_op(graph, "prefill", cpu_ops("prefill")),
        decode=_one_per_op(graph, "decode", cpu_ops("decode")),
        host=HostPolicy(weights="per_call", zero_copy=False, skip_unchanged_writes=False, reuse_buffers=False),
        notes=[
            "default: one op per group, unfused, family default tile configs",
            "KV writes, decode attention and the LM head run on the host CPU",
            "weights synced to the device on every call; host transposes around attention",
        ],
    )
    check_plan(plan, spec)
    return plan


# IRON's prefill attention (amd/IRON ``iron/operators/mha/design.py``, used by its Llama-3.2-1B application with 8
# pipelines and 64 x 64 blocks) streams K and V whole for every query block and its runtime sets the key-block loop
# to every block (``loop_idx_kv = num_kv_blocks``), the causal mask applied inside ``partial_softmax``: no block is
# skipped. Our attention family's tiling with that property; the rest is the family default.
IRON_MHA = {"skip_masked": False}


def iron_like_plan(spec: ModelSpec) -> DeploymentPlan:
    graph = block_graph(spec)

    def cpu_ops(stage: str) -> Callable[[OpNode], bool]:
        def on_cpu(n: OpNode) -> bool:
            return n.kind == "kv_write" or (n.kind == "attention" and stage == "decode")

        return on_cpu

    prefill = _one_per_op(graph, "prefill", cpu_ops("prefill"))
    for g in prefill.groups():
        for c in g.calls:
            if c.family == "attention":
                c.config = dict(IRON_MHA)
    plan = DeploymentPlan(
        name="iron-like",
        spec=spec.to_dict(),
        prefill=prefill,
        decode=_one_per_op(graph, "decode", cpu_ops("decode")),
        host=HostPolicy(weights="per_call", zero_copy=False, skip_unchanged_writes=False, reuse_buffers=False),
        notes=[
            "iron-like: one NPU dispatch per op (the IRON baseline as reference/xdna2.md describes it)",
            "weights synced to the device on every call; every intermediate read back and rewritten",
            "decode attention and KV-cache writes on the host CPU; host transposes around attention",
            "prefill attention computes every key block of every query block (IRON's fused MHA skips none)",
            "LM head on the NPU (IRON's ~194 dispatches per decode token = 12 per block x 16 + 2)",
        ],
    )
    check_plan(plan, spec)
    return plan


# short names of the post-attention ops, to name the split groups as the paper named its ELFs (o_res_norm, gate_up,
# swiglu_down_add, ...)
_TAGS = {"o_proj": "o", "o_bias": "bias", "resid1": "res", "ffn_norm": "norm", "gate_proj": "gate", "up_proj": "up",
         "swiglu": "swiglu", "down_proj": "down", "resid2": "add"}  # fmt: skip


def _split(nodes: list[OpNode], cuts: tuple[str, ...]) -> list[list[OpNode]]:
    """``nodes`` cut before every op named in ``cuts``."""
    parts: list[list[OpNode]] = [[]]
    for n in nodes:
        if n.op in cuts and parts[-1]:
            parts.append([])
        parts[-1].append(n)
    return parts


def _names(parts: list[list[OpNode]], whole: str) -> list[str]:
    """``whole`` for an unsplit part, else the ops' short names joined (``o_res_norm``, ``gate_up``, ...)."""
    return [whole] if len(parts) == 1 else ["_".join(_TAGS.get(n.op, n.op) for n in p) for p in parts]


def _decode_standalone(nodes: list[OpNode]) -> list[KernelGroup]:
    """Decode O+FFN without the fused cascade: every projection a standalone GEMV dispatch (a bias joins its
    projection's), the M=1 glue between them (residual add, FFN RMSNorm, SwiGLU) in CPU groups."""
    runs: list[tuple[str, list[OpNode]]] = []
    for n in nodes:
        where = "npu" if n.kind in ("linear", "bias") else "cpu"
        if runs and runs[-1][0] == where and n.kind != "linear":
            runs[-1][1].append(n)
        else:
            runs.append((where, [n]))
    tags = ["_".join(_TAGS.get(n.op, n.op) for n in ns) for _, ns in runs]
    return [
        _group(f"{tag.split('_')[0]}_gemv" if where == "npu" else f"cpu_{tag}", ns, "decode", where)
        for tag, (where, ns) in zip(tags, runs, strict=True)
    ]


def paper_like_plan(spec: ModelSpec) -> DeploymentPlan:
    """The paper's deployment of ``spec``'s model (``plan.paper_deployments``: its row of the table, or the
    reference deployment's for a model the paper did not deploy), one builder for every row."""
    graph = block_graph(spec)
    facts = paper_deployment(spec)
    known = facts is not None
    facts = facts or REFERENCE
    head_first = facts.head_first if known else spec.head_dim >= 128
    nodes = list(graph.block)
    split_attn = [n.op for n in nodes].index("attention")
    pre, attn, post = nodes[:split_attn], nodes[split_attn], nodes[split_attn + 1 :]
    # the host extracts K/V from the attention-input ELF's outputs into its KV cache (profile.md: kv_cache_extract,
    # 1.1 ms per layer at 2048 tokens; decode: the CPU attention updates the cache)
    kv_write = [n for n in pre if n.kind == "kv_write"]
    pre = [n for n in pre if n.kind != "kv_write"]
    final_norm, lm_head = graph.head

    def stage_plan(stage: str) -> StagePlan:
        if stage == "prefill":
            block = [_group("rms_gemms_rope", pre, stage), _group("cpu_kv_cache", kv_write, stage, "cpu")]
            block += [_group("flash_attn", [attn], stage)]
            parts = _split(post, facts.prefill_cuts)
            block += [_group(name, part, stage) for name, part in zip(_names(parts, "o_ffn"), parts, strict=True)]
        else:
            block = [_group("rms_gemv_rope", pre, stage), _group("cpu_attention", [*kv_write, attn], stage, "cpu")]
            block += [_group("o_gemv_ffn", post, stage)] if facts.decode_cascade else _decode_standalone(post)
        head = [_group("cpu_final_norm", [final_norm], stage, "cpu"), _group("lm_head", [lm_head], stage)]
        if known and facts.lm_head_rows != PARTITION_ROWS:
            # the paper's own partitioning of its LM head where it is not the family's (a shape it did not deploy,
            # and one it cut as the default does, keep the default config)
            head[1].calls[0].config = {"partition_rows": facts.lm_head_rows}
        return StagePlan(block=block, head=head)

    plan = DeploymentPlan(
        name="paper-like",
        spec=spec.to_dict(),
        prefill=stage_plan("prefill"),
        decode=stage_plan("decode"),
        host=HostPolicy(
            weights="preloaded",
            zero_copy=False,
            skip_unchanged_writes=True,
            reuse_buffers=True,
            layout="host_transpose" if head_first else "seq_first",
            handoff="host",
            attention="per_head",  # decode_attention_cpu loops over the query heads
        ),
        notes=[
            f"paper-like: the paper's deployment of {facts.model if known else 'its reference model ' + facts.model}"
            f" ({facts.source})",
            "attention-input ELF: RMSNorm + Q/K/V (+ QKV bias / QK-norm) + RoPE; the host copies K/V into its KV cache",
            "separate XRT kernels: each dispatch's activation inputs copied into its own buffers, results read "
            "zero-copy (host handoff)",
            "decode attention and the final RMSNorm on the host CPU"
            + ("" if facts.decode_cascade else "; decode projections standalone GEMVs, the M=1 glue on the CPU"),
            ("head-first FlashAttention with host seq<->head transposes" if head_first else "seq-first layout")
            + "; static weights preloaded once; redundant writes skipped; LM head on the NPU"
            + (f" in {facts.lm_head_rows}-row partitions" if known else ""),
        ],
    )
    check_plan(plan, spec)
    return plan


BUILTIN_PLANS: dict[str, Callable[[ModelSpec], DeploymentPlan]] = {
    "default": default_plan,
    "iron-like": iron_like_plan,
    "paper-like": paper_like_plan,
    "air-q4": lambda spec: air_q4_plan(paper_like_plan(spec)),
}


def builtin_plan(name: str, spec: ModelSpec) -> DeploymentPlan:
    """Build a built-in plan by name (``default``, ``iron-like``, ``paper-like``, ``air-q4``)."""
    try:
        builder = BUILTIN_PLANS[name]
    except KeyError:
        raise ConfigError(f"unknown plan {name!r}; built-in plans are {', '.join(BUILTIN_PLANS)}") from None
    return builder(spec)
