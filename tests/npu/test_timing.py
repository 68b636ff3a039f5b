"""Timing model: physical limits hold on hand-built designs, and the model's structure behaves sanely.

The designs here are built with the real IR classes but without kernel functions (timing never runs a
kernel), so shapes can be full size and the tests stay fast.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilepilot.errors import ConfigError, InputError
from tilepilot.npu import timing
from tilepilot.npu.calibration import CALIBRATION, FITTED, Calibration, physical_constants
from tilepilot.npu.design import (
    Design,
    MultiLaunchGroup,
    ObjectFifo,
    Runtime,
    TensorAccessPattern,
    TensorSpec,
    TileKernel,
    Worker,
    forward,
    join,
)
from tilepilot.npu.device import Tile, npu2
from tilepilot.npu.timing import HostCost, time_design, time_dispatch, time_group


def _noop(inputs, outputs, ctx):  # timing never calls kernels
    raise AssertionError("timing must not run kernels")


def eltwise_design(n: int, cols: int = 8, chunk: int = 2048, depth: int = 2, variant: str = "vector") -> Design:
    """c = a + b over n bf16 elements, n split over ``cols`` tiles, 3 DDR streams per tile."""
    per_tile = n // cols
    assert per_tile % chunk == 0
    dev = npu2()
    kernel = TileKernel("eltwise_add", _noop, variant=variant, vector_ops_per_call=chunk, bytes_per_call=6 * chunk)
    fifos, workers, rt = [], [], Runtime()
    for c in range(cols):
        shim = Tile(c, 0)
        names = (f"a{c}", f"b{c}", f"c{c}")
        fifos += [ObjectFifo(nm, (chunk,), "bf16", depth, shim_placement=shim) for nm in names]
        workers.append(
            Worker(f"w{c}", kernel, names[:2], names[2:], iterations=per_tile // chunk, placement=Tile(c, 2))
        )
        for nm, tensor in zip(names, ("a", "b", "c"), strict=True):
            tap = TensorAccessPattern.contiguous((n,), offset=c * per_tile, n=per_tile)
            (rt.drain if tensor == "c" else rt.fill)(nm, tensor, tap)
    return Design(
        name=f"add_{n}",
        device=dev,
        inputs=[TensorSpec("a", (n,)), TensorSpec("b", (n,))],
        outputs=[TensorSpec("c", (n,))],
        fifos=fifos,
        workers=workers,
        runtime=rt,
        meta={"family": "eltwise"},
    )


def gemm_design(
    M: int,
    K: int,
    N: int,
    rows: int = 4,
    cols: int = 8,
    tm: int = 64,
    tk: int = 32,
    tn: int = 128,
    variant: str = "vector",
    depth: int = 2,
    groups: int = 1,
) -> Design:
    """C[M,N] = A[M,K] @ B[K,N] on rows x cols tiles: A per row broadcast across columns, B forwarded per column
    through a memory tile and broadcast down it, C joined per column at the memory tile."""
    assert M % (rows * tm) == 0 and N % (cols * tn) == 0 and K % tk == 0
    m_blocks, n_blocks, k_steps = M // (rows * tm), N // (cols * tn), K // tk
    kernel = TileKernel("gemm", _noop, variant=variant, macs_per_call=tm * tk * tn)
    fifos, links, workers, rt = [], [], [], Runtime()
    for r in range(rows):
        fifos.append(ObjectFifo(f"A{r}", (tm, tk), "bf16", depth, shim_placement=Tile(r % cols, 0)))
    for c in range(cols):
        fifos.append(ObjectFifo(f"B{c}_l2", (tk, tn), "bf16", depth, shim_placement=Tile(c, 0)))
        fifos.append(ObjectFifo(f"B{c}", (tk, tn), "bf16", depth))
        links.append(forward(f"fwdB{c}", f"B{c}_l2", f"B{c}", placement=Tile(c, 1)))
        fifos.append(ObjectFifo(f"C{c}", (rows * tm, tn), "bf16", depth, shim_placement=Tile(c, 0)))
        srcs = [f"C{r}_{c}" for r in range(rows)]
        fifos += [ObjectFifo(s, (tm, tn), "bf16", depth) for s in srcs]
        links.append(join(f"joinC{c}", srcs, f"C{c}", [r * tm * tn for r in range(rows)], placement=Tile(c, 1)))
        for r in range(rows):
            workers.append(
                Worker(
                    f"w{r}_{c}",
                    kernel,
                    (f"A{r}", f"B{c}"),
                    (f"C{r}_{c}",),
                    iterations=m_blocks * n_blocks,
                    placement=Tile(c, 2 + r),
                    acquires={f"A{r}": k_steps, f"B{c}": k_steps, f"C{r}_{c}": 1},
                    calls_per_iteration=k_steps,
                )
            )
    per_group = max(1, m_blocks // groups)
    for g in range(groups):
        blocks = per_group if g < groups - 1 else m_blocks - per_group * (groups - 1)
        for r in range(rows):  # A rows of this row re-read once per N block
            rt.fill(f"A{r}", "A", TensorAccessPattern((M, K), 0, (n_blocks, blocks * tm, K), (0, K, 1)), g)
        for c in range(cols):
            rt.fill(f"B{c}_l2", "B", TensorAccessPattern((K, N), 0, (blocks, n_blocks, K, tn), (0, 0, N, 1)), g)
            rt.drain(f"C{c}", "C", TensorAccessPattern((M, N), 0, (blocks * rows * tm, n_blocks, tn), (N, 0, 1)), g)
    return Design(
        name=f"gemm_{M}x{K}x{N}",
        device=npu2(),
        inputs=[TensorSpec("A", (M, K)), TensorSpec("B", (K, N))],
        outputs=[TensorSpec("C", (M, N))],
        fifos=fifos,
        links=links,
        workers=workers,
        runtime=rt,
        meta={"family": "gemm"},
    )


# ----------------------------------------------------------------------------------------------------------------------
# physical limits
# ----------------------------------------------------------------------------------------------------------------------
GENEROUS = CALIBRATION.with_efficiency("gemm", 1.0).tuned(loop_overhead_cycles=0.0, dma_hop_latency_cycles=0.0)


@pytest.mark.parametrize("cal", [CALIBRATION, GENEROUS], ids=["default", "generous"])
@pytest.mark.parametrize("variant,peak", [("vector", 256), ("bfp16", 512)])
def test_big_gemm_cannot_beat_peak(cal, variant, peak):
    d = gemm_design(2048, 8192, 2048, variant=variant)
    t = time_design(d, cal)
    dev = d.device
    assert t.macs == 2048 * 8192 * 2048
    floor = t.macs / (peak * dev.n_compute_tiles * dev.clock_hz)
    assert t.seconds >= floor
    assert t.flops_per_s <= 2 * peak * dev.n_compute_tiles * dev.clock_hz


@settings(max_examples=40, deadline=None)
@given(
    tm=st.sampled_from([16, 32, 64]),
    tk=st.sampled_from([16, 32, 64]),
    tn=st.sampled_from([32, 64, 128]),
    rows=st.integers(1, 4),
    cols=st.integers(1, 8),
    eff=st.floats(0.05, 1.0),
    variant=st.sampled_from(["vector", "bfp16", "scalar"]),
)
def test_no_gemm_config_beats_the_array_peak(tm, tk, tn, rows, cols, eff, variant):
    d = gemm_design(rows * tm * 2, tk * 4, cols * tn * 2, rows, cols, tm, tk, tn, variant)
    t = time_design(d, CALIBRATION.with_efficiency("gemm", eff).tuned(loop_overhead_cycles=0.0))
    peak = {"vector": 256, "bfp16": 512, "scalar": 256}[variant]
    assert t.seconds >= t.macs / (peak * rows * cols * d.device.clock_hz)
    assert t.seconds >= t.ddr_bytes / CALIBRATION.ddr_bytes_per_s


@pytest.mark.parametrize("cal", [CALIBRATION, GENEROUS], ids=["default", "generous"])
def test_big_gemv_cannot_beat_ddr_bandwidth(cal):
    # y = x @ W: M=1 row, W (8192 x 2048) streamed once from DDR, 32 tiles.
    d = gemm_design(1, 2048, 8192, rows=1, cols=8, tm=1, tk=256, tn=64)
    t = time_design(d, cal)
    weight_bytes = 2048 * 8192 * 2
    assert t.ddr_read_bytes >= weight_bytes
    assert t.seconds >= weight_bytes / cal.ddr_bytes_per_s
    assert t.ddr_bytes_per_s <= cal.ddr_bytes_per_s


def test_big_eltwise_is_ddr_bound_and_close_to_the_bandwidth():
    n = 8 * 1024 * 1024
    t = time_design(eltwise_design(n))
    assert t.bound == "ddr" and t.limiter == "ddr"
    ideal = 3 * 2 * n / CALIBRATION.ddr_bytes_per_s
    assert ideal <= t.seconds <= 1.02 * ideal


def test_gemm_with_long_k_is_compute_bound():
    t = time_design(gemm_design(1024, 16384, 1024))
    assert t.bound == "compute" and t.limiter.startswith("worker")


def test_adding_a_launch_never_makes_a_group_faster():
    designs = [eltwise_design(1 << 20), gemm_design(256, 256, 1024), eltwise_design(1 << 16, cols=4)]
    prev = 0.0
    for k in range(1, len(designs) + 1):
        g = time_group(MultiLaunchGroup("g", designs[:k]))
        assert g.seconds > prev
        assert g.launches == k
        prev = g.seconds
    one = time_dispatch(designs[0])
    config = timing.tiles_configured(designs[0]) * CALIBRATION.tile_config_s
    assert one.seconds == pytest.approx(CALIBRATION.dispatch_overhead_s + config + time_design(designs[0]).seconds)
    assert timing.tiles_configured(designs[1]) == 32 + 8  # workers + memory tiles


def test_fusing_launches_into_one_dispatch_beats_separate_dispatches():
    a, b = eltwise_design(1 << 20), eltwise_design(1 << 18)
    fused = time_group([a, b]).seconds
    separate = time_dispatch(a).seconds + time_dispatch(b).seconds
    assert fused < separate  # launch_in_group < dispatch_overhead


@settings(max_examples=40, deadline=None)
@given(
    chunk=st.sampled_from([256, 1024, 4096]),
    cols=st.sampled_from([1, 2, 4, 8]),
    reps=st.integers(1, 16),
    variant=st.sampled_from(["vector", "scalar"]),
)
def test_double_buffering_is_never_slower_eltwise(chunk, cols, reps, variant):
    n = chunk * cols * reps
    single = time_design(eltwise_design(n, cols, chunk, depth=1, variant=variant))
    double = time_design(eltwise_design(n, cols, chunk, depth=2, variant=variant))
    assert double.seconds <= single.seconds
    for w1, w2 in zip(single.workers, double.workers, strict=True):
        assert w2.iteration_cycles <= w1.iteration_cycles
        # without double buffering the transfers stop overlapping the kernel (in and out still overlap each other)
        assert w1.iteration_cycles == pytest.approx(w1.compute_cycles + max(w1.dma_in_cycles, w1.dma_out_cycles))
        assert w2.iteration_cycles == pytest.approx(max(w2.compute_cycles, w2.dma_in_cycles, w2.dma_out_cycles))


@settings(max_examples=25, deadline=None)
@given(
    tk=st.sampled_from([16, 32, 64]), tn=st.sampled_from([32, 64, 128]), variant=st.sampled_from(["vector", "bfp16"])
)
def test_double_buffering_is_never_slower_gemm(tk, tn, variant):
    single = time_design(gemm_design(512, 512, 8 * tn * 2, tk=tk, tn=tn, variant=variant, depth=1))
    double = time_design(gemm_design(512, 512, 8 * tn * 2, tk=tk, tn=tn, variant=variant, depth=2))
    assert double.seconds <= single.seconds
    assert all(w.double_buffered for w in double.workers) and not any(w.double_buffered for w in single.workers)


def test_scalar_variant_is_slower_than_vector_and_bfp16_faster_when_compute_bound():
    shape = (1024, 16384, 1024)
    vec = time_design(gemm_design(*shape, variant="vector"))
    sca = time_design(gemm_design(*shape, variant="scalar"))
    bfp = time_design(gemm_design(*shape, variant="bfp16"))
    assert sca.seconds > 10 * vec.seconds
    assert bfp.seconds < vec.seconds
    sca_add, vec_add = (time_design(eltwise_design(1 << 16, cols=1, variant=v)) for v in ("scalar", "vector"))
    assert sca_add.workers[0].compute_cycles > vec_add.workers[0].compute_cycles
    assert sca_add.seconds > vec_add.seconds and sca_add.bound == "compute"


def test_task_groups_add_pipeline_bubbles():
    one = time_design(gemm_design(1024, 1024, 1024, groups=1))
    four = time_design(gemm_design(1024, 1024, 1024, groups=4))
    assert four.ddr_bytes == one.ddr_bytes
    assert four.seconds == pytest.approx(one.seconds + 3 * (one.fill_cycles + one.drain_cycles) / one.clock_hz)


def test_more_tiles_is_faster_when_compute_bound():
    small = time_design(gemm_design(1024, 8192, 1024, rows=2, cols=4, tm=64, tn=128))
    big = time_design(gemm_design(1024, 8192, 1024, rows=4, cols=8, tm=64, tn=128))
    assert big.seconds < small.seconds


def test_timing_is_modeled_and_reports_its_bounds():
    t = time_design(gemm_design(512, 512, 1024))
    assert t.clock == "modeled"
    names = dict(t.limits)
    assert "ddr" in names and any(k.startswith("worker") for k in names)
    assert any(k.startswith("mem tile") for k in names) and any(k.startswith("shim") for k in names)
    assert t.steady_cycles == pytest.approx(max(names.values()))
    assert t.cycles == pytest.approx(t.fill_cycles + t.steady_cycles + t.drain_cycles)
    d = t.to_dict()
    assert d["clock"] == "modeled" and d["workers"][0]["iterations"] == t.workers[0].iterations


# ----------------------------------------------------------------------------------------------------------------------
# memoization and errors
# ----------------------------------------------------------------------------------------------------------------------
def test_memoized_on_structure_not_on_name():
    timing.clear_cache()
    a = gemm_design(512, 512, 1024)
    b = replace(gemm_design(512, 512, 1024), name="renamed")
    ta, tb = time_design(a), time_design(b)
    assert timing._time_structure.cache_info().hits == 1
    assert ta.seconds == tb.seconds and (ta.name, tb.name) == (a.name, "renamed")
    c = gemm_design(512, 512, 1024, depth=1)
    assert timing.structure(c) != timing.structure(a)


def test_memo_distinguishes_calibrations():
    d = eltwise_design(1 << 20)
    slow = CALIBRATION.tuned(ddr_bytes_per_s=35e9)
    assert time_design(d, slow).seconds > time_design(d).seconds


def test_design_with_undeclared_fifo_is_an_input_error():
    d = eltwise_design(1 << 14)
    d.fifos = d.fifos[1:]
    with pytest.raises(InputError, match="does not declare"):
        time_design(d)


def test_empty_dispatch_is_an_input_error():
    with pytest.raises(InputError):
        time_group([])


# ----------------------------------------------------------------------------------------------------------------------
# calibration constants
# ----------------------------------------------------------------------------------------------------------------------
def test_calibration_refuses_impossible_constants():
    with pytest.raises(ConfigError):
        CALIBRATION.with_efficiency("gemm", 1.2)
    with pytest.raises(ConfigError):
        Calibration(ddr_bytes_per_s=200e9)
    with pytest.raises(ConfigError):
        Calibration(dispatch_overhead_s=-1.0)
    with pytest.raises(ConfigError, match="physical"):
        CALIBRATION.tuned(core_load_bytes_per_cycle=1024)
    with pytest.raises(ConfigError, match="Unknown"):
        CALIBRATION.tuned(warp_factor=9)


def test_calibration_lists_fitted_and_physical_constants():
    assert "dispatch_overhead_s" in FITTED and "ddr_bytes_per_s" in FITTED
    assert "core_load_bytes_per_cycle" not in FITTED
    assert CALIBRATION.efficiency("gemm") == dict(CALIBRATION.efficiency_table)["gemm"]
    assert CALIBRATION.efficiency("unknown_family") == CALIBRATION.default_efficiency
    assert CALIBRATION.efficiency("gemm_bias") == CALIBRATION.efficiency("gemm")
    phys = physical_constants(npu2())
    assert phys["clock_hz"] == 1.8e9 and phys["bf16_macs_per_cycle_per_tile"] == 256
    assert phys["stream_bytes_per_cycle_per_channel"] == 8
    assert math.isfinite(CALIBRATION.to_dict()["ddr_bytes_per_s"])
    back = Calibration.from_dict(CALIBRATION.to_dict())
    assert back.to_dict() == CALIBRATION.to_dict() and back == CALIBRATION
    with pytest.raises(ConfigError):
        Calibration.from_dict({"nonsense": 1})


# ----------------------------------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------------------------------
def test_host_costs():
    h = HostCost()
    assert h.sync_s(0) == pytest.approx(CALIBRATION.host_sync_fixed_s)
    assert h.sync_s(2 << 20) - h.sync_s(1 << 20) == pytest.approx((1 << 20) / CALIBRATION.host_copy_bytes_per_s)
    assert h.syncs_s([10, 10]) == pytest.approx(2 * h.sync_s(10))
    assert h.weights_s(1 << 30, preloaded=True) == 0.0
    assert h.weights_s(1 << 30, preloaded=False) == pytest.approx(h.preload_s(1 << 30))
    assert h.cpu_fallback_s(0.0123) == 0.0123
    assert 0 < h.sync_fixed_s < h.sync_s(1) and h.alloc_s() == CALIBRATION.host_alloc_s
    # fitted to AIR's decode attention on the CPU: ~0.3 ms per layer for 4 MiB of KV (calibration.py)
    assert h.cpu_estimate_s(4 << 20) == pytest.approx(0.3e-3, rel=0.05)
    for bad in (lambda: h.sync_s(-1), lambda: h.cpu_fallback_s(-0.1), lambda: h.cpu_estimate_s(-5)):
        with pytest.raises(InputError):
            bad()


def _chain(consumer_tile: Tile) -> Design:
    """shim -> w0 -> x -> w1 -> shim, with w1 either a neighbour of w0 (shared memory) or not."""
    k = TileKernel("eltwise_copy", _noop, vector_ops_per_call=1024)
    fifos = [
        ObjectFifo("i", (1024,), shim_placement=Tile(0, 0)),
        ObjectFifo("x", (1024,)),
        ObjectFifo("o", (1024,), shim_placement=Tile(0, 0)),
    ]
    workers = [
        Worker("w0", k, ("i",), ("x",), iterations=64, placement=Tile(0, 2)),
        Worker("w1", k, ("x",), ("o",), iterations=64, placement=consumer_tile),
    ]
    rt = Runtime().fill("i", "a", TensorAccessPattern.contiguous((65536,)))
    rt.drain("o", "b", TensorAccessPattern.contiguous((65536,)))
    return Design("chain", npu2(), [TensorSpec("a", (65536,))], [TensorSpec("b", (65536,))], fifos, [], workers, rt)


def test_fifo_between_neighbours_costs_no_dma():
    near, far = time_design(_chain(Tile(0, 3))), time_design(_chain(Tile(3, 4)))
    assert near.workers[0].dma_out_cycles == 0 and near.workers[1].dma_in_cycles == 0
    assert far.workers[0].dma_out_cycles > 0 and far.workers[1].dma_in_cycles > 0
    assert timing.structure(_chain(Tile(0, 3))) != timing.structure(_chain(Tile(3, 4)))


def test_shim_channel_rate_caps_streams_from_ddr():
    d = gemm_design(1, 2048, 8192, rows=1, cols=8, tm=1, tk=256, tn=64)
    fast = time_design(d, CALIBRATION.tuned(shim_channel_bytes_per_s=14.4e9))
    slow = time_design(d, CALIBRATION.tuned(shim_channel_bytes_per_s=2e9))
    assert slow.seconds > fast.seconds and slow.limiter.startswith("shim")
    per_column_weights = 2048 * 8192 * 2 / 8
    assert slow.seconds >= per_column_weights / 2e9
