"""Kernel probes: one kernel instance of a plan, run alone on known inputs and compared with its FP32 op.

Phase 1 validates every instance a plan uses with these probes, and the debug skills use them to find
which call of a failing plan is at fault and to pick a configuration that is not. A probe builds the
call's design for the shape the plan gives it, validates it (validator codes are evidence too), runs the
production fast path on seeded inputs, and compares with the family's ``reference`` (the oracle op);
small instances also run the tile-level executor, which must agree with the exact fast path bit for bit.
Probes are diagnostics, never the production path, so they may use the oracle's RoPE tables.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

import torch

from tilepilot.gates import metrics as M
from tilepilot.gates import thresholds as T
from tilepilot.gates.gate import Gate, Threshold
from tilepilot.kernels.bind import binding, family_module, make_config
from tilepilot.kernels.fuse import group_for_ops
from tilepilot.kernels.rope import table_for
from tilepilot.model.graph import KV_FAMILY, block_graph
from tilepilot.model.quant import pack_kv_rows, quantize
from tilepilot.npu.design import MultiLaunchGroup, torch_dtype
from tilepilot.npu.execute import run_group_tile, run_tile
from tilepilot.npu.validate import validate, validate_group
from tilepilot.oracle.ops import rope_tables
from tilepilot.oracle.rope import inv_freq_for
from tilepilot.plan.plan import DATA_FIELDS

# The tile-level executor is exact and slow; instances above this many MACs skip it (recorded).
TILE_PATH_MAX_MACS = 4_000_000
# Rows of the RoPE probe behind the layout signature (position 0 is RoPE's identity, 1.. are not).
ROPE_PROBE_ROWS = 16


@functools.lru_cache(maxsize=512)
def _default_config(family: str, shape):

    return family_module(family).default_config(shape)


def config_for(family: str, shape, config: dict[str, Any]):
    """The family Config of a plan config dict; ``{}`` is the family default, memoized per shape (a GEMM
    default ranks every candidate tiling, ~0.07 s, and probes ask for the same shapes again and again)."""

    if not config:
        return _default_config(family, shape)
    return make_config(family_module(family), shape, config)


@dataclass(frozen=True)
class CallRef:
    """Where a kernel call sits in a plan."""

    stage: str
    part: str
    group: str
    op: str
    family: str
    config: tuple  # sorted (key, value) pairs of the plan's config dict

    @property
    def config_dict(self) -> dict[str, Any]:
        return dict(self.config)

    def label(self) -> str:
        return f"{self.stage}/{self.op} ({self.family})"


def plan_calls(plan) -> list[CallRef]:
    """Every NPU kernel call of the plan (KV writes are DMAs, not kernels)."""
    out = []
    for stage in ("prefill", "decode"):
        st = plan.stage(stage)
        for part, groups in (("block", st.block), ("head", st.head)):
            for g in groups:
                if g.where != "npu":
                    continue
                for c in g.calls:
                    if c.family != KV_FAMILY:
                        out.append(CallRef(stage, part, g.name, c.op, c.family, tuple(sorted(c.config.items()))))
    return out


def call_shape(spec, call: CallRef, rows: int, context: int, config: dict[str, Any] | None = None, *, all_logits=False):
    """The call's kernel shape at ``rows`` x ``context``. The LM head reads only the last position (the runner's
    last_only prefill, and decode), unless ``all_logits``: a prefill asked for every position's logits (the gates'
    and the evaluator's prompts) runs the head over all ``rows``."""
    node = block_graph(spec).node(call.op)
    cfg = call.config_dict if config is None else config
    if call.part == "head" and node.kind == "lm_head" and not all_logits:
        rows = 1
    return binding(node, call.family).shape(node, spec, rows, context, cfg)


def stage_rows(stage: str, prompt_len: int) -> tuple[int, int]:
    """(rows, context) of a call in ``stage`` for a prompt of ``prompt_len`` tokens."""
    return (prompt_len, prompt_len) if stage == "prefill" else (1, prompt_len + 1)


@dataclass
class Probe:
    call: CallRef
    shape: dict[str, Any]
    config: dict[str, Any]
    measurements: dict[str, float] = field(default_factory=dict)
    row_cosine: list[float] = field(default_factory=list)
    partition_pearson: list[float] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)
    tile_checked: bool = False
    error: str | None = None
    report: dict[str, Any] | None = None
    copies_input: bool = False  # the output is bit-identical to one of the design's inputs (a copy, not a result)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.codes and bool(self.report and self.report.get("passed"))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["call"] = {**asdict(self.call), "config": self.call.config_dict}
        d["ok"] = self.ok
        return d


def _dict(x: Any) -> dict[str, Any]:
    return asdict(x) if is_dataclass(x) else dict(x)


def _inputs(design, family: str, spec, gen: torch.Generator, start: int = 0, shape=None) -> tuple[dict, dict]:
    """Seeded inputs for the design (by its DDR tensor names), and the same for the reference.

    RoPE gets real cos/sin tables (so position 0 is the identity); the reference gets them in FP32 as the
    true op, the design in its declared table dtype and with angles in its config's precision (as the runner's
    binding builds them). A packed (uint8) weight is a seeded weight quantized in the
    shape's block format: random bytes would make fp16 block scales NaN or Inf.
    """

    ins, ref = {}, {}
    for ts in design.inputs:
        if ts.dtype == "uint8" and shape is not None and hasattr(shape, "fmt"):
            w = torch.randn((shape.n, shape.k), generator=gen, dtype=torch.float32)
            ins[ts.name] = ref[ts.name] = quantize(w, shape.fmt, shape.block).data.reshape(ts.shape)
            continue
        if ts.dtype == "uint8" and getattr(shape, "kv_format", "bf16") != "bf16":  # a q8_0 KV cache's stored rows
            rows = torch.randn((ts.shape[0], 2 * shape.kv_dim), generator=gen, dtype=torch.float32)
            ins[ts.name] = ref[ts.name] = pack_kv_rows(rows, shape.kv_format)
            continue
        dt = torch_dtype(ts.dtype)
        if family == "rope" and ts.name == "cs":
            cos, sin = rope_tables(torch.arange(start, start + ts.shape[0]), inv_freq_for(spec))
            half = cos.shape[-1] // 2
            table = torch.cat((cos[:, :half], sin[:, :half]), dim=-1).float()
            ref[ts.name] = table
            angles = design.meta.get("config", {}).get("angles", "fp32")  # the table the config's runner builds
            if angles != "fp32":
                table = table_for(spec, start, ts.shape[0], "fp32", angles)
            ins[ts.name] = table.to(dt)
            continue
        t = torch.randn(ts.shape, generator=gen, dtype=torch.float32)
        if (ts.name == "w" and len(ts.shape) == 1) or ts.name == "g":  # norm weights sit around 1 (g: folded norms')
            t = 1.0 + 0.1 * t
        ins[ts.name] = ref[ts.name] = t.to(dt)
    return ins, ref


def _run_reference(mod, ref_inputs: dict, shape) -> dict[str, torch.Tensor]:
    params = inspect.signature(mod.reference).parameters
    return mod.reference(ref_inputs, shape=shape) if "shape" in params else mod.reference(ref_inputs)


def probe(
    spec,
    call: CallRef,
    rows: int,
    context: int,
    *,
    config: dict[str, Any] | None = None,
    library=None,
    seed: int = 0,
    tile: bool = True,
) -> Probe:
    """Validate and run one call's design alone; compare with the FP32 reference (and the tile path)."""

    cfg_dict = call.config_dict if config is None else dict(config)
    mod = family_module(call.family)
    shape = call_shape(spec, call, rows, context, cfg_dict)
    try:
        cfg = config_for(call.family, shape, cfg_dict)
        design = mod.make_design(shape, cfg)
    except Exception as e:
        codes = list(getattr(e, "codes", []) or [])
        return Probe(call, _dict(shape), cfg_dict, codes=codes, error=f"{type(e).__name__}: {e}")
    p = Probe(call, _dict(shape), _dict(cfg))
    group = isinstance(design, MultiLaunchGroup)
    p.codes = sorted({v.code for v in (validate_group(design) if group else validate(design))})
    if p.codes:
        p.error = f"validator: {', '.join(p.codes)}"
        return p
    gen = torch.Generator().manual_seed(seed)
    # a decode call runs at the last position of its context (RoPE tables there, not at the identity position 0)
    start = context - rows if call.stage == "decode" else 0
    ins, ref_ins = _inputs(design, call.family, spec, gen, start, shape)
    out = design.fast(ins)
    ref = _run_reference(mod, ref_ins, shape)
    name = design.outputs[0].name
    o, r = out[name].float(), ref[name].float()
    p.copies_input = any(v.shape == o.shape and torch.equal(v.float(), o) for v in ins.values())
    p.measurements = M.compare(r, o)
    p.row_cosine = M.per_position_cosine(r.reshape(r.shape[0], -1), o.reshape(o.shape[0], -1)).tolist()
    if call.family == "lm_head" and hasattr(mod, "partition_report"):
        p.partition_pearson = [c.pearson for c in mod.partition_report(design, ins, o, r)]
        p.measurements["partitions.min_pearson"] = min(p.partition_pearson)
    macs = float(design.meta.get("macs", 0) or 0)
    if tile and macs <= TILE_PATH_MAX_MACS:
        exact = design.fast(ins, exact=True)[name].float()
        if group:
            tiled = design.assemble_group_outputs(run_group_tile(design, design.group_inputs(ins))).float()
        else:
            tiled = run_tile(design, ins)[name].float()
        p.measurements[T.TILE_VS_FAST] = M.max_abs_err(exact, tiled)
        p.tile_checked = True
    gate = T.phase1_gate(call.family, tile_path=p.tile_checked)
    thresholds = list(gate.thresholds)
    if p.partition_pearson:
        thresholds.append(
            Threshold("partitions.min_pearson", ">=", T.min_correlation(call.family), T.SRC_DESIGN + " (per partition)")
        )
        gate = Gate(gate.name, thresholds)
    p.report = gate.evaluate(p.measurements).to_dict()
    return p


def probe_plan(plan, spec, prompt_len: int, *, seed: int = 0, tile: bool = True) -> list[Probe]:
    """One probe per distinct (family, shape, config) of the plan's NPU calls."""
    seen: dict[tuple, Probe] = {}
    out = []
    for call in plan_calls(plan):
        rows, context = stage_rows(call.stage, prompt_len)
        key = (call.family, repr(call_shape(spec, call, rows, context)), call.config)
        if key not in seen:
            seen[key] = probe(spec, call, rows, context, seed=seed, tile=tile)
        out.append(seen[key] if seen[key].call == call else _relabel(seen[key], call))
    return out


def validate_plan(plan, spec, prompt_len: int) -> list[dict[str, Any]]:
    """Every distinct NPU design of the plan at ``prompt_len``, re-built and run through the validator (no
    execution, so the timing shape of a full model is cheap): ``[{call, shape, codes, error}]`` for each refused."""
    bad, seen = [], set()
    for call in plan_calls(plan):
        rows, context = stage_rows(call.stage, prompt_len)
        try:
            shape = call_shape(spec, call, rows, context)
            key = (call.family, repr(shape), call.config)
            if key in seen:
                continue
            seen.add(key)
            design = family_module(call.family).make_design(shape, config_for(call.family, shape, call.config_dict))
            group = isinstance(design, MultiLaunchGroup)
            codes = sorted({v.code for v in (validate_group(design) if group else validate(design))})
            error = f"validator: {', '.join(codes)}" if codes else None
        except Exception as e:
            codes, error = sorted(set(getattr(e, "codes", []) or [type(e).__name__])), f"{type(e).__name__}: {e}"
        if codes or error:
            bad.append({"call": call.label(), "prompt_len": prompt_len, "codes": codes, "error": error})
    return bad


def kernel_audit(plan, spec, prompt_lens: tuple[int, ...], *, seed: int = 0) -> dict[str, Any]:
    """The evaluator's own kernel checks: every design re-validated at each prompt length, and at the first length
    each kernel re-run alone on seeded inputs against its FP32 reference and, where small, its tile path (phase 1's
    gate: a production fast path that is not the design it claims differs from the tile path), and checked not to
    return a copy of an input. Merged-group bindings stay phase 1's, at the plan's own prompt length (a padded
    tiling legitimately rebinds at other lengths)."""
    refused = [r for n in prompt_lens for r in validate_plan(plan, spec, n)]
    failing, copies = [], []
    if not refused:
        for pr in probe_plan(plan, spec, prompt_lens[0], seed=seed, tile=True):
            if pr.copies_input:
                copies.append(pr.call.label())
            if not pr.ok:
                failing.append(f"{pr.call.label()}: {pr.error or '; '.join((pr.report or {}).get('failures', []))}")
    return {
        "refused": refused,
        "kernel_gate_failures": sorted(set(failing)),
        "copies_input": sorted(set(copies)),
        "prompt_lens": list(prompt_lens),
    }


def _relabel(p: Probe, call: CallRef) -> Probe:
    q = Probe(**{**p.__dict__})
    q.call = call
    return q


def rope_probe(plan, spec) -> list[float]:
    """Per-position cosine of the plan's prefill RoPE kernel (q) over positions 0..ROPE_PROBE_ROWS-1."""
    for call in plan_calls(plan):
        if call.stage == "prefill" and call.op == "rope_q" and call.family == "rope":
            try:
                return probe(spec, call, ROPE_PROBE_ROWS, ROPE_PROBE_ROWS, tile=False).row_cosine
            except Exception:
                return []
    return []


@dataclass
class GroupCheck:
    """A multi-call NPU group built as one multi-launch dispatch, with its binding problems."""

    stage: str
    group: str
    ops: list[str]
    codes: list[str]
    message: str = ""

    @property
    def ok(self) -> bool:
        return not self.codes


def group_checks(plan, spec, prompt_len: int, only: tuple[str, str] | None = None) -> list[GroupCheck]:
    """Build every multi-call NPU group of the plan as a multi-launch group with tensor bindings between its
    launches (``kernels.fuse``); a binding whose tensors disagree is GROUP_BINDING. Groups that cannot be
    expressed as one fused dispatch for another reason are reported with that reason's codes."""

    graph = block_graph(spec)
    out = []
    for stage in ("prefill", "decode"):
        rows, context = stage_rows(stage, prompt_len)
        for part, groups in (("block", plan.stage(stage).block), ("head", plan.stage(stage).head)):
            for g in groups:
                # a cache write is no launch of the fused group (a bf16 cache's is the producers' drain; a quantized
                # cache's kvquant launch reads two producers' rows, which no one tensor binding expresses)
                kernel_ops = [c for c in g.calls if graph.node(c.op).kind != "kv_write"]
                if g.where != "npu" or len(kernel_ops) < 2 or part == "head":
                    continue
                if only is not None and (stage != only[0] or only[1] not in [c.op for c in g.calls]):
                    continue
                configs = {}
                for c in kernel_ops:
                    # attention's fused shape differs from the runner's (no query padding): let fuse choose the
                    # tiling, given the cache format the call reads
                    if c.family == "attention" and set(c.config) <= set(DATA_FIELDS):
                        configs[c.op] = dict(c.config)
                    elif c.config or c.family != "attention":
                        ref = CallRef(stage, part, g.name, c.op, c.family, tuple(sorted(c.config.items())))
                        configs[c.op] = config_for(c.family, call_shape(spec, ref, rows, context), c.config)
                ops = [c.op for c in g.calls if graph.node(c.op).kind != "kv_write"]
                try:
                    families = {c.op: c.family for c in kernel_ops}
                    group_for_ops(
                        g.name, spec, ops, rows, stage=stage, context=context - rows, configs=configs, families=families
                    )
                    out.append(GroupCheck(stage, g.name, ops, []))
                except Exception as e:
                    codes = sorted(set(getattr(e, "codes", []) or [type(e).__name__]))
                    out.append(GroupCheck(stage, g.name, ops, codes, str(e)))
    return out
