"""Design IR: access patterns, derived fifo endpoints, worker program summaries, multi-launch bindings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tilepilot.errors import ConfigError
from tilepilot.npu.design import (
    SHIM,
    Acquire,
    Binding,
    Call,
    Design,
    MultiLaunchGroup,
    ObjectFifo,
    Release,
    Runtime,
    RuntimeTask,
    TensorAccessPattern,
    TensorSpec,
    TileKernel,
    Worker,
    forward,
    link_end,
    nbytes,
    worker_end,
)


def _noop(ins, outs, ctx):
    pass


def test_tap_indices_follow_row_major_order():
    tap = TensorAccessPattern((4, 6), 1, (2, 3), (6, 2))
    assert tap.indices().tolist() == [1, 3, 5, 7, 9, 11]
    assert tap.n_elements == 6 and tap.index_range() == (1, 11)
    whole = TensorAccessPattern.contiguous((3, 4))
    assert whole.indices().tolist() == list(range(12))
    with pytest.raises(ConfigError):
        TensorAccessPattern((4,), 0, (2, 2), (1,))


@settings(max_examples=50, deadline=None)
@given(
    dims=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 7)), min_size=1, max_size=4),
    offset=st.integers(0, 5),
)
def test_tap_indices_match_a_nested_loop(dims, offset):
    sizes = tuple(d[0] for d in dims)
    strides = tuple(d[1] for d in dims)
    tap = TensorAccessPattern((1000,), offset, sizes, strides)
    expect = []
    for idx in np.ndindex(*sizes):
        expect.append(offset + sum(i * s for i, s in zip(idx, strides, strict=True)))
    assert tap.indices().tolist() == expect
    lo, hi = tap.index_range()
    assert lo == min(expect) and hi == max(expect)


def test_bytes_and_fifo_sizes():
    assert nbytes(10, "bf16") == 20 and nbytes(16, "bfp16") == 18 and nbytes(3, "bfp16") == 9
    f = ObjectFifo("f", (32, 16), "bf16", depth=3)
    assert (f.obj_elements, f.obj_bytes, f.buffer_bytes) == (512, 1024, 3072)
    with pytest.raises(ConfigError):
        ObjectFifo("g", (4,), depth=0)


def _pipeline() -> Design:
    k = TileKernel("k", _noop, macs_per_call=10)
    rt = Runtime().fill("x", "inp", TensorAccessPattern.contiguous((64,)))
    rt.drain("y", "out", TensorAccessPattern.contiguous((64,)))
    return Design(
        "pipe",
        inputs=[TensorSpec("inp", (64,))],
        outputs=[TensorSpec("out", (64,))],
        fifos=[ObjectFifo("x", (16,)), ObjectFifo("x2", (16,)), ObjectFifo("y", (16,))],
        links=[forward("fwd", "x", "x2")],
        workers=[Worker("w", k, ("x2",), ("y",), iterations=4)],
        runtime=rt,
    )


def test_endpoints_are_derived_from_use():
    d = _pipeline()
    assert d.producers("x") == [SHIM] and d.consumers("x") == [link_end("fwd")]
    assert d.producers("x2") == [link_end("fwd")] and d.consumers("x2") == [worker_end("w")]
    assert d.producers("y") == [worker_end("w")] and d.consumers("y") == [SHIM]
    assert d.total_macs() == 40
    assert d.ddr_read_bytes() == 128 and d.ddr_write_bytes() == 128
    assert not d.is_placed()
    assert "pipe" in d.summary()


def _drive(worker: Worker) -> list:
    gen = worker.run_program()
    ops, reply = [], None
    while True:
        try:
            op = gen.send(reply)
        except StopIteration:
            return ops
        ops.append(op)
        reply = [torch.zeros(1)] * op.n if isinstance(op, Acquire) else None


def test_default_program_holds_outputs_and_streams_inputs():
    k = TileKernel("k", _noop)
    w = Worker("w", k, ("a", "b", "q"), ("c",), iterations=2, acquires={"a": 3, "b": 3, "q": 1}, calls_per_iteration=3)
    ops = _drive(w)
    acquired: dict[str, int] = {}
    for op in ops:
        if isinstance(op, Acquire):
            acquired[op.fifo] = acquired.get(op.fifo, 0) + op.n
    assert acquired == w.total_acquires() == {"a": 6, "b": 6, "q": 2, "c": 2}
    calls = [op for op in ops if isinstance(op, Call)]
    assert [(c.iteration, c.step) for c in calls] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    # C is acquired before the K loop and released after it
    first_iter = ops[: ops.index(next(o for o in ops if isinstance(o, Release) and o.fifo == "c")) + 1]
    assert isinstance(first_iter[0], Acquire) and first_iter[0].fifo == "c"
    assert sum(isinstance(o, Call) for o in first_iter) == 3


def test_default_program_streams_outputs_per_call_too():
    w = Worker(
        "w", TileKernel("k", _noop), ("wt", "x"), ("y",), iterations=1, acquires={"x": 4, "y": 4}, calls_per_iteration=4
    )
    ops = _drive(w)
    assert [o.fifo for o in ops if isinstance(o, Acquire)] == ["wt"] + ["x", "y"] * 4
    assert isinstance(ops[-1], Release) and ops[-1].fifo == "wt"


def test_default_program_rejects_counts_it_cannot_express():
    w = Worker("w", TileKernel("k", _noop), ("a",), ("c",), acquires={"a": 2}, calls_per_iteration=3)
    with pytest.raises(ConfigError):
        _drive(w)


def test_group_bindings_detect_argument_mismatches():
    a, b = _pipeline(), _pipeline()
    b.name = "second"
    ok = MultiLaunchGroup("g", [a, b], [Binding("pipe", "out", "second", "inp")])
    assert ok.binding_problems() == []
    assert [n for n, _ in ok.group_inputs()] == ["pipe"] and len(ok.group_outputs()) == 2
    swapped = MultiLaunchGroup("g", [a, b], [Binding("second", "out", "pipe", "inp")])
    assert any("does not run before" in p for p in swapped.binding_problems())
    renamed = MultiLaunchGroup("g", [a, b], [Binding("pipe", "output", "second", "inp")])
    assert any("no output 'output'" in p for p in renamed.binding_problems())
    b.inputs = [TensorSpec("inp", (32,))]
    shape = MultiLaunchGroup("g", [a, b], [Binding("pipe", "out", "second", "inp")])
    assert any("does not match" in p for p in shape.binding_problems())
    dup = MultiLaunchGroup("g", [a, a], [])
    assert any("more than once" in p for p in dup.binding_problems())


def test_runtime_shim_ends_follow_the_task_list():
    """The shim-end index answers from the current task list: an appended task, a replaced list and a sort are
    seen (a stale index would give a fifo the wrong producer and let the validator pass a broken design)."""
    tap = TensorAccessPattern((8,), 0, (8,), (1,))
    rt = Runtime()
    rt.fill("a", "x", tap, group=1)
    assert rt.fills("a") and not rt.drains("a") and not rt.fills("b")
    rt.drain("b", "y", tap, group=0)
    assert rt.drains("b") and not rt.fills("b")
    rt.tasks.sort(key=lambda t: t.group)
    assert rt.fills("a") and rt.drains("b")
    assert [[t.fifo for t in g] for g in rt.groups()] == [["b"], ["a"]]
    rt.fill("a", "x", TensorAccessPattern((8,), 0, (2, 2), (4, 1)))
    moved = [rt.moved_elements(kind, fifo) for kind, fifo in (("fill", "a"), ("drain", "a"), ("drain", "b"))]
    assert moved == [12, 0, 8]
    rt.tasks = [RuntimeTask("drain", "a", "x", tap)]
    assert rt.drains("a") and not rt.fills("a") and not rt.drains("b")
