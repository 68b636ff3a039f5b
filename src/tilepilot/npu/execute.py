"""The executor: two paths, one semantics.

``run_tile`` runs a design as written. Every worker program, every memory-tile link and every runtime
DMA task is a coroutine; fifos are bounded rings of ``depth`` buffers; a runtime task moves exactly the
elements its access pattern names, in order; a link copies object slices at its offsets. Buffers start
as NaN (memory is not zeroed on hardware), so a kernel that reads before writing shows it. Nothing is
computed at tensor level, so this path is exact and slow: small shapes only.

``run_fast`` calls the design's tensor-level ``fast`` function, which applies the same rounding points
(exact=True: bit-identical to the tile path; exact=False: the family's production path).

Fifo capacity is modeled as one ring of ``depth`` objects per fifo that the producer may only reuse
once every consumer has released it (each DMA consumer reads its own copy). Hardware keeps a ring on
each side of a DMA connection, so it has at least this much buffering: a design that runs here does not
deadlock for lack of buffers there; the converse may fail only for contrived designs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch

from tilepilot.errors import InputError, TilepilotError
from tilepilot.npu.design import (
    Acquire,
    Call,
    CallContext,
    Design,
    FifoLink,
    MultiLaunchGroup,
    ObjectFifo,
    Release,
    RuntimeTask,
    TensorSpec,
    torch_dtype,
)
from tilepilot.npu.placer import SequentialPlacer
from tilepilot.npu.validate import DesignError, Violation, check, check_group, uses_shared_memory

MAX_OPS = 20_000_000  # guard against runaway programs on the tile path (far above any small-shape design)


class ExecutionError(TilepilotError, RuntimeError):
    """The tile path could not finish a design (deadlock, program/summary mismatch, data left in a fifo)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"{code}: {message}")


# ----------------------------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------------------------
def check_inputs(specs: list[TensorSpec], inputs: dict[str, torch.Tensor], what: str) -> dict[str, torch.Tensor]:
    """The inputs a launch needs, checked for presence, shape and dtype (InputError with one sentence otherwise)."""
    out: dict[str, torch.Tensor] = {}
    for spec in specs:
        if spec.name not in inputs:
            raise InputError(f"{what} needs input {spec.name!r} {spec.shape} {spec.dtype}; pass it by that name.")
        t = inputs[spec.name]
        if tuple(t.shape) != spec.shape or t.dtype != torch_dtype(spec.dtype):
            raise InputError(
                f"{what} input {spec.name!r} is {tuple(t.shape)} {t.dtype}, expected {spec.shape} {spec.dtype}; "
                "reshape or convert it (pad to the design's shape if it was padded)."
            )
        out[spec.name] = t
    return out


def run_fast(
    design: Design, inputs: dict[str, torch.Tensor], *, exact: bool = False, validate: bool = True
) -> dict[str, torch.Tensor]:
    """Tensor-level execution with the design's rounding points (exact=True matches run_tile bit for bit).

    The design is validated first (an illegal design must not produce numbers on either path); callers
    that already validated it, e.g. a plan executed layer after layer, pass ``validate=False``.
    """
    if design.fast is None:
        raise TilepilotError(f"Design {design.name} has no fast path; build it with its kernel family's make_design.")
    if validate:
        check(design)
    ins = check_inputs(design.inputs, inputs, f"design {design.name}")
    outs = design.fast(ins, exact=exact)
    return {spec.name: outs[spec.name] for spec in design.outputs}


# ----------------------------------------------------------------------------------------------------------------------
# Tile path machinery
# ----------------------------------------------------------------------------------------------------------------------
def _poison(dt: torch.dtype) -> float | int:
    """What an unwritten buffer holds: NaN for floats, 0xA5 for raw bytes (packed weights)."""
    return float("nan") if dt.is_floating_point else 0xA5


class _Ring:
    """One fifo at run time: a ring of ``depth`` producer buffers and, for DMA fifos, one ring per consumer."""

    def __init__(self, fifo: ObjectFifo, consumer_keys: list[str], shared: bool) -> None:
        self.fifo = fifo
        self.depth = fifo.depth
        dt = torch_dtype(fifo.dtype)

        def ring() -> list[torch.Tensor]:
            return [torch.full(fifo.obj_shape, _poison(dt), dtype=dt) for _ in range(fifo.depth)]

        self.buffers = ring()
        self.copies = {k: (self.buffers if shared else ring()) for k in consumer_keys}
        self.shared = shared
        self.p_acq = 0
        self.p_rel = 0
        self.c_acq = dict.fromkeys(consumer_keys, 0)
        self.c_rel = dict.fromkeys(consumer_keys, 0)

    def can_acquire(self, role: str, key: str, n: int) -> bool:
        if n > self.depth:
            return False
        if role == "prod":
            return self.p_acq + n - min(self.c_rel.values(), default=self.p_acq) <= self.depth
        return self.c_acq[key] + n <= self.p_rel

    def acquire(self, role: str, key: str, n: int) -> list[torch.Tensor]:
        if role == "prod":
            bufs = [self.buffers[(self.p_acq + i) % self.depth] for i in range(n)]
            self.p_acq += n
            return bufs
        start = self.c_acq[key]
        bufs = []
        for s in range(start, start + n):
            slot = s % self.depth
            mine = self.copies[key][slot]
            if not self.shared:
                mine.copy_(self.buffers[slot])  # the DMA transfer into the consumer's own buffer
            bufs.append(mine)
        self.c_acq[key] += n
        return bufs

    def release(self, role: str, key: str, n: int) -> None:
        if role == "prod":
            if self.p_rel + n > self.p_acq:
                raise ExecutionError("RELEASE_UNACQUIRED", f"producer of {self.fifo.name} releases more than it holds")
            self.p_rel += n
        else:
            if self.c_rel[key] + n > self.c_acq[key]:
                raise ExecutionError("RELEASE_UNACQUIRED", f"{key} releases more objects of {self.fifo.name} than held")
            self.c_rel[key] += n

    def waiting(self, role: str, key: str) -> str:
        if role == "prod":
            return f"{self.p_acq - min(self.c_rel.values(), default=0)} of {self.depth} slots busy"
        return f"{self.p_rel - self.c_acq[key]} objects ready"


@dataclass
class _Proc:
    """A coroutine on the array: a worker program, a link, or one runtime DMA task."""

    name: str
    kind: str  # "worker" | "link" | "task"
    gen: Iterator
    roles: dict[str, str]  # fifo -> "prod" | "cons"
    key: str  # consumer key in the rings
    pending: Acquire | None = None
    reply: object = None
    done: bool = False
    acquired: dict[str, int] = field(default_factory=dict)


def _fill(task: RuntimeTask, fifo: ObjectFifo, ddr: torch.Tensor, partial: dict[str, tuple]) -> Iterator:
    """Fill whole objects; a task that ends inside an object leaves it acquired in ``partial`` for the next task of
    the fifo, which completes and releases it: a chain of buffer descriptors on one shim channel gathering one
    object from several tensors (a fused RMSNorm's x and norm weight, ``kernels.gemv.matvec_dataflow``)."""
    idx = torch.from_numpy(task.tap.indices())
    n = fifo.obj_elements
    pos = 0
    while pos < len(idx):
        if task.fifo in partial:
            buf, filled = partial.pop(task.fifo)
        else:
            (buf,) = yield Acquire(task.fifo, 1)
            filled = 0
        take = min(n - filled, len(idx) - pos)
        buf.view(-1)[filled : filled + take] = ddr[idx[pos : pos + take]]
        pos, filled = pos + take, filled + take
        if filled < n:
            partial[task.fifo] = (buf, filled)
        else:
            yield Release(task.fifo, 1)


def _drain(task: RuntimeTask, fifo: ObjectFifo, ddr: torch.Tensor) -> Iterator:
    idx = torch.from_numpy(task.tap.indices())
    n = fifo.obj_elements
    for j in range(len(idx) // n):
        bufs = yield Acquire(task.fifo, 1)
        ddr[idx[j * n : (j + 1) * n]] = bufs[0].reshape(-1)
        yield Release(task.fifo, 1)


def _link(lk: FifoLink, fifos: dict[str, ObjectFifo]) -> Iterator:
    """Memory-tile link: runs for ever (like a BD chain); idling on an empty source at the end is normal."""
    while True:
        if lk.kind == "join":
            (dst,) = yield Acquire(lk.dsts[0], 1)
            flat = dst.view(-1)
            for src_name, off in zip(lk.srcs, lk.offsets, strict=True):
                (src,) = yield Acquire(src_name, 1)
                flat[off : off + fifos[src_name].obj_elements] = src.reshape(-1)
                yield Release(src_name, 1)
            yield Release(lk.dsts[0], 1)
        else:
            (src,) = yield Acquire(lk.srcs[0], 1)
            flat = src.reshape(-1)
            for dst_name, off in zip(lk.dsts, lk.offsets or (0,), strict=True):
                (dst,) = yield Acquire(dst_name, 1)
                dst.view(-1).copy_(flat[off : off + fifos[dst_name].obj_elements])
                yield Release(dst_name, 1)
            yield Release(lk.srcs[0], 1)


class _Machine:
    def __init__(self, design: Design, inputs: dict[str, torch.Tensor]) -> None:
        self.design = design
        self.fifos = {f.name: f for f in design.fifos}
        self.ddr: dict[str, torch.Tensor] = {k: v.reshape(-1).clone() for k, v in inputs.items()}
        for spec in design.outputs:
            dt = torch_dtype(spec.dtype)
            self.ddr[spec.name] = torch.full((spec.n_elements,), _poison(dt), dtype=dt)
        self.rings = {
            f.name: _Ring(f, [str(c) for c in design.consumers(f.name)], uses_shared_memory(design, f))
            for f in design.fifos
        }
        self.scratch: dict[str, dict] = {w.name: {} for w in design.workers}
        self.partial: dict[str, tuple] = {}  # fifo -> (object, elements filled) a fill task left open (_fill)
        self.workers = [
            _Proc(
                w.name,
                "worker",
                w.run_program(),
                {**{f: "cons" for f in w.inputs}, **{f: "prod" for f in w.outputs}},
                w.name,
            )
            for w in design.workers
        ]
        self.links = [
            _Proc(
                lk.name,
                "link",
                _link(lk, self.fifos),
                {**{f: "cons" for f in lk.srcs}, **{f: "prod" for f in lk.dsts}},
                lk.name,
            )
            for lk in design.links
        ]
        self.ops = 0

    def task_proc(self, task: RuntimeTask) -> _Proc:
        fifo = self.fifos[task.fifo]
        if task.kind == "fill":
            gen = _fill(task, fifo, self.ddr[task.tensor], self.partial)
        else:
            gen = _drain(task, fifo, self.ddr[task.tensor])
        role = "prod" if task.kind == "fill" else "cons"
        return _Proc(f"{task.kind} {task.tensor}->{task.fifo}", "task", gen, {task.fifo: role}, "shim")

    def step(self, p: _Proc) -> bool:
        """Run ``p`` until it blocks or ends; True if it did anything."""
        progressed = False
        while not p.done:
            self.ops += 1
            if self.ops > MAX_OPS:
                raise ExecutionError("RUNAWAY", f"more than {MAX_OPS} operations; use a smaller shape on the tile path")
            op = p.pending
            if op is None:
                try:
                    op = p.gen.send(p.reply)
                except StopIteration:
                    p.done = True
                    return True
                p.reply = None
            if isinstance(op, Acquire):
                role = self._role(p, op.fifo)
                ring = self.rings[op.fifo]
                if not ring.can_acquire(role, p.key, op.n):
                    p.pending = op
                    return progressed
                p.pending = None
                p.reply = ring.acquire(role, p.key, op.n)
                p.acquired[op.fifo] = p.acquired.get(op.fifo, 0) + op.n
            elif isinstance(op, Release):
                self.rings[op.fifo].release(self._role(p, op.fifo), p.key, op.n)
            elif isinstance(op, Call):
                w = self.design.worker(p.name)
                ctx = CallContext(w.name, op.iteration, op.step, op.steps, self.scratch[w.name], w.kernel.params)
                w.kernel.fn(list(op.inputs), list(op.outputs), ctx)
            else:
                raise ExecutionError("BAD_OP", f"{p.name} yielded {op!r}; programs yield Acquire, Release or Call")
            progressed = True
        return progressed

    def _role(self, p: _Proc, fifo: str) -> str:
        if fifo not in p.roles:
            raise ExecutionError("BAD_OP", f"{p.name} touches fifo {fifo}, which is not one of its fifos")
        return p.roles[fifo]

    def blocked_report(self, procs: list[_Proc]) -> str:
        lines = []
        for p in procs:
            if p.done or p.pending is None:
                continue
            role = self._role(p, p.pending.fifo)
            what = "a free slot of" if role == "prod" else "an object of"
            state = self.rings[p.pending.fifo].waiting(role, p.key)
            lines.append(f"{p.name} waits for {what} {p.pending.fifo} ({state})")
        return "; ".join(lines[:8]) + (f"; ... {len(lines) - 8} more" if len(lines) > 8 else "")

    def run(self) -> dict[str, torch.Tensor]:
        groups = self.design.runtime.groups()
        for group in groups:
            # one queue per shim channel, run in order: a fifo's own, or the one it rides (ObjectFifo.rides_with), so
            # a rider queued behind the transfers its consumers need after it deadlocks here as on the array
            queues: dict[tuple[str, str], list[_Proc]] = {}
            for t in group:
                queues.setdefault((t.kind, self.fifos[t.fifo].channel), []).append(self.task_proc(t))
            while any(queues.values()):
                active = [q[0] for q in queues.values() if q]
                progress = False
                for p in self.workers + self.links + active:
                    progress |= self.step(p)
                for q in queues.values():
                    while q and q[0].done:
                        q.pop(0)
                        progress = True
                if not progress:
                    raise ExecutionError(
                        "DEADLOCK",
                        f"design {self.design.name} stalls in task group {group[0].group}: "
                        + self.blocked_report(self.workers + self.links + active),
                    )
        # after the last group, workers must be able to finish on what is already buffered
        while not all(p.done for p in self.workers):
            progress = False
            for p in self.workers + self.links:
                progress |= self.step(p)
            if not progress:
                raise ExecutionError(
                    "DEADLOCK",
                    f"design {self.design.name}: the runtime sequence finished but "
                    + self.blocked_report(self.workers + self.links),
                )
        self._check_summaries()
        self._check_leftovers()
        return {s.name: self.ddr[s.name].reshape(s.shape) for s in self.design.outputs}

    def _check_summaries(self) -> None:
        for p in self.workers:
            want = self.design.worker(p.name).total_acquires()
            got = {f: p.acquired.get(f, 0) for f in want}
            if got != want:
                raise ExecutionError(
                    "PROGRAM_SUMMARY",
                    f"worker {p.name} acquired {got} but its declared summary says {want}; fix acquires/iterations",
                )

    def _check_leftovers(self) -> None:
        for name, ring in self.rings.items():
            for key, taken in ring.c_acq.items():
                if taken != ring.p_rel or ring.c_rel[key] != taken:
                    raise ExecutionError(
                        "FIFO_LEFTOVER",
                        f"fifo {name}: {ring.p_rel} objects produced, consumer {key} took {taken} "
                        f"and released {ring.c_rel[key]}",
                    )


def run_tile(design: Design, inputs: dict[str, torch.Tensor], *, validate: bool = True) -> dict[str, torch.Tensor]:
    """Run the design tile by tile (exact, slow). Validates first unless ``validate=False`` (fault injection)."""
    ins = check_inputs(design.inputs, inputs, f"design {design.name}")
    if validate:
        design = check(design)
    else:
        design = SequentialPlacer().place(design)
    return _Machine(design, ins).run()


# ----------------------------------------------------------------------------------------------------------------------
# Multi-launch groups
# ----------------------------------------------------------------------------------------------------------------------
def _run_group(group: MultiLaunchGroup, inputs: Mapping[str, torch.Tensor], run_one) -> dict[str, torch.Tensor]:
    bindings = {(b.dst_launch, b.dst_tensor): (b.src_launch, b.src_tensor) for b in group.bindings}
    results: dict[str, torch.Tensor] = {}
    for d in group.designs:
        ins: dict[str, torch.Tensor] = {}
        for spec in d.inputs:
            src = bindings.get((d.name, spec.name))
            key = f"{src[0]}.{src[1]}" if src else f"{d.name}.{spec.name}"
            if key not in (results if src else inputs):
                raise InputError(f"Group {group.name} needs input {key!r} for launch {d.name}; pass it by that name.")
            ins[spec.name] = results[key] if src else inputs[key]
        for name, t in run_one(d, ins).items():
            results[f"{d.name}.{name}"] = t
    return results


def binding_error(problems: list[str], name: str) -> DesignError:
    """The validator's GROUP_BINDING error for a group's binding problems."""
    return DesignError([Violation("GROUP_BINDING", None, f"group {name}: {p}") for p in problems], f"group {name}")


def check_bindings(group: MultiLaunchGroup) -> None:
    """GROUP_BINDING when a launch reads a tensor no earlier launch writes (or of another shape): a group edited
    after it was built (an argument renamed in one launch) fails before computing anything."""
    problems = group.binding_problems()
    if problems:
        raise binding_error(problems, group.name)


def run_group_fast(
    group: MultiLaunchGroup, inputs: Mapping[str, torch.Tensor], *, exact: bool = False, validate: bool = True
) -> dict[str, torch.Tensor]:
    """Every launch's fast path in order on the bound tensors; inputs and outputs keyed ``<launch>.<tensor>``.

    Like ``run_fast``, the launches are validated first (an illegal design must not produce numbers); a caller
    that already validated them (``kernels.fuse.build_group(validate=True)``, a plan's ``KernelLibrary``) passes
    ``validate=False``. The bindings are re-checked either way (``check_bindings``).
    """
    if validate:
        group = check_group(group)
    else:
        check_bindings(group)
    return _run_group(group, inputs, lambda d, ins: run_fast(d, ins, exact=exact, validate=False))


def run_group_tile(group: MultiLaunchGroup, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    group = check_group(group)
    return _run_group(group, inputs, lambda d, ins: run_tile(d, ins))
