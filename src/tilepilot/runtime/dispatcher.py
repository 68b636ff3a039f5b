"""Executes a plan's kernel groups for one layer (or the head): NPU groups as dispatches, CPU groups on host.

One executor, two modes. In a *functional* run every NPU call runs its design's fast path on real
bf16 tensors and every CPU call runs its cpu op (its cost on the timeline is modeled, its wall clock is recorded
beside it as ``measured_s``). In a *dry* run (``dry=True``,
what ``time_plan`` uses) the same code walks the same groups, builds and times the same designs and
moves the same (meta) buffers through the same pool, but computes nothing: NPU time comes from the
timing model and CPU cost from ``CpuOpTimer`` (modeled; optionally measured beside). So the modeled
figures of a plan and of a real run come from one piece of logic and cannot drift apart.

Every dispatch, buffer sync and CPU step is recorded in the trace with its group, layer and stage.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

import torch

from tilepilot.kernels.bind import (
    MergedLaunch,
    binding,
    config_key,
    family_module,
    make_config,
    merged_launch,
)
from tilepilot.model.graph import KV_FAMILY, KV_STATE, BlockGraph, OpNode, weight_shape
from tilepilot.model.spec import ModelSpec
from tilepilot.npu.calibration import CALIBRATION, Calibration
from tilepilot.npu.design import MultiLaunchGroup
from tilepilot.npu.device import Device, npu2
from tilepilot.npu.resident import time_resident
from tilepilot.npu.timing import GroupTiming, HostCost, time_group
from tilepilot.npu.trace import Trace
from tilepilot.npu.validate import DesignError, check_dispatch, validate, validate_group
from tilepilot.plan.plan import HostPolicy, KernelGroup
from tilepilot.runtime import cpu_ops
from tilepilot.runtime.buffers import BufferPool, DeviceBuffer, SyncCostModel, SyncEvent
from tilepilot.runtime.threads import step_threads

BF16 = torch.bfloat16
META = torch.device("meta")


def sync_costs(cal: Calibration = CALIBRATION) -> SyncCostModel:
    hc = HostCost(cal)
    return SyncCostModel(sync_s=hc.sync_s, fixed_s=hc.sync_fixed_s, alloc_s=hc.alloc_s(), handoff_s=hc.handoff_s)


def _key(x: Any) -> Any:
    """A hashable identity for a family Shape (frozen dataclasses hash by value; others by their fields)."""
    try:
        hash(x)
        return (type(x).__module__, x)
    except TypeError:
        return (type(x).__module__, type(x).__name__, tuple(sorted(asdict(x).items()))) if is_dataclass(x) else x


def cpu_flops(kind: str, rows: int, context: int, io_width: int, weight_elems: int, spec: ModelSpec) -> int:
    """Arithmetic of one cpu op (multiply and add counted apart): matrix products by their shapes, elementwise
    ops by a few operations per element of their inputs and output (they are bytes-bound on the host anyway)."""
    if kind in ("linear", "lm_head"):
        return 2 * rows * weight_elems
    if kind == "attention":
        return 4 * rows * context * spec.n_heads * spec.head_dim  # Q K^T and P V over the cached positions
    if kind == "kv_write":
        return 0
    return 4 * rows * io_width


class LaunchKey:
    """The identity of one launch in the library: (family, shape key, config items), hashed once. A run looks up
    the same launches every token (the LRU order, the dispatch times), and a shape's dataclass hash is recomputed
    on every use."""

    __slots__ = ("parts", "_hash")

    def __init__(self, parts: tuple) -> None:
        self.parts = parts
        self._hash = hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LaunchKey) and self._hash == other._hash and self.parts == other.parts

    def __repr__(self) -> str:
        return f"LaunchKey{self.parts!r}"


class KernelLibrary:
    """Designs and modeled dispatch times, built once per (family, shape, config) and group.

    Legal or nothing: every design is validated when it is built (``npu.validate``) and every dispatch's modeled
    time is checked against the driver's watchdog, so an illegal design raises ``DesignError`` naming its code
    instead of being timed. Everything that times a plan (``time_plan``, ``bench``, the optimizations, the
    evaluator, a functional run) builds its designs here.

    Bounded (least recently used first out): decode attention on the NPU has a new shape at every
    context length, so an unbounded cache would grow with every generated token.
    """

    def __init__(self, device: Device | None = None, cal: Calibration = CALIBRATION, capacity: int = 1024):
        self.device = device or npu2()
        self.cal = cal
        self.capacity = capacity
        self._designs: OrderedDict[LaunchKey, tuple[LaunchKey, Any]] = OrderedDict()
        self._groups: OrderedDict[tuple, GroupTiming] = OrderedDict()

    @staticmethod
    def _touch(cache: OrderedDict, key: Any, capacity: int) -> None:
        cache.move_to_end(key)
        while len(cache) > capacity:
            cache.popitem(last=False)

    def design(self, family: str, shape: Any, config: dict[str, Any]) -> tuple[Any, Any]:
        """(key, design) for one call; the key identifies it for ``dispatch_time``."""
        key = LaunchKey((family, _key(shape), config_key(config)))
        entry = self._designs.get(key)
        if entry is None:
            mod = family_module(family)
            cfg = make_config(mod, shape, config, self.device)
            design = mod.make_design(shape, cfg, self.device)
            problems = validate_group(design) if isinstance(design, MultiLaunchGroup) else validate(design)
            if problems:
                raise DesignError(problems, f"{family} {getattr(design, 'name', family)} (config {dict(config)})")
            entry = self._designs[key] = (key, design)  # the first key object stays the one handed out
        self._touch(self._designs, key, self.capacity)
        return entry

    def touch(self, keys: tuple[Any, ...], name: str | None = None) -> None:
        """Mark launches (and, with ``name``, their dispatch) as just used, as ``design``/``dispatch_time`` do: a
        caller that keeps what they returned keeps the eviction order of a caller that asks again."""
        for k in keys:
            if k in self._designs:
                self._designs.move_to_end(k)
        gkey = (name, tuple(keys), False, False)
        if name is not None and gkey in self._groups:
            self._groups.move_to_end(gkey)

    def designs(self) -> list[Any]:
        """Every design built so far (what a run dispatched), for the trace writer's per-tile layout."""
        return [design for _, design in self._designs.values()]

    def timed_dispatches(self, name: str) -> list[GroupTiming]:
        """The modeled dispatches named ``name`` timed so far, oldest first (e.g. a one-dispatch pass's breakdown)."""
        return [t for (n, *_), t in self._groups.items() if n == name]

    def dispatch_time(
        self, name: str, keys: list[Any], *, resident: bool = False, prefetch: bool = False
    ) -> GroupTiming:
        """Modeled time of one dispatch holding the given launches (multi-launch groups are flattened); ``resident``:
        the launches packed into the array and configured once (``npu.resident``; DesignError when they do not fit),
        ``prefetch``: their weights fetched ahead into free memory-tile regions (``npu.prefetch``)."""
        prefetch = prefetch and resident  # only a resident pass has the regions
        gkey = (name, tuple(keys), resident, prefetch)
        if gkey not in self._groups:
            designs = []
            for k in keys:
                d = self._designs[k][1]
                designs.extend(d.designs if isinstance(d, MultiLaunchGroup) else [d])
            if resident:
                timing = time_resident(name, designs, self.cal, prefetch=prefetch)
            else:
                timing = time_group(MultiLaunchGroup(name=name, designs=designs), self.cal)
            check_dispatch(name, timing.seconds)
            self._groups[gkey] = timing
        self._touch(self._groups, gkey, self.capacity)
        return self._groups[gkey]


class CpuOpTimer:
    """Host cost of a CPU group in dry runs: always *modeled* (``HostCost.cpu_model_s``, a roofline of the group's
    bytes and FLOPs at the calibration's host rates, plus a per-head cost where the plan's host attention loops over
    heads), so a modeled total depends on the plan, the code and the
    constants only, never on this machine's load. With ``mode="measured"`` the group is also run once per shape
    on zero tensors and its measured wall clock is reported *beside* the modeled cost (trace ``measured_s``),
    never inside it. ``"estimated"`` is an older name of ``"modeled"``."""

    MODES = ("modeled", "estimated", "measured")

    def __init__(self, mode: str = "modeled", cal: Calibration = CALIBRATION, repeats: int = 3):
        if mode not in self.MODES:
            raise ValueError(f"CpuOpTimer mode must be one of {self.MODES}, got {mode!r}")
        self.mode = mode
        self.cal = cal
        self.repeats = repeats
        self._cache: dict[Any, float] = {}

    @property
    def clock(self) -> str:
        """The clock of the cost that enters modeled totals: always modeled."""
        return "modeled"

    @property
    def measures(self) -> bool:
        return self.mode == "measured"

    def seconds(self, nbytes: int, flops: int = 0, heads: int = 0) -> float:
        """Modeled host seconds of a CPU step streaming ``nbytes`` with ``flops`` of arithmetic and ``heads`` query
        heads of host attention."""
        return HostCost(self.cal).cpu_model_s(nbytes, flops, heads)

    def measured(self, key: Any, run: Callable[[], None]) -> float | None:
        """Measured wall clock of ``run`` (median of ``repeats``, cached by ``key``), or None when not measuring."""
        if not self.measures:
            return None
        if key not in self._cache:
            run()  # warm up: page in the tensors, pick kernels
            samples = []
            for _ in range(self.repeats):
                t0 = time.perf_counter()
                run()
                samples.append(time.perf_counter() - t0)
            self._cache[key] = sorted(samples)[len(samples) // 2]
        return self._cache[key]


@dataclass
class Pass:
    """One forward pass: its stage, first position, token count and whether it computes."""

    stage: str
    start: int
    rows: int
    dry: bool = False

    @property
    def context(self) -> int:
        return self.start + self.rows


@dataclass
class KVState:
    """The KV cache as the dispatcher sees it: storage (None in dry runs) and which side wrote last."""

    cache: Any = None
    side: dict[int, str] = field(default_factory=dict)  # layer -> "npu" | "cpu" that wrote this pass's rows


# Host operations per value to decode a quantized KV cache's blocks (convert, scale; ESTIMATE) for host attention.
KV_DECODE_OPS = 2
# ... and to encode a row into blocks on the host (abs and max over its block, scale, round and pack; ESTIMATE).
KV_ENCODE_OPS = 4

# The only op whose kernel shape depends on the cached context (``kernels.bind``: attention reads the KV rows).
CONTEXT_KINDS = ("attention",)


@dataclass(frozen=True)
class PreparedGroup:
    """An NPU group resolved for one step shape: each op's node, binding and design, the launches' keys and the
    modeled dispatch time. Resolving them is the same for every token of a stage (and, for a group without
    attention, every context), so the dispatcher does it once per shape instead of once per call."""

    group: KernelGroup  # held so that the id in the cache key stays this group's
    # (node, OpBinding / a MergedLaunch (one launch for a KernelGroup.merged run; the run's other ops have
    # no entry) or None for kv_write, design or None)
    calls: tuple[tuple[OpNode, Any, Any], ...]
    keys: tuple[Any, ...]  # the timed launch keys, in order
    timing: GroupTiming | None  # None when the pass is one dispatch (timed at end_pass) or holds no launch


class Dispatcher:
    """Runs groups of one plan stage against a buffer pool and a trace."""

    def __init__(
        self,
        spec: ModelSpec,
        graph: BlockGraph,
        policy: HostPolicy,
        pool: BufferPool,
        trace: Trace,
        library: KernelLibrary,
        timer: CpuOpTimer | None = None,
    ):
        self.spec = spec
        self.graph = graph
        self.policy = policy
        self.pool = pool
        self.trace = trace
        self.library = library
        self.timer = timer or CpuOpTimer()
        self.hc = HostCost(library.cal)
        self._ctx: dict[str, Any] = {}
        self._pass_keys: list[Any] | None = None  # launches of a one-dispatch pass, collected until end_pass
        self._resident = self._prefetch = False
        self._kv_readback: Callable[[int], int] | None = None
        self._prepared: OrderedDict[tuple, PreparedGroup] = OrderedDict()
        self._launches: OrderedDict[tuple, tuple] = OrderedDict()  # (group id, op, stage, rows) -> (group, call, key)
        self._reads_context: dict[int, tuple[KernelGroup, bool]] = {}  # group id -> (group, has an attention op)
        self._cpu_groups: dict[int, tuple[KernelGroup, tuple]] = {}  # group id -> (group, its nodes)
        pool.on_sync = self._on_sync

    # ---- one dispatch per pass ---------------------------------------------------------------
    def begin_pass(
        self,
        one_dispatch: bool,
        kv_readback: Callable[[int], int] | None = None,
        resident: bool = False,
        prefetch: bool = False,
    ) -> None:
        """Start a pass; ``one_dispatch``: every NPU group's launches join one dispatch, timed at ``end_pass``.
        ``kv_readback(context)``: KV rows each attention launch streams (a fused program's fixed template).
        ``resident``: that dispatch is configured once with every launch packed into the array (``npu/resident``);
        ``prefetch``: its launches' weights run ahead into free memory-tile regions (``npu/prefetch``)."""
        self._pass_keys = [] if one_dispatch else None
        self._kv_readback = kv_readback
        self._resident = resident
        self._prefetch = prefetch
        self.pool.in_pass = one_dispatch

    def end_pass(self, name: str, stage: str) -> None:
        """Time and trace the pass's single dispatch: one host round trip, a design switch per launch after the
        first (``npu.timing.time_group``) or, resident, every launch packed and configured once
        (``npu.resident.time_resident``: an illegal packing is a DesignError), and the driver's per-dispatch
        watchdog (DISPATCH_WATCHDOG) checked on it."""
        keys, self._pass_keys, self._kv_readback = self._pass_keys, None, None
        self.pool.in_pass = False
        if keys:
            gt = self.library.dispatch_time(name, keys, resident=self._resident, prefetch=self._prefetch)
            self.trace.add_dispatch(gt, group=name, layer=None, stage=stage)

    def abort_pass(self) -> None:
        """Drop a pass that raised before ``end_pass``: nothing is timed, and the pool leaves the pass."""
        self._pass_keys, self._kv_readback = None, None
        self.pool.in_pass = False

    # ---- trace plumbing ---------------------------------------------------------------------
    def set_stage(self, stage: str) -> None:
        """Host-side work outside any group (inputs, logits read-back) is traced under its stage."""
        self._ctx = {"group": None, "layer": None, "stage": stage}

    def _on_sync(self, ev: SyncEvent) -> None:
        if ev.seconds <= 0:
            return
        self.trace.add(
            "sync",
            f"{ev.op}:{ev.name}",
            ev.seconds,
            group=self._ctx.get("group"),
            layer=self._ctx.get("layer"),
            stage=self._ctx.get("stage"),
            bytes=ev.nbytes,
        )

    # ---- entry point --------------------------------------------------------------------------
    def run(
        self,
        groups: list[KernelGroup],
        env: dict[str, DeviceBuffer],
        weights: dict[str, DeviceBuffer],
        p: Pass,
        layer: int | None,
        kv: KVState,
        tables: DeviceBuffer | None,
    ) -> None:
        """Run ``groups`` in order; ``env`` maps value names to buffers and gains every value produced."""
        for g in groups:
            self._ctx = {"group": g.name, "layer": layer, "stage": p.stage}
            if g.where == "cpu":
                self._run_cpu(g, env, weights, p, layer, kv, tables)
            else:
                self._run_npu(g, env, weights, p, layer, kv, tables)
        self.set_stage(p.stage)  # host-side work between groups

    # ---- NPU ------------------------------------------------------------------------------------
    def _prepare(self, g: KernelGroup, p: Pass) -> PreparedGroup:
        """The group resolved for this pass's shape (cached per stage, rows and, with attention, context)."""
        reads_context = self._reads_context.get(id(g))
        if reads_context is None or reads_context[0] is not g:
            reads_context = self._reads_context[id(g)] = (
                g,
                any(self.graph.node(c.op).kind in CONTEXT_KINDS for c in g.calls),
            )
        ckey = (id(g), p.stage, p.rows, p.context if reads_context[1] else None, self._pass_keys is not None)
        prep = self._prepared.get(ckey)
        if prep is not None and prep.group is g:
            self._prepared.move_to_end(ckey)
            self.library.touch(prep.keys, None if prep.timing is None else g.name)
            return prep
        nodes = [self.graph.node(c.op) for c in g.calls]
        calls: list[tuple[OpNode, Any, Any]] = []
        keys: list[Any] = []
        merged = {m[0]: merged_launch(tuple(self.graph.node(o) for o in m)) for m in g.merged}
        served = {o for m in g.merged for o in m[1:]}  # computed by their run's first op's launch
        kept: list[Any] = []
        for call, node in zip(g.calls, nodes, strict=True):
            if node.kind == "kv_write" and call.family == KV_FAMILY:  # a bf16 cache: the producers' drains write it
                calls.append((node, None, None))
                continue
            if call.op in served:
                continue
            # a launch that does not read the context resolves once per group, stage and rows: a group holding
            # attention (a one-dispatch pass's whole layer) is prepared again at every context, its other launches not
            lkey = (id(g), call.op, p.stage, p.rows) if node.kind not in CONTEXT_KINDS else None
            hit = self._launches.get(lkey) if lkey else None
            if hit is not None and hit[0] is not g:
                hit = None  # a group object gone, its id reused
            if hit is not None:
                entry, key = hit[1], hit[2]
                kept.append(key)
            elif call.op in merged:
                shape = merged[call.op].shape(call.family, self.spec, p.rows, call.config)
                key, design = self.library.design(call.family, shape, call.config)
                entry = (node, merged[call.op], design)
            else:
                key, design = self.library.design(call.family, self._shape(node, call, p), call.config)
                key, entry = self._timed_key(node, call, p, key), (node, binding(node, call.family), design)
            if lkey and hit is None:
                self._launches[lkey] = (g, entry, key)
                while len(self._launches) > 4 * self.library.capacity:
                    self._launches.popitem(last=False)
            keys.append(key)
            calls.append(entry)
        self.library.touch(tuple(kept))
        timing = self.library.dispatch_time(g.name, keys) if keys and self._pass_keys is None else None
        prep = PreparedGroup(g, tuple(calls), tuple(keys), timing)
        self._prepared[ckey] = prep
        while len(self._prepared) > self.library.capacity:
            self._prepared.popitem(last=False)
        return prep

    def _run_npu(self, g, env, weights, p: Pass, layer, kv: KVState, tables) -> None:
        prep = self._prepare(g, p)
        internal: dict[str, torch.Tensor] = {}
        seen_inputs: dict[str, torch.Tensor] = {}
        produced: list[str] = []

        def value(v: str) -> torch.Tensor:
            if v in internal:
                return internal[v]
            if v not in seen_inputs:
                seen_inputs[v] = self.pool.device_view(env[v])
            return seen_inputs[v]

        def stored(rows: torch.Tensor, write: bool = True) -> None:
            """The step's K/V rows are in the cache, written from the NPU: ``rows`` a quantized cache's stored rows (a
            kvquant launch's, or a RoPE launch's epilogue's) to write, or with ``write`` False bf16 K, already there."""
            if write and not p.dry:
                kv.cache.write_stored(layer, rows)
            kv.side[layer] = "npu"
            internal[KV_STATE] = rows

        for node, bound, design in prep.calls:
            if node.kind == "kv_write":
                k, v = value(node.inputs[0]), value(node.inputs[1])
                if bound is None:  # a bf16 cache: the producers' drains land in it
                    if not p.dry:
                        kv.cache.write(layer, k, v)
                    stored(k, write=False)
                else:
                    stored(k if p.dry else bound.run(design, {"_in": [k, v], "_w": ()}, self.spec))
                continue
            if isinstance(bound, MergedLaunch):
                ins = [value(v) for v in bound.reads]  # one x for a GEMV
                ws = [self.pool.weight_view(weights[n.weights[0]]) for n in bound.members if n.weights]
                extra: dict[str, Any] = {}
                if bound.tables:
                    if "cs" not in seen_inputs:
                        seen_inputs["cs"] = self.pool.device_view(tables)
                    extra = {"cs": seen_inputs["cs"], "start": p.start}
                if p.dry:
                    outs = [torch.empty(p.rows, n.width, dtype=BF16, device=META) for n in bound.writes]
                else:
                    outs = bound.run(design, ins, ws, extra, self.spec)
                for n, o in zip(bound.writes, outs, strict=True):
                    if n.kind == "kv_write":  # a RoPE launch's cache-write epilogue (``CachedRope``)
                        stored(o)
                        continue
                    internal[n.output] = o
                    produced.append(n.output)
                continue
            args: dict[str, Any] = {"_w": node.weights}
            if node.kind == "attention":
                args["_in"] = [value(node.inputs[0])]
                self._kv_to("npu", layer, p, kv)
                self._host_transposes(g, p)
                args.update(self._kv_args(layer, p, kv))
            else:
                args["_in"] = [value(v) for v in node.inputs]
            for w in node.weights:
                args[w] = self.pool.weight_view(weights[w])
            if node.kind == "rope":
                if "cs" not in seen_inputs:
                    seen_inputs["cs"] = self.pool.device_view(tables)
                args.update(cs=seen_inputs["cs"], start=p.start)
            if p.dry:
                out = torch.empty(p.rows, node.width, dtype=BF16, device=META)
            else:
                out = bound.run(design, args, self.spec)
            internal[node.output] = out
            produced.append(node.output)
        if prep.keys and self._pass_keys is not None:
            self._pass_keys.extend(prep.keys)  # part of the pass's one dispatch
        elif prep.timing is not None:
            self.trace.add_dispatch(prep.timing, group=g.name, layer=layer, stage=p.stage)  # + launches and DMAs
        for name in produced:
            buf = self.pool.buffer(f"{p.stage}.{name}")
            self.pool.produced(buf, internal[name])
            env[name] = buf

    def _shape(self, node: OpNode, call, p: Pass, context: int | None = None) -> Any:
        ctx = p.context if context is None else context
        return binding(node, call.family).shape(node, self.spec, p.rows, ctx, call.config)

    def _timed_key(self, node: OpNode, call, p: Pass, key: Any) -> Any:
        """The launch that is timed: an attention launch of a fused template streams its readback window (the
        padded blocks cost DMA; the query computes on the blocks its context needs, so the run keeps ``key``'s
        design). The readback design is built and validated like any other; its compute over the padded blocks is
        counted too, an upper bound that does not set the time while decode attention is DMA-bound."""
        if node.kind != "attention" or self._kv_readback is None:
            return key
        rows = self._kv_readback(p.context)
        if rows <= p.context:
            return key
        return self.library.design(call.family, self._shape(node, call, p, rows), call.config)[0]

    def _kv_to(self, side: str, layer: int, p: Pass, kv: KVState) -> None:
        """Attention on ``side`` needs this pass's new K/V rows there: account the crossing if any."""
        wrote = kv.side.get(layer, side)
        if wrote != side:
            row = kv.cache.row_width * kv.cache.dtype.itemsize if kv.cache is not None else 4 * self.spec.kv_dim
            nbytes = p.rows * row
            self.pool.transfer(f"kv_cache.layer{layer}", "to_device" if side == "npu" else "from_device", nbytes)

    def _host_transposes(self, g: KernelGroup, p: Pass) -> None:
        """Layout ``host_transpose``: Q, new K/V rows and the output go through the host to be transposed. Under host
        handoff they cross anyway (the dispatch's own input copies, the KV rows, the result's read-back), so only the
        transposes themselves are added."""
        if self.policy.layout != "host_transpose" or self.pool.in_pass:
            return  # inside one dispatch the host cannot transpose: the pass's kernels read what the last one wrote
        s = self.spec
        crossing = not self.pool.host_handoff
        for name, width in (("q", s.q_dim), ("k", s.kv_dim), ("v", s.kv_dim), ("attn_out", s.q_dim)):
            nbytes = p.rows * width * 2
            if crossing:
                self.pool.transfer(f"{name}.transpose", "from_device", nbytes)
            self.trace.add(
                "sync",
                f"host_transpose:{name}",
                self.hc.cpu_estimate_s(2 * nbytes),
                group=g.name,
                layer=self._ctx.get("layer"),
                stage=p.stage,
                bytes=nbytes,
            )
            if crossing:
                self.pool.transfer(f"{name}.transpose", "to_device", nbytes)

    def _kv_args(self, layer: int, p: Pass, kv: KVState) -> dict[str, Any]:
        return {"kv_cache": kv.cache, "layer": layer, "start": p.start}

    def _tables(self, tables: DeviceBuffer) -> dict[str, torch.Tensor]:
        t = self.pool.host_view(tables)
        half = t.shape[-1] // 2
        return {"cos": t[:, :half], "sin": t[:, half:]}

    # ---- CPU ------------------------------------------------------------------------------------
    def _cpu_nodes(self, g: KernelGroup) -> tuple[tuple[OpNode, tuple[str, ...], int], ...]:
        """The group's nodes, each with its input values (the KV state aside) and their summed width (per group)."""
        entry = self._cpu_groups.get(id(g))
        if entry is None or entry[0] is not g:
            s = self.spec
            nodes = []
            for c in g.calls:
                node = self.graph.node(c.op)
                ins = tuple(v for v in node.inputs if v != KV_STATE)
                nodes.append((node, ins, sum(self.graph.value_width(v, s) for v in ins)))
            entry = self._cpu_groups[id(g)] = (g, tuple(nodes))
        return entry[1]

    def _run_cpu(self, g, env, weights, p: Pass, layer, kv: KVState, tables) -> None:
        s = self.spec
        nodes = self._cpu_nodes(g)
        inputs: dict[str, torch.Tensor] = {}
        if any(node.kind == "kv_write" for node, _, _ in nodes):
            kv.side[layer] = "cpu"
        for node, _, _ in nodes:
            for v in node.inputs:
                if v != KV_STATE and v in env and v not in inputs:
                    inputs[v] = self.pool.host_view(env[v])
            if node.kind == "attention":
                self._kv_to("cpu", layer, p, kv)
        tab = self._tables(tables) if any(node.kind == "rope" for node, _, _ in nodes) else {}
        nbytes = 0

        def compute() -> dict[str, torch.Tensor]:
            local = dict(inputs)
            out: dict[str, torch.Tensor] = {}
            for node, ins_names, _ in nodes:
                ins = [local[v] for v in ins_names]
                w = [weights[n].host for n in node.weights]
                r = self._cpu_op(node, ins, w, tab, p, layer, kv)
                if r is not None:
                    local[node.output] = r
                    out[node.output] = r
            return out

        flops = heads = 0
        for node, _, in_width in nodes:
            wbytes = sum(int(weights[n].nbytes) for n in node.weights)
            nbytes += wbytes
            nbytes += 2 * p.rows * (node.width + in_width)
            flops += cpu_flops(node.kind, p.rows, p.context, node.width + in_width, wbytes // 2, s)
            if node.kind == "kv_write" and kv.cache is not None and kv.cache.fmt != "bf16":
                # the rows land as stored blocks, not bf16, after the host encodes every value
                nbytes += p.rows * kv.cache.row_width * kv.cache.dtype.itemsize - 2 * p.rows * node.width
                flops += KV_ENCODE_OPS * p.rows * node.width
            if node.kind == "attention":
                cache = kv.cache
                if cache is None or cache.fmt == "bf16":
                    nbytes += 2 * p.context * self.graph.value_width(KV_STATE, s)  # reads the cached K/V rows
                else:  # reads the stored blocks and decodes every value (a few operations each) before attending
                    nbytes += p.context * cache.row_width * cache.dtype.itemsize
                    flops += KV_DECODE_OPS * p.context * self.graph.value_width(KV_STATE, s)
                heads += s.n_heads if self.policy.attention == "per_head" else 0  # the host's loop over heads
        secs = self.timer.seconds(nbytes, flops, heads)
        if p.dry:
            key = (tuple((c.op, self._ctx.get("stage")) for c in g.calls), p.rows, p.context)
            with step_threads(p.rows, self.spec.hidden):
                measured = self.timer.measured(key, lambda: self._dry_cpu(g, p))
            for call in g.calls:
                node = self.graph.node(call.op)
                if node.kind == "kv_write":
                    kv.side[layer] = "cpu"
                else:
                    buf = self.pool.buffer(f"{p.stage}.{node.output}")
                    buf.write(torch.empty(p.rows, node.width, dtype=BF16, device=META))
                    env[node.output] = buf
            self.trace.add(
                "cpu", g.name, secs, clock="modeled", measured_s=measured, group=g.name, layer=layer, stage=p.stage
            )
            return
        with step_threads(p.rows, self.spec.hidden):
            t0 = time.perf_counter()
            out = compute()
            wall = time.perf_counter() - t0
        # the modeled cost enters the timeline; the wall clock it really took rides beside it, labelled measured
        self.trace.add("cpu", g.name, secs, clock="modeled", measured_s=wall, group=g.name, layer=layer, stage=p.stage)
        for name, t in out.items():
            if name == KV_STATE:
                continue
            buf = self.pool.buffer(f"{p.stage}.{name}")
            buf.write(t)
            env[name] = buf

    def _cpu_op(self, node: OpNode, ins, w, tab, p: Pass, layer, kv: KVState) -> torch.Tensor | None:
        s, k = self.spec, node.kind
        if k == "rmsnorm":
            return cpu_ops.rmsnorm(ins[0], w[0], s.rms_eps)
        if k == "head_norm":
            return cpu_ops.head_norm(ins[0], w[0], s.rms_eps, s.head_dim)
        if k in ("linear", "lm_head"):
            return cpu_ops.linear(ins[0], w[0])
        if k == "bias":
            return cpu_ops.bias_add(ins[0], w[0])
        if k == "rope":
            return cpu_ops.rope(ins[0], tab["cos"], tab["sin"], s.head_dim)
        if k == "add":
            return cpu_ops.add(ins[0], ins[1])
        if k == "swiglu":
            return cpu_ops.swiglu(ins[0], ins[1])
        if k == "kv_write":
            kv.cache.write(layer, ins[0], ins[1])
            kv.side[layer] = "cpu"
            return None
        if k == "attention":
            keys, vals = kv.cache.keys(layer, p.rows), kv.cache.values(layer, p.rows)
            return cpu_ops.attention(ins[0], keys, vals, p.start, s.n_heads, s.n_kv_heads, s.head_dim)
        raise ValueError(f"no cpu op for kind {k!r}")

    def _dry_cpu(self, g: KernelGroup, p: Pass) -> None:
        """Run a CPU group's cpu ops once on zero tensors of the real shapes (for CpuOpTimer)."""

        s = self.spec
        half = s.head_dim // 2
        tab = {"cos": torch.zeros(p.rows, half), "sin": torch.zeros(p.rows, half)}
        for call in g.calls:
            node = self.graph.node(call.op)
            ins = [torch.zeros(p.rows, self.graph.value_width(v, s), dtype=BF16) for v in node.inputs if v != KV_STATE]
            w = [torch.zeros(weight_shape(s, n), dtype=BF16) for n in node.weights]
            if node.kind == "kv_write":
                torch.zeros(p.context, 2 * s.kv_dim, dtype=BF16)[-p.rows :].copy_(torch.cat(ins, dim=1))
            elif node.kind == "attention":
                kz = torch.zeros(p.context, s.kv_dim, dtype=BF16)
                cpu_ops.attention(ins[0], kz, kz, p.start, s.n_heads, s.n_kv_heads, s.head_dim)
            else:
                self._cpu_op(node, ins, w, tab, p, None, KVState())
