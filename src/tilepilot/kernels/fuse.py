"""Fusion: several kernel launches as one dispatch (a ``MultiLaunchGroup``), with their tensors wired together.

A dispatch costs a host round trip (tens of microseconds) that small launches cannot amortize; the paper's
reference deployment runs a whole block in 3 dispatches. A group here is a list of ``Launch``es: each
names its kernel family, shape and config, and binds some of its input tensors to outputs of earlier
launches ("q_proj.c"). Unbound inputs become group inputs named ``<launch>.<tensor>``; every launch
output is a group output under the same naming. Bindings are checked when the group is built: a
binding that names a missing launch or tensor, or joins tensors of different sizes or dtypes (the
"merged-launch argument mismatch" the paper's authors hit), raises the validator's ``GROUP_BINDING``
error. DDR tensors are flat bytes, so a binding between tensors of equal size and dtype but different
shapes (an elementwise launch's flat vector and a GEMM's [rows, cols]) reinterprets the destination
tensor's shape; ``Launch.views`` does the same explicitly for group inputs and outputs.

``group_for_ops`` builds a group from any run of ops of the block graph (``plan.graph``: one general graph
for every model family), so "RMSNorm + Q/K/V projections (+ bias, + Q/K norm) + RoPE" and "O projection
+ residual + RMSNorm + gate/up + SwiGLU + down + residual" are the same code for Llama, Qwen2 and Qwen3
(``qkv_rope_group``, ``o_ffn_group``). The KV-cache write is not a kernel: on the NPU it is the K/V
producers' drain landing in the cache buffer, so ``kv_write`` nodes add no launch.

Numerics: a group runs (``npu.execute.run_group_fast``, the executor's one group runner; this module only builds
groups) its launches' own fast paths in order on the bound tensors, so a fused group is
bit-identical to its launches run one by one (tested); only the modeled time changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from tilepilot.errors import ConfigError, InputError
from tilepilot.kernels.registry import family as family_module
from tilepilot.model.graph import KV_STATE, block_graph, weight_shape
from tilepilot.model.spec import ModelSpec
from tilepilot.model.weights import LayerWeights
from tilepilot.npu.design import Binding, Design, MultiLaunchGroup, TensorSpec, torch_dtype
from tilepilot.npu.device import Device, npu2
from tilepilot.npu.execute import binding_error, run_group_fast
from tilepilot.npu.validate import check_group

LINEAR_FAMILY = {"prefill": "gemm", "decode": "gemv"}
# DDR tensor names per family: (activation inputs in graph order, weight input or None, output).
TENSORS: dict[str, tuple[tuple[str, ...], str | None, str]] = {
    "gemm": (("a",), "w", "c"),
    "gemv": (("x",), "w", "y"),
    "qgemm": (("a",), "w", "c"),
    "qgemv": (("x",), "w", "y"),
    "rmsnorm": (("x",), "w", "y"),
    "bias": (("x",), "b", "y"),
    "rope": (("x",), None, "y"),
    "eltwise": (("a", "b"), None, "c"),
    "swiglu": (("gate", "up"), None, "y"),
    "attention": (("q", "kv"), None, "o"),
}


@dataclass(frozen=True)
class Launch:
    """One launch of a group: ``bindings`` maps an input tensor to ``"<earlier launch>.<output tensor>"``."""

    name: str
    family: str
    shape: Any
    config: Any = None
    bindings: Mapping[str, str] = field(default_factory=dict)
    views: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


def as_launch(item: Launch | Sequence[Any]) -> Launch:
    """A Launch, or a (name, family, shape, config, bindings) tuple."""
    if isinstance(item, Launch):
        return item
    name, family, shape, config, bindings = item
    return Launch(name, family, shape, config, dict(bindings or {}))


# ----------------------------------------------------------------------------------------------------------------------
# Reinterpreting a DDR tensor's shape
# ----------------------------------------------------------------------------------------------------------------------
def view_design(design: Design, shapes: Mapping[str, tuple[int, ...]]) -> Design:
    """The same design with some DDR tensors declared in another shape of the same size (a free reinterpretation:
    access patterns address flat elements). The fast path sees its original shapes."""
    if not shapes:
        return design
    specs = {t.name: t for t in design.inputs + design.outputs}
    new: dict[str, TensorSpec] = {}
    for name, shape in shapes.items():
        if name not in specs:
            raise ConfigError(f"Design {design.name} has no tensor {name!r} to view; its tensors are {sorted(specs)}.")
        spec = specs[name]
        view = TensorSpec(name, tuple(shape), spec.dtype)
        if view.n_elements != spec.n_elements:
            raise ConfigError(
                f"Cannot view {design.name}.{name} {spec.shape} as {view.shape}: {spec.n_elements} vs "
                f"{view.n_elements} elements; a view keeps the size."
            )
        new[name] = view
    original = {n: specs[n].shape for n in new}
    tasks = [replace(t, tap=replace(t.tap, tensor_shape=new[t.tensor].shape)) if t.tensor in new else t
             for t in design.runtime.tasks]  # fmt: skip
    inner = design.fast

    def fast(inputs: dict[str, torch.Tensor], *, exact: bool = False) -> dict[str, torch.Tensor]:
        ins = {k: v.reshape(original[k]) if k in original else v for k, v in inputs.items()}
        outs = inner(ins, exact=exact)
        return {k: v.reshape(new[k].shape) if k in new else v for k, v in outs.items()}

    return replace(
        design,
        inputs=[new.get(t.name, t) for t in design.inputs],
        outputs=[new.get(t.name, t) for t in design.outputs],
        runtime=replace(design.runtime, tasks=tasks),
        fast=fast,
        meta={**design.meta, "views": {k: list(v) for k, v in shapes.items()}},
    )


# ----------------------------------------------------------------------------------------------------------------------
# Building and running groups
# ----------------------------------------------------------------------------------------------------------------------
def launch_design(launch: Launch, device: Device | None = None) -> Design:
    """The launch's design, renamed after the launch (bindings name launches) and with its views applied."""
    mod = family_module(launch.family)
    design = mod.make_design(launch.shape, launch.config, device or npu2())
    return view_design(replace(design, name=launch.name), launch.views)


def build_group(
    name: str, launches: Sequence[Launch | Sequence[Any]], device: Device | None = None, validate: bool = False
) -> MultiLaunchGroup:
    """A multi-launch group of ``launches`` in order; GROUP_BINDING errors on any inconsistent binding.

    ``validate=True`` also runs the full validator on every launch (what a phase gate does once per plan).
    """
    device = device or npu2()
    designs: list[Design] = []
    bindings: list[Binding] = []
    problems: list[str] = []
    for item in launches:
        launch = as_launch(item)
        design = launch_design(launch, device)
        outputs = {(d.name, t.name): t for d in designs for t in d.outputs}
        views: dict[str, tuple[int, ...]] = {}
        for dst, src in launch.bindings.items():
            if "." not in src:
                problems.append(f"{launch.name}.{dst} is bound to {src!r}; name a source as '<launch>.<tensor>'")
                continue
            src_launch, src_tensor = src.rsplit(".", 1)
            bindings.append(Binding(src_launch, src_tensor, launch.name, dst))
            out = outputs.get((src_launch, src_tensor))
            mine = next((t for t in design.inputs if t.name == dst), None)
            if out is not None and mine is not None and out.shape != mine.shape:
                if out.n_elements == mine.n_elements and out.dtype == mine.dtype:
                    views[dst] = out.shape
        designs.append(view_design(design, views))
    group = MultiLaunchGroup(name, designs, bindings)
    problems += group.binding_problems()
    if problems:
        raise binding_error(problems, name)
    return check_group(group) if validate else group


def run_unfused_fast(
    group: MultiLaunchGroup, inputs: Mapping[str, torch.Tensor], *, exact: bool = False
) -> dict[str, torch.Tensor]:
    """The same launches as separate dispatches (each output read back and fed to the next launch's call)."""
    out: dict[str, torch.Tensor] = {}
    for d in group.designs:
        single = MultiLaunchGroup(d.name, [d], [])
        ins = {}
        for spec in d.inputs:
            b = next((b for b in group.bindings if b.dst_launch == d.name and b.dst_tensor == spec.name), None)
            key = f"{b.src_launch}.{b.src_tensor}" if b else f"{d.name}.{spec.name}"
            ins[f"{d.name}.{spec.name}"] = (out if b else inputs)[key].clone()
        out.update(run_group_fast(single, ins, exact=exact))
    return out


# ----------------------------------------------------------------------------------------------------------------------
# Groups from the block graph
# ----------------------------------------------------------------------------------------------------------------------
def node_launch(
    node, spec: ModelSpec, rows: int, stage: str, context: int, config: Any = None, family: str | None = None
) -> Launch:
    """The launch of one block-graph node for ``rows`` tokens (attention: ``context`` cached positions before).
    ``family`` is the plan's family of a linear op (a quantized plan's qgemm/qgemv, whose shape carries the weight
    format and block of ``config``); by default the stage's bf16 family."""
    kind = node.kind
    if kind == "linear":
        n, k = weight_shape(spec, node.weights[0])
        family = family or LINEAR_FAMILY[stage]
        mod = family_module(family)
        if family in ("qgemm", "qgemv"):
            shape = mod.Shape(m=rows, n=n, k=k, fmt=config.fmt, block=config.block)
        else:
            shape = mod.Shape(m=rows, n=n, k=k) if family == "gemm" else mod.Shape(n=n, k=k, m=rows)
    elif kind == "rmsnorm":
        family, shape = "rmsnorm", family_module("rmsnorm").Shape(rows, node.width, 1, spec.rms_eps)
    elif kind == "head_norm":
        heads = node.width // spec.head_dim
        family, shape = "rmsnorm", family_module("rmsnorm").Shape(rows, spec.head_dim, heads, spec.rms_eps)
    elif kind == "bias":
        family, shape = "bias", family_module("bias").Shape(rows, node.width)
    elif kind == "rope":
        family, shape = "rope", family_module("rope").Shape(rows, node.width // spec.head_dim, spec.head_dim)
    elif kind == "add":
        family, shape = "eltwise", family_module("eltwise").Shape(n=rows * node.width, op="add")
    elif kind == "swiglu":
        family, shape = "swiglu", family_module("swiglu").Shape(rows, node.width)
    elif kind == "attention":
        family = "attention"
        # the cache's format from the config; a dict of data fields only (``plan.plan.DATA_FIELDS``) leaves the
        # tiling to the default of this (unpadded) shape
        fmt = config.get("kv_format", "bf16") if isinstance(config, dict) else getattr(config, "kv_format", "bf16")
        config = None if isinstance(config, dict) else config
        shape = family_module("attention").Shape(
            rows, context + rows, spec.n_heads, spec.n_kv_heads, spec.head_dim, kv_format=fmt
        )
    else:
        raise ConfigError(f"op {node.op} ({kind}) has no NPU kernel to fuse; leave it out of the group.")
    views = {t: (rows, node.width) for t in ("a", "b", "c")} if family == "eltwise" else {}
    return Launch(node.op, family, shape, config, {}, views)


def group_for_ops(
    name: str,
    spec: ModelSpec,
    ops: Sequence[str],
    rows: int,
    *,
    stage: str = "prefill",
    context: int = 0,
    configs: Mapping[str, Any] | None = None,
    device: Device | None = None,
    families: Mapping[str, str] | None = None,
) -> MultiLaunchGroup:
    """One dispatch for a run of block-graph ops: a launch per op (kv_write adds none), inputs bound to the
    outputs of earlier ops of the group; everything else (layer input, weights, RoPE tables, the KV cache,
    values of earlier groups) is a group input."""

    if stage not in LINEAR_FAMILY:
        raise ConfigError(f"stage {stage!r} is unknown; use prefill or decode.")
    graph = block_graph(spec)
    configs = configs or {}
    launches: list[Launch] = []
    produced: dict[str, str] = {}  # value name -> "<launch>.<output tensor>"
    for op in ops:
        node = graph.node(op)
        if node.kind == "kv_write":
            continue
        launch = node_launch(node, spec, rows, stage, context, configs.get(op), (families or {}).get(op))
        acts, _, out = TENSORS[launch.family]
        values = [v for v in node.inputs if v != KV_STATE]
        bindings = {t: produced[v] for t, v in zip(acts, values, strict=False) if v in produced}
        launches.append(replace(launch, bindings=bindings))
        produced[node.output] = f"{node.op}.{out}"
    if not launches:
        raise ConfigError(f"group {name} holds no NPU op among {list(ops)}; give it at least one kernel op.")
    return build_group(name, launches, device)


def _ops_before_attention(spec: ModelSpec) -> list[str]:

    ops = list(block_graph(spec).block_ops)
    return ops[: ops.index("attention")]


def _ops_after_attention(spec: ModelSpec) -> list[str]:

    ops = list(block_graph(spec).block_ops)
    return ops[ops.index("attention") + 1 :]


def qkv_rope_group(spec: ModelSpec, rows: int, **kw: Any) -> MultiLaunchGroup:
    """RMSNorm + Q/K/V projections (+ QKV bias, + per-head Q/K norm) + RoPE on Q and K, as one dispatch."""
    return group_for_ops("rms_qkv_rope", spec, _ops_before_attention(spec), rows, **kw)


def o_ffn_group(spec: ModelSpec, rows: int, **kw: Any) -> MultiLaunchGroup:
    """O projection (+ bias) + residual + RMSNorm + gate/up + SwiGLU + down + residual, as one dispatch."""
    return group_for_ops("o_ffn", spec, _ops_after_attention(spec), rows, **kw)


def weight_inputs(group: MultiLaunchGroup, spec: ModelSpec, layer: LayerWeights) -> dict[str, torch.Tensor]:
    """The group inputs that are the layer's weights (``<op>.<weight tensor>`` -> the LayerWeights field)."""

    graph = block_graph(spec)
    out: dict[str, torch.Tensor] = {}
    for d in group.designs:
        family = d.meta.get("family")
        node = next((n for n in graph.block if n.op == d.name), None)
        if node is None or family not in TENSORS or not node.weights:
            continue
        weight = TENSORS[family][1]
        tensor = getattr(layer, node.weights[0])
        if tensor is None:
            raise InputError(f"Layer weights lack {node.weights[0]!r}, which op {node.op} needs; check the checkpoint.")
        out[f"{d.name}.{weight}"] = tensor.to(torch_dtype(d.tensor(weight).dtype))
    return out
