"""``parallel.fork_map``: independent fits on forked workers, the same results in the same order as a plain map."""

from __future__ import annotations

import os
import subprocess
import sys

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
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0.0, 1.0, 2.0]"
