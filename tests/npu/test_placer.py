"""SequentialPlacer: IRON-like column-major worker placement, links and shim ends next to their workers."""

from __future__ import annotations

from dataclasses import replace

from tilepilot.npu.design import Design, ObjectFifo, Runtime, TensorAccessPattern, TensorSpec, Tile, TileKernel, Worker
from tilepilot.npu.design import forward as fwd
from tilepilot.npu.placer import SequentialPlacer
from tilepilot.npu.validate import validate

K = TileKernel("k", lambda i, o, c: None)


def design(n: int, placements: dict[int, Tile] | None = None, via_mem: bool = False) -> Design:
    placements = placements or {}
    fifos, links, workers, rt = [], [], [], Runtime()
    for i in range(n):
        src = f"x{i}"
        fifos.append(ObjectFifo(src, (64,)))
        if via_mem:
            fifos.append(ObjectFifo(f"x{i}_l1", (64,)))
            links.append(fwd(f"l{i}", src, f"x{i}_l1"))
            src = f"x{i}_l1"
        fifos.append(ObjectFifo(f"y{i}", (64,)))
        workers.append(Worker(f"w{i}", K, (src,), (f"y{i}",), placement=placements.get(i)))
        rt.fill(f"x{i}", "a", TensorAccessPattern.contiguous((64,))).drain(
            f"y{i}", "c", TensorAccessPattern.contiguous((64,))
        )
    return Design(
        "p",
        inputs=[TensorSpec("a", (64,))],
        outputs=[TensorSpec("c", (64,))],
        fifos=fifos,
        links=links,
        workers=workers,
        runtime=rt,
    )


def test_workers_fill_column_major_and_keep_explicit_tiles():
    d = SequentialPlacer().place(design(6, {1: Tile(0, 2)}))
    tiles = [w.placement for w in d.workers]
    assert tiles[1] == Tile(0, 2)
    assert tiles[0] == Tile(0, 3) and tiles[2:] == [Tile(0, 4), Tile(0, 5), Tile(1, 2), Tile(1, 3)]


def test_shim_ends_follow_their_worker_and_spill_to_nearest_free_column():
    d = SequentialPlacer().place(design(3, {0: Tile(3, 2), 1: Tile(3, 3), 2: Tile(3, 4)}))
    fills = [d.fifo(f"x{i}").shim_placement for i in range(3)]
    assert fills[0] == Tile(3, 0) and fills[1] == Tile(3, 0)  # two MM2S channels on shim 3
    assert fills[2] in (Tile(2, 0), Tile(4, 0))  # the third spills to a neighbour column
    assert validate(d) == []


def test_links_go_to_the_mem_tile_of_their_consumer_column():
    d = SequentialPlacer().place(design(2, {0: Tile(5, 2), 1: Tile(6, 2)}, via_mem=True))
    assert d.link("l0").placement == Tile(5, 1) and d.link("l1").placement == Tile(6, 1)
    assert d.fifo("x0").shim_placement == Tile(5, 0)
    assert d.is_placed() and validate(d) == []


def test_overfull_array_leaves_workers_unplaced_for_the_validator():
    d = SequentialPlacer().place(design(33))
    assert sum(w.placement is None for w in d.workers) == 1
    assert "PLACEMENT_MISSING" in {v.code for v in validate(d)}


def test_placer_does_not_touch_its_input():
    d = design(2)
    SequentialPlacer().place(d)
    assert all(w.placement is None for w in d.workers)
    assert replace(d).workers == d.workers
