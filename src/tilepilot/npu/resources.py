"""What a placed design asks of each tile (memory, DMA channels, buffer descriptors, locks).

Its own module because both the placer (choosing where links go) and the validator (checking the totals) need it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tilepilot.npu.design import Design, FifoLink, ObjectFifo, Tile

CORE_STACK_BYTES = 0x400  # mlir-aie aie.core default stack_size
LOCKS_PER_FIFO_END = 2  # AIE2 object fifo lowering: one producer + one consumer semaphore lock per fifo end


@dataclass
class TileUse:
    """What a design asks of one tile, with the contributions that make up the memory figure."""

    memory: int = 0
    s2mm: int = 0
    mm2s: int = 0
    bds: int = 0
    locks: int = 0
    parts: list[str] = field(default_factory=list)

    def add_memory(self, nbytes: int, what: str) -> None:
        self.memory += nbytes
        self.parts.append(f"{what} {nbytes} B")


def shares_memory(a: Tile | None, b: Tile | None) -> bool:
    """Two compute tiles whose cores reach each other's memory (AIE2: orthogonal neighbours)."""
    return a is not None and b is not None and abs(a.col - b.col) + abs(a.row - b.row) == 1


def uses_shared_memory(design: Design, fifo: ObjectFifo) -> bool:
    prods, cons = design.producers(fifo.name), design.consumers(fifo.name)
    if len(prods) != 1 or len(cons) != 1 or prods[0].kind != "worker" or cons[0].kind != "worker":
        return False
    return shares_memory(design.worker(prods[0].name).placement, design.worker(cons[0].name).placement)


def link_cost(design: Design, link: FifoLink) -> TileUse:
    """Memory-tile resources one link takes (see module docstring)."""
    use = TileUse()
    srcs = [design.fifo(f) for f in link.srcs]
    dsts = [design.fifo(f) for f in link.dsts]
    store = srcs[0] if link.kind in ("split", "forward") else dsts[0]
    use.add_memory(store.buffer_bytes, f"link {link.name} buffers ({store.depth} x {store.obj_bytes} B)")
    use.s2mm, use.mm2s = len(srcs), len(dsts)
    use.bds = sum(f.depth for f in srcs + dsts)
    use.locks = LOCKS_PER_FIFO_END * (len(srcs) + len(dsts))
    return use


def resource_use(design: Design) -> dict[Tile, TileUse]:
    """Per-tile resource demand of a placed design (unplaced endpoints are skipped)."""
    use: dict[Tile, TileUse] = defaultdict(TileUse)
    for w in design.workers:
        if w.placement is None:
            continue
        u = use[w.placement]
        u.add_memory(CORE_STACK_BYTES, "stack")
        if w.local_bytes:
            u.add_memory(w.local_bytes, f"{w.name} locals")
    for f in design.fifos:
        if uses_shared_memory(design, f):
            tile = design.worker(design.producers(f.name)[0].name).placement
            use[tile].add_memory(f.buffer_bytes, f"fifo {f.name} (shared, {f.depth} x {f.obj_bytes} B)")
            use[tile].locks += LOCKS_PER_FIFO_END
            continue
        # a producer end sends on an MM2S channel, a consumer end receives on an S2MM one; a worker end also holds
        # the fifo's buffers, its BDs and its locks in its own tile (link ends are counted by link_cost below)
        sides = ((design.producers(f.name), "out", "mm2s"), (design.consumers(f.name), "in", "s2mm"))
        for ends, side, channel in sides:
            for end in ends:
                tile = design.endpoint_tile(end, f.name)
                if tile is None or end.kind not in ("worker", "shim"):
                    continue
                u = use[tile]
                setattr(u, channel, getattr(u, channel) + 1)
                if end.kind == "worker":
                    u.add_memory(f.buffer_bytes, f"fifo {f.name} {side} ({f.depth} x {f.obj_bytes} B)")
                    u.bds += f.depth
                    u.locks += LOCKS_PER_FIFO_END
    for lk in design.links:
        if lk.placement is None:
            continue
        c = link_cost(design, lk)
        u = use[lk.placement]
        for p in c.parts:
            u.parts.append(p)
        u.memory += c.memory
        u.s2mm += c.s2mm
        u.mm2s += c.mm2s
        u.bds += c.bds
        u.locks += c.locks
    for group in design.runtime.groups():
        per_shim: dict[Tile, int] = defaultdict(int)
        for t in group:
            tile = design.fifo(t.fifo).shim_placement
            if tile is not None:
                per_shim[tile] += 1
        for tile, n in per_shim.items():
            use[tile].bds = max(use[tile].bds, n)
    return dict(use)
