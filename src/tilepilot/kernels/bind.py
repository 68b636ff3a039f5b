"""How one op of the block graph becomes one kernel call: its family shape, config and tensor binding.

This is the only place that knows both the graph's value names and each family's DDR tensor names,
so the runner and ``time_plan`` build exactly the same designs for the same op. A binding gives:

- ``shape(node, spec, rows, context, config)``: the family ``Shape`` for ``rows`` tokens in this call
  and ``context`` positions of KV cache (attention); ``config`` is the plan's config dict (attention
  pads its queries to the config's query tile);
- ``run(design, args, spec)``: call ``design.fast`` with the op's tensors and return the output value
  as ``[rows, width]`` bf16. ``args`` holds the op's input values by value name, its weights by
  ``LayerWeights`` field name, for RoPE the table ``cs``, and for attention the ``kv_cache`` and ``layer``.

Families pad where their shapes do not tile; the family's ``prepare_inputs``/``crop_outputs`` helpers
do it, so callers never pad by hand.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

import torch

from tilepilot.errors import ConfigError
from tilepilot.kernels.registry import family as family_module
from tilepilot.model.graph import EPILOGUE_KINDS, LINEAR_KINDS, OpNode, weight_shape
from tilepilot.model.spec import ModelSpec
from tilepilot.npu.design import torch_dtype
from tilepilot.npu.timing import time_group

Args = dict[str, Any]


def make_config(module, shape: Any, config: dict[str, Any], device=None) -> Any:
    """The family's Config from a plan's config dict. An empty dict is the family default for the shape; a partial
    one is completed from that default by a family with ``complete_config`` (so a baseline plan can name one field
    and keep a tiling that fits any shape), and from the Config's own field defaults by every other family."""
    if not config:
        return module.default_config(shape, device) if device is not None else module.default_config(shape)
    known = {f.name for f in fields(module.Config)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ConfigError(f"{module.FAMILY} config has unknown keys {unknown}; known keys are {sorted(known)}")
    _check_types(module, config)
    complete = getattr(module, "complete_config", None)  # a family whose partial config completes for the shape
    if complete is not None and set(config) < known:
        return complete(shape, config, device) if device is not None else complete(shape, config)
    return module.Config(**config)


def config_key(config: dict[str, Any]) -> tuple[tuple[str, str, Any], ...]:
    """A plan config dict as the key of a cache of designs built from it: each value's type is part of the key,
    since 64 == 64.0 and 1 == True while a float tile size or a bool count builds differently or not at all (a
    cache keyed by the values alone hands the first one's design, or its legality, to the other)."""
    return tuple(sorted((k, type(v).__name__, v) for k, v in config.items()))


def config_of_key(key: tuple[tuple[str, str, Any], ...]) -> dict[str, Any]:
    """The config dict a ``config_key`` was made from."""
    return {k: v for k, _, v in key}


def _check_types(module, config: dict[str, Any]) -> None:
    """A config value of another type than its field's default (a tile size of 64.0, a variant of 1) is the plan's
    error, named, not a TypeError deep inside a design builder; an int where a float is expected is fine."""
    for f in fields(module.Config):
        if f.name not in config or f.default is None or f.default is MISSING:
            continue
        want, got = type(f.default), config[f.name]
        ok = type(got) is want or (want is float and type(got) is int)
        if want in (int, float, str, bool) and not ok:
            raise ConfigError(
                f"{module.FAMILY} config {f.name}={got!r} is {type(got).__name__}; it must be {want.__name__} "
                f"(e.g. {f.default!r})"
            )


@dataclass(frozen=True)
class OpBinding:
    """How one block-graph op becomes a kernel launch: its shape for a stage, and how to run its design on the op's
    arguments (the tensor-to-tensor wiring between launches of a group is ``npu.design.Binding``)."""

    shape: Callable[[OpNode, ModelSpec, int, int, dict[str, Any]], Any]
    run: Callable[[Any, Args, ModelSpec], torch.Tensor]


# ---- linear: GEMM (prefill) and GEMV (decode) ---------------------------------------------------------------------
def _linear_dims(node: OpNode, spec: ModelSpec) -> tuple[int, int]:

    n, k = weight_shape(spec, node.weights[0])
    return n, k


def _gemm_shape(node: OpNode, spec: ModelSpec, rows: int, context: int, config: dict[str, Any]) -> Any:
    n, k = _linear_dims(node, spec)
    return family_module("gemm").Shape(m=rows, n=n, k=k)


def _gemm_run(design: Any, args: Args, spec: ModelSpec) -> torch.Tensor:
    mod = family_module("gemm")
    node_in, w = args["_in"][0], args[args["_w"][0]]
    ins = mod.prepare_inputs(design, node_in, w)
    return mod.crop_outputs(design, design.fast(ins))["c"]


def _gemv_shape(node: OpNode, spec: ModelSpec, rows: int, context: int, config: dict[str, Any]) -> Any:
    n, k = _linear_dims(node, spec)
    return family_module("gemv").Shape(n=n, k=k, m=rows)


def _gemv_run(design: Any, args: Args, spec: ModelSpec) -> torch.Tensor:
    mod = family_module("gemv")
    x, w = args["_in"][0], args[args["_w"][0]]
    if hasattr(mod, "prepare_inputs"):
        out = mod.crop_outputs(design, design.fast(mod.prepare_inputs(design, x, w)))
    else:
        out = design.fast({"x": x, "w": w})
    return out["y"]


def _qgemv_shape(node: OpNode, spec: ModelSpec, rows: int, context: int, config: dict[str, Any]) -> Any:
    n, k = _linear_dims(node, spec)
    return family_module("qgemv").Shape(n=n, k=k, m=rows, fmt=config.get("fmt", "q4_0"), block=config.get("block", 32))


def _qgemv_run(design: Any, args: Args, spec: ModelSpec) -> torch.Tensor:
    """``args[field]`` is the packed uint8 weight (the runner registers packed buffers for qgemv stages)."""
    return design.fast({"x": args["_in"][0], "w": args[args["_w"][0]]})["y"]


def _qgemm_shape(node: OpNode, spec: ModelSpec, rows: int, context: int, config: dict[str, Any]) -> Any:
    n, k = _linear_dims(node, spec)
    return family_module("qgemm").Shape(m=rows, n=n, k=k, fmt=config.get("fmt", "q4_0"), block=config.get("block", 32))


def _qgemm_run(design: Any, args: Args, spec: ModelSpec) -> torch.Tensor:
    """``args[field]`` is the packed uint8 weight (the runner registers packed buffers for qgemm stages)."""
    mod = family_module("qgemm")
    ins = mod.prepare_inputs(design, args["_in"][0], args[args["_w"][0]])
    return mod.crop_outputs(design, design.fast(ins))["c"]


class _Merged:
    """What every merged launch shares: by default it reads its members' first inputs (one x for a multi-matrix
    GEMV) and writes every member's output, in ``run``'s order. ``tables``: the launch reads the pass's RoPE table
    (the dispatcher passes ``cs`` and ``start`` to ``run``)."""

    members: tuple[OpNode, ...]
    tables = False

    @property
    def reads(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n.inputs[0] for n in self.members))

    @property
    def writes(self) -> tuple[OpNode, ...]:
        return self.members


@dataclass(frozen=True)
class MergedLinear(_Merged):
    """One multi-matrix launch serving several linear ops that read the same input (``KernelGroup.merged``): its
    family shape concatenates the matrices' output rows (``Shape.parts``), ``run`` returns each op's output."""

    members: tuple[OpNode, ...]

    def shape(self, family: str, spec: ModelSpec, rows: int, config: dict[str, Any]) -> Any:
        if family not in ("gemv", "qgemv"):
            raise ConfigError(f"ops {[n.op for n in self.members]} cannot share a {family} launch; only GEMVs merge")
        dims = [_linear_dims(n, spec) for n in self.members]
        if len({k for _, k in dims}) != 1:
            raise ConfigError(f"ops {[n.op for n in self.members]} have different input widths; they cannot merge")
        parts = tuple(n for n, _ in dims)
        if family == "gemv":
            return family_module("gemv").Shape(n=sum(parts), k=dims[0][1], m=rows, parts=parts)
        return family_module("qgemv").Shape(
            n=sum(parts), k=dims[0][1], m=rows, fmt=config.get("fmt", "q4_0"), block=config.get("block", 32),
            parts=parts,
        )  # fmt: skip

    def run(
        self, design: Any, inputs: list[torch.Tensor], weights: list[torch.Tensor], args: Args, spec: ModelSpec
    ) -> list[torch.Tensor]:
        """Each member's output from the members' inputs (one for a multi-matrix GEMV), their weights and the
        call's other arguments (RoPE's table and start)."""
        out = design.fast({"x": inputs[0], **{f"w{j}": w for j, w in enumerate(weights)}})
        return [out[f"y{j}"] for j in range(len(weights))]


@dataclass(frozen=True)
class MergedRope(_Merged):
    """One RoPE launch serving several RoPE ops of a group (Q's and K's): their heads side by side in one launch
    over the one position table. Each element is rotated on its own (``kernels/rope.py``), so the outputs are
    bit-identical to the separate launches; what changes is one launch and one table stream instead of several."""

    members: tuple[OpNode, ...]
    tables = True

    def shape(self, family: str, spec: ModelSpec, rows: int, config: dict[str, Any]) -> Any:
        if family != "rope":
            raise ConfigError(f"ops {[n.op for n in self.members]} cannot share a {family} launch; only RoPE merges")
        heads = sum(n.width // spec.head_dim for n in self.members)
        return family_module("rope").Shape(rows=rows, heads=heads, head_dim=spec.head_dim)

    def run(
        self, design: Any, inputs: list[torch.Tensor], weights: list[torch.Tensor], args: Args, spec: ModelSpec
    ) -> list[torch.Tensor]:
        y = _rope_run(design, {**args, "_in": [torch.cat(inputs, dim=1)]}, spec)
        return list(torch.split(y, [int(x.shape[1]) for x in inputs], dim=1))


@dataclass(frozen=True)
class MergedBias(_Merged):
    """One bias launch serving several bias ops of a group (Qwen2's Q, K and V biases): their inputs side by side
    and their bias vectors concatenated the same way. Each element gets its own column's bias (``kernels/bias.py``),
    so the outputs are bit-identical to the separate launches; what changes is one launch and one held vector
    instead of three (inside a one-dispatch decode, a launch's fill and drain cost more than its adds)."""

    members: tuple[OpNode, ...]

    def shape(self, family: str, spec: ModelSpec, rows: int, config: dict[str, Any]) -> Any:
        if family != "bias":
            raise ConfigError(f"ops {[n.op for n in self.members]} cannot share a {family} launch; only bias merges")
        return family_module("bias").Shape(rows=rows, width=sum(n.width for n in self.members))

    def run(
        self, design: Any, inputs: list[torch.Tensor], weights: list[torch.Tensor], args: Args, spec: ModelSpec
    ) -> list[torch.Tensor]:
        y = design.fast({"x": torch.cat(inputs, dim=1), "b": torch.cat(weights)})["y"]
        return list(torch.split(y, [int(x.shape[1]) for x in inputs], dim=1))


@dataclass(frozen=True)
class FoldedLinear(_Merged):
    """One GEMV launch serving its linear ops and the small ops folded into it, members in this order: the linear (or
    LM head) ops, then optionally the RMSNorm they all read (its prologue: every worker normalizes its resident x
    once before its first call, ``kernels.gemv.resident_x``), then optionally the residual add of the one linear's
    output or the SwiGLU of the two linears' outputs (its epilogue: each worker adds its rows of the residual, riding
    in x, or writes silu(gate) * up of its rows), or the RoPE ops of the first linears' outputs, in their order (its
    epilogue: each worker rotates its rows of each head with the position's table, riding in x, ``kernels.gemv.
    rope_blocks``). Each folded op runs with its own kernel's arithmetic, so the outputs equal the separate launches'
    bit for bit; the folded launches, their DDR round trips and their fills and drains are saved. Only the last op's
    output is written, or each linear's RoPE output in its place (``plan.merge_problems`` checks nothing else reads
    the others)."""

    members: tuple[OpNode, ...]

    @property
    def linears(self) -> tuple[OpNode, ...]:
        return tuple(n for n in self.members if n.kind in LINEAR_KINDS)

    @property
    def norm(self) -> OpNode | None:
        return next((n for n in self.members if n.kind == "rmsnorm"), None)

    @property
    def epilogue(self) -> OpNode | None:
        return next((n for n in self.members if n.kind in EPILOGUE_KINDS), None)

    @property
    def ropes(self) -> tuple[OpNode, ...]:
        """The RoPE ops of a RoPE epilogue, one per rotated linear op (the first ones), in their order."""
        return tuple(n for n in self.members if n.kind == "rope")

    @property
    def tables(self) -> bool:  # type: ignore[override]
        return bool(self.ropes)

    @property
    def reads(self) -> tuple[str, ...]:
        x = self.norm.inputs[0] if self.norm else self.linears[0].inputs[0]
        ep = self.epilogue
        if ep is not None and ep.kind == "add":
            return (x, next(v for v in ep.inputs if v != self.linears[0].output))
        return (x,)

    @property
    def writes(self) -> tuple[OpNode, ...]:
        if self.epilogue is not None:
            return (self.epilogue,)
        return (*self.ropes, *self.linears[len(self.ropes) :])

    def shape(self, family: str, spec: ModelSpec, rows: int, config: dict[str, Any]) -> Any:
        known = {f.name for f in fields(family_module(family).Shape)} if family in ("gemv", "qgemv") else set()
        if not {"norm_eps", "residual", "gated", "rope_dim"} <= known:
            raise ConfigError(f"{family} takes no folded ops; ops {[n.op for n in self.members]} cannot merge")
        ropes = self.ropes
        if [r.inputs for r in ropes] != [(n.output,) for n in self.linears[: len(ropes)]]:
            raise ConfigError(f"ops {[n.op for n in self.members]}: RoPE op j must rotate linear op j's output")
        if len(self.linears) > 1:
            inner = MergedLinear(self.linears).shape(family, spec, rows, config)
        else:
            inner = binding(self.linears[0], family).shape(self.linears[0], spec, rows, 0, config)
        ep = self.epilogue.kind if self.epilogue is not None else None
        eps = spec.rms_eps if self.norm is not None else None
        rope = {"rope_dim": spec.head_dim, "rope_parts": len(ropes)} if ropes else {}
        return replace(inner, norm_eps=eps, residual=ep == "add", gated=ep == "swiglu", **rope)

    def run(
        self, design: Any, inputs: list[torch.Tensor], weights: list[torch.Tensor], args: Args, spec: ModelSpec
    ) -> list[torch.Tensor]:
        """``inputs``: x (the norm's input with a prologue), then the residual of an add epilogue; ``weights``: the
        linear ops' (packed) matrices, then the norm's weight; ``args``: a RoPE epilogue's table (the pass's fp32
        table of the call's positions, in the design's table precision as ``_rope_fast`` gives it to RoPE)."""
        mats = weights[: len(self.linears)]
        names = [f"w{j}" for j in range(len(mats))] if len(mats) > 1 else ["w"]
        ins = {"x": inputs[0], **dict(zip(names, mats, strict=True))}
        if self.norm is not None:
            ins["g"] = weights[len(self.linears)]
        if len(inputs) > 1:
            ins["r"] = inputs[1]
        if self.ropes:
            ins["cs"] = args["cs"].to(torch_dtype(design.tensor("cs").dtype))
        out = design.fast(ins)
        if self.epilogue is not None or len(mats) == 1:
            return [out["y"]]
        return [out[f"y{j}"] for j in range(len(mats))]


@dataclass(frozen=True)
class NormedRope(_Merged):
    """One RoPE launch serving RoPE ops and the per-head RMSNorms that feed them (Qwen3's q_norm and k_norm), members
    in this order: the RoPE ops, then norm j for RoPE op j (its output is that op's input). Every head is normalized
    with its own norm's weight by the norm kernel's arithmetic, then rotated (``kernels/rope.py``, ``norm_heads``), so
    the outputs equal the separate launches' bit for bit; the norms' launches and their DDR round trips are saved."""

    members: tuple[OpNode, ...]
    tables = True

    @property
    def ropes(self) -> tuple[OpNode, ...]:
        return tuple(n for n in self.members if n.kind == "rope")

    @property
    def norms(self) -> tuple[OpNode, ...]:
        return tuple(n for n in self.members if n.kind == "head_norm")

    @property
    def reads(self) -> tuple[str, ...]:
        return tuple(n.inputs[0] for n in self.norms)

    @property
    def writes(self) -> tuple[OpNode, ...]:
        return self.ropes

    def shape(self, family: str, spec: ModelSpec, rows: int, config: dict[str, Any]) -> Any:
        if family != "rope":
            raise ConfigError(f"ops {[n.op for n in self.members]} cannot share a {family} launch; only RoPE's can")
        heads = tuple(n.width // spec.head_dim for n in self.ropes)
        return family_module("rope").Shape(
            rows=rows, heads=sum(heads), head_dim=spec.head_dim, norm_heads=heads, norm_eps=spec.rms_eps
        )

    def run(
        self, design: Any, inputs: list[torch.Tensor], weights: list[torch.Tensor], args: Args, spec: ModelSpec
    ) -> list[torch.Tensor]:
        """``inputs``: the norms' inputs (Q's and K's projections); ``weights``: the norms' weights, in run order."""
        y = _rope_run(design, {**args, "_in": [torch.cat(inputs, dim=1)], "g": torch.stack(weights)}, spec)
        return list(torch.split(y, [int(x.shape[1]) for x in inputs], dim=1))


@dataclass(frozen=True)
class CachedRope(_Merged):
    """One RoPE launch that also writes a quantized KV cache, members in this order: the RoPE ops (K's last), then
    optionally the per-head norms feeding them (``NormedRope``), then the ``kv_write`` of K's rotated rows and V's rows
    (``kernels/rope.py``, its cache-write epilogue). V's rows ride in x after the rotated heads; the launch writes
    the RoPE outputs other than K's (which only the write reads) and the cache's stored rows, each by the separate
    kernels' own arithmetic, so the outputs equal the RoPE and KV-write launches bit for bit. The cache format is
    the launch config's ``kv_format`` (``plan.apply_kv_cache`` sets it)."""

    members: tuple[OpNode, ...]
    tables = True

    @property
    def inner(self) -> MergedRope | NormedRope:
        """The RoPE launch the write is folded into."""
        rest = self.members[:-1]
        return NormedRope(rest) if any(n.kind == "head_norm" for n in rest) else MergedRope(rest)

    @property
    def kv_write(self) -> OpNode:
        """The folded write, last of the members (its inputs: K's RoPE output, then V)."""
        return self.members[-1]

    @property
    def reads(self) -> tuple[str, ...]:
        return (*self.inner.reads, self.kv_write.inputs[1])

    @property
    def writes(self) -> tuple[OpNode, ...]:
        return (*self.inner.writes[:-1], self.kv_write)

    def shape(self, family: str, spec: ModelSpec, rows: int, config: dict[str, Any]) -> Any:
        fmt = config.get("kv_format", "bf16")
        if fmt == "bf16":
            raise ConfigError(
                f"ops {[n.op for n in self.members]}: a RoPE launch writing the KV cache needs its config's kv_format "
                "(a quantized cache; a bf16 cache is written by the producers' drains, apply_kv_cache sets it)"
            )
        return replace(self.inner.shape(family, spec, rows, config), kv_format=fmt, kv_heads=spec.n_kv_heads)

    def run(
        self, design: Any, inputs: list[torch.Tensor], weights: list[torch.Tensor], args: Args, spec: ModelSpec
    ) -> list[torch.Tensor]:
        """``inputs``: the RoPE ops' (or their norms') inputs, K's last, then V's rows; ``weights``: the norms'."""
        norm = {"g": torch.stack(weights)} if weights else {}
        out = _rope_fast(design, {**args, "_in": [torch.cat(inputs, dim=1)], **norm}, spec)
        ys = list(torch.split(out["y"], [int(x.shape[1]) for x in inputs[:-2]], dim=1)) if "y" in out else []
        return [*ys, out["kv"]]


MergedLaunch = MergedLinear | MergedRope | MergedBias | FoldedLinear | NormedRope | CachedRope
_MERGED_BY_KIND: dict[str, type] = {"linear": MergedLinear, "rope": MergedRope, "bias": MergedBias}


def merged_launch(members: tuple[OpNode, ...]) -> MergedLaunch:
    """The one launch of a ``KernelGroup.merged`` run: a multi-matrix GEMV for linear ops, one RoPE launch for RoPE
    ops, one bias launch for bias ops; linear (or LM head) ops followed by the RMSNorm they read and/or a residual
    add or SwiGLU of their outputs, or the RoPE ops of their outputs: one GEMV launch with those folded in
    (``FoldedLinear``); RoPE ops followed by the
    per-head norms that feed them: one RoPE launch normalizing first (``NormedRope``); either RoPE run followed by the
    write of a quantized KV cache: one RoPE launch that also stores the cache's rows (``CachedRope``)."""
    kinds = [n.kind for n in members]
    if len(kinds) > 1 and kinds[-1] == "kv_write" and kinds[0] == "rope":
        return CachedRope(members)
    if len(set(kinds)) == 1 and kinds[0] in _MERGED_BY_KIND:
        return _MERGED_BY_KIND[kinds[0]](members)
    n_rope = kinds.count("rope")
    if n_rope and kinds == ["rope"] * n_rope + ["head_norm"] * n_rope:
        return NormedRope(members)
    n_lin = next((i for i, k in enumerate(kinds) if k not in LINEAR_KINDS), len(kinds))
    rest = kinds[n_lin:]
    if n_lin and rest in (["rmsnorm"], *([e] for e in EPILOGUE_KINDS), *(["rmsnorm", e] for e in EPILOGUE_KINDS)):
        return FoldedLinear(members)
    ropes = ["rope"] * rest.count("rope")
    if n_lin and ropes and rest in (ropes, ["rmsnorm", *ropes]):  # a RoPE epilogue
        return FoldedLinear(members)
    raise ConfigError(f"ops {[n.op for n in members]} ({sorted(set(kinds))}) cannot share one launch")


# ---- residual add ---------------------------------------------------------------------------------------------------
def _add_shape(node: OpNode, spec: ModelSpec, rows: int, context: int, config: dict[str, Any]) -> Any:
    return family_module("eltwise").Shape(n=rows * node.width, op="add")


def _add_run(design: Any, args: Args, spec: ModelSpec) -> torch.Tensor:
    mod = family_module("eltwise")
    a, b = args["_in"]
    out = mod.crop_outputs(design, design.fast(mod.prepare_inputs(design, a, b)))["c"]
    return out.reshape(a.shape[0], -1)


# ---- LM head --------------------------------------------------------------------------------------------------------
def _head_shape(node: OpNode, spec: ModelSpec, rows: int, context: int, config: dict[str, Any]) -> Any:
    return family_module("lm_head").Shape(vocab=spec.vocab, k=spec.hidden, m=rows)


def _head_run(design: Any, args: Args, spec: ModelSpec) -> torch.Tensor:
    return design.fast({"x": args["_in"][0], "w": args["lm_head"]})["logits"]


# ---- norms, RoPE, SwiGLU, bias: row-streaming families with x/w -> y style tensors --------------------------------
def _rmsnorm_shape(node: OpNode, spec: ModelSpec, rows: int, context: int, config: dict[str, Any]) -> Any:
    return family_module("rmsnorm").Shape(rows=rows, width=node.width, heads=1, eps=spec.rms_eps)


def _head_norm_shape(node: OpNode, spec: ModelSpec, rows: int, context: int, config: dict[str, Any]) -> Any:
    heads = node.width // spec.head_dim
    return family_module("rmsnorm").Shape(rows=rows, width=spec.head_dim, heads=heads, eps=spec.rms_eps)


def _norm_run(design: Any, args: Args, spec: ModelSpec) -> torch.Tensor:
    return design.fast({"x": args["_in"][0], "w": args[args["_w"][0]]})["y"]


def _rope_shape(node: OpNode, spec: ModelSpec, rows: int, context: int, config: dict[str, Any]) -> Any:
    return family_module("rope").Shape(rows=rows, heads=node.width // spec.head_dim, head_dim=spec.head_dim)


def _rope_run(design: Any, args: Args, spec: ModelSpec) -> torch.Tensor:
    return _rope_fast(design, args, spec)["y"]


def _rope_fast(design: Any, args: Args, spec: ModelSpec) -> dict[str, torch.Tensor]:
    """The pass's fp32-angle table, or, for a config whose ``angles`` differ, that precision's table of the call's
    positions (``args["start"]`` on), built here because the runner's one table serves every RoPE call."""
    cs_spec = design.tensor("cs")
    cs = args["cs"]
    angles = design.meta["config"].get("angles", "fp32")
    if angles != "fp32":
        cs = family_module("rope").table_for(spec, int(args["start"]), cs.shape[0], "fp32", angles)
    cs = cs.to(torch_dtype(cs_spec.dtype))
    norm = {"g": args["g"]} if "g" in args else {}  # a per-head norm prologue's weights (``NormedRope``)
    return design.fast({"x": args["_in"][0], "cs": cs, **norm})


def _swiglu_shape(node: OpNode, spec: ModelSpec, rows: int, context: int, config: dict[str, Any]) -> Any:
    return family_module("swiglu").Shape(rows=rows, width=node.width)


def _swiglu_run(design: Any, args: Args, spec: ModelSpec) -> torch.Tensor:
    gate, up = args["_in"]
    return design.fast({"gate": gate, "up": up})["y"]


def _bias_shape(node: OpNode, spec: ModelSpec, rows: int, context: int, config: dict[str, Any]) -> Any:
    return family_module("bias").Shape(rows=rows, width=node.width)


def _bias_run(design: Any, args: Args, spec: ModelSpec) -> torch.Tensor:
    return design.fast({"x": args["_in"][0], "b": args[args["_w"][0]]})["y"]


# ---- attention over the packed KV cache -------------------------------------------------------------------------
ATTN_Q_GRANULE = 4  # the family's smallest query tile above 2 rows (MMUL M); prompts are padded to it
ATTN_Q_TILE_MAX = 64  # the family's largest query tile: a long prompt may be padded to whole tiles of it


def _attn_q_len(rows: int, config: dict[str, Any], timed: Callable[[int], float] | None = None) -> int:
    """Query rows of the launch: ``rows`` padded to whole query tiles of the config's ``tile_q``; without one, to the
    smallest granule, or for a prompt longer than one largest tile to whole largest tiles when ``timed(q_len)``
    (the modeled seconds of the family default at that length) says that is faster. Padding to 4 leaves a length
    with a large odd factor only tiny query tiles (6001 rows -> 6004 = 4 x 1501: 1-query tiles, 211 ms per
    SmolLM2-135M layer, modeled, against 39 ms at 6016 with 32-query tiles)."""
    tile = int(config.get("tile_q", 0))
    if tile:
        return -(-rows // tile) * tile
    if rows <= 2:
        return rows
    small = -(-rows // ATTN_Q_GRANULE) * ATTN_Q_GRANULE
    large = -(-rows // ATTN_Q_TILE_MAX) * ATTN_Q_TILE_MAX
    if timed is None or rows <= ATTN_Q_TILE_MAX or large == small or timed(large) >= timed(small):
        return small
    return large


@functools.lru_cache(maxsize=256)
def _default_attention_s(q_len: int, kv_len: int, n_heads: int, n_kv_heads: int, head_dim: int) -> float:
    """Modeled seconds of the attention family's default design for a shape (built and validated: an illegal one
    raises, as timing it would)."""
    mod = family_module("attention")
    shape = mod.Shape(q_len=q_len, kv_len=kv_len, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)
    return time_group(mod.make_design(shape)).seconds


def _attention_shape(node: OpNode, spec: ModelSpec, rows: int, context: int, config: dict[str, Any]) -> Any:
    """Queries padded at the end to whole query tiles (``_attn_q_len``): the padded queries sit *after* every real
    one, so causality hides them (and the key rows they add) from the real queries. Under one tiling their outputs
    are unchanged; without a config the padded length takes its own default tiling (``attention.default_config``),
    whose key block may differ, and the production path's rounding with it (bf16 ulps)."""
    dims = (spec.n_heads, spec.n_kv_heads, spec.head_dim)
    q_len = _attn_q_len(rows, config, lambda q: _default_attention_s(q, context + q - rows, *dims))
    return family_module("attention").Shape(
        q_len=q_len, kv_len=context + q_len - rows, n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads,
        head_dim=spec.head_dim, kv_format=config.get("kv_format", "bf16"),
    )  # fmt: skip


def _attention_run(design: Any, args: Args, spec: ModelSpec) -> torch.Tensor:
    q = args["_in"][0]
    rows, q_len = q.shape[0], design.tensor("q").shape[0]
    if q_len != rows:
        q = torch.cat((q, torch.zeros(q_len - rows, q.shape[1], dtype=q.dtype)))
    kv = args["kv_cache"].packed(args["layer"], design.meta["kv_rows"])
    return design.fast({"q": q, "kv": kv})["o"][:rows]


# ---- the KV-cache write of a q8_0 cache: the step's [k | v] rows quantized by a launch (``kernels/kvquant.py``) ------
def _kvquant_shape(node: OpNode, spec: ModelSpec, rows: int, context: int, config: dict[str, Any]) -> Any:
    return family_module("kvquant").Shape(rows=rows, width=node.width, kv_format=config.get("kv_format", "q8_0"))


def _kvquant_run(design: Any, args: Args, spec: ModelSpec) -> torch.Tensor:
    """The stored rows of the step's K (after RoPE) and V, which the dispatcher writes into the cache."""
    k, v = args["_in"]
    return design.fast({"x": torch.cat((k, v), dim=1)})["kv"]


BINDINGS: dict[tuple[str, str], OpBinding] = {
    ("attention", "attention"): OpBinding(_attention_shape, _attention_run),
    ("rmsnorm", "rmsnorm"): OpBinding(_rmsnorm_shape, _norm_run),
    ("head_norm", "rmsnorm"): OpBinding(_head_norm_shape, _norm_run),
    ("rope", "rope"): OpBinding(_rope_shape, _rope_run),
    ("swiglu", "swiglu"): OpBinding(_swiglu_shape, _swiglu_run),
    ("bias", "bias"): OpBinding(_bias_shape, _bias_run),
    ("linear", "gemm"): OpBinding(_gemm_shape, _gemm_run),
    ("linear", "gemv"): OpBinding(_gemv_shape, _gemv_run),
    ("linear", "qgemv"): OpBinding(_qgemv_shape, _qgemv_run),
    ("linear", "qgemm"): OpBinding(_qgemm_shape, _qgemm_run),
    ("add", "eltwise"): OpBinding(_add_shape, _add_run),
    ("kv_write", "kvquant"): OpBinding(_kvquant_shape, _kvquant_run),
    ("lm_head", "lm_head"): OpBinding(_head_shape, _head_run),
    ("lm_head", "gemv"): OpBinding(
        lambda n, s, r, c, cfg: family_module("gemv").Shape(n=s.vocab, k=s.hidden, m=r),
        lambda d, a, s: _gemv_run(d, {**a, "_w": ("lm_head",)}, s),
    ),
    ("lm_head", "qgemv"): OpBinding(
        lambda n, s, r, c, cfg: family_module("qgemv").Shape(
            n=s.vocab, k=s.hidden, m=r, fmt=cfg.get("fmt", "q4_0"), block=cfg.get("block", 32)
        ),
        lambda d, a, s: _qgemv_run(d, {**a, "_w": ("lm_head",)}, s),
    ),
    ("lm_head", "gemm"): OpBinding(
        lambda n, s, r, c, cfg: family_module("gemm").Shape(m=r, n=s.vocab, k=s.hidden),
        lambda d, a, s: _gemm_run(d, {**a, "_w": ("lm_head",)}, s),
    ),
}


def binding(node: OpNode, family: str) -> OpBinding:
    try:
        return BINDINGS[(node.kind, family)]
    except KeyError:
        raise ConfigError(
            f"op {node.op} ({node.kind}) has no kernel binding for family {family!r}; "
            f"bound families: {sorted(f for k, f in BINDINGS if k == node.kind)}"
        ) from None
