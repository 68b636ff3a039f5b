"""Every validator code has a design that triggers it; hypothesis checks L1 and channel verdicts against a recount."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from tilepilot.npu.design import (
    Binding,
    Design,
    MultiLaunchGroup,
    ObjectFifo,
    Runtime,
    TensorAccessPattern,
    TensorSpec,
    Tile,
    TileKernel,
    Worker,
    forward,
    split,
    worker_end,
)
from tilepilot.npu.device import npu2
from tilepilot.npu.numerics import Numerics
from tilepilot.npu.validate import (
    CODES,
    CORE_STACK_BYTES,
    DesignError,
    check,
    legal_taps,
    resource_use,
    tap_problems,
    validate,
    validate_group,
)


def _noop(ins, outs, ctx):
    pass


K = TileKernel("k", _noop)


def tap(n: int, offset: int = 0, total: int | None = None) -> TensorAccessPattern:
    """n contiguous elements; long runs as rows of 64 so the pattern stays within DMA limits."""
    if n > 2046 and n % 64 == 0:
        return TensorAccessPattern(((total or n),), offset, (n // 64, 64), (64, 1))
    return TensorAccessPattern(((total or n),), offset, (n,), (1,))


def stream(n_workers: int = 1, obj: int = 64, objs: int = 4, depth: int = 2) -> Design:
    """Legal baseline: each worker reads x_i from DDR and writes y_i back, objs objects of obj elements."""
    fifos, workers, rt = [], [], Runtime()
    for i in range(n_workers):
        fifos += [ObjectFifo(f"x{i}", (obj,), depth=depth), ObjectFifo(f"y{i}", (obj,), depth=depth)]
        workers.append(Worker(f"w{i}", K, (f"x{i}",), (f"y{i}",), iterations=objs))
        rt.fill(f"x{i}", "inp", tap(obj * objs, i * obj * objs, n_workers * obj * objs))
        rt.drain(f"y{i}", "out", tap(obj * objs, i * obj * objs, n_workers * obj * objs))
    n = n_workers * obj * objs
    return Design(
        "s",
        inputs=[TensorSpec("inp", (n,))],
        outputs=[TensorSpec("out", (n,))],
        fifos=fifos,
        workers=workers,
        runtime=rt,
    )


def codes(design: Design) -> set[str]:
    return {v.code for v in validate(design)}


def test_baseline_is_legal_and_check_places_it():
    d = stream(3)
    assert validate(d) == []
    placed = check(d)
    assert [w.placement for w in placed.workers] == [Tile(0, 2), Tile(0, 3), Tile(0, 4)]
    assert placed.is_placed()


def test_a_fifo_riding_another_shim_channel_takes_none_and_must_ride_a_fill_on_its_shim():
    """``ObjectFifo.rides_with``: x1's DDR fills queue on x0's MM2S channel (the placer puts it on x0's shim and it
    claims no channel); riding a drain, an unknown fifo, a rider, or a channel on another shim is SHIM_CHANNEL_SHARE."""
    d = stream(3)
    d.fifos = [replace(f, rides_with="x0") if f.name == "x1" else f for f in d.fifos]
    placed = check(d)
    shim = {f.name: f.shim_placement for f in placed.fifos}
    assert shim["x1"] == shim["x0"]
    alone = check(stream(3))
    mm2s = sum(u.mm2s for t, u in resource_use(placed).items() if t.row == 0)
    assert mm2s == sum(u.mm2s for t, u in resource_use(alone).items() if t.row == 0) - 1
    for rider, host in (("x1", "y0"), ("x1", "nope"), ("x1", "x1"), ("y1", "x0")):  # a drain, unknown, itself
        d = stream(3)
        d.fifos = [replace(f, rides_with=host) if f.name == rider else f for f in d.fifos]
        assert "SHIM_CHANNEL_SHARE" in codes(d), (rider, host)
    d = stream(3)  # a rider of a rider
    d.fifos = [replace(f, rides_with={"x1": "x0", "x2": "x1"}.get(f.name)) for f in d.fifos]
    assert "SHIM_CHANNEL_SHARE" in codes(d)
    d = stream(2)  # no DDR end at all: a worker-to-worker fifo
    d.fifos.append(ObjectFifo("mid", (64,), rides_with="x0"))
    d.workers = [replace(d.workers[0], outputs=("y0", "mid")), replace(d.workers[1], inputs=("x1", "mid"))]
    assert "SHIM_CHANNEL_SHARE" in codes(d)
    moved = [replace(f, shim_placement=Tile(5, 0)) if f.name == "x1" else f for f in placed.fifos]
    assert "SHIM_CHANNEL_SHARE" in codes(replace(placed, fifos=[replace(f, rides_with="x0") if f.name == "x1" else f
                                                                  for f in moved]))  # fmt: skip


def test_unknown_ref_and_duplicate_name():
    d = stream()
    d.workers[0] = replace(d.workers[0], inputs=("nope",))
    assert codes(d) == {"UNKNOWN_REF"}
    d = stream()
    d.fifos.append(ObjectFifo("x0", (64,)))
    assert codes(d) == {"DUPLICATE_NAME"}


def test_dangling_fifos():
    d = stream()
    d.fifos.append(ObjectFifo("lonely", (64,)))
    assert {"FIFO_NO_PRODUCER", "FIFO_NO_CONSUMER"} <= codes(d)
    d = stream()
    d.runtime.tasks = [t for t in d.runtime.tasks if t.kind != "fill"]
    assert "FIFO_NO_PRODUCER" in codes(d)
    d = stream()
    d.runtime.tasks = [t for t in d.runtime.tasks if t.kind != "drain"]
    assert "FIFO_NO_CONSUMER" in codes(d)


def test_multi_producer_and_declared_endpoint_mismatch():
    d = stream(2)
    d.workers[1] = replace(d.workers[1], outputs=("y0",))
    assert "FIFO_MULTI_PRODUCER" in codes(d)
    d = stream()
    d.fifos[1] = replace(d.fifos[1], producer=worker_end("ghost"))
    assert codes(d) == {"FIFO_ENDPOINT_MISMATCH"}


def test_balance_tensor_role_dtype_tiling():
    d = stream()
    d.workers[0] = replace(d.workers[0], iterations=3)
    assert codes(d) == {"FIFO_BALANCE"}
    d = stream()
    d.runtime.tasks[1] = replace(d.runtime.tasks[1], tensor="inp")
    assert "TENSOR_ROLE" in codes(d)
    d = stream()
    d.inputs = [TensorSpec("inp", (256,), "fp32")]
    assert "DTYPE_MISMATCH" in codes(d)
    d = stream()
    d.runtime.tasks[0] = replace(d.runtime.tasks[0], tap=tap(250, 0, 256))
    assert "SHAPE_NOT_TILING" in codes(d)


def test_tap_limits():
    assert tap_problems(TensorAccessPattern((64,), 0, (2, 2, 2, 2, 4), (0, 0, 0, 0, 1)))  # 5 dims
    assert tap_problems(TensorAccessPattern((4096,), 0, (4096,), (1,)))  # 2048 words innermost
    assert tap_problems(TensorAccessPattern((1 << 16,), 0, (65, 2, 2, 8), (16, 8, 4, 1)))  # repeat > 64
    assert tap_problems(TensorAccessPattern((64,), 0, (8, 8), (8, 2)))  # bf16 innermost stride != 1
    assert tap_problems(TensorAccessPattern((64,), 1, (8,), (1,)))  # misaligned offset
    assert tap_problems(TensorAccessPattern((64,), 60, (8,), (1,)))  # outside the tensor
    assert tap_problems(TensorAccessPattern((1 << 23,), 0, (2, 2, 8), (1 << 22, 8, 1)))  # stride > 1M words
    assert tap_problems(TensorAccessPattern((64,), 0, (4, 8), (0, 1))) != []  # stride 0 outside the repeat dim
    assert tap_problems(TensorAccessPattern((256,), 0, (4, 2, 4, 8), (0, 32, 8, 1))) == []  # repeat may be 0
    d = stream()
    d.runtime.tasks[0] = replace(d.runtime.tasks[0], tap=TensorAccessPattern((256,), 200, (256,), (1,)))
    assert "TAP_LIMIT" in codes(d)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    sizes=st.lists(st.integers(1, 70), min_size=1, max_size=5),
    inner_run=st.sampled_from([2, 8, 64, 3000]),
)
def test_legal_taps_split_any_nest_into_legal_patterns_in_the_same_order(sizes, inner_run):
    sizes = [*sizes, inner_run]
    assume(math.prod(sizes) <= 200_000)
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.insert(0, acc)
        acc *= s
    shape = (acc,)
    whole = TensorAccessPattern(shape, 0, tuple(sizes), tuple(strides)).indices()
    taps = legal_taps(shape, 0, sizes, strides)
    assert all(tap_problems(t) == [] for t in taps)
    got = [i for t in taps for i in t.indices().tolist()]
    assert got == whole.tolist()


def test_links_shapes():
    d = stream()
    d.fifos += [ObjectFifo("big", (128,)), ObjectFifo("p0", (64,)), ObjectFifo("p1", (64,))]
    d.links.append(split("sp", "big", ["p0", "p1"], [0, 32]))
    assert "LINK_SHAPE" in codes(d)
    d = stream()
    d.fifos += [ObjectFifo("x", (128,)), ObjectFifo("z", (64,))]
    d.links.append(forward("f", "x", "z"))
    assert "LINK_SHAPE" in codes(d)


def test_placement_rules():
    d = stream()
    d.workers[0] = replace(d.workers[0], placement=Tile(0, 1))
    assert "PLACEMENT_OFF_DEVICE" in codes(d)
    d = stream()
    d.workers[0] = replace(d.workers[0], placement=Tile(8, 2))
    assert "PLACEMENT_OFF_DEVICE" in codes(d)
    d = stream(2)
    d.workers = [replace(w, placement=Tile(1, 3)) for w in d.workers]
    assert "PLACEMENT_SHARED" in codes(d)
    d = stream(33, obj=8, objs=1)
    assert "PLACEMENT_MISSING" in codes(d)
    d = stream()
    d.fifos[0] = replace(d.fifos[0], shim_placement=Tile(0, 2))
    assert "PLACEMENT_OFF_DEVICE" in codes(d)


def test_l1_overflow_names_tile_and_bytes():
    d = stream(obj=8192, objs=1)  # 2 fifos x 2 x 16 KiB = 64 KiB + stack
    vs = [v for v in validate(d) if v.code == "L1_OVERFLOW"]
    assert len(vs) == 1 and vs[0].tile == Tile(0, 2)
    assert str(2 * 2 * 16384 + CORE_STACK_BYTES) in vs[0].message and "65536" in vs[0].message
    d = stream(obj=4096, objs=2)
    assert "L1_OVERFLOW" not in codes(d)
    d.workers[0] = replace(d.workers[0], local_bytes=32 * 1024)
    assert "L1_OVERFLOW" in codes(d)


def test_l2_overflow():
    d = stream()
    d.fifos += [ObjectFifo("l2in", (160 * 1024,), depth=2), ObjectFifo("l2out", (160 * 1024,), depth=2)]
    d.inputs.append(TensorSpec("big", (160 * 1024,)))
    d.outputs.append(TensorSpec("bigout", (160 * 1024,)))
    d.links.append(forward("stage", "l2in", "l2out", Tile(0, 1)))
    d.runtime.fill("l2in", "big", TensorAccessPattern((160 * 1024,), 0, (80, 2048), (2048, 1)))
    d.runtime.drain("l2out", "bigout", TensorAccessPattern((160 * 1024,), 0, (80, 2048), (2048, 1)))
    vs = [v for v in validate(d) if v.code == "L2_OVERFLOW"]
    assert len(vs) == 1 and vs[0].tile == Tile(0, 1) and str(2 * 320 * 1024) in vs[0].message


def test_dma_channels_compute_and_shim():
    d = stream()
    for i in (1, 2):
        d.fifos.append(ObjectFifo(f"extra{i}", (64,)))
        d.runtime.fill(f"extra{i}", "inp", tap(256))
    d.workers[0] = replace(d.workers[0], inputs=("x0", "extra1", "extra2"))
    vs = [v for v in validate(d) if v.code == "DMA_CHANNELS"]
    assert any(v.tile == Tile(0, 2) and "3 S2MM" in v.message for v in vs)
    # 9 workers with two DDR inputs each need 18 shim MM2S channels; npu2 has 8 x 2
    fifos, workers, rt = [], [], Runtime()
    for i in range(9):
        fifos += [ObjectFifo(f"a{i}", (64,)), ObjectFifo(f"b{i}", (64,)), ObjectFifo(f"c{i}", (64,))]
        workers.append(Worker(f"w{i}", K, (f"a{i}", f"b{i}"), (f"c{i}",), placement=Tile(i % 8, 2 + i // 8)))
        rt.fill(f"a{i}", "a", tap(64)).fill(f"b{i}", "a", tap(64)).drain(f"c{i}", "c", tap(64))
    d9 = Design(
        "nine",
        inputs=[TensorSpec("a", (64,))],
        outputs=[TensorSpec("c", (64,))],
        fifos=fifos,
        workers=workers,
        runtime=rt,
    )
    vs = [v for v in validate(d9) if v.code == "DMA_CHANNELS"]
    assert vs and all(npu2().is_shim(v.tile) for v in vs)
    d8 = replace(d9, workers=d9.workers[:8], fifos=d9.fifos[:24], runtime=Runtime(d9.runtime.tasks[:24]))
    assert validate(d8) == []


def test_bd_and_lock_limits():
    d = stream(obj=16, objs=9, depth=9)  # 9 + 9 BDs on the compute tile
    assert any(v.code == "BD_LIMIT" and v.tile == Tile(0, 2) for v in validate(d))
    d = stream(obj=8, objs=17)
    d.runtime.tasks = [t for t in d.runtime.tasks if t.kind == "drain"]
    for i in range(17):  # 17 concurrent tasks on one shim
        d.runtime.fill("x0", "inp", tap(8, 8 * i, 8 * 17))
    assert any(v.code == "BD_LIMIT" and v.tile == Tile(0, 0) for v in validate(d))
    # 9 shared-memory fifos from a producer to its north neighbour: 18 locks on the producer tile
    fifos = [ObjectFifo(f"s{i}", (8,)) for i in range(9)] + [ObjectFifo("x", (8,)), ObjectFifo("y", (8,))]
    prod = Worker("p", K, ("x",), tuple(f"s{i}" for i in range(9)), placement=Tile(0, 2))
    cons = Worker("c", K, tuple(f"s{i}" for i in range(9)), ("y",), placement=Tile(0, 3))
    rt = Runtime().fill("x", "inp", tap(8)).drain("y", "out", tap(8))
    d = Design(
        "locks",
        inputs=[TensorSpec("inp", (8,))],
        outputs=[TensorSpec("out", (8,))],
        fifos=fifos,
        workers=[prod, cons],
        runtime=rt,
    )
    vs = validate(d)
    assert [v.code for v in vs] == ["LOCK_LIMIT"] and vs[0].tile == Tile(0, 2)


def test_a_shared_memory_hand_off_keeps_its_buffers_where_both_cores_reach():
    """A core reaches its own, the west, north and south memories: a hand-off to the east or north neighbour keeps
    the buffers on the producer's tile, one to the west neighbour (who cannot reach east) on the consumer's."""
    fifos = [ObjectFifo(f"s{i}", (8,)) for i in range(9)] + [ObjectFifo("x", (8,)), ObjectFifo("y", (8,))]
    rt = Runtime().fill("x", "inp", tap(8)).drain("y", "out", tap(8))
    for prod_tile, cons_tile, charged in (
        (Tile(1, 2), Tile(2, 2), Tile(1, 2)),  # east: the consumer reaches its west, the producer's memory
        (Tile(1, 2), Tile(1, 3), Tile(1, 2)),  # north
        (Tile(1, 2), Tile(0, 2), Tile(0, 2)),  # west: the producer reaches its west, the consumer's memory
    ):
        prod = Worker("p", K, ("x",), tuple(f"s{i}" for i in range(9)), placement=prod_tile)
        cons = Worker("c", K, tuple(f"s{i}" for i in range(9)), ("y",), placement=cons_tile)
        d = Design("hand_off", inputs=[TensorSpec("inp", (8,))], outputs=[TensorSpec("out", (8,))], fifos=fifos,
                   workers=[prod, cons], runtime=rt)  # fmt: skip
        vs = validate(d)  # 9 fifos x 2 locks on one tile: the tile that holds them is the one over the limit
        assert [v.code for v in vs] == ["LOCK_LIMIT"] and vs[0].tile == charged


def test_worker_program_and_numerics_mismatch():
    d = stream()
    d.workers[0] = replace(d.workers[0], acquires={"x0": 2}, calls_per_iteration=3, iterations=2)
    assert "WORKER_PROGRAM" in codes(d)
    d = stream()
    d.workers[0] = replace(d.workers[0], kernel=TileKernel("q", _noop, variant="bfp16"))
    assert codes(d) == {"NUMERICS_MISMATCH"}
    d.numerics = Numerics(operands="bfp16")
    assert codes(d) == set()


def test_group_binding_and_check_raises_with_all_codes():
    a, b = stream(), stream()
    b.name = "t"
    g = MultiLaunchGroup("g", [a, b], [Binding("s", "out", "t", "missing")])
    assert {v.code for v in validate_group(g)} == {"GROUP_BINDING"}
    assert validate_group(MultiLaunchGroup("g", [a, b], [Binding("s", "out", "t", "inp")])) == []
    d = stream(obj=8192, objs=1)
    d.workers[0] = replace(d.workers[0], iterations=2)
    with pytest.raises(DesignError) as e:
        check(d)
    assert set(e.value.codes) == {"L1_OVERFLOW", "FIFO_BALANCE"}
    assert "L1_OVERFLOW" in str(e.value) or "FIFO_BALANCE" in str(e.value)


def test_every_code_is_exercised_here():
    src = open(__file__).read()
    missing = [c for c in CODES if f'"{c}"' not in src]
    assert missing == []


# ----------------------------------------------------------------------------------------------------------------------
# Property test: the validator's L1 and channel verdicts against an independent recount
# ----------------------------------------------------------------------------------------------------------------------
@st.composite
def random_design(draw):
    dev = npu2()
    span = draw(st.sampled_from([2, 8]))  # a narrow region makes neighbours (shared-memory fifos) common
    tiles = draw(st.lists(st.sampled_from(dev.compute_tiles()[: 4 * span]), min_size=1, max_size=8, unique=True))
    fifos, workers_io, rt = [], {i: ([], []) for i in range(len(tiles))}, Runtime()
    n = 0
    for i in range(len(tiles)):
        for direction in ("in", "out"):
            for _ in range(draw(st.integers(0, 3))):
                name = f"f{n}"
                n += 1
                obj = draw(st.sampled_from([64, 512, 2048, 4096]))
                shim = Tile(draw(st.integers(0, 7)), 0)
                fifos.append(ObjectFifo(name, (obj,), depth=draw(st.integers(1, 3)), shim_placement=shim))
                if direction == "in":
                    workers_io[i][0].append(name)
                    rt.fill(name, "inp", tap(obj, 0, 8192))
                else:
                    workers_io[i][1].append(name)
                    rt.drain(name, "out", tap(obj, 0, 8192))
    for _ in range(draw(st.integers(0, 4))):  # worker-to-worker fifos, possibly between neighbours
        if len(tiles) < 2:
            break
        p, c = draw(st.lists(st.integers(0, len(tiles) - 1), min_size=2, max_size=2, unique=True))
        name = f"f{n}"
        n += 1
        fifos.append(ObjectFifo(name, (draw(st.sampled_from([64, 1024, 4096])),), depth=draw(st.integers(1, 3))))
        workers_io[p][1].append(name)
        workers_io[c][0].append(name)
    workers = [
        Worker(
            f"w{i}",
            K,
            tuple(workers_io[i][0]),
            tuple(workers_io[i][1]),
            placement=t,
            local_bytes=draw(st.sampled_from([0, 4096, 16384])),
        )
        for i, t in enumerate(tiles)
    ]
    return Design(
        "rand",
        inputs=[TensorSpec("inp", (8192,))],
        outputs=[TensorSpec("out", (8192,))],
        fifos=fifos,
        workers=workers,
        runtime=rt,
    )


def reaches(core: Tile, memory: Tile) -> bool:
    """AIE2 (mlir-aie AIE2TargetModel::isLegalMemAffinity): a core reaches its own, west, north and south memory."""
    dc, dr = memory.col - core.col, memory.row - core.row
    return (dc, dr) in ((0, 0), (-1, 0), (0, 1), (0, -1))


def recount(d: Design):
    """Independent recount from the rules as documented (not via resource_use)."""
    mem = defaultdict(int)
    chans = defaultdict(lambda: [0, 0])  # tile -> [in, out]
    where = {w.name: w.placement for w in d.workers}
    for w in d.workers:
        mem[w.placement] += CORE_STACK_BYTES + w.local_bytes
    for f in d.fifos:
        size = f.depth * f.obj_elements * 2
        prod = [w for w in d.workers if f.name in w.outputs]
        cons = [w for w in d.workers if f.name in w.inputs]
        if prod and cons:
            a, b = where[prod[0].name], where[cons[0].name]
            if abs(a.col - b.col) + abs(a.row - b.row) == 1 and len(cons) == 1:
                # the buffers go where both cores reach: the producer's memory if the consumer reaches it (east,
                # north or south neighbour), else the consumer's (a west neighbour; the producer reaches west)
                mem[a if reaches(b, a) else b] += size
                continue
        for w in prod:
            mem[w.placement] += size
            chans[w.placement][1] += 1
        for w in cons:
            mem[w.placement] += size
            chans[w.placement][0] += 1
        if not prod:
            chans[f.shim_placement][1] += 1
        if not cons:
            chans[f.shim_placement][0] += 1
    l1 = {t for t, m in mem.items() if m > 65536}
    dma = {t for t, (i, o) in chans.items() if i > 2 or o > 2}
    return l1, dma


def west_hand_off() -> Design:
    """The kind of design the random search failed on in CI: w0 on (1,2) hands f2 (3 x 8 KiB) to w1 on (0,2), its west
    neighbour. w0 cannot reach east, so the buffers live in w1's memory: (0,2) holds 1 + 24 + 16 + 24 KiB and
    overflows, (1,2) holds 1 + 16 + 24 KiB and does not. A recount that put them on the producer saw it the other
    way round."""
    fifos = [
        ObjectFifo("f0", (4096,), depth=3, shim_placement=Tile(0, 0)),
        ObjectFifo("f1", (4096,), depth=3, shim_placement=Tile(0, 0)),
        ObjectFifo("f2", (4096,), depth=3),
        ObjectFifo("f3", (4096,), depth=2, shim_placement=Tile(0, 0)),
    ]
    workers = [
        Worker("w0", K, ("f0",), ("f2",), placement=Tile(1, 2), local_bytes=16384),
        Worker("w1", K, ("f1", "f2"), ("f3",), placement=Tile(0, 2)),
    ]
    rt = Runtime().fill("f0", "inp", tap(4096, 0, 8192)).fill("f1", "inp", tap(4096, 0, 8192))
    rt.drain("f3", "out", tap(4096, 0, 8192))
    return Design("rand", inputs=[TensorSpec("inp", (8192,))], outputs=[TensorSpec("out", (8192,))], fifos=fifos,
                  workers=workers, runtime=rt)  # fmt: skip


def test_west_hand_off_overflows_the_consumer_tile_not_the_producer():
    vs = validate(west_hand_off())
    assert [(v.code, v.tile) for v in vs] == [("L1_OVERFLOW", Tile(0, 2))]
    assert "66560 B" in vs[0].message and "fifo f2 (shared, 3 x 8192 B)" in vs[0].message
    assert resource_use(west_hand_off())[Tile(1, 2)].memory == 1024 + 16384 + 24576


@settings(max_examples=150, deadline=None, derandomize=True)
@given(random_design())
@example(west_hand_off())
def test_validator_matches_independent_resource_count(d):
    vs = validate(d)
    l1, dma = recount(d)
    assert {v.tile for v in vs if v.code == "L1_OVERFLOW"} == l1
    assert {v.tile for v in vs if v.code == "DMA_CHANNELS"} == dma
    use = resource_use(d)
    for t in l1:
        assert use[t].memory > 65536


def test_dispatch_watchdog_is_a_rule_on_a_dispatchs_modeled_time():
    """xdna2.md: the amdxdna watchdog kills a dispatch running longer than ~4-6 s; the validator holds the lower end."""
    from tilepilot.npu.validate import DISPATCH_WATCHDOG_S, DesignError, check_dispatch, dispatch_problems

    assert DISPATCH_WATCHDOG_S == 4.0
    assert dispatch_problems("decode_all", 3.9) == []
    with pytest.raises(DesignError) as e:
        check_dispatch("decode_all", 4.2)
    assert e.value.codes == ["DISPATCH_WATCHDOG"] and "4.200 s" in str(e.value)
