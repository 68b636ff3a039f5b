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


def shared_buffer_tile(producer: Tile, consumer: Tile) -> Tile:
    """Where a shared-memory fifo's buffers live: a tile whose memory both cores reach (a core reaches its own, the
    west, north and south memories). The producer's, unless the consumer sits west of it and so cannot reach east;
    then the consumer's own, which the producer reaches as its west neighbour's."""
    return consumer if consumer.row == producer.row and consumer.col == producer.col - 1 else producer


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


def resource_claims(design: Design) -> dict[Tile, list[tuple[tuple, TileUse]]]:
    """Per tile, what each part of a placed design claims, keyed by the part's *layout* (what it holds, not its
    name): a core's stack, its locals, a fifo end's buffers (side, object bytes, depth; or side, role, depth for a
    fifo with a ``role``), a link's storage, the shim BDs of a task group. ``resource_use`` sums the claims; a
    resident pass (``npu/resident.py``) lets launches that run one after another share a claim of the same layout
    (unplaced endpoints are skipped)."""
    claims: dict[Tile, list[tuple[tuple, TileUse]]] = defaultdict(list)

    def claim(tile: Tile, key: tuple, **kw: int) -> TileUse:
        u = TileUse(**{k: v for k, v in kw.items() if k != "memory"})
        claims[tile].append((key, u))
        return u

    for w in design.workers:
        if w.placement is None:
            continue
        claim(w.placement, ("stack",)).add_memory(CORE_STACK_BYTES, "stack")
        if w.local_bytes:
            claim(w.placement, ("locals",)).add_memory(w.local_bytes, f"{w.name} locals")
    for f in design.fifos:
        if uses_shared_memory(design, f):
            prod = design.worker(design.producers(f.name)[0].name).placement
            tile = shared_buffer_tile(prod, design.worker(design.consumers(f.name)[0].name).placement)
            u = claim(tile, ("shared", f.obj_bytes, f.depth), locks=LOCKS_PER_FIFO_END)
            u.add_memory(f.buffer_bytes, f"fifo {f.name} (shared, {f.depth} x {f.obj_bytes} B)")
            continue
        # a producer end sends on an MM2S channel, a consumer end receives on an S2MM one; a worker end also holds
        # the fifo's buffers, its BDs and its locks in its own tile (link ends are counted by link_cost below)
        sides = ((design.producers(f.name), "out", "mm2s"), (design.consumers(f.name), "in", "s2mm"))
        for ends, side, channel in sides:
            for end in ends:
                tile = design.endpoint_tile(end, f.name)
                if tile is None or end.kind not in ("worker", "shim"):
                    continue
                if end.kind == "shim":
                    claim(tile, ("shim", side, f.name), **{channel: 0 if f.rides_with else 1})
                    continue
                if f.role:  # buffers and locks shared by the role; a descriptor per transfer size (ObjectFifo.role)
                    u = claim(tile, ("role", side, f.role, f.depth), locks=LOCKS_PER_FIFO_END)
                    claim(tile, ("role bds", side, f.role, f.depth, f.obj_bytes), bds=f.depth)
                else:
                    u = claim(tile, ("fifo", side, f.obj_bytes, f.depth), bds=f.depth, locks=LOCKS_PER_FIFO_END)
                setattr(u, channel, 1)
                u.add_memory(f.buffer_bytes, f"fifo {f.name} {side} ({f.depth} x {f.obj_bytes} B)")
    for lk in design.links:
        if lk.placement is None:
            continue
        c = link_cost(design, lk)
        srcs = tuple((design.fifo(f).obj_bytes, design.fifo(f).depth) for f in lk.srcs)
        dsts = tuple((design.fifo(f).obj_bytes, design.fifo(f).depth) for f in lk.dsts)
        claims[lk.placement].append((("link", lk.kind, srcs, dsts), c))
    shim_bds: dict[Tile, int] = defaultdict(int)  # the most tasks one task group runs on each shim at once
    for group in design.runtime.groups():
        per_shim: dict[Tile, int] = defaultdict(int)
        for t in group:
            tile = design.fifo(t.fifo).shim_placement
            if tile is not None:
                per_shim[tile] += 1
        for tile, n in per_shim.items():
            shim_bds[tile] = max(shim_bds[tile], n)
    for tile, n in shim_bds.items():
        claims[tile].append((("shim_bds",), TileUse(bds=n)))
    return dict(claims)


def add_use(total: TileUse, part: TileUse, times: int = 1) -> None:
    """Add ``part``'s demand ``times`` over to ``total`` (memory with its contributions)."""
    total.memory += part.memory * times
    total.parts.extend(part.parts * times)
    total.s2mm += part.s2mm * times
    total.mm2s += part.mm2s * times
    total.bds += part.bds * times
    total.locks += part.locks * times


def resource_use(design: Design) -> dict[Tile, TileUse]:
    """Per-tile resource demand of a placed design: its claims summed (the shim's BDs: the largest task group)."""
    use: dict[Tile, TileUse] = {}
    for tile, items in resource_claims(design).items():
        u = use[tile] = TileUse()
        shim_bds = 0
        for key, part in items:
            if key == ("shim_bds",):
                shim_bds = max(shim_bds, part.bds)
            else:
                add_use(u, part)
        u.bds = max(u.bds, shim_bds)
    return use
