"""time_plan: modeled TTFT/decode of whole plans (every figure is deterministic; cpu='measured' adds wall clock
beside)."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from tilepilot.plan.builtin import builtin_plan, iron_like_plan, paper_like_plan
from tilepilot.runtime.dispatcher import KernelLibrary
from tilepilot.runtime.timing import time_plan


@pytest.fixture(scope="module")
def library():
    return KernelLibrary()


def test_iron_like_is_slower_than_paper_like_for_llama_1b(llama_1b, library):
    iron = time_plan(iron_like_plan(llama_1b), llama_1b, 2048, cpu="estimated", library=library)
    paper = time_plan(paper_like_plan(llama_1b), llama_1b, 2048, cpu="estimated", library=library)
    assert paper.ttft_s < iron.ttft_s
    assert paper.decode_s_per_token < iron.decode_s_per_token
    # fewer dispatches per layer: 3 in prefill, 2 in decode (the published paper-like structure)
    assert paper.dispatches == {"prefill": 16 * 3 + 1, "decode": 16 * 2 + 1}
    assert iron.dispatches["prefill"] > 10 * paper.dispatches["prefill"] / 3
    # sanity: modeled figures are in the range of the published XDNA2 measurements (seconds, not micro/kilo)
    assert 0.2 < paper.ttft_s < 5 and 0.2 < iron.ttft_s < 10
    assert 0.01 < paper.decode_s_per_token < 1
    # preloaded weights are paid once at load, not per token
    assert paper.load_s > 0 and iron.load_s == 0


def test_iron_like_prefill_attention_computes_every_key_block(llama_1b, library):
    """IRON's fused MHA skips no causally masked block (amd/IRON mha/design.py: the key-block loop runs over every
    block of every query block), so the iron-like plan's prefill attention does about twice the work of the
    family's causal-skipping default at 2048 tokens, and its modeled time follows."""
    plan = iron_like_plan(llama_1b)
    (call,) = [c for g in plan.prefill.groups() for c in g.calls if c.family == "attention"]
    assert call.config == {"skip_masked": False}
    skipping = copy.deepcopy(plan)
    for g in skipping.prefill.groups():
        for c in g.calls:
            if c.family == "attention":
                c.config = {}
    every = time_plan(plan, llama_1b, 2048, library=library).group("prefill", "attention")
    causal = time_plan(skipping, llama_1b, 2048, library=library).group("prefill", "attention")
    assert 1.7 < every.dispatch_s / causal.dispatch_s < 2.1


def test_timing_dispatches_match_the_plan(tiny_spec, library):
    for name in ("default", "iron-like", "paper-like"):
        plan = builtin_plan(name, tiny_spec)
        t = time_plan(plan, tiny_spec, 64, cpu="estimated", library=library)
        assert t.dispatches == {s: plan.dispatches_per_token(s) for s in ("prefill", "decode")}
        assert {g.name for g in t.stage_groups("decode")} >= {g.name for g in plan.decode.groups()}
        block = [g for g in t.stage_groups("prefill") if g.part == "block"]
        assert all(g.calls == tiny_spec.n_layers for g in block)
        json.dumps(t.to_dict())


def test_prefill_lm_head_computes_only_the_last_position(tiny_spec, library):
    t = time_plan(paper_like_plan(tiny_spec), tiny_spec, 128, cpu="estimated", library=library)
    assert t.group("prefill", "lm_head").dispatch_s == pytest.approx(t.group("decode", "lm_head").dispatch_s)


@pytest.mark.parametrize(
    "change",
    [
        {"weights": "preloaded"},
        {"zero_copy": True},
        {"skip_unchanged_writes": True},
        {"reuse_buffers": True},
        {"layout": "seq_first"},
    ],
)
def test_each_host_policy_lowers_modeled_ttft(tiny_spec, library, change):
    base = iron_like_plan(tiny_spec)
    better = dataclasses.replace(base, host=dataclasses.replace(base.host, **change))
    t0 = time_plan(base, tiny_spec, 64, cpu="estimated", library=library)
    t1 = time_plan(better, tiny_spec, 64, cpu="estimated", library=library)
    assert t1.ttft_s < t0.ttft_s
    # (durations come from timeline end - start, so equal sums may differ in the last bits)
    assert t1.decode_s_per_token <= t0.decode_s_per_token * (1 + 1e-9)


def test_decode_latency_grows_with_context(tiny_spec, library):
    plan = paper_like_plan(tiny_spec)
    short = time_plan(plan, tiny_spec, 16, context_len=16, cpu="estimated", library=library)
    long = time_plan(plan, tiny_spec, 16, context_len=400, cpu="estimated", library=library)
    assert long.decode_s_per_token > short.decode_s_per_token


def test_cpu_groups_are_modeled_and_their_wall_clock_is_reported_beside(tiny_spec, library):
    modeled = time_plan(builtin_plan("default", tiny_spec), tiny_spec, 16, library=library)
    both = time_plan(builtin_plan("default", tiny_spec), tiny_spec, 16, library=library, cpu="measured")
    assert modeled.cpu_clock == "modeled" and modeled.clock == "modeled"
    g, gm = modeled.group("decode", "attention"), both.group("decode", "attention")
    assert g.cpu_s > 0 and g.cpu_measured_s is None
    # measuring the host beside the model does not move a modeled figure
    assert gm.cpu_measured_s is not None and gm.cpu_measured_s > 0 and gm.cpu_s == g.cpu_s
    assert (both.ttft_s, both.decode_s_per_token) == (modeled.ttft_s, modeled.decode_s_per_token)


def _figures(t):
    return (t.ttft_s, t.decode_s_per_token, t.load_s, [(g.stage, g.name, g.total_s) for g in t.groups])


def _busy(stop) -> None:
    x = 0
    while not stop.is_set():
        x = (x * 31 + 7) % 1000003


def test_modeled_figures_are_identical_under_cpu_load(llama_1b):
    """Issue 11 item 6: the default plan (CPU groups on the host) timed idle and with the CPU busy, fresh caches
    each time: every modeled figure is exactly equal."""
    import multiprocessing as mp
    import threading

    plan = builtin_plan("default", llama_1b)
    idle = time_plan(plan, llama_1b, 256, library=KernelLibrary())
    stop_t, stop_p = threading.Event(), mp.get_context("spawn").Event()
    thread = threading.Thread(target=_busy, args=(stop_t,), daemon=True)
    proc = mp.get_context("spawn").Process(target=_busy, args=(stop_p,), daemon=True)
    thread.start()
    proc.start()
    try:
        busy = time_plan(plan, llama_1b, 256, library=KernelLibrary())
    finally:
        stop_t.set()
        stop_p.set()
        thread.join()
        proc.join(timeout=10)
    assert any(g.cpu_s > 0 for g in idle.groups)  # the plan has CPU groups, so the test means something
    assert _figures(busy) == _figures(idle)


def test_an_illegal_tiling_is_an_error_naming_its_code_never_a_time(llama_1b):
    """Issue 11 item 7: time_plan validates every design it times."""
    import sys
    from pathlib import Path

    from tilepilot.npu.validate import DesignError

    sys.path.insert(0, str(Path(__file__).parent))
    from illegal import with_illegal_up_proj

    bad = with_illegal_up_proj(paper_like_plan(llama_1b))
    with pytest.raises(DesignError) as e:
        time_plan(bad, llama_1b, 256, library=KernelLibrary())
    assert "L1_OVERFLOW" in e.value.codes and "L1_OVERFLOW" in str(e.value)
