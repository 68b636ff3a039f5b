"""The ``air-q4`` built-in plan: AIR's Q4NX deployment for any model shape, and ``bench --plan air-q4``."""

from __future__ import annotations

import json

import pytest
import torch

from tilepilot.cli import main
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.quant import deployment_weights
from tilepilot.model.zoo import get_zoo_model, zoo_names
from tilepilot.oracle.model import Oracle
from tilepilot.plan.air_q4 import KV_WINDOW_STEP, air_q4_plan, fused_stage
from tilepilot.plan.builtin import builtin_plan, paper_like_plan
from tilepilot.plan.plan import KV_TEMPLATE_ROWS, validate_plan
from tilepilot.runtime.dispatcher import KernelLibrary
from tilepilot.runtime.runner import NpuRunner
from tilepilot.runtime.timing import time_plan

TIMED = ("llama-3.2-1b", "smollm2-1.7b", "qwen2.5-0.5b", "qwen3-0.6b")


@pytest.mark.parametrize("name", zoo_names())
def test_air_q4_builds_and_times_for_every_seed_shape(name):
    spec = get_zoo_model(name).spec()
    plan = builtin_plan("air-q4", spec)
    assert plan.name == "air-q4" and validate_plan(plan) == []
    assert plan.weight_format().format == "q4_1"
    assert plan.decode.one_dispatch and all(g.where == "npu" for g in plan.decode.groups())
    assert plan.decode.kv_windows[0] == KV_WINDOW_STEP and max(plan.decode.kv_windows) == KV_TEMPLATE_ROWS
    assert {c.family for g in plan.prefill.block for c in g.calls} >= {"gemm"}  # bf16 prefill after dequantization
    qgemv = [c.config for g in plan.decode.block for c in g.calls if c.family == "qgemv"]
    assert qgemv and all(c["fmt"] == "q4_1" for c in qgemv)
    # AIR's attention units each take whole KV heads: no tiling that splits a head's keys over stages
    attention = [c.config for g in plan.decode.block for c in g.calls if c.family == "attention"]
    assert attention and not any(c.get("group_rows") for c in attention)
    if name in TIMED:  # one shape per family is timed (benchmarks/quantized.py times all of them)
        t = time_plan(plan, spec, prompt_len=256)
        assert t.dispatches["decode"] == 1 and t.decode_tok_s > 0 and t.ttft_s > 0


def test_the_variants_air_measured_are_plans_of_their_own():
    spec = get_zoo_model("llama-3.2-1b").spec()
    base = paper_like_plan(spec)
    one = air_q4_plan(base, weight_channels=1, windowed=False)
    two = air_q4_plan(base, weight_channels=2, windowed=False)
    win = air_q4_plan(base, weight_channels=2, windowed=True)
    assert {c.config["weight_channels"] for g in one.decode.block for c in g.calls if c.family == "qgemv"} == {1}
    assert 2 in {c.config["weight_channels"] for g in two.decode.block for c in g.calls if c.family == "qgemv"}
    assert one.decode.kv_windows == two.decode.kv_windows == [KV_TEMPLATE_ROWS]
    lib = KernelLibrary()
    padded, windowed = (time_plan(p, spec, prompt_len=1024, library=lib) for p in (two, win))
    assert windowed.decode_s_per_token < padded.decode_s_per_token  # fewer KV bytes at a 1k context
    assert windowed.ttft_s == padded.ttft_s  # prefill is the same plan
    with pytest.raises(Exception, match="weight_channels"):
        air_q4_plan(base, weight_channels=3)


def test_air_q4_runs_the_deployed_model(zoo_model):
    ck = load_checkpoint(zoo_model("qwen2.5-0.5b", layers=1))
    plan = builtin_plan("air-q4", ck.spec)
    runner = NpuRunner(plan, ck)
    oracle = Oracle(deployment_weights(ck, plan.weight_format()))
    ids = [2, 7, 11]
    runner.prefill(ids)
    oracle.prefill(ids)
    a, b = runner.decode(4).logits[-1], oracle.decode(4).logits[-1]
    assert torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=0) > 0.999


def test_bench_a_model_dir_with_the_air_q4_plan(zoo_model, capsys):
    model_dir = zoo_model("llama-3.2-1b", layers=1)
    rc = main(["bench", str(model_dir), "--plan", "air-q4", "--prompt-len", "64", "--decode-tokens", "1", "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert res["plan"] == "air-q4" and res["modeled"]["dispatches_per_token"]["decode"] == 1
    assert "modeled" in res["modeled"]["clock"]


def test_a_one_dispatch_decode_reads_as_one_per_token_not_zero_per_layer():
    """A stage whose whole pass is one dispatch has no dispatch of its own per layer (0); the summaries people read
    say one per token instead, and a per-layer stage keeps its count."""
    spec = get_zoo_model("llama-3.2-1b").spec(layers=2)
    one = fused_stage(paper_like_plan(spec))
    assert one is not None and one.dispatches_per_layer("decode") == 0
    assert one.dispatches_text() == "dispatches 3/layer prefill, 1/token decode"
    assert paper_like_plan(spec).dispatches_text() == "dispatches 3/layer prefill, 2/layer decode"
