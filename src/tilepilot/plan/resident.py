"""Make a one-dispatch decode resident: configs whose designs fit the array together (``npu/resident.py``).

A resident pass holds every distinct design of a decode step at once. The configs a per-launch tuner picks each
fill a tile on their own (a quantized GEMV's weight chunks and decoded block, an attention launch's K/V tiles), so
together they overflow L1, locks and BDs. ``fit_resident`` repairs them with a greedy search: while the packing
(``npu.resident.pack``) breaks a budget on some tile, it takes the cheapest change (modeled time per token: launches
per token x the time it adds) among the candidate configs (``candidate_configs``) of the launches on that tile that
lowers the tile's overrun and that of every tile the change touches; launches of one family sharing a buffer
layout there change together; no config is revisited; when no change helps, a launch is spread over fewer tiles.
Deterministic: candidates in family order, ties broken by position. Every candidate design is validated on its own
before it is considered, and the result is packed again by whoever times it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

from tilepilot.errors import ConfigError, TilepilotError
from tilepilot.kernels.bind import MergedLaunch, binding, config_key, config_of_key, make_config, merged_launch
from tilepilot.kernels.registry import family
from tilepilot.model.graph import KV_FAMILY, OpNode, block_graph
from tilepilot.model.spec import ModelSpec
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.npu.design import Design, MultiLaunchGroup
from tilepilot.npu.device import Device, Tile, npu2
from tilepilot.npu.placer import SequentialPlacer
from tilepilot.npu.resident import Occupancy, Packing, pack, summary_of, tiles_of, touches
from tilepilot.npu.timing import time_design
from tilepilot.npu.validate import DesignError, tile_budgets, validate, validate_group
from tilepilot.parallel import fork_map
from tilepilot.plan.merge import restructured, split_moves
from tilepilot.plan.plan import DATA_FIELDS, DeploymentPlan, KernelCall

# Candidates of one family tried per launch (the family's own ranking; the tuner's bound, kernels/tuning.py).
MAX_CANDIDATES = 48
# Config replacements before the search gives up (each one lowers an overrun or the tiles a launch uses).
MAX_STEPS = 96


@dataclass(frozen=True)
class _Rules:
    """What a replacement config must respect: keys it keeps from the current config, and the caller's check."""

    keep: tuple[str, ...] = ()
    allowed: Callable[[str, dict[str, Any]], bool] | None = None

    def refuses(self, slot: _Slot, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` may not replace the slot's: it changes a key the rules keep, or a data field the slot's
        config sets (``DATA_FIELDS``: a launch's candidates may come from another launch of its family, whose data
        differ: a RoPE launch writing the KV cache beside one that does not), or the caller's check says no."""
        cur = slot.call.config
        if any(k in cur and config.get(k) != cur[k] for k in (*self.keep, *DATA_FIELDS)):
            return True
        return self.allowed is not None and not self.allowed(slot.call.op, config)


@dataclass
class _Slot:
    """One launch of the pass: the plan call whose config decides it, its shape for a config, its launches per
    token (a block op runs once per layer)."""

    call: KernelCall
    shape: Callable[[dict[str, Any]], Any]
    per_token: int


def _slots(plan: DeploymentPlan, spec: ModelSpec, context: int) -> list[_Slot]:
    graph = block_graph(spec)
    st = plan.decode
    out = []
    for groups, per_token in ((st.block, spec.n_layers), (st.head, 1)):
        for g in groups:
            merged = {m[0]: m for m in g.merged}
            served = {o for m in g.merged for o in m[1:]}
            for call in g.calls:
                node = graph.node(call.op)
                if (node.kind == "kv_write" and call.family == KV_FAMILY) or call.op in served:
                    continue  # a bf16 cache's write is the producers' drain, no launch (a quantized cache's is one)
                if call.op in merged:
                    shape = _merged_shape(merged_launch(tuple(graph.node(o) for o in merged[call.op])), call, spec)
                else:
                    ctx = st.kv_readback(context) if node.kind == "attention" else context
                    shape = _op_shape(node, call, spec, ctx)
                out.append(_Slot(call, shape, per_token))
    return out


@dataclass(frozen=True)
class _Built:
    """A legal candidate: its config, its placed designs, their modeled launch time, the compute and memory tiles
    they use."""

    config: dict[str, Any]
    designs: list[Design]
    seconds: float
    tiles: int
    _on_device: dict[tuple[int, int], bool] = field(default_factory=dict, compare=False, repr=False)

    def on_device(self, move: tuple[int, int]) -> bool:
        """Whether every design, moved by ``move``, stays on its device (remembered per move)."""
        if move not in self._on_device:
            self._on_device[move] = all(_on_device(d, move) for d in self.designs)
        return self._on_device[move]


def _merged_shape(ml: MergedLaunch, call: KernelCall, spec: ModelSpec) -> Callable[[dict[str, Any]], Any]:
    return lambda cfg: ml.shape(call.family, spec, 1, cfg)


def _op_shape(node: OpNode, call: KernelCall, spec: ModelSpec, ctx: int) -> Callable[[dict[str, Any]], Any]:
    b = binding(node, call.family)
    return lambda cfg: b.shape(node, spec, 1, ctx, cfg)


class _Designs:
    """Legal candidates by (family, shape, config), built once per process (``_build``): a deployment's phases and
    the air-q4 variants of ``calibrate`` fit the same launches again."""

    def __init__(self, device: Device):
        self.device = device

    def get(self, fam: str, shape: Any, config: dict[str, Any]) -> _Built | None:
        return _build(fam, shape, config_key(config), self.device)

    def of(self, slot: _Slot) -> _Built | None:
        """The slot's launch at its current config."""
        return self.get(slot.call.family, slot.shape(slot.call.config), slot.call.config)


@functools.lru_cache(maxsize=512)
def _candidates(fam: str, shape: Any, device: Device) -> tuple[Mapping[str, Any], ...]:
    """The family's first ``MAX_CANDIDATES`` candidate configs for a shape (its own ranking), each as a read-only
    mapping: the search reads them tens of thousands of times, and whoever keeps one copies it (``dict(cd)``)."""
    return tuple(MappingProxyType(asdict(c)) for c in family(fam).candidate_configs(shape, device)[:MAX_CANDIDATES])


@functools.lru_cache(maxsize=2048)
def _build(fam: str, shape: Any, config: tuple, device: Device) -> _Built | None:
    mod = family(fam)
    try:
        obj = mod.make_design(shape, make_config(mod, shape, config_of_key(config), device), device)
    except TilepilotError:
        return None
    problems = validate_group(obj) if isinstance(obj, MultiLaunchGroup) else validate(obj)
    if problems:
        return None
    placer = SequentialPlacer()
    designs = [placer.place(d) for d in (obj.designs if isinstance(obj, MultiLaunchGroup) else [obj])]
    return _Built(config_of_key(config), designs, sum(time_design(d).seconds for d in designs), _tiles_used(designs))


def _excess(tiles: set[Tile], occ: Occupancy, device: Device) -> float:
    """How far the designs held in ``occ`` overrun the budgets of ``tiles`` (0 = they fit): the sum of
    used / budget - 1 over the budgets they break."""
    total = 0.0
    for tile in tiles:
        u = occ.use_of(tile, detail=False)
        if device.kind(tile) == "off":
            return float("inf")
        total += sum(max(0.0, used / have - 1.0) for _, used, have in tile_budgets(device, tile, u) if have)
    return total


def _spread_less(
    here: list[int],
    slots: list[_Slot],
    current: list[_Built],
    built: _Designs,
    device: Device,
    keep: _Rules,
    seen: list[set[tuple]],
) -> tuple[float, float, int, int, list[tuple[int, dict[str, Any]]]] | None:
    """When no change frees the full tile, the cheapest candidate of a launch on it that uses fewer tiles, so the
    packing can move the launches around it (the tile count only falls, so the search ends)."""
    best = None
    for i in here:
        s, b = slots[i], current[i]
        for j, cd in enumerate(_candidates(s.call.family, s.shape(s.call.config), device)):
            if keep.refuses(s, cd):
                continue
            if tuple(sorted(cd.items())) in seen[i]:
                continue
            got = built.get(s.call.family, s.shape(cd), cd)
            if got is None or got.tiles >= b.tiles:
                continue
            cost = (got.seconds - b.seconds) * s.per_token
            if best is None or (cost, i, j) < (best[0], best[2], best[3]):
                best = (cost, 0.0, i, j, [(i, dict(cd))])
    return best


def _shared_layouts(tile: Tile, a: _Built, b: _Built, packing: Packing) -> bool:
    """Whether two launches claim a buffer of the same layout on ``tile`` (a core's stack aside)."""

    def keys(built: _Built) -> set[tuple]:
        out: set[tuple] = set()
        for d in built.designs:
            layouts, _ = summary_of(d, packing.moves[id(d)]).get(tile, ({}, None))
            out |= {key for key in layouts if key != ("stack",)}
        return out

    return bool(keys(a) & keys(b))


def _on_device(design: Design, move: tuple[int, int]) -> bool:
    return all(design.device.kind(t) != "off" for t in tiles_of(design, move))


def _tiles_used(designs: list[Design]) -> int:
    """Compute and memory tiles the designs use (what a launch spread less must lower)."""
    return len({t for d in designs for t in tiles_of(d) if d.device.kind(t) != "shim"})


def prefetch_if_faster(
    plan: DeploymentPlan, seconds: Callable[[DeploymentPlan], float], stage: str = "decode"
) -> DeploymentPlan:
    """``plan`` with its resident pass's GEMV weights fetched ahead (``StagePlan.prefetch``, ``npu/prefetch.py``) when
    ``seconds`` says that is faster, else as it is. Fits are compared as they will run: a packing that leaves memory
    tiles room for the prefetch regions can be slower without them and faster with them (Llama-3.2-1B q4_0, the RoPE
    epilogue folded: 11.028 ms per token packed with smaller o/down tiles and no room, 11.055 ms packed with room,
    10.890 ms with its prefetch, modeled)."""
    st = plan.stage(stage)
    return plan if not st.resident or st.prefetch else _timed_as_run(plan, seconds, stage)[0]


def _timed_as_run(
    plan: DeploymentPlan, seconds: Callable[[DeploymentPlan], float], stage: str
) -> tuple[DeploymentPlan, float]:
    """``prefetch_if_faster`` with the seconds of the plan it returns (each plan timed once)."""
    was = seconds(plan)
    st = plan.stage(stage)
    if not st.resident or st.prefetch:
        return plan, was
    new = copy.deepcopy(plan)
    new.stage(stage).prefetch = True
    now = seconds(new)
    return (new, now) if now < was else (plan, was)


def as_it_will_run(
    fit: DeploymentPlan,
    seconds: Callable[[DeploymentPlan], float],
    stage: str = "decode",
    like: DeploymentPlan | None = None,
    check: Callable[[DeploymentPlan], bool] | None = None,
) -> tuple[DeploymentPlan, bool]:
    """The faster of a resident fit and the same fit with the merged runs of ``like`` made again on its configs (the
    pass its packing alternative split, ``plan.merge.restructured``), each with its weights prefetched when that is
    faster (``prefetch_if_faster``), and whether it is the latter. A packing found with a run split out can leave
    room the run's own fit does not (Llama-3.2-1B q4_0 with a q4_0 cache: the RoPE epilogue's own fit packs o/down in
    128-value chunks and leaves no memory tile room for the prefetch, 90.68 tok/s; the fit with RoPE separate, its
    RoPE folded again, 91.83 with its prefetch, modeled). The remade pass is taken only when it packs (``seconds``
    raising ``DesignError`` leaves the fit) and ``check`` accepts it (a caller's checks the plan layer cannot make)."""
    remade = restructured(fit, like, stage) if like is not None else None
    if remade is None:
        return prefetch_if_faster(fit, seconds, stage), False
    best, best_s = _timed_as_run(fit, seconds, stage)
    try:
        remade, remade_s = _timed_as_run(remade, seconds, stage)
    except DesignError:
        return best, False
    if remade_s < best_s and (check is None or check(remade)):
        return remade, True
    return best, False


def fit_resident(
    plan: DeploymentPlan,
    spec: ModelSpec | None = None,
    *,
    context: int = 2048,
    device: Device | None = None,
    max_steps: int = MAX_STEPS,
    keep: tuple[str, ...] = (),
    allowed: Callable[[str, dict[str, Any]], bool] | None = None,
    starts: tuple[str, ...] | None = None,
    improve: bool = True,
    kicks: int | None = None,
) -> tuple[DeploymentPlan, list[str]]:
    """A copy of ``plan`` whose one-dispatch decode is resident, with the configs changed that had to be (one note
    per change); DesignError with the packing's violations when no such configs are found. ``context``: the KV
    readback the attention launches are packed at (their footprint does not grow with it). ``keep``: config keys a
    replacement must keep where the current config sets them (e.g. a plan that stands for a given weight feed).
    ``allowed(op, config)``: False refuses a replacement (a caller's check the plan layer cannot make, e.g. the
    group bindings of ``harness.probes.group_checks``). ``starts``: which of ``STARTS`` to search from (all).
    ``improve``: once a start's repair packs, try faster configs that still pack (``_improve``); off for a plan that
    stands for someone else's design, whose configs are repaired only as far as they must be. ``kicks``: how many
    configs of the launch with most to gain the kick step holds (``_kicks``; ``MAX_KICKS``, 0 = none; only with
    ``improve``)."""
    spec = spec or plan.model_spec()
    device = device or npu2()
    if not plan.decode.one_dispatch:
        raise DesignError([], f"plan {plan.name}: decode is not one dispatch; make it one (one-dispatch-decode) first")
    built = _Designs(device)
    rules = _Rules(keep, allowed)
    found: list[tuple[float, int, DeploymentPlan, list[str]]] = []
    failed: list[DesignError] = []
    unknown = sorted(set(starts or ()) - set(STARTS))
    if unknown:
        raise ConfigError(f"unknown resident search starts {unknown}; choose from {list(STARTS)}")
    repaired: set[tuple] = set()  # configs a start's repair reached: a later start reaching them finds the same
    for n, start in enumerate(starts or STARTS):
        new = copy.deepcopy(plan)
        new.decode.resident = True
        slots = _slots(new, spec, context)
        notes = _start(start, slots, built, device, rules)
        try:
            notes += _greedy(plan.name, slots, built, device, rules, max_steps)
        except DesignError as e:
            failed.append(e)
            continue
        state = tuple(tuple(sorted(s.call.config.items())) for s in slots)
        if state in repaired:
            continue  # the improvement from here is deterministic: an earlier start already has its result
        repaired.add(state)
        if improve:
            notes += _improve(slots, built, device, rules)
        seconds = _launch_seconds(slots, built)
        found.append((seconds, n, new, [f"search from {start}: {seconds * 1e3:.3f} ms/token of launches (modeled)"]
                      + notes))  # fmt: skip
    if not found:
        raise failed[0]
    kicks = MAX_KICKS if kicks is None else kicks
    if improve and kicks > 0:
        beat = min(f[0] for f in found)
        for _, n, got, said in list(found):
            found += _kicks(got, said, spec, context, built, device, rules, max_steps, len(STARTS) * (n + 1), kicks,
                            beat)  # fmt: skip
    _, _, new, notes = min(found, key=lambda f: (f[0], f[1]))
    return new, notes


# The kick step: launches tried at a faster config held while the rest is repaired (most time to gain first), and
# placement fields whose values make a candidate's footprint (the kick tries the fastest config of each footprint).
MAX_KICKS = 2
# A launch is kicked only when its fastest config would save at least this share of the pass's launch time: below
# it, the repairs it costs (seconds each) cannot pay for themselves.
KICK_MIN_SHARE = 0.01
FOOTPRINT_TRIES = 4
FOOTPRINT_FIELDS = ("cols", "rows", "tiles", "heads_per_col", "kv_stages", "kv_cols", "weight_channels", "kv_channels")


def _kicks(
    plan: DeploymentPlan,
    notes: list[str],
    spec: ModelSpec,
    context: int,
    built: _Designs,
    device: Device,
    rules: _Rules,
    max_steps: int,
    first: int,
    limit: int,
    beat: float,
) -> list[tuple[float, int, DeploymentPlan, list[str]]]:
    """From a start's packing (``plan``, ``notes``), the launch with the most modeled time per token to gain is put at
    the fastest config of each footprint that beats its own (``_footprints``, the ``limit`` fastest of them) and held
    there while the others are repaired around it and improved. Repair and improvement change one launch at a time
    where it sits, so a launch whose fast config needs room several others must give is never reached by them: an LM
    head runs once per token beside layer launches that run once per layer, so degrading the head is always the
    cheapest single repair. A config is held only if the time it gains would bring the pass below ``beat`` (the best
    pass found yet), so a kick is tried only where it could win. Each result's first note names its start, the launch
    held and its modeled launch time per token."""
    slots = _slots(plan, spec, context)
    gains = []
    for i, s in enumerate(slots):
        now, best = built.of(s), _fastest(s, built, device, rules)
        if now is not None and best is not None and best[0] < now.seconds:
            gains.append(((now.seconds - best[0]) * s.per_token, i))
    total = _launch_seconds(slots, built)
    if not gains or max(g for g, _ in gains) < KICK_MIN_SHARE * total:
        return []
    _, i = min(gains, key=lambda g: (-g[0], g[1]))
    now = built.of(slots[i])
    assert now is not None
    # the gain a held config brings must take the pass below ``beat``: its time per launch must be under this
    below = min(now.seconds, now.seconds - (total - beat) / slots[i].per_token)
    out = []
    for k, (held_s, cfg) in enumerate(_footprints(slots[i], built, device, rules, below)[:limit]):
        new = copy.deepcopy(plan)
        kicked = _slots(new, spec, context)
        op = kicked[i].call.op
        kicked[i].call.config = dict(cfg)
        held = _Rules(rules.keep, _holding(op, cfg, rules.allowed))
        gain = (now.seconds - held_s) * kicked[i].per_token
        said = [f"then {op}: held at {cfg} ({gain * 1e6:.2f} us/token to gain, modeled)"]
        try:
            said += _greedy(plan.name, kicked, built, device, held, max_steps)
        except DesignError:
            continue
        said += _improve(kicked, built, device, held)
        seconds = _launch_seconds(kicked, built)
        head = f"{notes[0].split(': ')[0]}, then {op} held at a faster config"
        out.append((seconds, first + k, new, [f"{head}: {seconds * 1e3:.3f} ms/token of launches (modeled)",
                                              *notes[1:], *said]))  # fmt: skip
    return out


def _footprints(
    s: _Slot, built: _Designs, device: Device, rules: _Rules, below: float
) -> list[tuple[float, dict[str, Any]]]:
    """The slot's fastest legal config of each footprint (``FOOTPRINT_FIELDS``) faster than ``below`` seconds,
    fastest first, from the family's first ``FOOTPRINT_TRIES`` candidates of each footprint (the search's own list
    keeps the family's first ``MAX_CANDIDATES``, which for a large launch may all share one footprint: the whole
    array; building every candidate of a full-size LM head would take longer than the whole search)."""
    best: dict[tuple, tuple[float, int, dict[str, Any]]] = {}
    tried: dict[tuple, int] = {}
    for j, cfg in enumerate(family(s.call.family).candidate_configs(s.shape(s.call.config), device)):
        cd = asdict(cfg)
        key = tuple(cd.get(f) for f in FOOTPRINT_FIELDS)
        if tried.get(key, 0) >= FOOTPRINT_TRIES or rules.refuses(s, cd):
            continue
        tried[key] = tried.get(key, 0) + 1
        got = built.get(s.call.family, s.shape(cd), cd)
        if got is None or got.seconds >= below:
            continue
        if key not in best or got.seconds < best[key][0]:
            best[key] = (got.seconds, j, cd)
    return [(sec, cd) for sec, _, cd in sorted(best.values(), key=lambda b: (b[0], b[1]))]


def _launch_seconds(slots: list[_Slot], built: _Designs) -> float:
    """The modeled launch time per token of the slots at their current configs (each legal: a repair reached it)."""
    total = 0.0
    for s in slots:
        got = built.of(s)
        assert got is not None
        total += got.seconds * s.per_token
    return total


def _holding(
    op: str, config: dict[str, Any], allowed: Callable[[str, dict[str, Any]], bool] | None
) -> Callable[[str, dict[str, Any]], bool]:
    """An ``allowed`` rule that keeps ``op`` at ``config`` and otherwise asks ``allowed``."""

    def rule(o: str, c: dict[str, Any]) -> bool:
        if o == op and c != config:
            return False
        return allowed is None or allowed(o, c)

    return rule


# Where the search starts: the plan's own configs; each launch's fastest legal candidate on its own (what a
# per-launch tuner would pick); one config for all launches of a family (the candidate of its slowest launch that
# costs the family least per token), so their buffers share one layout as AIR's one projection role does; that,
# with every other family on at most half the columns (its fastest such candidate), so the family that costs most
# keeps the whole array and the launches beside it get whole columns of their own (AIR's fused decode gives its
# projection role most cores and the small roles a few). Greedy repair is path-dependent (a change is judged where
# the launch sits, so it never finds room it would have to move to); the fastest legal result is kept.
STARTS = ("the plan's configs", "each launch's fastest config", "one config per family",
          "one config per family, the rest on half the columns")  # fmt: skip


def _start(start: str, slots: list[_Slot], built: _Designs, device: Device, keep: _Rules) -> list[str]:
    if start == STARTS[0]:
        return []
    if start == STARTS[2]:
        return _one_per_family(slots, built, device, keep)
    if start == STARTS[3]:
        return _one_per_family(slots, built, device, keep) + _rest_on_half(slots, built, device, keep)
    notes = []
    for s in slots:
        cur = built.of(s)
        best = _fastest(s, built, device, keep)
        if cur is not None and (best is None or cur.seconds <= best[0]):
            best = (cur.seconds, s.call.config)
        if best is not None and best[1] != s.call.config:
            notes.append(f"{s.call.op}: start at {best[1]}")
            s.call.config = dict(best[1])
    return notes


def _fastest(
    s: _Slot, built: _Designs, device: Device, keep: _Rules, accept: Callable[[_Built], bool] = lambda b: True
) -> tuple[float, dict[str, Any]] | None:
    """The slot's fastest legal candidate (modeled seconds, config) that the rules allow and ``accept`` takes; ties
    go to the family's own ranking."""
    best: tuple[float, dict[str, Any]] | None = None
    for cd in _candidates(s.call.family, s.shape(s.call.config), device):
        if keep.refuses(s, cd):
            continue
        got = built.get(s.call.family, s.shape(cd), cd)
        if got is not None and accept(got) and (best is None or got.seconds < best[0]):
            best = (got.seconds, dict(cd))
    return best


def _columns(built: _Built, device: Device) -> int:
    """Columns whose compute tiles a launch uses."""
    return len({t.col for d in built.designs for t in tiles_of(d) if device.kind(t) == "compute"})


def _rest_on_half(slots: list[_Slot], built: _Designs, device: Device, keep: _Rules) -> list[str]:
    """Every launch outside the family that costs most per token moved to its fastest candidate on at most half the
    columns (see ``STARTS``)."""
    cost: dict[str, float] = {}
    for s in slots:
        got = built.of(s)
        cost[s.call.family] = cost.get(s.call.family, 0.0) + (got.seconds * s.per_token if got else 0.0)
    if not cost:
        return []
    heaviest = max(cost, key=lambda f: (cost[f], f))
    notes = []
    for s in slots:
        if s.call.family == heaviest:
            continue
        now = built.of(s)
        if now is not None and _columns(now, device) <= device.columns // 2:
            continue
        best = _fastest(s, built, device, keep, lambda got: _columns(got, device) <= device.columns // 2)
        if best is not None:
            notes.append(f"{s.call.op}: start on half the columns at {best[1]}")
            s.call.config = dict(best[1])
    return notes


def _one_per_family(slots: list[_Slot], built: _Designs, device: Device, keep: _Rules) -> list[str]:
    notes = []
    families: dict[str, list[_Slot]] = {}
    for s in slots:
        families.setdefault(s.call.family, []).append(s)
    for fam, group in families.items():
        if len(group) < 2:
            continue
        now = [built.of(s) for s in group]
        if any(b is None for b in now):
            continue
        lead = max(zip(group, now, strict=True), key=lambda sb: sb[1].seconds * sb[0].per_token)[0]
        best: tuple[float, dict[str, Any]] | None = None
        for cd in _candidates(fam, lead.shape(lead.call.config), device):
            total = 0.0
            for s in group:
                if keep.refuses(s, cd):
                    break
                got = built.get(fam, s.shape(cd), cd)
                if got is None:
                    break
                total += got.seconds * s.per_token
            else:
                if best is None or total < best[0]:
                    best = (total, dict(cd))
        if best is not None:
            for s in group:
                s.call.config = dict(best[1])
            notes.append(f"every {fam} launch starts at {best[1]} ({best[0] * 1e3:.3f} ms/token modeled)")
    return notes


def _greedy(name: str, slots: list[_Slot], built: _Designs, device: Device, keep: _Rules, max_steps: int) -> list[str]:
    """Repair the slots' configs until their designs pack (the notes of each change); DesignError if they cannot."""
    notes: list[str] = []
    # configs each launch has had: never returned to, so the search cannot cycle
    seen: list[set[tuple]] = [{tuple(sorted(s.call.config.items()))} for s in slots]
    for _ in range(max_steps + 1):
        current = []
        for s in slots:
            got = built.of(s)
            if got is None:
                raise DesignError([], f"{s.call.op}: its {s.call.family} config {s.call.config} is not legal")
            current.append(got)
        packing = _pack(current)
        if not packing.problems:
            return notes
        tile = packing.problems[0].tile
        if tile is None:
            raise DesignError(list(packing.problems), f"plan {name}: resident decode")
        moves = packing.moves
        here = [i for i, b in enumerate(current) if any(touches(packing.placed[id(d)], tile) for d in b.designs)]
        full = Occupancy()
        for b in current:
            for d in b.designs:
                full.add(d, moves[id(d)])
        now_tile = _excess({tile}, full, device)
        # every candidate change with its modeled cost per token, cheapest first; the first that lowers the tile's
        # overrun (and the overrun of every tile it touches) is taken, so only a few are ever packed on trial
        options: list[tuple[float, int, int, list[tuple[int, _Built, tuple[int, int]]]]] = []
        for i in here:
            s = slots[i]
            # launches of the family that share a buffer layout with this one on the tile change with it: one alone
            # cannot free a buffer the others still claim
            peers = [k for k in here if k != i and slots[k].call.family == s.call.family
                     and _shared_layouts(tile, current[i], current[k], packing)]  # fmt: skip
            for j, cd in enumerate(_candidates(s.call.family, s.shape(s.call.config), device)):
                change = []
                for k in [i, *peers]:
                    sk = slots[k]
                    if keep.refuses(sk, cd):
                        continue
                    if tuple(sorted(cd.items())) in seen[k]:
                        continue
                    got = built.get(sk.call.family, sk.shape(cd), cd)
                    move = moves[id(current[k].designs[0])]
                    if got is not None and got.on_device(move):
                        change.append((k, got, move))
                if change and change[0][0] == i:
                    cost = sum((got.seconds - current[k].seconds) * slots[k].per_token for k, got, _ in change)
                    options.append((cost, i, j, change))
        options.sort(key=lambda o: (o[0], o[1], o[2]))
        best: tuple[float, float, int, int, list[tuple[int, dict[str, Any]]]] | None = None
        placed_all = [(k, d, moves[id(d)]) for k, b in enumerate(current) for d in b.designs]
        # the tile's own check reads only the designs on it (the others claim nothing there)
        on_tile = [(k, d, m) for k, d, m in placed_all if tile in summary_of(d, m)]
        for cost, i, j, change in options:
            changed = {k for k, _, _ in change}
            new = [(d, move) for _, got, move in change for d in got.designs]
            held = [(d, m) for k, d, m in on_tile if k not in changed]
            if _excess({tile}, Occupancy.of(held + new, {tile}), device) >= now_tile:
                continue
            entries = [(d, m) for k, d, m in placed_all if k not in changed] + new
            region = {tile}
            for k, got, move in change:
                region |= set().union(*(tiles_of(d, move) for d in got.designs))
                region |= set().union(*(tiles_of(d, moves[id(d)]) for d in current[k].designs))
            left = _excess(region, Occupancy.of(entries, region), device)
            if left >= _excess(region, full, device):
                continue
            best = (cost, left, i, j, [(k, dict(got.config)) for k, got, _ in change])
            break
        if best is None:
            best = _spread_less(here, slots, current, built, device, keep, seen)
        if best is None:
            raise DesignError(list(packing.problems), f"plan {name}: resident decode")
        cost, _, _, _, changes = best
        for k, cd in changes:
            sk = slots[k]
            seen[k].add(tuple(sorted(cd.items())))
            was = sk.call.config or "default"
            notes.append(f"{sk.call.op}: {sk.call.family} config {was} -> {cd}")
            sk.call.config = cd
        notes[-1] += f" ({cost * 1e3:+.3f} ms/token modeled for this step)"
    raise DesignError(list(packing.problems), f"plan {name}: resident decode (gave up after {max_steps} changes)")


# Packings tried by the improvement pass per start (each ~10 ms for a full-size model): a bound on its run time.
MAX_IMPROVE_TRIALS = 240


def _improve(slots: list[_Slot], built: _Designs, device: Device, keep: _Rules) -> list[str]:
    """Hill-climb a packing the repair reached. The repair judges a change where the launch sits and stops at the
    first packing, so it can stop short of one that is legal and faster (a launch that freed a tile early keeps a
    slow config after the tile that forced it has room again). Each sweep lists the slots' faster candidates, alone
    or with the launches of the family that share the slot's config (so a layout they share stays shared), most
    modeled time saved per token first, and takes each that still packs beside the changes already taken and
    lowers the pass's modeled time (the launches' time plus one configuration per packed tile, as
    ``npu.resident.time_resident`` counts it); sweeps repeat while one takes a change, up to
    ``MAX_IMPROVE_TRIALS`` packings."""
    notes: list[str] = []
    trials = 0
    current = [built.of(s) for s in slots]
    if any(b is None for b in current):
        return notes
    tiles = _pack(current).tiles(device)
    while trials < MAX_IMPROVE_TRIALS:
        options: dict[tuple, tuple[float, int, int, tuple[int, ...], dict[str, Any]]] = {}
        for i, s in enumerate(slots):
            twins = tuple(k for k, t in enumerate(slots) if t.call.family == s.call.family
                          and t.call.config == s.call.config)  # fmt: skip
            for j, cd in enumerate(_candidates(s.call.family, s.shape(s.call.config), device)):
                for group in sorted({(i,), twins}, key=len):
                    key = (group, tuple(sorted(cd.items())))
                    gain = 0.0 if key in options else _gain(group, cd, slots, current, built, keep)
                    if gain > 0:  # a group shared by several slots is listed once
                        options[key] = (-gain, i, j, group, cd)
        changed: set[int] = set()
        for neg, _, _, group, cd in sorted(options.values(), key=lambda o: (o[0], o[1], o[2], len(o[3]))):
            if trials >= MAX_IMPROVE_TRIALS:
                break
            if changed & set(group):
                continue  # judged against configs this sweep has replaced: the next sweep lists it again
            trials += 1
            trial = list(current)
            for k in group:
                trial[k] = built.get(slots[k].call.family, slots[k].shape(cd), cd)
            packing = _pack(trial)
            if packing.problems:
                continue
            more = packing.tiles(device) - tiles
            saved = -neg - more * CALIBRATION.tile_config_s
            if saved <= 0:
                continue  # faster launches on so many more tiles that configuring them costs more
            current, tiles = trial, tiles + more
            changed |= set(group)
            for k in group:
                notes.append(f"{slots[k].call.op}: {slots[k].call.family} config {slots[k].call.config} -> {dict(cd)}")
                slots[k].call.config = dict(cd)
            notes[-1] += f" (improvement: {-saved * 1e6:+.2f} us/token modeled)"
        if not changed:
            return notes
    return notes


def _pack(launches: list[_Built | None]) -> Packing:
    """The slots' launches packed as one resident decode pass (``npu.resident.pack``)."""
    return pack("decode", [d for b in launches if b is not None for d in b.designs])


def _gain(
    group: tuple[int, ...],
    cd: dict[str, Any],
    slots: list[_Slot],
    current: list[_Built | None],
    built: _Designs,
    keep: _Rules,
) -> float:
    """Modeled time per token saved by giving every slot of ``group`` config ``cd`` (0 when one refuses it)."""
    gain = 0.0
    for k in group:
        sk, bk = slots[k], current[k]
        got = None if keep.refuses(sk, cd) else built.get(sk.call.family, sk.shape(cd), cd)
        if got is None or bk is None:
            return 0.0
        gain += (bk.seconds - got.seconds) * sk.per_token
    return gain


# Weight-streaming families: a resident pass whose packing leaves one of these below the DDR rate is worth refitting
# with another structure (``squeezed``).
STREAMING_FAMILIES = ("gemv", "qgemv", "lm_head")
# Rounds of ``search_structures`` (each fits every one-unit move of the best structure so far).
STRUCTURE_ROUNDS = 3


def squeezed(plan: DeploymentPlan, spec: ModelSpec | None = None, *, device: Device | None = None) -> list[str]:
    """The weight-streaming launches of ``plan``'s decode that its configs leave below the DDR rate (bound by compute
    or a DMA channel) although the launch's fastest legal config alone streams at it, as ``op (bound)``: in a
    resident pass every launch shares the array's L1, and a stream the packing squeezed may pack better in another
    structure of merged runs and folds. A launch no config streams at the DDR rate (a bf16 LM head's compute-bound
    tiles) is not squeezed by anything a structure could give back, nor is one whose fastest config would save less
    than ``KICK_MIN_SHARE`` of the pass's launch time."""
    spec = spec or plan.model_spec()
    device = device or npu2()
    built = _Designs(device)

    def bounds(b: _Built) -> set[str]:
        return {time_design(d).bound for d in b.designs} - {"ddr"}

    slots = _slots(plan, spec, 2048)  # the context sizes attention only, which streams no weights
    if any(built.of(s) is None for s in slots):
        return []  # an illegal config: the fit repairs it before anything is squeezed
    total = _launch_seconds(slots, built)
    out = []
    for s in slots:
        got = built.of(s) if s.call.family in STREAMING_FAMILIES else None
        below = bounds(got) if got is not None else set()
        if not below:
            continue
        alone = _fastest(s, built, device, _Rules())
        # as for a kick: a stream with less than KICK_MIN_SHARE of the pass to gain cannot pay for the refits
        if alone is None or (got.seconds - alone[0]) * s.per_token < KICK_MIN_SHARE * total:
            continue
        if not bounds(built.get(s.call.family, s.shape(alone[1]), alone[1])):
            out.append(f"{s.call.op} ({'/'.join(sorted(below))})")
    return out


def search_structures(
    base: DeploymentPlan,
    seconds: float,
    fit: Callable[[DeploymentPlan], DeploymentPlan | None],
    timed: Callable[[DeploymentPlan], float],
    *,
    stage: str = "decode",
    rounds: int = STRUCTURE_ROUNDS,
    jobs: int | None = 1,
) -> list[tuple[DeploymentPlan, DeploymentPlan, float, str]]:
    """A walk over the structures of ``base`` (an unfitted pass whose resident fit takes ``seconds`` per token): each
    round fits every one-unit move of the best structure so far (``plan.merge.split_moves``: a fold taken out, a
    merged run split; ``fit(plan)`` -> the resident plan, or None when it does not pack; ``timed(fitted)`` -> its
    seconds per token) and moves to the fastest when it beats the best; it stops when none does or after ``rounds``.
    Returns every step taken as (structure, its resident fit, seconds, what was undone): ties go to the first move,
    so the walk is a function of the plan. A packing is a heuristic search over shared L1, so one unit can change
    the fit of launches far from it; the walk spends fits only where the caller found the best fit squeezed. A
    round's fits are independent: ``jobs`` worker processes fit them side by side (``parallel.fork_map``; None =
    the machine's default), which changes no result; the fits are timed here, in the caller's process."""
    steps = []
    for _ in range(rounds):
        moves = split_moves(base, stage)
        tried = []
        for (alt, words), got in zip(moves, fork_map(fit, [alt for alt, _ in moves], jobs), strict=True):
            if got is not None:
                tried.append((timed(got), alt, got, words))
        better = [t for t in tried if t[0] < seconds]
        if not better:
            break
        seconds, base, fitted, words = min(better, key=lambda t: t[0])
        steps.append((base, fitted, seconds, words))
    return steps
