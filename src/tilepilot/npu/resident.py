"""A resident pass: every launch of a dispatch configured into the array once, as AIR's fused decode is built.

AIR's fused decode (Xilinx/mlir-air ``programming_examples/fused_decode``) is *one* AIR module: 16 layers and the
LM head in one xclbin, the same core roles (``proj_qmm``, ``rms_residual``, ``rope``, ``glu``, ``attn_qk`` /
``attn_kv``) serving every layer, per-token words patched on the host. Nothing is reconfigured between its
operations: a core finishes one and its locks release the next. A multi-launch group (``npu/timing.py``
``time_group``) is the other thing AIR and IRON do: designs loaded one after another, each further launch paying
a design switch (``Calibration.launch_in_group_s``).

Legality (a MODEL of how such a module is allocated; conservative where unsure): every distinct design of the
pass holds its resources at the same time, on the tiles it is placed on, except that launches which run one after
another share a claim of the same *layout* (``npu/resources.py`` ``resource_claims``: a fifo end of the same side,
object size and depth; a link of the same kind and objects; a core's stack and its locals, whose lifetimes end
with the launch): one buffer set per layout and tile, as many as the one launch that needs most of them. So a
projection kernel reused for Q/K/V, O, gate/up and down with one tiling costs its buffers once, as AIR's
``proj_qmm`` role does, while launches of different layouts add up. DMA channels are the most any one launch uses
(a channel's BD chain serves each launch's buffers in turn); shim BDs are re-written by the runtime sequence per
task group, so they too are the most any launch uses. Budgets are the device's per-tile ones (the validator's).

Not modeled: program memory (each core's program holds every role it runs), and whether the compiler could
overlay buffers of different layouts (it is not assumed).

Timing (``time_resident``): one host round trip, each tile of the union configured once, then the launches' own
modeled times in order (each with its pipeline fill and drain); no design switch between them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from tilepilot.errors import InputError
from tilepilot.npu.calibration import CALIBRATION, Calibration
from tilepilot.npu.design import Design
from tilepilot.npu.device import Device, Tile
from tilepilot.npu.placer import SequentialPlacer, translate
from tilepilot.npu.prefetch import Prefetched, regions_free, regions_use
from tilepilot.npu.prefetch import prefetch as weight_prefetch
from tilepilot.npu.resources import TileUse, add_use, resource_claims
from tilepilot.npu.timing import GroupTiming, time_design
from tilepilot.npu.validate import DesignError, Violation, budget_problems, within_budgets


def distinct(designs: Sequence[Design]) -> list[Design]:
    """The pass's designs once each (a layer's launches repeat in every layer), in first-use order."""
    seen: dict[int, Design] = {}
    for d in designs:
        seen.setdefault(id(d), d)
    return list(seen.values())


Claims = dict[Tile, list[tuple[tuple, TileUse]]]


# per tile: layout -> (the most claims of it one launch makes, the largest claim), and the DMA channels one launch uses
Summary = dict[Tile, tuple[dict[tuple, tuple[int, TileUse]], tuple[int, int]]]


def _wider(a: TileUse, b: TileUse) -> TileUse:
    """The larger of two claims of one layout (memory, then BDs, then locks): the buffer set both can use."""
    return a if (a.memory, a.bds, a.locks) > (b.memory, b.bds, b.locks) else b


# the layout key of a shim tile's task-group BDs (``summarize``): counted as the busiest group, not per launch
_SHIM_BDS = ("shim_bds",)


def _held_together(was: tuple[int, TileUse] | None, new: tuple[int, TileUse]) -> tuple[int, TileUse]:
    """One layout's claim when two launch sets that claim it are held together: the most claims either makes in
    one launch, each the wider buffer set (launches of a resident pass run one after another, so they share)."""
    return new if was is None else (max(was[0], new[0]), _wider(new[1], was[1]))


def _sums(layouts: dict[tuple, tuple[int, TileUse]]) -> tuple[int, int, int, int]:
    """(memory, BDs, locks, shim BDs) a tile's layouts add up to (the shim's task-group BDs are their own count)."""
    memory = bds = locks = shim = 0
    for key, (n, part) in layouts.items():
        if key == _SHIM_BDS:
            shim = part.bds
            continue
        memory, bds, locks = memory + n * part.memory, bds + n * part.bds, locks + n * part.locks
    return memory, bds, locks, shim


class Occupancy:
    """What designs held together claim, per tile: layout -> (the most claims of it in one launch, the largest
    claim), and the (S2MM, MM2S) channels of the busiest launch. Built in place; ``only`` copies the tiles a trial
    is about to change."""

    def __init__(self) -> None:
        self.layouts: dict[Tile, dict[tuple, tuple[int, TileUse]]] = {}
        self.channels: dict[Tile, tuple[int, int]] = {}
        self._totals: dict[Tile, tuple[int, int, int, int]] = {}

    def merge(self, summary: Summary, tiles: set[Tile] | None = None) -> None:
        if tiles is None:
            items = summary.items()
        elif len(tiles) < len(summary):  # a trial's few tiles: looked up, not every tile of the design scanned
            items = ((t, summary[t]) for t in tiles if t in summary)
        else:
            items = ((t, v) for t, v in summary.items() if t in tiles)
        for tile, (layouts, (s2mm, mm2s)) in items:
            have = self.layouts.setdefault(tile, {})
            self._totals.pop(tile, None)
            for key, claim in layouts.items():
                have[key] = _held_together(have.get(key), claim)
            c = self.channels.get(tile, (0, 0))
            self.channels[tile] = (max(c[0], s2mm), max(c[1], mm2s))

    @classmethod
    def of(cls, entries: Iterable[tuple[Design, tuple[int, int]]], tiles: set[Tile] | None = None) -> Occupancy:
        """What the placed designs, each moved by its move, claim together (only on ``tiles``, if given)."""
        occ = cls()
        for design, move in entries:
            occ.add(design, move, tiles)
        return occ

    def add(self, design: Design, move: tuple[int, int] = (0, 0), tiles: set[Tile] | None = None) -> None:
        """Add a placed design moved by ``move`` (only its claims on ``tiles``, if given)."""
        self.merge(summary_of(design, move), tiles)

    def only(self, tiles: set[Tile]) -> Occupancy:
        """A copy holding ``tiles`` only (what the caller is about to change)."""
        out = Occupancy()
        out.layouts = {t: dict(self.layouts[t]) for t in tiles if t in self.layouts}
        out.channels = {t: self.channels[t] for t in tiles if t in self.channels}
        return out

    def use_of(self, tile: Tile, detail: bool = True) -> TileUse:
        """The tile's demand; ``detail=False`` without the memory contributions (numbers only, for a trial)."""
        s2mm, mm2s = self.channels.get(tile, (0, 0))
        if not detail:
            memory, bds, locks, shim = self._totals_of(tile)
            return TileUse(memory=memory, s2mm=s2mm, mm2s=mm2s, bds=bds + shim, locks=locks)
        total = TileUse()
        for key, (n, part) in self.layouts.get(tile, {}).items():
            if key == _SHIM_BDS:  # the busiest task group's BDs, however many launches held them (a shim has no others)
                total.bds += part.bds
                continue
            add_use(total, part, n)
        total.s2mm, total.mm2s = s2mm, mm2s
        return total

    def use(self, tiles: Iterable[Tile] | None = None, detail: bool = True) -> dict[Tile, TileUse]:
        return {t: self.use_of(t, detail) for t in (self.layouts if tiles is None else tiles)}

    def use_with(self, summary: Summary) -> dict[Tile, TileUse]:
        """The demand of ``summary``'s tiles were it merged in (numbers only; nothing is changed or copied): what a
        packing trial asks of every move it tries. Each tile's held totals are kept (``_totals``), so a trial adds
        only what its own layouts change."""
        return dict(self._uses_with(summary))

    def fits_with(self, summary: Summary, device: Device) -> bool:
        """Whether every tile of ``summary`` keeps its budgets were it merged in: ``use_with`` judged tile by tile,
        stopping at the first tile over (most moves a packing tries do not fit)."""
        return all(within_budgets(device, {tile: use}) for tile, use in self._uses_with(summary))

    def _uses_with(self, summary: Summary) -> Iterator[tuple[Tile, TileUse]]:
        for tile, (layouts, (s2mm, mm2s)) in summary.items():
            have = self.layouts.get(tile, {})
            memory, bds, locks, shim = self._totals_of(tile)
            for key, new in layouts.items():
                was = have.get(key)
                n, part = _held_together(was, new)
                if key == _SHIM_BDS:
                    shim = part.bds  # one such claim per shim tile
                    continue
                memory, bds, locks = memory + n * part.memory, bds + n * part.bds, locks + n * part.locks
                if was is not None:
                    m, p = was
                    memory, bds, locks = memory - m * p.memory, bds - m * p.bds, locks - m * p.locks
            c = self.channels.get(tile, (0, 0))
            yield tile, TileUse(memory=memory, s2mm=max(c[0], s2mm), mm2s=max(c[1], mm2s), bds=bds + shim, locks=locks)

    def _totals_of(self, tile: Tile) -> tuple[int, int, int, int]:
        """(memory, BDs, locks, shim BDs) the tile holds now: ``use_of``'s numbers, remembered until a merge."""
        got = self._totals.get(tile)
        if got is None:
            got = self._totals[tile] = _sums(self.layouts.get(tile, {}))
        return got


def summarize(claims: Claims) -> Summary:
    """A design's claims reduced to what the sharing rule reads (see ``Occupancy``)."""
    out: Summary = {}
    for tile, items in claims.items():
        layouts: dict[tuple, tuple[int, TileUse]] = {}
        s2mm = mm2s = 0
        for key, part in items:
            s2mm, mm2s = s2mm + part.s2mm, mm2s + part.mm2s
            was = layouts.get(key)
            if was is None:
                layouts[key] = (1, part)
            else:
                layouts[key] = (was[0] + 1, _wider(part, was[1]))
        out[tile] = (layouts, (s2mm, mm2s))
    return out


@dataclass(frozen=True)
class Packing:
    """Where each distinct design of a resident pass sits (``placed``: id of the design as given -> the design
    moved there), the per-tile demand of all of them together, and the budgets it breaks (empty = legal)."""

    placed: dict[int, Design]
    use: dict[Tile, TileUse]
    problems: tuple[Violation, ...]
    moves: dict[int, tuple[int, int]] = field(default_factory=dict)  # id of the design as given -> (columns, rows)

    def designs(self, designs: Sequence[Design]) -> list[Design]:
        """The pass's launches in order, each as packed."""
        return [self.placed[id(d)] for d in designs]

    def tiles(self, device: Device) -> int:
        """Tiles the pass configures: every compute and memory tile any of its designs uses, once."""
        return sum(1 for tile in self.use if device.kind(tile) != "shim")


def _shift(claims: dict, dc: int, dr: int, device: Device) -> dict:
    """Claims of the design moved ``dc`` columns and its compute tiles ``dr`` rows (``npu.placer.translate``)."""
    if dc == 0 and dr == 0:
        return claims
    return {Tile(t.col + dc, t.row + (dr if device.kind(t) == "compute" else 0)): items for t, items in claims.items()}


def _moves(design: Design) -> list[tuple[int, int]]:
    """The column and row moves that keep ``design`` on its device, nearest first."""
    dev = design.device
    tiles = [w.placement for w in design.workers if w.placement is not None]
    tiles += [lk.placement for lk in design.links if lk.placement is not None]
    tiles += [f.shim_placement for f in design.fifos if f.shim_placement is not None]
    if not tiles:
        return [(0, 0)]
    cols = dev.columns - 1 - max(t.col for t in tiles)
    rows = [w.placement.row for w in design.workers if w.placement is not None]
    drows = dev.rows - 1 - max(rows) if rows else 0
    moves = [(dc, dr) for dc in range(-min(t.col for t in tiles), cols + 1) for dr in range(drows + 1)]
    return sorted(moves, key=lambda m: (abs(m[0]) + m[1], m[1], abs(m[0]), m[0]))


def pack(name: str, designs: Sequence[Design]) -> Packing:
    """Pack the distinct designs of a resident pass onto one array, deterministically: the designs with the most
    workers first, each at the nearest move of its own placement (``npu.placer.translate``: whole columns, compute
    rows) where everything packed so far and it fit the tile budgets together; a design that fits nowhere stays
    where its placer put it and the pass's problems say which budgets break.

    A packing is a function of its designs alone, so it is remembered (by the identity of the designs, which are
    held, for the last ``_PACKS_KEPT`` sets): a deployment's resident search, its re-fits and every timing of the
    resident plan ask for the same sets again. The returned ``placed`` and ``use`` are shared: read them only."""
    if not designs:
        raise InputError(f"Resident pass {name!r} holds no launches; give it at least one design.")
    ds = distinct(designs)
    key = tuple(id(d) for d in ds)
    hit = _PACKS.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], ds, strict=True)):
        _PACKS.move_to_end(key)
    else:
        hit = (ds, *_pack_distinct(ds))
        _PACKS[key] = hit
        while len(_PACKS) > _PACKS_KEPT:
            _PACKS.popitem(last=False)
    _, placed, use, problems, moves = hit
    named = tuple(Violation(v.code, v.tile, f"resident pass {name}: {v.message}") for v in problems)
    return Packing(placed, use, named, moves)


_PACKS: OrderedDict[tuple[int, ...], tuple] = OrderedDict()
_PACKS_KEPT = 512


def _pack_distinct(
    ds: list[Design],
) -> tuple[dict[int, Design], dict[Tile, TileUse], list[Violation], dict[int, tuple[int, int]]]:
    """``pack`` of distinct designs: where each goes, the demand of all, the budgets it breaks, the moves."""
    placer = SequentialPlacer()
    device = ds[0].device
    order = sorted(range(len(ds)), key=lambda i: (-len(ds[i].workers), i))
    occ = Occupancy()
    placed: dict[int, Design] = {}
    moves: dict[int, tuple[int, int]] = {}
    for i in order:
        d = ds[i] if ds[i].is_placed() else placer.place(ds[i])
        move = (0, 0)
        for m in _moves(d):
            if occ.fits_with(summary_of(d, m), device):
                move = m
                break
        occ.add(d, move)
        placed[id(ds[i])], moves[id(ds[i])] = translate(d, *move), move
    use = occ.use()
    return placed, use, budget_problems(device, use), moves


def tiles_of(design: Design, move: tuple[int, int] = (0, 0)) -> set[Tile]:
    """The tiles a placed design claims once moved."""
    return set(summary_of(design, move))


_SUMMARIES: OrderedDict[int, tuple[Design, Claims, Summary, dict]] = OrderedDict()


def _entry(design: Design) -> tuple[Design, Claims, Summary, dict]:
    """``resource_claims`` of a placed design, its summary and its moved summaries, remembered (by identity, the
    design held) for the last few thousand designs: a packing search asks about the same designs at every step."""
    hit = _SUMMARIES.get(id(design))
    if hit is not None and hit[0] is design:
        _SUMMARIES.move_to_end(id(design))
        return hit
    claims = resource_claims(design)
    entry = (design, claims, summarize(claims), {})
    _SUMMARIES[id(design)] = entry
    while len(_SUMMARIES) > 4096:
        _SUMMARIES.popitem(last=False)
    return entry


def summary_of(design: Design, move: tuple[int, int] = (0, 0)) -> Summary:
    """The design's summary with its tiles moved (``npu.placer.translate``; remembered per move)."""
    _, _, summary, moved = _entry(design)
    if move not in moved:
        moved[move] = _shift(summary, *move, design.device)
    return moved[move]


def touches(design: Design, tile: Tile) -> bool:
    """Whether a placed design uses ``tile`` (a worker, a link or a shim end on it)."""
    return (
        any(w.placement == tile for w in design.workers)
        or any(lk.placement == tile for lk in design.links)
        or any(f.shim_placement == tile for f in design.fifos)
    )


def time_resident(
    name: str, designs: Sequence[Design], cal: Calibration = CALIBRATION, *, prefetch: bool = False
) -> GroupTiming:
    """One dispatch holding every launch of a resident pass: host round trip + each tile configured once + the
    launches in order (modeled). No design switch: nothing is reconfigured between them. Raises ``DesignError``
    when the designs cannot be packed into one array (legal or nothing). ``prefetch``: the launches' weights run
    ahead into memory-tile regions the packing leaves free (``npu/prefetch.py``)."""
    packing = pack(name, designs)
    if packing.problems:
        raise DesignError(list(packing.problems), f"resident pass {name}")
    placed = packing.designs(designs)
    timings = tuple(time_design(d, cal) for d in placed)
    fetched: tuple[Prefetched, ...] = ()
    if prefetch:
        retimed, done, heads = weight_prefetch(placed, timings, regions_free(placed, packing.use), cal)
        problems = budget_problems(designs[0].device, regions_use(placed, packing.use, heads))
        if problems:  # by construction never: a timed pass is a legal one
            raise DesignError(problems, f"resident pass {name} with its weight prefetch regions")
        timings, fetched = tuple(retimed), tuple(done)
    configure = packing.tiles(designs[0].device) * cal.tile_config_s
    seconds = cal.dispatch_overhead_s + configure + sum(t.seconds for t in timings)
    return GroupTiming(name, seconds, cal.dispatch_overhead_s, configure, timings, prefetched=fetched)
