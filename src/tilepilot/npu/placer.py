"""SequentialPlacer: IRON's default placement, so unplaced designs land where IRON would put them.

Workers without a tile take the next free compute tile in column-major order (column 0 rows 2..5, then
column 1, ...). Memory-tile links go to the memory tile of the column where their compute-side endpoint
sits, and DDR ends of fifos to the shim tile of the column of their on-array endpoint; if that tile has
no DMA channel left in the needed direction, the nearest column that has one is used (IRON's placer
also checks channel counts only). Anything that cannot be placed is left unplaced, and the validator
reports it (PLACEMENT_MISSING) or the overload (DMA_CHANNELS): the placer never hides a problem.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from tilepilot.npu.design import SHIM, Design, FifoLink, ObjectFifo, Tile
from tilepilot.npu.device import MEM_ROW, SHIM_ROW
from tilepilot.npu.resources import link_cost


class SequentialPlacer:
    """Places whatever a design leaves unplaced; explicit placements are kept as given."""

    def place(self, design: Design) -> Design:
        dev = design.device
        workers = list(design.workers)
        taken = {w.placement for w in workers if w.placement is not None}
        free = [t for t in dev.compute_tiles() if t not in taken]
        for i, w in enumerate(workers):
            if w.placement is None and free:
                workers[i] = replace(w, placement=free.pop(0))
        placed = replace(design, workers=workers)

        # memory tiles: channels in use per tile, then links in order
        mem_used: dict[Tile, list[int]] = defaultdict(lambda: [0, 0])
        for lk in placed.links:
            if lk.placement is not None:
                c = link_cost(placed, lk)
                mem_used[lk.placement][0] += c.s2mm
                mem_used[lk.placement][1] += c.mm2s
        links = list(placed.links)
        for i, lk in enumerate(links):
            if lk.placement is not None:
                continue
            c = link_cost(placed, lk)
            col = self._link_column(placed, lk)
            tile = self._nearest(dev.columns, col, MEM_ROW, mem_used, (c.s2mm, c.mm2s), dev.mem)
            mem_used[tile][0] += c.s2mm
            mem_used[tile][1] += c.mm2s
            links[i] = replace(lk, placement=tile)
            placed = replace(placed, links=links)
        placed = replace(placed, links=links)

        # shim tiles: one MM2S per filled fifo, one S2MM per drained fifo
        shim_used: dict[Tile, list[int]] = defaultdict(lambda: [0, 0])
        for f in placed.fifos:
            if f.shim_placement is not None:
                need = self._shim_need(placed, f)
                shim_used[f.shim_placement][0] += need[0]
                shim_used[f.shim_placement][1] += need[1]
        fifos = list(placed.fifos)
        for i, f in enumerate(fifos):
            need = self._shim_need(placed, f)
            if f.shim_placement is not None or need == (0, 0):
                continue
            col = self._fifo_column(placed, f)
            tile = self._nearest(dev.columns, col, SHIM_ROW, shim_used, need, dev.shim)
            shim_used[tile][0] += need[0]
            shim_used[tile][1] += need[1]
            fifos[i] = replace(f, shim_placement=tile)
        hosts = {f.name: f.shim_placement for f in fifos}
        for i, f in enumerate(fifos):
            if f.rides_with and f.shim_placement is None:  # on the shim tile of the channel it rides
                fifos[i] = replace(f, shim_placement=hosts.get(f.rides_with))
        return replace(placed, fifos=fifos)

    # --- helpers ----------------------------------------------------------------------------------------------------
    @staticmethod
    def _nearest(columns: int, col: int, row: int, used, need: tuple[int, int], res) -> Tile:
        """The tile of ``row`` nearest to column ``col`` with room for ``need`` (s2mm, mm2s); ``col`` if none has."""
        for c in sorted(range(columns), key=lambda c: (abs(c - col), c)):
            t = Tile(c, row)
            s2mm, mm2s = used[t]
            if s2mm + need[0] <= res.s2mm_channels and mm2s + need[1] <= res.mm2s_channels:
                return t
        return Tile(min(max(col, 0), columns - 1), row)

    @staticmethod
    def _shim_need(design: Design, f: ObjectFifo) -> tuple[int, int]:
        if f.rides_with:  # its transfers queue on another fifo's channel (ObjectFifo.rides_with)
            return (0, 0)
        return (int(SHIM in design.consumers(f.name)), int(SHIM in design.producers(f.name)))

    @staticmethod
    def _end_column(design: Design, fifo: str, ends) -> int | None:
        for end in ends:
            if end.kind == "shim":
                continue
            tile = design.endpoint_tile(end, fifo)
            if tile is not None:
                return tile.col
        return None

    def _link_column(self, design: Design, lk: FifoLink) -> int:
        """Column of the link's compute-side endpoints (consumers of a split/forward, producers of a join)."""
        if lk.kind == "join":
            cands = [(s, design.producers(s)) for s in lk.srcs]
        else:
            cands = [(d, design.consumers(d)) for d in lk.dsts]
        for fifo, ends in cands:
            col = self._end_column(design, fifo, ends)
            if col is not None:
                return col
        return 0

    def _fifo_column(self, design: Design, f: ObjectFifo) -> int:
        ends = [e for e in design.consumers(f.name) + design.producers(f.name) if e.kind != "shim"]
        col = self._end_column(design, f.name, ends)
        return 0 if col is None else col


def translate(design: Design, dcol: int, drow: int) -> Design:
    """A placed design moved ``dcol`` columns and its compute tiles ``drow`` rows (memory and shim tiles move with
    their column only). Its structure, and so its validity and modeled time, are unchanged by the move; the caller
    checks that the moved design stays on the device."""
    if dcol == 0 and drow == 0:
        return design

    def move(t: Tile | None, rows: int) -> Tile | None:
        return None if t is None else Tile(t.col + dcol, t.row + rows)

    return replace(
        design,
        workers=[replace(w, placement=move(w.placement, drow)) for w in design.workers],
        links=[replace(lk, placement=move(lk.placement, 0)) for lk in design.links],
        fifos=[replace(f, shim_placement=move(f.shim_placement, 0)) for f in design.fifos],
    )
