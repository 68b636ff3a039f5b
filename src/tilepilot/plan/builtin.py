"""The built-in plans, derived from any ModelSpec through the general block graph.

- ``default``: the starting point of a new deployment: one op per group, unfused, weights synced per
  call, host transposes, and the ops that are hardest to get right on the array (decode attention,
  LM head) on the CPU. Correct first; the optimization skills take it from there.
- ``iron-like``: how ``reference/xdna2.md`` describes the IRON baseline: one dispatch per op, weights
  synced on every call, decode attention on the CPU, host transposes, KV cache managed by the host.
- ``paper-like``: the paper's reference deployment: 3 dispatches per layer in prefill
  (rms+QKV(+bias, +Q/K norm)+RoPE | flash attention | O+residual+RMSNorm+gate/up+SwiGLU+down+residual),
  2 in decode with attention on the CPU, static (preloaded) weights, skipped redundant writes,
  seq-first layout, LM head on the NPU.
"""

from __future__ import annotations

from collections.abc import Callable

from tilepilot.errors import ConfigError
from tilepilot.model.graph import CPU_FAMILY, BlockGraph, OpNode, block_graph
from tilepilot.model.spec import ModelSpec
from tilepilot.plan.air_q4 import air_q4_plan
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


def iron_like_plan(spec: ModelSpec) -> DeploymentPlan:
    graph = block_graph(spec)

    def cpu_ops(stage: str) -> Callable[[OpNode], bool]:
        def on_cpu(n: OpNode) -> bool:
            return n.kind == "kv_write" or (n.kind == "attention" and stage == "decode")

        return on_cpu

    plan = DeploymentPlan(
        name="iron-like",
        spec=spec.to_dict(),
        prefill=_one_per_op(graph, "prefill", cpu_ops("prefill")),
        decode=_one_per_op(graph, "decode", cpu_ops("decode")),
        host=HostPolicy(weights="per_call", zero_copy=False, skip_unchanged_writes=False, reuse_buffers=False),
        notes=[
            "iron-like: one NPU dispatch per op (the IRON baseline as reference/xdna2.md describes it)",
            "weights synced to the device on every call; every intermediate read back and rewritten",
            "decode attention and KV-cache writes on the host CPU; host transposes around attention",
            "LM head on the NPU (IRON's ~194 dispatches per decode token = 12 per block x 16 + 2)",
        ],
    )
    check_plan(plan, spec)
    return plan


def paper_like_plan(spec: ModelSpec) -> DeploymentPlan:
    graph = block_graph(spec)
    nodes = list(graph.block)
    split_attn = [n.op for n in nodes].index("attention")
    pre, attn, post = nodes[:split_attn], nodes[split_attn], nodes[split_attn + 1 :]

    def stage_plan(stage: str) -> StagePlan:
        first = "rms_gemms_rope" if stage == "prefill" else "rms_gemv_rope"
        last = "o_ffn" if stage == "prefill" else "o_gemv_ffn"
        attention = (
            _group("flash_attn", [attn], stage) if stage == "prefill" else _group("cpu_attention", [attn], stage, "cpu")
        )
        return StagePlan(
            block=[_group(first, pre, stage), attention, _group(last, post, stage)],
            head=[_group("lm_head", list(graph.head), stage)],
        )

    plan = DeploymentPlan(
        name="paper-like",
        spec=spec.to_dict(),
        prefill=stage_plan("prefill"),
        decode=stage_plan("decode"),
        host=HostPolicy(
            weights="preloaded", zero_copy=False, skip_unchanged_writes=True, reuse_buffers=True, layout="seq_first"
        ),
        notes=[
            "paper-like: the paper's reference deployment (3 dispatches per layer in prefill, 2 in decode)",
            "KV cache written by the projection group's drain; decode attention on the host CPU",
            "static weights preloaded once; redundant writes skipped; seq-first layout; LM head on the NPU",
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
