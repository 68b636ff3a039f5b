"""``parallel.fork_map``: independent fits on forked workers, the same results in the same order as a plain map."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tilepilot import parallel
from tilepilot.errors import InputError
from tilepilot.parallel import default_jobs, fork_map


class Refused(Exception):
    """An error type of this test: what a worker raised must reach the caller as itself."""


def test_workers_return_the_plain_maps_results_in_the_items_order():
    offset = {"by": 7}  # a closure over local state: inherited by the fork, never pickled

    def work(x):
        return x * x + offset["by"], os.getpid()

    got = fork_map(work, range(9), jobs=3)
    assert [r for r, _ in got] == [x * x + 7 for x in range(9)]
    pids = {pid for _, pid in got}
    assert os.getpid() not in pids and 1 <= len(pids) <= 3  # computed in workers, at most three of them


def test_one_job_or_one_item_runs_in_this_process():
    seen = []

    def work(x):
        seen.append(x)
        return os.getpid()

    assert fork_map(work, [1, 2, 3], jobs=1) == [os.getpid()] * 3 and seen == [1, 2, 3]
    assert fork_map(work, [4], jobs=4) == [os.getpid()] and seen[-1] == 4


def test_an_error_in_a_worker_is_raised_here_as_itself():
    def work(x):
        if x == 2:
            raise Refused(f"item {x} refused")
        return x

    with pytest.raises(Refused, match="item 2 refused"):
        fork_map(work, range(4), jobs=2)


def test_an_item_that_fails_only_in_a_worker_is_computed_here():
    """An item whose worker raised, died, or returned what does not pickle is run again in this process: the map
    still returns every result, in order."""
    here = os.getpid()

    def work(x):
        if os.getpid() != here:
            if x == 1:
                raise Refused("only in a worker")
            if x == 3:
                return lambda: x  # a closure does not pickle back
        return x, os.getpid()

    got = fork_map(work, range(5), jobs=2)
    assert [g[0] for g in got] == [0, 1, 2, 3, 4]
    assert [g[1] == here for g in got] == [False, True, False, True, False]  # 1 and 3 again here, the rest not


def test_a_worker_killed_mid_map_leaves_its_items_to_this_process():
    here = os.getpid()

    def work(x):
        if os.getpid() != here and x == 2:
            os._exit(3)  # as the OOM killer would: the pool is broken
        return x * 10

    assert fork_map(work, range(6), jobs=2) == [0, 10, 20, 30, 40, 50]


def test_a_map_inside_a_worker_runs_in_that_worker():
    def inner(x):
        return os.getpid()

    def outer(x):
        return os.getpid(), fork_map(inner, range(3), jobs=2)

    for pid, inner_pids in fork_map(outer, range(2), jobs=2):
        assert inner_pids == [pid] * 3


def test_the_default_is_the_environments_or_the_cpus_at_most_the_cap(monkeypatch):
    monkeypatch.setenv(parallel.JOBS_ENV, "3")
    assert default_jobs() == 3
    monkeypatch.delenv(parallel.JOBS_ENV)
    assert 1 <= default_jobs() <= parallel.MAX_DEFAULT_JOBS
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(parallel.JOBS_ENV, bad)
        with pytest.raises(InputError, match="TILEPILOT_JOBS"):
            default_jobs()


def test_a_worker_computes_tensors_after_the_parent_has(tmp_path):
    """A fork of a process whose PyTorch thread pool has run hangs at the child's first parallel tensor op unless the
    worker drops to one thread (``_start_worker``). Run in a subprocess with a timeout: a regression hangs."""
    script = tmp_path / "fork_torch.py"
    script.write_text(
        "import torch\n"
        "from tilepilot.parallel import fork_map\n"
        "a = torch.randn(512, 512)\n"
        "(a @ a).sum()\n"
        "print(fork_map(lambda x: float((a @ a).sum()) * 0 + x, [0, 1, 2], 2))\n"
    )
    assert _run_alone(script, 120) == "[0.0, 1.0, 2.0]"


def test_the_workers_die_with_their_parent(tmp_path):
    """A parent killed from outside (a timeout, the OOM killer) takes its workers with it: none is left waiting
    on its task queue as a copy of a deployment process."""
    script = tmp_path / "killed_parent.py"
    script.write_text(
        "import os, signal, time\n"
        "from tilepilot.parallel import fork_map\n"
        "def work(x):\n"
        "    if x == 0:\n"
        "        print(os.getpid(), flush=True)\n"
        "        os.kill(os.getppid(), signal.SIGKILL)\n"
        "    time.sleep(60)\n"
        "fork_map(work, range(2), 2)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        worker = int(proc.stdout.readline())
        proc.wait(timeout=60)
        for _ in range(100):  # the parent-death signal is delivered at once; give the kernel a moment
            if not _alive(worker):
                break
            time.sleep(0.1)
        assert not _alive(worker)
    finally:
        _kill_group(proc)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has ended; only its entry waits for a reaper
    except FileNotFoundError:
        return False


def _kill_group(proc: subprocess.Popen) -> None:
    """End the test's subprocess and any worker it left (they share its session's process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _run_alone(script, timeout: float) -> str:
    """Run ``script`` in its own process group; on a timeout (a hang) kill the group, workers included."""
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise
    assert proc.returncode == 0, err
    return out.strip()


def test_ctrl_c_ends_the_workers_at_once(tmp_path):
    """An interrupt in the parent (SIGINT, here from an alarm) cancels what is queued and terminates the running
    fits instead of waiting for them, and the parent exits with the interrupt."""
    script = tmp_path / "interrupted.py"
    script.write_text(
        "import signal, time\n"
        "from tilepilot.parallel import fork_map\n"
        "def stop(*_):\n"
        "    raise KeyboardInterrupt\n"
        "signal.signal(signal.SIGALRM, stop)\n"
        "signal.alarm(1)\n"
        "t = time.monotonic()\n"
        "try:\n"
        "    fork_map(lambda x: time.sleep(30), range(4), 2)\n"
        "except KeyboardInterrupt:\n"
        "    print(round(time.monotonic() - t))\n"
    )
    t = time.monotonic()
    assert int(_run_alone(script, 60)) < 10 and time.monotonic() - t < 20


def test_the_default_takes_no_more_workers_than_memory_holds_copies_of_this_process(monkeypatch):
    monkeypatch.setenv(parallel.JOBS_ENV, "4")
    room = parallel.copies_memory_holds()
    assert room is None or room >= 0  # read from /proc where there is one
    monkeypatch.setattr(parallel, "copies_memory_holds", lambda: 0)  # no room for a copy: work here
    assert fork_map(lambda x: os.getpid(), range(3)) == [os.getpid()] * 3
    monkeypatch.setattr(parallel, "copies_memory_holds", lambda: 2)
    assert len(set(fork_map(lambda x: (os.getpid(), __import__("time").sleep(0.2))[0], range(6)))) <= 2
    assert os.getpid() not in fork_map(lambda x: os.getpid(), range(3), jobs=3)  # an explicit count is taken as is
