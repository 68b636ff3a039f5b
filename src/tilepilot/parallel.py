"""Independent pieces of one search run in forked worker processes (``fork_map``).

A deployment's longest step is the resident decode's search: it fits the decode pass in several structures, each fit
a deterministic function of its plan that takes seconds to a minute of one core. The fits are independent, so they
can run side by side on the machine's cores. Forked workers inherit the function (usually a closure over a
deployment's context) and the items as they are, with every cache already warm; only results travel back, pickled.
Results come back in the items' order, so a search that takes the first best of them is the same search on one
process or on many: the number of workers changes wall-clock time, never a result.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

from tilepilot.errors import InputError

T = TypeVar("T")
R = TypeVar("R")

# Environment variable that sets the default number of worker processes (1 = everything in this process).
JOBS_ENV = "TILEPILOT_JOBS"
# The default never takes more workers than this, however many CPUs the machine has: each worker is a copy-on-write
# fork of a deployment process that may hold a few GiB, and a search rarely has more independent fits than this.
MAX_DEFAULT_JOBS = 8

# What the forked workers run: set by ``fork_map`` just before the pool forks, read by ``_run`` in the child.
_WORK: tuple[Callable[[Any], Any], list[Any]] | None = None
# True inside a worker: a map there runs in the worker itself (no pool inside a pool).
_IN_WORKER = False
# One map at a time per process (``_WORK`` is read when the workers fork); re-entrant for a map inside the re-run of
# an item here.
_ONE_MAP = threading.RLock()


def default_jobs() -> int:
    """Worker processes a search may use: ``TILEPILOT_JOBS`` when set, else the CPUs this process may run on, at
    most ``MAX_DEFAULT_JOBS``."""
    raw = os.environ.get(JOBS_ENV)
    if raw is not None and raw.strip():
        try:
            jobs = int(raw)
        except ValueError:
            jobs = 0
        if jobs < 1:
            raise InputError(f"{JOBS_ENV}={raw!r} is not a number of worker processes; set it to 1 or more.")
        return jobs
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_DEFAULT_JOBS, cpus))


def copies_memory_holds() -> int | None:
    """How many more copies of this process the machine's available memory holds (None where it cannot be read).
    A forked worker shares its parent's pages until it writes them, and Python's reference counts write to every
    object it touches, so a worker is counted as a whole copy: a default that stays safe for a large model."""
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        with open("/proc/self/statm") as f:
            resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return available // max(resident, 1)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _start_worker(parent: int) -> None:
    """A forked worker's first step: die with the parent, leave Ctrl-C to it, and run torch on one thread.

    A worker of a parent killed from outside would otherwise wait on its task queue forever, a copy of a process
    that may hold GiB (Linux's parent-death signal ends it). Ctrl-C reaches the whole terminal process group; the
    parent ends the workers itself (``fork_map``). The parent's intra-op thread pool (PyTorch's OpenMP threads,
    started by any tensor work it did) does not survive a fork: the child's first parallel region would wait for
    threads it does not have, forever. One thread in the worker is what PyTorch's own DataLoader workers do."""
    global _IN_WORKER
    _IN_WORKER = True
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # no prctl here: the parent's own shutdown still ends the workers
            pass
    if os.getppid() != parent:  # the parent died before the signal was set
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _run(i: int) -> tuple[bool, Any]:
    assert _WORK is not None
    fn, items = _WORK
    try:
        return True, fn(items[i])
    except Exception:  # the parent runs this item again, so the error is raised where the caller can catch it
        return False, None


def fork_map(fn: Callable[[T], R], items: Iterable[T], jobs: int | None = None) -> list[R]:
    """``[fn(x) for x in items]``, computed by up to ``jobs`` forked workers and returned in the items' order (None:
    ``default_jobs()``, capped by ``copies_memory_holds()``). ``fn`` must be deterministic and leave nothing behind
    that the caller reads (a worker's side effects die with it), and should compute no tensors (a worker runs torch
    on one thread, whose sums can round differently). An item whose call raises in a worker, whose result does not
    pickle, or whose worker died, is run again here, so the caller sees the real exception or the real result. Off
    Linux, with one job or one item, or inside a worker, it is a plain map in this process. Ctrl-C ends the workers
    at once."""
    todo = list(items)
    n = jobs
    if n is None:  # the default also stays within the memory the machine has for copies of this process
        n, room = default_jobs(), copies_memory_holds()
        n = n if room is None else max(1, min(n, room))
    if n <= 1 or len(todo) <= 1 or _IN_WORKER or not sys.platform.startswith("linux"):
        return [fn(x) for x in todo]
    global _WORK
    with _ONE_MAP:
        _WORK = (fn, todo)
        pool = ProcessPoolExecutor(
            max_workers=min(n, len(todo)),
            mp_context=multiprocessing.get_context("fork"),
            initializer=_start_worker,
            initargs=(os.getpid(),),
        )
        try:
            gc.freeze()  # the workers fork on the first submit: the collector then leaves the shared pages alone
            try:
                futures = [pool.submit(_run, i) for i in range(len(todo))]
            finally:
                gc.unfreeze()
            out = []
            for i, future in enumerate(futures):
                try:
                    ok, got = future.result()
                except Exception:  # the pool broke (a worker killed) or the result did not pickle
                    ok, got = False, None
                out.append(got if ok else fn(todo[i]))
        except BaseException:
            # a fit already running would hold the exit for up to a minute: end the workers (the executor keeps
            # them in ``_processes`` and forgets them on shutdown, so they are taken first)
            procs = list((getattr(pool, "_processes", None) or {}).values())
            for proc in procs:
                proc.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            _WORK = None
        pool.shutdown()
    return out
