"""Tile-path executor semantics (rings, links, task groups, errors) and the fast path's checks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tilepilot.errors import InputError
from tilepilot.kernels import eltwise
from tilepilot.npu.design import (
    Acquire,
    Binding,
    Call,
    Design,
    MultiLaunchGroup,
    ObjectFifo,
    Release,
    Runtime,
    TensorAccessPattern,
    TensorSpec,
    Tile,
    TileKernel,
    Worker,
    join,
    split,
)
from tilepilot.npu.execute import ExecutionError, run_fast, run_group_fast, run_group_tile, run_tile
from tilepilot.npu.validate import DesignError, validate


def double(ins, outs, ctx):
    outs[0].copy_((ins[0].float() * 2).bfloat16())


def contiguous(n: int, offset: int = 0, total: int | None = None) -> TensorAccessPattern:
    return TensorAccessPattern(((total or n),), offset, (n,), (1,))


def scale_design(objs: int = 4, obj: int = 16, depth: int = 2, iterations: int | None = None, program=None) -> Design:
    n = objs * obj
    w = Worker(
        "w",
        TileKernel("double", double),
        ("x",),
        ("y",),
        iterations=objs if iterations is None else iterations,
        program=program,
    )
    rt = Runtime().fill("x", "a", contiguous(n)).drain("y", "c", contiguous(n))
    return Design(
        "scale",
        inputs=[TensorSpec("a", (n,))],
        outputs=[TensorSpec("c", (n,))],
        fifos=[ObjectFifo("x", (obj,), depth=depth), ObjectFifo("y", (obj,), depth=depth)],
        workers=[w],
        runtime=rt,
    )


def test_tile_path_moves_exactly_what_the_patterns_name():
    x = torch.arange(64, dtype=torch.float32).bfloat16()
    out = run_tile(scale_design(), {"a": x})["c"]
    assert torch.equal(out, (x.float() * 2).bfloat16())
    # a strided drain writes only the elements it names; the rest stays NaN (never written)
    d = scale_design(objs=2)
    d.outputs = [TensorSpec("c", (64,))]
    d.runtime.tasks[1] = replace(d.runtime.tasks[1], tap=TensorAccessPattern((64,), 0, (8, 4), (8, 1)))
    out = run_tile(d, {"a": x[:32]})["c"]
    written = torch.tensor([i % 8 < 4 for i in range(64)])
    assert torch.equal(out[written], (x[:32].float() * 2).bfloat16())
    assert out[~written].isnan().all()


def test_split_and_join_through_a_memory_tile():
    k = TileKernel("double", double)
    fifos = [
        ObjectFifo("big", (32,)),
        ObjectFifo("p0", (16,)),
        ObjectFifo("p1", (16,)),
        ObjectFifo("q0", (16,)),
        ObjectFifo("q1", (16,)),
        ObjectFifo("out", (32,)),
    ]
    workers = [Worker("w0", k, ("p0",), ("q0",), iterations=3), Worker("w1", k, ("p1",), ("q1",), iterations=3)]
    links = [split("sp", "big", ["p0", "p1"], [16, 0]), join("jn", ["q0", "q1"], "out", [0, 16])]
    rt = Runtime().fill("big", "a", contiguous(96)).drain("out", "c", contiguous(96))
    d = Design(
        "sj",
        inputs=[TensorSpec("a", (96,))],
        outputs=[TensorSpec("c", (96,))],
        fifos=fifos,
        links=links,
        workers=workers,
        runtime=rt,
    )
    x = torch.randn(96).bfloat16()
    out = run_tile(d, {"a": x})["c"].reshape(3, 2, 16)
    # the split sends the second half to p0 and the first to p1; the join puts q0 first: halves swap
    expect = (x.float() * 2).bfloat16().reshape(3, 2, 16).flip(1)
    assert torch.equal(out, expect)


def test_broadcast_consumers_get_their_own_copy_and_shared_memory_fifos_work():
    def add_inplace(ins, outs, ctx):
        ins[0].add_(1)  # a consumer scribbling on its input must not affect the other consumer
        outs[0].copy_(ins[0])

    k = TileKernel("k", add_inplace)
    fifos = [ObjectFifo("x", (8,)), ObjectFifo("y0", (8,)), ObjectFifo("y1", (8,)), ObjectFifo("z", (8,))]
    workers = [
        Worker("a", k, ("x",), ("y0",), iterations=2, placement=Tile(0, 2)),
        Worker("b", k, ("x",), ("y1",), iterations=2, placement=Tile(4, 2)),
        Worker("c", TileKernel("d", double), ("y1",), ("z",), iterations=2, placement=Tile(4, 3)),  # neighbour of b
    ]
    rt = Runtime().fill("x", "a", contiguous(16)).drain("y0", "c0", contiguous(16)).drain("z", "c1", contiguous(16))
    d = Design(
        "bc",
        inputs=[TensorSpec("a", (16,))],
        outputs=[TensorSpec("c0", (16,)), TensorSpec("c1", (16,))],
        fifos=fifos,
        workers=workers,
        runtime=rt,
    )
    x = torch.arange(16, dtype=torch.float32).bfloat16()
    out = run_tile(d, {"a": x})
    assert torch.equal(out["c0"], x + 1)
    assert torch.equal(out["c1"], ((x + 1).float() * 2).bfloat16())


def test_task_groups_run_in_order():
    d = scale_design(objs=4)
    d.runtime = Runtime()
    for g in range(2):
        d.runtime.fill("x", "a", contiguous(32, 32 * g, 64), group=g).drain("y", "c", contiguous(32, 32 * g, 64), g)
    x = torch.randn(64).bfloat16()
    assert torch.equal(run_tile(d, {"a": x})["c"], (x.float() * 2).bfloat16())


def test_deadlock_is_reported_with_who_waits_for_what():
    def greedy(worker):  # acquires 3 objects at once from a depth-2 fifo: can never succeed
        for _ in range(worker.iterations // 3):
            bufs = yield Acquire("x", 3)
            (out,) = yield Acquire("y", 1)
            yield Call((bufs[0],), (out,), 0, 0, 1)
            yield Release("x", 3)
            yield Release("y", 1)

    d = scale_design(objs=6, program=greedy)
    with pytest.raises(ExecutionError) as e:
        run_tile(d, {"a": torch.zeros(96).bfloat16()}, validate=False)
    assert e.value.code == "DEADLOCK" and "w waits for an object of x" in str(e.value)


def test_program_that_disagrees_with_its_summary_is_caught():
    d = scale_design(objs=4, iterations=2, program=lambda w: _loop(w, 4))
    assert "FIFO_BALANCE" in {v.code for v in validate(d)}
    with pytest.raises(ExecutionError) as e:
        run_tile(d, {"a": torch.zeros(64).bfloat16()}, validate=False)
    assert e.value.code == "PROGRAM_SUMMARY"


def test_objects_left_in_a_fifo_are_an_error():
    d = scale_design(objs=4, iterations=3)
    with pytest.raises(ExecutionError) as e:
        run_tile(d, {"a": torch.zeros(64).bfloat16()}, validate=False)
    assert e.value.code in ("FIFO_LEFTOVER", "DEADLOCK")


def _loop(worker, n):
    for it in range(n):
        (a,) = yield Acquire("x", 1)
        (b,) = yield Acquire("y", 1)
        yield Call((a,), (b,), it, 0, 1)
        yield Release("x", 1)
        yield Release("y", 1)


def test_uninitialised_tile_memory_shows_up_as_nan():
    def forgetful(ins, outs, ctx):  # accumulates into its output without zeroing it first
        outs[0].add_(ins[0])

    d = scale_design()
    d.workers[0] = replace(d.workers[0], kernel=TileKernel("acc", forgetful))
    assert run_tile(d, {"a": torch.ones(64).bfloat16()})["c"].isnan().all()


def test_both_paths_check_inputs_and_legality():
    d = eltwise.make_design(eltwise.Shape(64), eltwise.Config(tiles=2, chunk=16))
    x = torch.randn(64).bfloat16()
    with pytest.raises(InputError):
        run_fast(d, {"a": x})
    with pytest.raises(InputError):
        run_tile(d, {"a": x, "b": x.float()})
    bad = eltwise.make_design(eltwise.Shape(9 * 64), eltwise.Config(tiles=9, chunk=64))
    with pytest.raises(DesignError):
        run_fast(bad, {"a": torch.zeros(576).bfloat16(), "b": torch.zeros(576).bfloat16()})


def test_multi_launch_group_on_both_paths():
    add = eltwise.make_design(eltwise.Shape(128, "add"), eltwise.Config(tiles=2, chunk=32))
    mul = eltwise.make_design(eltwise.Shape(128, "mul"), eltwise.Config(tiles=4, chunk=16))
    g = MultiLaunchGroup("resid_then_scale", [add, mul], [Binding(add.name, "c", mul.name, "a")])
    torch.manual_seed(0)
    a, b, s = (torch.randn(128).bfloat16() for _ in range(3))
    ins = {f"{add.name}.a": a, f"{add.name}.b": b, f"{mul.name}.b": s}
    tile = run_group_tile(g, ins)
    fast = run_group_fast(g, ins, exact=True)
    want = ((a.float() + b.float()).bfloat16().float() * s.float()).bfloat16()
    assert torch.equal(tile[f"{mul.name}.c"], want) and torch.equal(fast[f"{mul.name}.c"], want)
    broken = MultiLaunchGroup("g", [add, mul], [Binding(add.name, "out", mul.name, "a")])
    with pytest.raises(DesignError) as e:
        run_group_fast(broken, ins)
    assert e.value.codes == ["GROUP_BINDING"]
    with pytest.raises(InputError):
        run_group_fast(g, {f"{add.name}.a": a})
