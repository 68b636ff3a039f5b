"""DeploymentPlan: which kernel groups (dispatches) run one block and the head, and how the host behaves.

A plan is plain data: skills edit it, ``time_plan`` models it, the runner executes it, and it is
saved as ``deployment.json`` in a workspace. ``validate`` checks a plan against the block graph of its
spec so that a skill that drops, duplicates or reorders an op is caught before anything runs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tilepilot.errors import ConfigError
from tilepilot.files import write_text_atomic
from tilepilot.model.graph import (
    CPU_FAMILY,
    EPILOGUE_KINDS,
    KIND_FAMILIES,
    KV_FAMILY,
    LAYER_INPUT,
    LEGACY_CPU_FAMILY,
    LINEAR_KINDS,
    OpNode,
    block_graph,
    folded_kinds,
)
from tilepilot.model.quant import WeightFormat
from tilepilot.model.spec import ModelSpec

PLAN_FORMAT = 1
STAGES = ("prefill", "decode")
WHERE = ("npu", "cpu")
WEIGHT_POLICIES = ("preloaded", "per_call")
LAYOUTS = ("seq_first", "host_transpose")
# Where an activation one dispatch produces and a later one reads lives in between (runtime/buffers.py):
# "device" - in the device buffer the next dispatch reads; "host" - each dispatch has its own argument buffers, as
# separate XRT kernels do, so the host maps the result (zero-copy) and copies it into the next dispatch's input.
HANDOFFS = ("device", "host")
# How a host attention runs: "batched" (one matmul over every head, runtime/cpu_ops.attention) or "per_head" (a Python
# loop over the query heads, the paper's decode_attention_cpu): the latter pays npu.calibration.host_cpu_head_s a head.
HOST_ATTENTION = ("batched", "per_head")
# families that read packed weights (model/quant.py) instead of bf16 ones
QUANT_FAMILIES = ("qgemv", "qgemm")


# kind -> family by stage: prefill works on T rows (GEMM), decode on one row (GEMV).
_LINEAR = {"prefill": "gemm", "decode": "gemv"}


def npu_family(node: OpNode, stage: str) -> str:
    """The (bf16) kernel family a node uses on the NPU in ``stage``."""
    if node.kind == "linear":
        return _LINEAR[stage]
    return KIND_FAMILIES[node.kind][0]


@dataclass
class KernelCall:
    """One op of the block graph mapped to a kernel family; an empty config means the family default."""

    op: str
    family: str
    config: dict[str, Any] = field(default_factory=dict)


# families whose launch may serve several ops of a group (``KernelGroup.merged``), with the op kind each serves: one
# multi-matrix GEMV over matrices that read the same input (kernels/gemv.py and qgemv.py ``Shape.parts``), one RoPE
# launch over Q's and K's heads (``kernels.bind.MergedRope``), one bias launch over Q's, K's and V's biases
# (``kernels.bind.MergedBias``)
MERGED_KIND = {"gemv": "linear", "qgemv": "linear", "rope": "rope", "bias": "bias"}
# GEMV families whose launch may also serve small ops next to it (``kernels.bind.FoldedLinear``): the RMSNorm its ops
# read (``[q_proj, k_proj, v_proj, attn_norm]``: every worker normalizes x first), the residual add of its output
# (``[o_proj, resid1]``) or the SwiGLU of its two outputs (``[gate_proj, up_proj, ffn_norm, swiglu]``)
FOLD_FAMILIES = ("qgemv", "gemv")
# Config fields that describe the data a launch reads rather than its tiling (a packed projection's weight format, the
# KV cache's format): the plan's number formats set them (``with_weights``, ``apply_kv_cache``) and every
# reconfiguration (a debug skill's reset, a candidate config) keeps them.
DATA_FIELDS = ("fmt", "block", "kv_format")


@dataclass
class KernelGroup:
    """One dispatch (a multi-launch group) on the NPU, or one host step on the CPU.

    ``merged``: runs of the group's ops that one launch serves (e.g. ``["q_proj", "k_proj", "v_proj"]``): linear ops
    of one mergeable family reading the same input, run as one multi-matrix launch, or RoPE ops (Q's and K's), run
    as one launch over all their heads; at the first op's place with the first op's config (one design switch
    instead of several). GEMV ops followed by the RMSNorm they read and/or the add or SwiGLU of their outputs
    (``[gate_proj, up_proj, ffn_norm, swiglu]``) are one GEMV launch with those folded in; their launches are saved."""

    name: str
    calls: list[KernelCall]
    where: str = "npu"
    merged: list[list[str]] = field(default_factory=list)

    @property
    def ops(self) -> list[str]:
        return [c.op for c in self.calls]

    @property
    def is_dispatch(self) -> bool:
        """An NPU group launches the array only if it holds a kernel (a lone KV write is a DMA)."""
        return self.where == "npu" and any(c.family != KV_FAMILY for c in self.calls)


# AIR's fused decode compiles its attention for a padded KV readback of ATTN_MAXL = 2048 positions
# (reference/xdna2.md, "AIR's own 4-bit deployments"): one dispatch has one program, so the readback length is fixed.
KV_TEMPLATE_ROWS = 2048


@dataclass
class StagePlan:
    """Groups of one block (repeated for every layer) and of the head, in execution order.

    ``one_dispatch``: the whole pass (every layer's groups, then the head's) is a single NPU dispatch, as AIR's fused
    decode runs 16 layers and the LM head per token; every group must then be on the NPU. ``kv_windows``: the KV
    readback templates of such a dispatch (its attention launches stream ``kv_readback(context)`` rows per layer,
    the smallest window holding the context); empty = each attention launch reads exactly the context.
    ``resident``: such a dispatch is configured into the array once, every launch's tiles packed together, as AIR's
    fused decode is one module (``npu/resident.py``): no design switch between launches, legal only when the
    pass's designs fit the array together (``plan/resident.py`` finds configs that do); False = a design switch per
    launch after the first (``npu.timing.time_group``). ``prefetch``: in such a resident dispatch each launch's
    weights run ahead into memory-tile regions the packing leaves free (``npu/prefetch.py``); resident only.
    """

    block: list[KernelGroup]
    head: list[KernelGroup]
    one_dispatch: bool = False
    kv_windows: list[int] = field(default_factory=list)
    resident: bool = False
    prefetch: bool = False

    def groups(self) -> list[KernelGroup]:
        return self.block + self.head

    def join(self) -> None:
        """A one-dispatch stage's block groups as one group ("layer") and its head groups as another ("head"): inside
        one dispatch a group boundary is no launch boundary (the pass times the same either way), but merges and
        folds (``plan.merge``) look within one group, so joined they see gate and up of a paper plan that split its
        FFN into several ELFs together, and the final norm beside the LM head. A no-op on any other stage."""
        if not self.one_dispatch:
            return
        for part, name in (("block", "layer"), ("head", "head")):
            groups = getattr(self, part)
            if len(groups) > 1:
                calls = [c for g in groups for c in g.calls]
                setattr(self, part, [KernelGroup(name, calls, merged=[m for g in groups for m in g.merged])])

    def kv_readback(self, context: int) -> int:
        """KV rows one attention launch streams at ``context`` cached positions: the smallest template window that
        holds them; past the largest, the context rounded up to a multiple of it (one template per multiple)."""
        if not self.kv_windows:
            return context
        fit = [w for w in sorted(self.kv_windows) if w >= context]
        if fit:
            return fit[0]
        top = max(self.kv_windows)
        return -(-context // top) * top


@dataclass
class HostPolicy:
    """Host-side behaviour: each option changes modeled time and never a result."""

    weights: str = "per_call"
    zero_copy: bool = False
    skip_unchanged_writes: bool = False
    reuse_buffers: bool = False
    layout: str = "host_transpose"
    handoff: str = "device"
    attention: str = "batched"


@dataclass
class DeploymentPlan:
    name: str
    spec: dict[str, Any]
    prefill: StagePlan
    decode: StagePlan
    host: HostPolicy = field(default_factory=HostPolicy)
    notes: list[str] = field(default_factory=list)
    # the deployed weight format (model/quant.WeightFormat as a dict; empty = bf16 everywhere)
    weights: dict[str, Any] = field(default_factory=dict)

    def weight_format(self) -> WeightFormat:
        return WeightFormat.from_dict(self.weights)

    # ---- views --------------------------------------------------------------------------
    def model_spec(self) -> ModelSpec:
        return ModelSpec.from_dict(self.spec)

    def stage(self, stage: str) -> StagePlan:
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        return self.prefill if stage == "prefill" else self.decode

    def dispatches_per_layer(self, stage: str) -> int:
        """Dispatches each layer starts (0 when the stage is one dispatch per pass: no layer starts its own)."""
        if self.stage(stage).one_dispatch:
            return 0
        return sum(g.is_dispatch for g in self.stage(stage).block)

    def dispatches_text(self) -> str:
        """The plan's dispatches for a person (``describe_dispatches``)."""
        return describe_dispatches({s: self.dispatches_per_layer(s) for s in STAGES})

    def dispatches_per_token(self, stage: str) -> int:
        """NPU dispatches of one forward pass (all layers plus the head)."""
        st = self.stage(stage)
        if st.one_dispatch:
            return 1
        n_layers = int(self.spec["n_layers"])
        return n_layers * self.dispatches_per_layer(stage) + sum(g.is_dispatch for g in st.head)

    # ---- serialization ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["format"] = PLAN_FORMAT
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeploymentPlan:
        try:
            if d.get("format", PLAN_FORMAT) != PLAN_FORMAT:
                raise ConfigError(
                    f"plan format {d.get('format')} is not supported (expected {PLAN_FORMAT}); rebuild the plan"
                )
            return cls(
                name=str(d["name"]),
                spec=dict(d["spec"]),
                prefill=_stage_from_dict(d["prefill"]),
                decode=_stage_from_dict(d["decode"]),
                host=HostPolicy(**d.get("host", {})),
                notes=list(d.get("notes", [])),
                weights=dict(d.get("weights", {})),
            )
        except (KeyError, TypeError) as e:
            raise ConfigError(f"plan JSON is malformed ({type(e).__name__}: {e}); rebuild or fix the plan") from None

    @classmethod
    def from_json(cls, text: str) -> DeploymentPlan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"plan is not valid JSON ({e.msg} at line {e.lineno}); rebuild or fix it") from None
        if not isinstance(data, dict):
            raise ConfigError("plan JSON must hold an object; rebuild or fix it")
        return cls.from_dict(data)

    def save(self, path: str | Path) -> Path:
        """Write atomically (temp file + rename) so a crash never leaves half a plan."""
        return write_text_atomic(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> DeploymentPlan:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"plan file {path} does not exist; create it with a plan builder or `tilepilot deploy`")
        return cls.from_json(path.read_text())


def _family(name: str) -> str:
    """A saved plan's family name, with the old name of CPU calls read as today's."""
    return CPU_FAMILY if name == LEGACY_CPU_FAMILY else str(name)


def _stage_from_dict(d: dict[str, Any]) -> StagePlan:
    def groups(items: list[dict[str, Any]]) -> list[KernelGroup]:
        return [
            KernelGroup(
                name=str(g["name"]),
                calls=[KernelCall(c["op"], _family(c["family"]), dict(c.get("config", {}))) for c in g["calls"]],
                where=str(g.get("where", "npu")),
                merged=[[str(o) for o in m] for m in g.get("merged", [])],
            )
            for g in items
        ]

    return StagePlan(
        block=groups(d["block"]),
        head=groups(d["head"]),
        one_dispatch=bool(d.get("one_dispatch", False)),
        kv_windows=[int(w) for w in d.get("kv_windows", [])],
        resident=bool(d.get("resident", False)),
        prefetch=bool(d.get("prefetch", False)),
    )


def validate_plan(plan: DeploymentPlan, spec: ModelSpec | None = None) -> list[str]:
    """Every problem of the plan against its spec's block graph, one sentence each (empty = valid)."""
    spec = spec or plan.model_spec()
    graph = block_graph(spec)
    problems: list[str] = []
    h = plan.host
    if h.weights not in WEIGHT_POLICIES:
        problems.append(f"host.weights is {h.weights!r}; use one of {WEIGHT_POLICIES}")
    if h.layout not in LAYOUTS:
        problems.append(f"host.layout is {h.layout!r}; use one of {LAYOUTS}")
    if h.handoff not in HANDOFFS:
        problems.append(f"host.handoff is {h.handoff!r}; use one of {HANDOFFS}")
    if h.attention not in HOST_ATTENTION:
        problems.append(f"host.attention is {h.attention!r}; use one of {HOST_ATTENTION}")
    try:
        wf = plan.weight_format()
        problems += wf.problems()
    except TypeError as e:
        problems.append(f"weights is malformed ({e}); use format/block/bf16_tensors")
        wf = WeightFormat()
    for stage in STAGES:
        st = plan.stage(stage)
        if st.one_dispatch and any(g.where != "npu" for g in st.groups()):
            cpu = [g.name for g in st.groups() if g.where != "npu"]
            problems.append(f"{stage} is one dispatch but groups {cpu} run on the CPU; move them to the NPU first")
        if any(not isinstance(w, int) or w < 1 for w in st.kv_windows):
            problems.append(f"{stage} kv_windows {st.kv_windows} must be positive row counts")
        elif st.kv_windows and not st.one_dispatch:
            problems.append(f"{stage} has kv_windows but is not one dispatch; windows are templates of a fused pass")
        if st.resident and not st.one_dispatch:
            problems.append(f"{stage} is resident but not one dispatch; only a one-dispatch pass can be resident")
        if st.prefetch and not st.resident:
            problems.append(f"{stage} prefetches weights but is not resident; only a resident pass has the regions")
        for part, groups, expected, external in (
            ("block", st.block, graph.block_ops, {LAYER_INPUT}),
            ("head", st.head, graph.head_ops, {LAYER_INPUT}),
        ):
            where = f"{stage} {part}"
            names = [g.name for g in groups]
            if len(set(names)) != len(names):
                problems.append(f"{where} has duplicate group names {sorted(n for n in names if names.count(n) > 1)}")
            ops = [c.op for g in groups for c in g.calls]
            missing = [o for o in expected if o not in ops]
            extra = [o for o in ops if o not in expected]
            dup = sorted({o for o in ops if ops.count(o) > 1})
            if missing:
                problems.append(f"{where} lacks ops {missing}; every op of the block graph must run once")
            if extra:
                problems.append(f"{where} has ops {extra} that the model's block graph does not contain")
            if dup:
                problems.append(f"{where} runs ops {dup} more than once")
            available = set(external)
            for g in groups:
                if g.where not in WHERE:
                    problems.append(f"{where} group {g.name} has where={g.where!r}; use 'npu' or 'cpu'")
                if not g.calls:
                    problems.append(f"{where} group {g.name} is empty")
                for c in g.calls:
                    if c.op not in expected:
                        continue
                    node = graph.node(c.op)
                    for inp in node.inputs:
                        if inp not in available:
                            problems.append(f"{where} op {c.op} reads {inp} before it is computed")
                    available.add(node.output)
                    allowed = KIND_FAMILIES[node.kind]
                    if g.where == "cpu":
                        if c.family not in (CPU_FAMILY,):
                            problems.append(
                                f"{where} op {c.op} is in CPU group {g.name} but names family {c.family!r}; use 'cpu'"
                            )
                    elif c.family not in allowed:
                        problems.append(f"{where} op {c.op} uses family {c.family!r}; it must be one of {allowed}")
                    if c.family in QUANT_FAMILIES and not wf.quantized:
                        problems.append(f"{where} op {c.op} uses {c.family} but the plan's weights are bf16")
                    if g.where == "npu" and node.kind in ("kv_write", "attention"):
                        problems += _kv_cache_problems(where, c, node.kind, wf.kv_cache)
                    if not isinstance(c.config, dict):
                        problems.append(f"{where} op {c.op} has a non-object config")
                problems += merge_problems(g, graph, where)
                problems += _cache_writer_problems(where, g, graph, wf.kv_cache)
    return problems


def _cache_writer_problems(where: str, g: KernelGroup, graph: Any, fmt: str) -> list[str]:
    """Why a RoPE launch writing the KV cache (a merged run ending in its ``kv_write``) writes another format than the
    plan's cache (``apply_kv_cache`` makes them match; ``merge_problems`` checks the run itself)."""
    calls = {c.op: c for c in g.calls}
    problems = []
    for m in g.merged:
        if m[0] not in calls or m[-1] not in calls or graph.node(m[-1]).kind != "kv_write":
            continue
        got = calls[m[0]].config.get("kv_format")
        if got != fmt:
            problems.append(
                f"{where} op {m[0]} writes the KV cache as {got!r} but the plan's cache is {fmt}; set its config "
                "kv_format (apply_kv_cache)"
            )
    return problems


def dispatch_rate(per_layer: int, stage: str) -> str:
    """A stage's dispatches as a person reads them: ``3/layer``, or, for a stage whose whole pass is one dispatch (0
    per layer in ``dispatches_per_layer``, which reads as a stage with no NPU work), one per pass (``1/token`` in
    decode)."""
    return f"{per_layer}/layer" if per_layer else f"1/{'token' if stage == 'decode' else 'pass'}"


def describe_dispatches(per_layer: dict[str, int]) -> str:
    """Every stage's ``dispatch_rate``: "dispatches 1/layer prefill, 1/token decode"."""
    return "dispatches " + ", ".join(f"{dispatch_rate(per_layer[s], s)} {s}" for s in STAGES)


def merge_problems(g: KernelGroup, graph: Any, where: str) -> list[str]:
    """Why the group's ``merged`` runs cannot be one launch each (empty = they can): two or more of the group's NPU
    ops, each in one run, of one mergeable family and its op kind (``MERGED_KIND``): linear ops of one config format
    all reading the same input, or RoPE (bias) ops of one config whose inputs are all computed before the run's first
    op (the launch runs there)."""
    problems: list[str] = []
    calls = {c.op: c for c in g.calls}
    seen: set[str] = set()
    for m in g.merged:
        what = f"{where} group {g.name} merge {m}"
        if len(m) < 2 or len(set(m)) != len(m):
            problems.append(f"{what} must name two or more distinct ops")
            continue
        if g.where != "npu" or any(o not in calls for o in m):
            problems.append(f"{what} names ops outside this NPU group; merge only ops of one dispatch")
            continue
        if seen & set(m):
            problems.append(f"{what} repeats ops of another merge; an op runs in one launch")
        seen |= set(m)
        nodes = [graph.node(o) for o in m]
        if nodes[-1].kind == "kv_write":
            problems += _cached_rope_problems(what, g, m, nodes, graph)
            continue
        if any(n.kind == "head_norm" for n in nodes):
            problems += _normed_rope_problems(what, g, m, nodes, graph)
            continue
        if folded_kinds([n.kind for n in nodes]):
            problems += _folded_problems(what, g, m, nodes, graph)
            continue
        fams = {calls[o].family for o in m}
        fam = next(iter(fams)) if len(fams) == 1 else None
        if fam not in MERGED_KIND or any(n.kind != MERGED_KIND[fam] for n in nodes):
            kinds = ", ".join(f"{k} ops of {f}" for f, k in MERGED_KIND.items())
            problems.append(f"{what} must be ops of one family ({kinds}), got {sorted(fams)}")
        elif MERGED_KIND[fam] == "linear":
            if len({(calls[o].config.get("fmt"), calls[o].config.get("block")) for o in m}) != 1:
                problems.append(f"{what} mixes weight formats; one launch decodes one format")
            if len({tuple(n.inputs) for n in nodes}) != 1:
                problems.append(f"{what} reads different inputs; a multi-matrix launch streams one x")
        else:
            later = _computed_from(g, graph, m[0])
            if any(v in later for n in nodes for v in n.inputs):
                problems.append(f"{what} reads a value computed at or after {m[0]}; the merged launch runs there")
    return problems


def _computed_from(g: KernelGroup, graph: Any, op: str) -> set[str]:
    """The values the group computes at or after ``op``'s place: a launch running there cannot read them."""
    order = [c.op for c in g.calls]
    return {graph.node(o).output for o in order[order.index(op) :]}


def _folded_problems(what: str, g: KernelGroup, m: list[str], nodes: list, graph: Any) -> list[str]:
    """Why a GEMV run with folded ops (``kernels.bind.FoldedLinear``: linear ops, then optionally the RMSNorm they read,
    then optionally the residual add of the one linear's output or the SwiGLU of the two linears' outputs, or the
    RoPE ops of the first linears' outputs) cannot be one launch: the linear ops are of one GEMV family that folds
    (``FOLD_FAMILIES``) and one format; every value the launch does not write (the norm's output, the linears'
    outputs under an epilogue) is read by no op outside the run; an add's residual is computed before the run's first
    op (the launch runs there); RoPE op j runs as rope at the table the epilogue streams (fp32 angles, half layout)
    and reads linear op j's output alone."""
    calls = {c.op: c for c in g.calls}
    lins = [n for n in nodes if n.kind in LINEAR_KINDS]
    rest = [n for n in nodes if n not in lins]
    norm = next((n for n in rest if n.kind == "rmsnorm"), None)
    ep = next((n for n in rest if n.kind in EPILOGUE_KINDS), None)
    ropes = [n for n in rest if n.kind == "rope"]
    tail = [n for n in (norm, ep) if n is not None] + ropes
    shape_ok = nodes[: len(lins)] == lins and rest == tail and lins and not (ep and ropes)
    fams = {calls[n.op].family for n in lins}
    if not shape_ok or len(fams) != 1 or fams - set(FOLD_FAMILIES):
        return [
            f"{what}: a folded run is linear ops of one of {FOLD_FAMILIES}, then the RMSNorm they read and/or the "
            f"add, SwiGLU or RoPE ops of their outputs, got {[n.op for n in nodes]} on {sorted(fams)}"
        ]
    problems = []
    if len({(calls[n.op].config.get("fmt"), calls[n.op].config.get("block")) for n in lins}) != 1:
        problems.append(f"{what} mixes weight formats; one launch decodes one format")
    hidden = []  # values the launch computes but does not write
    if norm is not None:
        hidden.append(norm.output)
        if calls[norm.op].family != "rmsnorm":
            problems.append(f"{what}: {norm.op} runs as {calls[norm.op].family}, not rmsnorm; it cannot be a prologue")
        if any(tuple(n.inputs) != (norm.output,) for n in lins):
            problems.append(f"{what}: every linear op must read {norm.output} alone")
    elif len({tuple(n.inputs) for n in lins}) != 1:
        problems.append(f"{what} reads different inputs; a multi-matrix launch streams one x")
    if ep is not None:
        hidden += [n.output for n in lins]
        want = {"add": "eltwise", "swiglu": "swiglu"}[ep.kind]
        if calls[ep.op].family != want:
            problems.append(f"{what}: {ep.op} must run as {want} to fold")
        if ep.kind == "add" and (len(lins) != 1 or lins[0].output not in ep.inputs):
            problems.append(f"{what}: a residual epilogue is the add of its one linear op's output")
        if ep.kind == "swiglu" and tuple(ep.inputs) != tuple(n.output for n in lins):
            problems.append(f"{what}: a SwiGLU epilogue gates its two linear ops' outputs, gate first")
        if ep.kind == "add":
            later = _computed_from(g, graph, m[0])
            if any(v in later for v in ep.inputs if v not in hidden):
                problems.append(f"{what}: {ep.op}'s residual is computed at or after {m[0]}; the launch runs there")
    for lin, r in zip(lins, ropes, strict=False):  # RoPE op j rotates linear op j's output
        hidden.append(lin.output)
        config = calls[r.op].config
        table = (config.get("angles", "fp32"), config.get("layout", "half"))
        if calls[r.op].family != "rope" or table != ("fp32", "half"):
            problems.append(f"{what}: {r.op} must run as rope with fp32 angles in the half layout to be an epilogue")
        if tuple(r.inputs) != (lin.output,):
            problems.append(f"{what}: {r.op} must rotate {lin.op}'s output alone (RoPE op j rotates linear op j's)")
    if len(ropes) > len(lins):
        problems.append(f"{what}: more RoPE ops than linear ops to rotate")
    for v in hidden:
        readers = set(graph.readers(v)) - set(m)
        if readers:
            problems.append(f"{what}: {sorted(readers)} also read {v}, which the launch does not write")
    return problems


def _normed_rope_problems(what: str, g: KernelGroup, m: list[str], nodes: list, graph: Any) -> list[str]:
    """Why a RoPE run with per-head norms (``kernels.bind.NormedRope``: RoPE ops, then norm j for RoPE op j) cannot be
    one launch (at the first op's place, with its config): the RoPE ops run as rope and the norms as rmsnorm with the
    fp32 accumulator (the arithmetic the prologue repeats); norm j's output is RoPE op j's input and nothing outside
    the run reads it; the norms' inputs are computed before the run's first op."""
    calls = {c.op: c for c in g.calls}
    half = len(nodes) // 2
    ropes, norms = nodes[:half], nodes[half:]
    if not half or len(nodes) % 2 or any(n.kind != "rope" for n in ropes) or any(n.kind != "head_norm" for n in norms):
        return [f"{what}: a normed RoPE run is RoPE ops, then the per-head norm feeding each, got {m}"]
    problems = []
    if {calls[n.op].family for n in ropes} != {"rope"}:
        problems.append(f"{what}: its RoPE ops must run as rope")
    for n in norms:
        if calls[n.op].family != "rmsnorm" or calls[n.op].config.get("acc", "fp32") != "fp32":
            problems.append(f"{what}: {n.op} must run as rmsnorm with the fp32 accumulator to be a RoPE prologue")
    for r, n in zip(ropes, norms, strict=True):
        if tuple(r.inputs) != (n.output,):
            problems.append(f"{what}: {r.op} must read {n.output} alone")
        readers = set(graph.readers(n.output)) - set(m)
        if readers:
            problems.append(f"{what}: {sorted(readers)} also read {n.output}, which the launch does not write")
    later = _computed_from(g, graph, m[0])
    if any(v in later for n in norms for v in n.inputs):
        problems.append(f"{what} reads a value computed at or after {m[0]}; the launch runs there")
    return problems


def _cached_rope_problems(what: str, g: KernelGroup, m: list[str], nodes: list, graph: Any) -> list[str]:
    """Why a RoPE run writing the KV cache (``kernels.bind.CachedRope``: RoPE ops, K's last, optionally their per-head
    norms, then the ``kv_write``) cannot be one launch: the RoPE run without the write must be one launch itself (a
    single RoPE op, or ``merge_problems``' RoPE or normed RoPE run); the write runs as kvquant (a quantized cache,
    whose format the launch's config names: ``validate_plan`` checks it); it stores K's rotated rows (the last RoPE
    op's output, which nothing else reads) and V's rows computed before the run's first op."""
    calls = {c.op: c for c in g.calls}
    rest, kv = nodes[:-1], nodes[-1]
    ropes = [n for n in rest if n.kind == "rope"]
    if not ropes or rest[0].kind != "rope" or any(n.kind not in ("rope", "head_norm") for n in rest):
        return [f"{what}: a RoPE run writing the KV cache is RoPE ops (K's last), their norms, then kv_write, got {m}"]
    problems = []
    if len(rest) > 1:
        problems += merge_problems(KernelGroup(g.name, g.calls, merged=[[n.op for n in rest]]), graph, what)
    elif calls[rest[0].op].family != "rope":
        problems.append(f"{what}: {rest[0].op} must run as rope")
    if calls[kv.op].family != "kvquant":
        problems.append(f"{what}: {kv.op} runs as {calls[kv.op].family}; only a quantized cache's kvquant write folds")
    k_rope = ropes[-1]
    if kv.inputs[0] != k_rope.output:
        problems.append(f"{what}: {kv.op} must store the last RoPE op's output, K's")
    readers = set(graph.readers(k_rope.output)) - set(m)
    if readers:
        problems.append(f"{what}: {sorted(readers)} also read {k_rope.output}, which the launch does not write")
    if graph.node(kv.inputs[1]).width != k_rope.width:
        problems.append(f"{what}: {kv.inputs[1]} is not as wide as {k_rope.output}; the launch stores [k | v] rows")
    if kv.inputs[1] in _computed_from(g, graph, m[0]):
        problems.append(f"{what}: {kv.inputs[1]} is computed at or after {m[0]}; the launch runs there")
    return problems


def _kv_cache_problems(where: str, c: KernelCall, kind: str, fmt: str) -> list[str]:
    """Why an NPU KV-cache op does not match the plan's cache format (``apply_kv_cache`` makes them match)."""
    if kind == "kv_write" and c.family != kv_write_family(fmt):
        want = kv_write_family(fmt)
        return [f"{where} op {c.op} writes a {fmt} KV cache with family {c.family!r}; use {want!r} (apply_kv_cache)"]
    if kind == "kv_write" and fmt != "bf16" and c.config.get("kv_format", "q8_0") != fmt:
        return [f"{where} op {c.op} writes {c.config.get('kv_format', 'q8_0')} blocks into a {fmt} KV cache; set its "
                "config kv_format (apply_kv_cache)"]  # fmt: skip
    if kind == "attention" and c.config.get("kv_format", "bf16") != fmt:
        return [
            f"{where} op {c.op} reads a {c.config.get('kv_format', 'bf16')} KV cache but the plan's is {fmt}; "
            "set its config kv_format (apply_kv_cache)"
        ]
    return []


def check_plan(plan: DeploymentPlan, spec: ModelSpec | None = None) -> None:
    """Raise ConfigError listing the plan's problems, if any."""
    problems = validate_plan(plan, spec)
    if problems:
        raise ConfigError(f"plan {plan.name!r} is invalid: " + "; ".join(problems))


def with_weights(plan: DeploymentPlan, fmt: WeightFormat, packed_prefill: bool = True) -> DeploymentPlan:
    """``plan`` deploying ``fmt``: decode projections the format packs run the quantized GEMV (``qgemv``) over the
    packed blocks; prefill projections run the quantized GEMM (``qgemm``) over them, or with
    ``packed_prefill=False`` bf16 GEMMs over the dequantized weights (as AIR's Q4NX prefill does)."""

    out = DeploymentPlan.from_dict(plan.to_dict())
    out.weights = asdict(fmt) | {"bf16_tensors": list(fmt.bf16_tensors)}
    graph = block_graph(out.model_spec())
    quant = {"decode": ("qgemv", "gemv"), "prefill": ("qgemm" if packed_prefill else "gemm", "gemm")}
    for stage, (packed, plain) in quant.items():
        for g in out.stage(stage).block:
            for c in g.calls:
                node = graph.node(c.op)
                if g.where != "npu" or node.kind != "linear":
                    continue
                if fmt.packs(node.weights[0]) and packed in QUANT_FAMILIES:
                    c.family, c.config = packed, {"fmt": fmt.format, "block": fmt.block}
                elif c.family in QUANT_FAMILIES:
                    c.family, c.config = plain, {}
    for g in out.decode.head:  # the LM head streams packed blocks too when the format packs it
        for c in g.calls:
            if g.where == "npu" and graph.node(c.op).kind == "lm_head" and fmt.packs_head:
                c.family, c.config = "qgemv", {"fmt": fmt.format, "block": fmt.block}
            elif c.family in QUANT_FAMILIES:
                c.family, c.config = "lm_head", {}
    if fmt.quantized:
        out.notes.append(f"weights {fmt.format} (block {fmt.block}); bf16: {', '.join(fmt.bf16_tensors)}")
    if fmt.kv_cache != "bf16":
        out.notes.append(f"KV cache {fmt.kv_cache}")
    return apply_kv_cache(out)


def kv_write_family(fmt: str) -> str:
    """The family of an NPU cache write: a bf16 cache's is the producers' drain (no launch), a quantized cache's a
    ``kvquant`` launch."""
    return KV_FAMILY if fmt == "bf16" else "kvquant"


def apply_kv_cache(plan: DeploymentPlan) -> DeploymentPlan:
    """``plan`` (changed in place) with its NPU KV-cache ops matching its KV-cache format (``WeightFormat.kv_cache``):
    its writes of ``kv_write_family`` and, for a quantized cache, its writes and attention launches naming the
    format (config ``kv_format``), as does a RoPE launch writing it (``kernels.bind.CachedRope``), which a bf16 cache
    takes apart (its write is the producers' drain). Every change that moves ops onto the NPU calls it, so a plan
    never reads a cache in another format than it writes."""
    fmt = plan.weight_format().kv_cache
    graph = block_graph(plan.model_spec())
    for stage in STAGES:
        for g in plan.stage(stage).groups():
            if g.where != "npu":
                continue
            if fmt == "bf16":  # no write launch to fold: a RoPE launch that wrote a quantized cache writes RoPE's
                kept = ([o for o in m if graph.node(o).kind != "kv_write"] for m in g.merged)
                g.merged = [r for r in kept if len(r) > 1]
            writing = {m[0] for m in g.merged if graph.node(m[-1]).kind == "kv_write"}  # RoPE launches that write it
            for c in g.calls:
                if c.op in writing:
                    c.config["kv_format"] = fmt
                elif c.family == "rope" and c.config.get("kv_format", "bf16") != "bf16":
                    del c.config["kv_format"]  # its write was taken out again: a plain RoPE launch writes no cache
                kind = graph.node(c.op).kind
                if kind == "kv_write":
                    c.family = kv_write_family(fmt)
                if kind not in ("kv_write", "attention"):
                    continue
                if fmt == "bf16":
                    c.config.pop("kv_format", None)
                else:
                    c.config["kv_format"] = fmt
    return plan
