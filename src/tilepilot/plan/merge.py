"""Multi-matrix launches: the linear ops of a group that read the same input (Q/K/V, gate/up) as one launch each,
the group's RoPE ops (Q's and K's) as one launch over all their heads, and its bias ops (Qwen2's Q, K and V biases)
as one launch over all their columns.

A fused decode step is bounded by its launches: each launch inside the one dispatch costs a design switch and the
configuration of its tiles (``npu.timing.time_group``), and per token Llama-3.2-1B runs 15 launches per layer. Q, K
and V read the same normed activations, as gate and up do, so one GEMV launch can stream all of their packed (or
bf16) weights past one x broadcast and drain each matrix's rows to its own output (``Shape.parts`` of
``kernels/gemv.py`` and ``kernels/qgemv.py``, one dataflow), bit-identical to the separate launches. RoPE rotates
each element on its own with the position's table, so Q's and K's heads side by side in one launch
(``kernels.bind.MergedRope``) are bit-identical to two launches too, at one launch and one table stream; a bias
adds each column's own value, so Q's, K's and V's columns side by side with their biases concatenated
(``kernels.bind.MergedBias``) are bit-identical to three launches.
``merged_stage`` marks those runs (``KernelGroup.merged``) and gives each run's first op a config the merged shape
tiles (the first op's own if it does, else the family default, for qgemv first keeping its columns, weight channels
and compute rows). The ``multi-matrix-launches`` decode skill proposes it and keeps it only when faster and
correct.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from tilepilot.kernels.bind import make_config, merged_launch
from tilepilot.kernels.registry import family
from tilepilot.model.graph import EPILOGUE_KINDS, FOLDED_KINDS, LINEAR_KINDS, block_graph, folded_kinds
from tilepilot.model.spec import ModelSpec
from tilepilot.npu.validate import DesignError, validate
from tilepilot.plan.plan import FOLD_FAMILIES, MERGED_KIND, DeploymentPlan, KernelGroup, apply_kv_cache, merge_problems

# (family, merged shape) -> the merged launch's config dict
Tuner = Callable[[str, Any], dict[str, Any]]


def merge_runs(spec: ModelSpec, group: KernelGroup) -> list[list[str]]:
    """The runs of ``group``'s NPU ops that one launch could serve, two or more ops each (in the group's order):
    linear ops of one mergeable family and weight format reading the same input; RoPE ops of one config whose
    inputs are all computed before the first of them (``plan.merge_problems`` says the same of a plan)."""
    if group.where != "npu":
        return []
    graph = block_graph(spec)
    runs: dict[tuple, list[str]] = {}
    for c in group.calls:
        node = graph.node(c.op)
        if MERGED_KIND.get(c.family) != node.kind:
            continue
        if node.kind == "linear":
            key: tuple = (tuple(node.inputs), c.family, c.config.get("fmt"), c.config.get("block"))
        else:
            key = (c.family, tuple(sorted(c.config.items())))
        runs.setdefault(key, []).append(c.op)
    out = []
    for ops in runs.values():
        while len(ops) >= 2 and merge_problems(KernelGroup(group.name, group.calls, merged=[ops]), graph, "plan"):
            ops = ops[:-1]  # a RoPE op whose input is computed after the first one's place stays on its own
        if len(ops) >= 2:
            out.append(ops)
    return out


def _legal(fam: str, shape: Any, config: dict[str, Any]) -> bool:
    """Whether ``config`` builds a design of ``shape`` that the validator accepts (a fused launch's extra buffers can
    break a tile's budgets where the unfused shape's did not)."""
    mod = family(fam)
    try:
        return not validate(mod.make_design(shape, make_config(mod, shape, config)))
    except DesignError:
        return False


def merged_config(
    spec: ModelSpec, group: KernelGroup, run: list[str], rows: int = 1, tuner: Tuner | None = None
) -> dict[str, Any]:
    """A config of the run's first op that tiles the merged shape: the ``tuner``'s for that shape when given (the
    format fields kept), else as the module docstring says."""
    graph = block_graph(spec)
    calls = {c.op: c for c in group.calls}
    first = calls[run[0]]
    config = dict(first.config)
    if graph.node(run[-1]).kind == "kv_write":  # a launch writing the cache writes its write's format (the plan's:
        config["kv_format"] = calls[run[-1]].config["kv_format"]  # ``apply_kv_cache`` sets it on every kvquant call)
    shape = merged_launch(tuple(graph.node(o) for o in run)).shape(first.family, spec, rows, config)
    if tuner is not None:
        return tuner(first.family, shape)
    if _legal(first.family, shape, config):
        return config
    mod = family(first.family)
    if first.family == "qgemv":
        keep = {"cols": first.config.get("cols"), "channels": first.config.get("weight_channels", 1)}
        variants: tuple[dict[str, Any], ...] = ({**keep, "rows": first.config.get("rows", 1)}, keep, {})
    else:
        variants = ({},)
    for kw in variants:
        try:
            return asdict(mod.default_config(shape, **kw))
        except DesignError:
            continue
    raise DesignError([], f"{first.family} {run}: no config tiles the merged shape {shape}")


def merged_stage(plan: DeploymentPlan, stage: str = "decode", tuner: Tuner | None = None) -> DeploymentPlan | None:
    """A copy of ``plan`` whose ``stage`` groups run every mergeable run as one launch; None when nothing merges
    (or every run is already merged, or no config tiles a merged shape). ``tuner(family, shape)`` -> config dict
    picks each merged launch's config (the decode skill passes the tile tuner)."""
    spec = plan.model_spec()
    new = copy.deepcopy(plan)
    new.stage(stage).join()  # a one-dispatch pass saved before its groups were joined
    changed = False
    for g in new.stage(stage).groups():
        runs = [r for r in merge_runs(spec, g) if r not in g.merged]
        taken = {o for m in g.merged for o in m}
        for run in runs:
            if taken & set(run):
                continue
            try:
                config = merged_config(spec, g, run, tuner=tuner)
            except DesignError:
                continue
            next(c for c in g.calls if c.op == run[0]).config = config
            g.merged.append(run)
            taken |= set(run)
            changed = True
    return new if changed else None


def split_stage(
    plan: DeploymentPlan, stage: str = "decode", kinds: tuple[str, ...] = ("rope",)
) -> DeploymentPlan | None:
    """A copy of ``plan`` whose ``stage`` runs its merged runs of these op kinds as separate launches again (None when
    it has none); "rmsnorm" ("add") takes the norm (residual add) out of a GEMV launch that runs it as its prologue
    (epilogue): ``normed_stage``, ``residual_stage``.
    A merged launch is a packing choice as well as a launch saved: Q's and K's RoPE in one launch hold all their
    heads on one tile (Llama-3.2-3B: 34 KB of L1 where the separate launches hold 26 and 10 KB on tiles of their
    own), which can leave a resident pass worse configs elsewhere; ``resident-decode`` fits both."""
    graph = block_graph(plan.model_spec())
    new = copy.deepcopy(plan)
    changed = False
    for g in new.stage(stage).groups():
        keep = []
        for m in g.merged:
            nodes = [graph.node(o) for o in m]
            if folded_kinds([n.kind for n in nodes]):  # a launch with folded ops: take out the named ones
                keep += _split_of(m, nodes, kinds)
            elif nodes[0].kind not in kinds:
                keep.append(m)
        changed |= keep != g.merged
        g.merged = keep
    return apply_kv_cache(new) if changed else None


def _split_of(run: list[str], nodes: list, kinds: tuple[str, ...]) -> list[list[str]]:
    """The runs a folded run leaves with its ops of ``kinds`` taken out: what stays of it (``_left_of``), and a GEMV
    launch's RoPE epilogue of two or more RoPE ops, when it leaves with them, as the one RoPE launch it was before."""
    rest = _left_of(run, nodes, kinds)
    ropes = [o for o, n in zip(run, nodes, strict=True) if n.kind == "rope"]
    left = len(ropes) > 1 and nodes[0].kind in LINEAR_KINDS and not set(ropes) & set(rest or ())
    return ([rest] if rest else []) + ([ropes] if left else [])


def _left_of(run: list[str], nodes: list, kinds: tuple[str, ...]) -> list[str] | None:
    """What stays of a folded run with its ops of ``kinds`` taken out: still a run when its launch's own ops remain
    and are more than one (the norms of a RoPE run taken out with its RoPE ops are separate launches again), else
    None (every op a launch of its own)."""
    rest = [o for o, n in zip(run, nodes, strict=True) if n.kind not in kinds]
    return rest if len(rest) > 1 and nodes[run.index(rest[0])].kind == nodes[0].kind else None


def restructured(plan: DeploymentPlan, like: DeploymentPlan, stage: str = "decode") -> DeploymentPlan | None:
    """A copy of ``plan`` whose ``stage`` runs the merged runs of ``like`` (a plan of the same groups: the pass a
    packing alternative split, ``packing_alternatives``), each run ``plan`` lacks at a config of its first op that
    tiles the fused shape (``merged_config``: its own when legal, else the family default keeping its columns and
    rows); None when the structures are the same or a run has no such config."""
    if _structure(plan, stage) == _structure(like, stage):
        return None
    spec = plan.model_spec()
    new = copy.deepcopy(plan)
    for g, want in zip(new.stage(stage).groups(), like.stage(stage).groups(), strict=True):
        for run in (r for r in want.merged if r not in g.merged):
            try:
                config = merged_config(spec, g, run)
            except DesignError:
                return None
            next(c for c in g.calls if c.op == run[0]).config = config
        g.merged = [list(r) for r in want.merged]
    return apply_kv_cache(new)


def _structure(plan: DeploymentPlan, stage: str) -> tuple:
    """The merged runs of every group of ``stage``: two plans with the same structure fit the same."""
    return tuple(tuple(map(tuple, g.merged)) for g in plan.stage(stage).groups())


def normed_runs(spec: ModelSpec, group: KernelGroup) -> list[tuple[list[str] | None, list[str]]]:
    """(the merged run it extends or None, the new run) for every RMSNorm of ``group`` whose readers are all GEMV ops
    of a family with an RMSNorm prologue (``FOLD_FAMILIES``) in this group, one merged run of them or a single op:
    that run with the norm after its linear ops (``kernels.bind.FoldedLinear``), when ``plan.merge_problems``
    accepts it."""
    if group.where != "npu":
        return []
    graph = block_graph(spec)
    calls = {c.op: c for c in group.calls}
    out = []
    for c in group.calls:
        node = graph.node(c.op)
        if node.kind != "rmsnorm" or c.family != "rmsnorm" or any(c.op in m for m in group.merged):
            continue
        readers = list(graph.readers(node.output))
        if not readers or any(r not in calls or calls[r].family not in FOLD_FAMILIES for r in readers):
            continue
        old = next((m for m in group.merged if set(readers) <= set(m)), None)
        lins = [o for o in old if graph.node(o).kind in LINEAR_KINDS] if old else readers
        if set(lins) != set(readers) or (old is None and len(readers) > 1):
            continue  # several unmerged readers: multi-matrix-launches merges them first
        run = [*lins, c.op, *[o for o in old or () if o not in lins]]
        if not merge_problems(KernelGroup(group.name, group.calls, merged=[run]), graph, "plan"):
            out.append((old, run))
    return out


def residual_runs(spec: ModelSpec, group: KernelGroup) -> list[tuple[None, list[str]]]:
    """(None, ``[linear, add]``) for every residual add of ``group`` whose other operand is the output of an unmerged
    GEMV op of a family with a residual epilogue (``FOLD_FAMILIES``) in this group, when ``plan.merge_problems``
    accepts the pair as one launch (``kernels.bind.FoldedLinear``)."""
    if group.where != "npu":
        return []
    graph = block_graph(spec)
    calls = {c.op: c for c in group.calls}
    taken = {o for m in group.merged for o in m}
    out: list[tuple[None, list[str]]] = []
    for c in group.calls:
        node = graph.node(c.op)
        if node.kind != "add" or c.family != "eltwise" or c.op in taken:
            continue
        for v in node.inputs:
            if v in calls and v not in taken and calls[v].family in FOLD_FAMILIES and graph.node(v).kind == "linear":
                run = [v, c.op]
                if not merge_problems(KernelGroup(group.name, group.calls, merged=[run]), graph, "plan"):
                    out.append((None, run))
                break
    return out


def gated_runs(spec: ModelSpec, group: KernelGroup) -> list[tuple[list[str], list[str]]]:
    """(the merged run it extends, the new run) for every SwiGLU of ``group`` whose gate and up are the linear ops of
    one merged run of a GEMV family that folds (``FOLD_FAMILIES``): that run with the SwiGLU last
    (``kernels.bind.FoldedLinear``), when ``plan.merge_problems`` accepts it."""
    if group.where != "npu":
        return []
    graph = block_graph(spec)
    taken = {o for m in group.merged for o in m}
    out: list[tuple[list[str], list[str]]] = []
    for c in group.calls:
        node = graph.node(c.op)
        if node.kind != "swiglu" or c.family != "swiglu" or c.op in taken:
            continue
        old = next((m for m in group.merged if set(node.inputs) <= set(m)), None)
        if old is None or [o for o in old if graph.node(o).kind in LINEAR_KINDS] != list(node.inputs):
            continue
        run = [*old, c.op]
        if not merge_problems(KernelGroup(group.name, group.calls, merged=[run]), graph, "plan"):
            out.append((old, run))
    return out


def normed_rope_runs(spec: ModelSpec, group: KernelGroup) -> list[tuple[list[str] | None, list[str]]]:
    """(the merged RoPE run it extends or None, the new run) for every RoPE launch of ``group`` (one merged run of
    RoPE ops, or a single RoPE op) whose inputs are all outputs of per-head norms (Qwen3's q_norm, k_norm) run as
    rmsnorm in this group: the RoPE ops, then their norms (``kernels.bind.NormedRope``), then the KV-cache write the
    launch already folds (``kernels.bind.CachedRope``), when ``plan.merge_problems`` accepts it."""
    if group.where != "npu":
        return []
    graph = block_graph(spec)
    calls = {c.op: c for c in group.calls}
    producer = {graph.node(o).output: o for o in calls}
    taken = {o for m in group.merged for o in m}
    launches = [(m, m) for m in group.merged if graph.node(m[0]).kind == "rope"]
    launches += [(None, [c.op]) for c in group.calls if graph.node(c.op).kind == "rope" and c.op not in taken]
    out = []
    for old, launch in launches:
        if any(graph.node(o).kind == "head_norm" for o in launch):
            continue  # already holds its norms
        ropes = [o for o in launch if graph.node(o).kind == "rope"]
        writes = [o for o in launch if graph.node(o).kind == "kv_write"]  # a cache write folded in stays last
        norms = [producer.get(graph.node(o).inputs[0]) for o in ropes]
        if any(n is None or graph.node(n).kind != "head_norm" or n in taken for n in norms):
            continue
        run = [*ropes, *norms, *writes]
        if not merge_problems(KernelGroup(group.name, group.calls, merged=[run]), graph, "plan"):
            out.append((old, run))
    return out


def roped_runs(spec: ModelSpec, group: KernelGroup) -> list[tuple[list[list[str]], list[str]]]:
    """(the merged runs it replaces, the new run) for every RoPE launch of ``group`` (a merged run of RoPE ops, or one
    RoPE op) whose ops rotate the first outputs of one GEMV launch of this group (a merged or folded run of linear
    ops of a family that folds, ``FOLD_FAMILIES``, with no epilogue yet, or one such op), RoPE op j linear op j's:
    that GEMV launch with the RoPE ops as its epilogue (``kernels.bind.FoldedLinear``), when ``plan.merge_problems``
    accepts it. A RoPE launch holding per-head norms or a cache write is not one (its ops read the norms)."""
    if group.where != "npu":
        return []
    graph = block_graph(spec)
    calls = {c.op: c for c in group.calls}
    taken = {o for m in group.merged for o in m}
    launches = [m for m in group.merged if all(graph.node(o).kind == "rope" for o in m)]
    launches += [[c.op] for c in group.calls if graph.node(c.op).kind == "rope" and c.op not in taken]
    out: list[tuple[list[list[str]], list[str]]] = []
    for ropes in launches:
        rotated = [graph.node(o).inputs[0] for o in ropes]  # a value is named after the op that computes it
        if any(v not in calls or calls[v].family not in FOLD_FAMILIES for v in rotated):
            continue
        old = next((m for m in group.merged if rotated[0] in m), None)
        gemv = old or [rotated[0]]
        kinds = [graph.node(o).kind for o in gemv]
        lins = [o for o in gemv if graph.node(o).kind in LINEAR_KINDS]
        if any(k in EPILOGUE_KINDS or k == "rope" for k in kinds) or lins[: len(rotated)] != rotated:
            continue
        run = [*gemv, *ropes]
        if not merge_problems(KernelGroup(group.name, group.calls, merged=[run]), graph, "plan"):
            out.append(([r for r in (old, ropes) if r in group.merged], run))
    return out


def cached_rope_runs(spec: ModelSpec, group: KernelGroup) -> list[tuple[list[str] | None, list[str]]]:
    """(the RoPE run it extends or None, the new run) for every write of a quantized KV cache (``kvquant``) in
    ``group`` whose K rows come from a RoPE launch of this group (a merged or normed RoPE run with K's RoPE last, or
    K's RoPE alone): that launch with the write last (``kernels.bind.CachedRope``), when ``plan.merge_problems``
    accepts it."""
    if group.where != "npu":
        return []
    graph = block_graph(spec)
    taken = {o for m in group.merged for o in m}
    out: list[tuple[list[str] | None, list[str]]] = []
    for c in group.calls:
        node = graph.node(c.op)
        if node.kind != "kv_write" or c.family != "kvquant" or c.op in taken:
            continue
        k_rope = node.inputs[0]  # a value is named after the op that computes it
        if k_rope not in {c2.op for c2 in group.calls} or graph.node(k_rope).kind != "rope":
            continue
        old = next((m for m in group.merged if k_rope in m), None)
        run = [*(old or [k_rope]), c.op]
        if not merge_problems(KernelGroup(group.name, group.calls, merged=[run]), graph, "plan"):
            out.append((old, run))
    return out


def cached_rope_stage(plan: DeploymentPlan, stage: str = "decode", tuner: Tuner | None = None) -> DeploymentPlan | None:
    """A copy of ``plan`` whose ``stage`` runs every quantized KV-cache write it can inside the RoPE launch that
    rotates K (``cached_rope_runs``); None when none can."""
    return _folded_stage(plan, stage, cached_rope_runs, tuner)


def roped_stage(plan: DeploymentPlan, stage: str = "decode", tuner: Tuner | None = None) -> DeploymentPlan | None:
    """A copy of ``plan`` whose ``stage`` runs every RoPE launch it can as the epilogue of the GEMV launch whose outputs
    it rotates (``roped_runs``); None when none can."""
    return _folded_stage(plan, stage, roped_runs, tuner)


def normed_stage(plan: DeploymentPlan, stage: str = "decode", tuner: Tuner | None = None) -> DeploymentPlan | None:
    """A copy of ``plan`` whose ``stage`` runs every RMSNorm it can as the prologue of the GEMV launch that reads it
    (``normed_runs``); None when none can."""
    return _folded_stage(plan, stage, normed_runs, tuner)


def normed_rope_stage(plan: DeploymentPlan, stage: str = "decode", tuner: Tuner | None = None) -> DeploymentPlan | None:
    """A copy of ``plan`` whose ``stage`` runs every per-head norm it can inside the RoPE launch that reads it
    (``normed_rope_runs``); None when none can."""
    return _folded_stage(plan, stage, normed_rope_runs, tuner)


def residual_stage(plan: DeploymentPlan, stage: str = "decode", tuner: Tuner | None = None) -> DeploymentPlan | None:
    """A copy of ``plan`` whose ``stage`` runs every residual add it can as the epilogue of the GEMV launch whose
    output it adds (``residual_runs``); None when none can."""
    return _folded_stage(plan, stage, residual_runs, tuner)


def gated_stage(plan: DeploymentPlan, stage: str = "decode", tuner: Tuner | None = None) -> DeploymentPlan | None:
    """A copy of ``plan`` whose ``stage`` runs every SwiGLU it can as the epilogue of the gate/up GEMV launch whose
    outputs it gates (``gated_runs``); None when none can."""
    return _folded_stage(plan, stage, gated_runs, tuner)


def every_fold(plan: DeploymentPlan, stage: str = "decode", tuner: Tuner | None = None) -> DeploymentPlan | None:
    """A copy of ``plan`` with every merge and fold of ``stage`` made that its groups allow, in the decode skills'
    order (multi-matrix launches, then ``FOLDS``), or None when none is new. ``resident-decode`` fits it beside the
    pass as it is when it joined a pass the earlier skills saw as several dispatches: they fold within a group, so
    ops the paper's groups split (RoPE in one ELF, the cache write in the next) meet only in the joined pass."""
    out = plan
    for step in (merged_stage, *FOLDS):
        out = step(out, stage, tuner) or out
    return out if out is not plan else None


def _folded_stage(
    plan: DeploymentPlan, stage: str, runs_of: Callable[[ModelSpec, KernelGroup], list], tuner: Tuner | None
) -> DeploymentPlan | None:
    """``plan`` with the runs ``runs_of(spec, group)`` gives (each replacing the merged run it extends, if any, or the
    merged runs it joins, a list of them), each launch at a config its fused shape tiles (``merged_config``: the
    tuner's, or the launch's own config when legal, else the family default keeping its columns and rows); None when
    there is none."""
    spec = plan.model_spec()
    new = copy.deepcopy(plan)
    new.stage(stage).join()  # a one-dispatch pass saved before its groups were joined
    changed = False
    for g in new.stage(stage).groups():
        for old, run in runs_of(spec, g):
            try:
                config = merged_config(spec, g, run, tuner=tuner)
            except DesignError:
                continue
            next(c for c in g.calls if c.op == run[0]).config = config
            olds = old if old and isinstance(old[0], list) else [old] if old else []
            if olds:  # the run takes the first replaced run's place
                g.merged = [run if m == olds[0] else m for m in g.merged if m == olds[0] or m not in olds]
            else:
                g.merged = [*g.merged, run]
            changed = True
    return new if changed else None


# Merged runs of these kinds are packing choices worth refitting without: each holds several ops' rows on one tile.
# ("linear",) takes every multi-matrix GEMV launch apart, and with it every fold into a GEMV: with a one-dispatch
# pass joined into one group, gate and up of a paper plan that split its FFN merge, and the merged gate/up of
# Llama-3.2-3B at q4_0 packs into smaller, compute-bound tiles (22.48 tok/s resident; 24.28 with every multi-matrix
# launch split, modeled).
# ("kv_write",) takes a quantized cache's write out of its RoPE launch alone: the fused launch's fourth fifo needs two
# more locks on its tile, and Llama-3.2-1B at q4_0 with a q4_0 cache packs to the lock limit (with the write folded,
# the best fit moves attention to two stages: 87.01 tok/s; without it 88.85, before prefetch, modeled).
SPLITTABLE = (("rope",), ("bias",), ("rope", "bias"), ("kv_write",), FOLDED_KINDS, ("linear",))


def packing_alternatives(plan: DeploymentPlan, stage: str = "decode") -> list[tuple[DeploymentPlan, str]]:
    """``plan`` and, for each of ``SPLITTABLE`` it merges, a copy with those merged runs split again, each with a few
    words saying what was split ("" for the plan itself): a resident fit of each may pack differently, and the
    caller keeps the fastest. Qwen2.5-3B at q4_0 packed 5 % slower with Q's, K's and V's bias adds merged than
    before they merged (26.41 vs 27.74 tok/s, modeled), as Llama-3.2-3B's merged RoPE once did."""
    out: list[tuple[DeploymentPlan, str]] = [(plan, "")]
    seen: set[tuple] = set()
    words = {
        "rope": "Q's and K's RoPE",
        "bias": "Q's, K's and V's bias adds",
        "rmsnorm": "the RMSNorm prologues",
        "add": "the residual epilogues",
        "swiglu": "the SwiGLU epilogues",
        "head_norm": "the per-head norms in RoPE",
        "kv_write": "the KV-cache writes in RoPE",
        "linear": "the multi-matrix GEMVs and every fold into a GEMV",
    }
    for kinds in SPLITTABLE:
        alt = split_stage(plan, stage, kinds)
        if alt is None:
            continue
        key = _structure(alt, stage)
        if key in seen:
            continue
        seen.add(key)
        out.append((alt, " with " + " and ".join(words[k] for k in kinds) + " as separate launches"))
    # RoPE folds into its GEMV (rope-epilogue) before a quantized cache's write folds into RoPE (kv-write-into-rope),
    # so a pass that took the first never tried the second: with RoPE one launch again, the write may fold into it.
    # SmolLM2-135M's 3 KV heads leave its RoPE epilogue one column; without this its q4_0-cache row lost both folds
    # in the packing (346.95 -> 335.98 tok/s, modeled).
    graph = block_graph(plan.model_spec())
    runs = [[graph.node(o).kind for o in m] for g in plan.stage(stage).groups() for m in g.merged]
    if any("rope" in folded_kinds(kinds) for kinds in runs):
        apart = split_stage(plan, stage, ("rope",))
        cached = cached_rope_stage(apart, stage) if apart is not None else None
        if cached is not None and _structure(cached, stage) not in seen:
            out.append((cached, " with Q's and K's RoPE as one launch again and the KV-cache writes in it"))
    return out


def split_moves(plan: DeploymentPlan, stage: str = "decode") -> list[tuple[DeploymentPlan, str]]:
    """Every copy of ``plan`` one unit less merged, each with a few words saying what was undone: a folded op taken
    out of its GEMV launch (a RoPE launch's per-head norms together, as they fold together), or a whole merged run
    split into its launches. ``SPLITTABLE`` undoes a kind everywhere at once; a resident packing is a search over
    the array's L1, whose best structure a kind at a time can miss (Llama-3.2-3B at q4_0 packed fastest with Q/K/V
    merged, its norm, RoPE and gate/up separate, and the residual adds folded), so ``resident-decode`` also walks
    from its best fit one unit at a time (``plan.resident.search_structures``)."""
    graph = block_graph(plan.model_spec())
    out: list[tuple[DeploymentPlan, str]] = []
    structure = _structure(plan, stage)
    seen: set[tuple] = set()
    for gi, g in enumerate(plan.stage(stage).groups()):
        for mi, m in enumerate(g.merged):
            nodes = [graph.node(o) for o in m]
            folded = folded_kinds([n.kind for n in nodes])
            # (the runs that stay in its place, and what was undone)
            undo: list[tuple[list[list[str]], str]] = [([], f"{'+'.join(m)} as separate launches")]
            for kind in folded:
                out_ops = ", ".join(n.op for n in nodes if n.kind == kind)
                undo.append((_split_of(m, nodes, (kind,)), f"{out_ops} out of {m[0]}'s launch"))
            for keep, words in undo:
                runs = (*g.merged[:mi], *keep, *g.merged[mi + 1 :])
                key = (*structure[:gi], tuple(map(tuple, runs)), *structure[gi + 1 :])
                if key in seen:
                    continue
                seen.add(key)
                new = copy.deepcopy(plan)
                new.stage(stage).groups()[gi].merged = [list(r) for r in runs]
                out.append((apply_kv_cache(new), words))
    return out


# The folds into a launch, in the order the decode phase tries them (``skills.optimize.decode``: rmsnorm-prologue,
# residual-epilogue, swiglu-epilogue, qk-norm-into-rope, rope-epilogue, kv-write-into-rope), for anything that walks
# them as the phase does (``every_fold``, ``benchmarks/quantized.py``). RoPE folds into its GEMV before a cache write
# folds into RoPE: where both could, the RoPE launch goes (6.5 us per Llama-3.2-1B layer, modeled) rather than the
# write's (4.3 us), and a resident fit that packs better without it splits it out again (``SPLITTABLE``).
FOLDS = (normed_stage, residual_stage, gated_stage, normed_rope_stage, roped_stage, cached_rope_stage)
