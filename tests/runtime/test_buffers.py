from __future__ import annotations

import pytest
import torch

from tilepilot.plan.plan import HostPolicy
from tilepilot.runtime.buffers import BufferPool, StaleBufferError, SyncCostModel

COSTS = SyncCostModel(sync_s=lambda n: 1e-5 + n / 1e10, fixed_s=1e-5, alloc_s=2e-5, handoff_s=lambda n: 1e-5 + n / 1e10)


def pool(**kw) -> BufferPool:
    trust = kw.pop("trust_static", True)
    return BufferPool(HostPolicy(**kw), COSTS, trust_static=trust)


def run_iron_like_chain(p: BufferPool, steps: int = 3) -> torch.Tensor:
    """A toy two-dispatch chain per step: host input -> kernel A -> kernel B -> host."""
    w = p.weight("w", torch.full((4,), 2.0))
    out = None
    for s in range(steps):
        x = p.buffer("x")
        x.write(torch.full((4,), float(s)))
        a = p.buffer("a")
        p.produced(a, p.device_view(x) * p.weight_view(w))
        b = p.buffer("b")
        p.produced(b, p.device_view(a) + 1)
        out = p.host_view(b)
    return out


@pytest.mark.parametrize(
    "policy",
    [
        {},
        {"weights": "preloaded"},
        {"skip_unchanged_writes": True},
        {"zero_copy": True},
        {"reuse_buffers": True},
        {"weights": "preloaded", "skip_unchanged_writes": True, "zero_copy": True, "reuse_buffers": True},
        {"skip_unchanged_writes": True, "handoff": "host"},
    ],
)
def test_policies_change_cost_never_results(policy):
    base = pool()
    ref = run_iron_like_chain(base)
    p = pool(**policy)
    assert torch.equal(run_iron_like_chain(p), ref)
    if policy:
        assert p.stats.modeled_s < base.stats.modeled_s


def test_preloaded_weights_upload_once_and_per_call_every_use():
    pre, per = pool(weights="preloaded"), pool(weights="per_call")
    for p in (pre, per):
        w = p.weight("w", torch.ones(8))
        for _ in range(5):
            p.weight_view(w)
    assert pre.stats.to_device == 1
    assert per.stats.to_device == 5


def test_skip_unchanged_keeps_device_values_on_device():
    p = pool(skip_unchanged_writes=True)
    run_iron_like_chain(p, steps=2)
    # per step: x written once; a stays on the device; b is read back once for the host
    assert p.stats.to_device == 2 + 2  # two x writes + two per-call weight uploads
    assert p.stats.from_device == 2
    q = pool()
    run_iron_like_chain(q, steps=2)
    assert q.stats.from_device == 4  # a and b read back every step


def test_host_handoff_copies_every_activation_input_and_maps_results_zero_copy():
    """The paper's separate XRT kernels: each dispatch's activation inputs are copied into its own buffers (BO Write),
    a result is read on the host through a zero-copy view (BO Read: the fixed cost only), static inputs skipped."""
    p = pool(skip_unchanged_writes=True, weights="preloaded", handoff="host")
    w = p.weight("w", torch.full((256,), 2.0))
    x = p.buffer("x")
    x.write(torch.ones(256))
    a = p.buffer("a")
    p.produced(a, p.device_view(x) * p.weight_view(w))
    before = p.stats.modeled_s
    assert torch.equal(p.device_view(a), torch.full((256,), 2.0))  # dispatch B reads A's result
    assert p.stats.modeled_s - before == pytest.approx(COSTS.fixed_s + COSTS.sync_s(a.nbytes))
    p.device_view(x)  # a second dispatch reading the same host input writes it into its own buffer again
    assert p.stats.to_device == 1 + 3  # the weight's one upload, x twice, a once
    assert p.stats.from_device == 1
    dev = pool(skip_unchanged_writes=True, weights="preloaded")  # device handoff: a stays, x is written once
    x2, a2 = dev.buffer("x"), dev.buffer("a")
    x2.write(torch.ones(256))
    dev.produced(a2, dev.device_view(x2))
    dev.device_view(a2)
    dev.device_view(x2)
    assert dev.stats.to_device == 1 and dev.stats.from_device == 0


def test_static_buffer_that_changes_gives_stale_results_unless_checked():
    p = pool()
    t = p.buffer("table", kind="table")
    t.write(torch.tensor([1.0]))
    p.mark_static("table")
    assert p.device_view(t).item() == 1.0  # first call correct
    t.write(torch.tensor([2.0]))
    assert p.device_view(t).item() == 1.0  # stale: the device still holds the first upload
    checked = pool(trust_static=False)
    t = checked.buffer("table", kind="table", static=True)
    t.write(torch.tensor([1.0]))
    checked.device_view(t)
    t.write(torch.tensor([2.0]))
    with pytest.raises(StaleBufferError, match="marked static"):
        checked.device_view(t)


def test_reuse_buffers_allocates_once():
    reuse, fresh = pool(reuse_buffers=True), pool()
    for p in (reuse, fresh):
        for _ in range(4):
            p.buffer("x")
    assert reuse.stats.allocs == 1
    assert fresh.stats.allocs == 4


def test_zero_copy_buffers_cannot_go_stale():
    p = pool(zero_copy=True)
    t = p.buffer("table", kind="table", static=True)
    t.write(torch.tensor([1.0]))
    p.device_view(t)
    t.write(torch.tensor([2.0]))
    assert p.device_view(t).item() == 2.0


def test_a_host_handoff_is_priced_at_the_handoff_rate_not_a_weight_syncs():
    """The paper's handoff copies an activation through its Python host (calibration's host_handoff_bytes_per_s);
    a weight upload or a device-handoff write stays an XRT sync (host_copy_bytes_per_s)."""
    costs = SyncCostModel(sync_s=lambda n: 1e-5 + n / 1e10, fixed_s=1e-5, alloc_s=2e-5, handoff_s=lambda n: n / 1e8)
    p = BufferPool(HostPolicy(skip_unchanged_writes=True, weights="preloaded", handoff="host"), costs)
    w = p.weight("w", torch.full((256,), 2.0))
    assert p.stats.modeled_s == pytest.approx(costs.sync_s(w.nbytes))
    x = p.buffer("x")
    x.write(torch.ones(256))
    before = p.stats.modeled_s
    p.device_view(x)
    assert p.stats.modeled_s - before == pytest.approx(x.nbytes / 1e8)
    d = BufferPool(HostPolicy(skip_unchanged_writes=True, weights="preloaded"), costs)
    y = d.buffer("y")
    y.write(torch.ones(256))
    before = d.stats.modeled_s
    d.device_view(y)
    assert d.stats.modeled_s - before == pytest.approx(costs.sync_s(y.nbytes))
