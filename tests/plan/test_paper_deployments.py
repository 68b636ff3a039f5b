"""The paper-like plan of each of the paper's nine models reproduces how the paper deployed it (issue 11 item 4)."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from tilepilot.model.graph import CPU_FAMILY, block_graph
from tilepilot.model.zoo import get_zoo_model
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.plan.paper_deployments import PAPER_DEPLOYMENTS, REFERENCE, paper_deployment, shape_key

PUBLISHED = json.loads(resources.files("tilepilot.data").joinpath("published.json").read_text())
MODELS = [d.model for d in PAPER_DEPLOYMENTS]
GLUE = {"resid1", "ffn_norm", "swiglu", "resid2"}  # the M=1 decode glue of xdna2.md


def cpu_ops(plan, stage: str) -> set[str]:
    return {c.op for g in plan.stage(stage).groups() if g.where == "cpu" for c in g.calls}


def test_the_table_is_the_papers_nine_models_with_their_published_dispatch_counts():
    published = PUBLISHED["paper_deployment_structure"]["dispatches_per_layer"]
    assert sorted(MODELS) == sorted(PUBLISHED["paper_autonomous_deployments_2048"]) == sorted(published)
    for d in PAPER_DEPLOYMENTS:
        assert d.dispatches == tuple(published[d.model]), d.model
        assert "xdna2.md" in d.source and d.model in d.source
        assert paper_deployment(get_zoo_model(d.model).spec()) == d  # the zoo config's shape finds its row


@pytest.mark.parametrize("model", MODELS)
def test_paper_like_plan_reproduces_the_papers_deployment(model):
    spec = get_zoo_model(model).spec()
    facts = paper_deployment(spec)
    plan = paper_like_plan(spec)
    assert (plan.dispatches_per_layer("prefill"), plan.dispatches_per_layer("decode")) == facts.dispatches
    # on the CPU: decode attention, the KV-cache writes (profile.md: kv_cache_extract) and the final RMSNorm always,
    # the M=1 glue when decode has no fused cascade
    assert cpu_ops(plan, "prefill") == {"kv_write", "final_norm"}
    glue = set() if facts.decode_cascade else GLUE
    assert cpu_ops(plan, "decode") == {"attention", "kv_write", "final_norm"} | glue
    # separate XRT kernels: activations reach each dispatch through the host (BO Write / BO Read), weights preloaded
    assert plan.host.handoff == "host" and plan.host.weights == "preloaded" and plan.host.skip_unchanged_writes
    # head_dim 128: head-first FlashAttention behind host seq<->head transposes; 64: seq-first
    assert plan.host.layout == ("host_transpose" if spec.head_dim == 128 else "seq_first")
    # QKV bias / per-head QK-norm fused into the attention-input dispatch, in both stages
    extras = {n.op for n in block_graph(spec).block if n.kind in ("bias", "head_norm")}
    assert bool(extras) == (spec.qkv_bias or spec.qk_norm)
    for stage in ("prefill", "decode"):
        first = plan.stage(stage).block[0]
        assert first.where == "npu" and extras <= set(first.ops) and "rope_k" in first.ops
    lm_head = plan.decode.head[-1]
    assert lm_head.where == "npu" and lm_head.ops == ["lm_head"]


@pytest.mark.parametrize("model", MODELS)
def test_the_decode_cascade_fact_follows_the_published_limits(model):
    """xdna2.md: the fused o_gemv_ffn cascade is capped at 4 cascade core-rows (one per 512 of the hidden size)
    and needs an FFN width divisible by 512; the table's decode form agrees with that rule for every model."""
    spec = get_zoo_model(model).spec()
    rule = -(-spec.hidden // 512) <= 4 and spec.intermediate % 512 == 0
    assert paper_deployment(spec).decode_cascade == rule


def test_a_model_the_paper_did_not_deploy_gets_the_reference_deployment(tiny_spec):
    assert paper_deployment(tiny_spec) is None and shape_key(tiny_spec) not in {d.shape for d in PAPER_DEPLOYMENTS}
    plan = paper_like_plan(tiny_spec)
    assert (plan.dispatches_per_layer("prefill"), plan.dispatches_per_layer("decode")) == REFERENCE.dispatches
    assert [g.name for g in plan.prefill.block] == ["rms_gemms_rope", "cpu_kv_cache", "flash_attn", "o_ffn"]
    assert all(c.family == CPU_FAMILY for g in plan.decode.groups() if g.where == "cpu" for c in g.calls)


def test_a_model_cut_to_fewer_layers_keeps_its_deployment():
    spec = get_zoo_model("qwen3-4b").spec()
    cut = type(spec).from_dict({**spec.to_dict(), "n_layers": 2})
    assert paper_deployment(cut) == paper_deployment(spec)
    assert paper_like_plan(cut).dispatches_per_layer("prefill") == 7


@pytest.mark.parametrize("model", ["qwen2.5-0.5b", "qwen3-4b", "llama-3.2-1b"])
def test_paper_like_lm_head_is_partitioned_as_the_paper_deployed_it(model):
    """AIR's Qwen deployments cut the 151936-word head into 19 partitions of 8192 rows (the push_queue repeat-count
    limit); Llama's 128256 words into 8 of 16384. The plan names the partition size and the tiling completes."""
    from tilepilot.kernels import lm_head
    from tilepilot.kernels.bind import make_config

    spec = get_zoo_model(model).spec()
    expected = {"qwen2.5-0.5b": 19, "qwen3-4b": 19, "llama-3.2-1b": 8}[model]
    for stage in ("prefill", "decode"):
        (call,) = [c for g in paper_like_plan(spec).stage(stage).groups() for c in g.calls if c.op == "lm_head"]
        shape = lm_head.Shape(vocab=spec.vocab, k=spec.hidden, m=1)
        cfg = make_config(lm_head, shape, call.config)
        assert len(lm_head.partitions(shape, cfg)) == expected
        assert len(lm_head.make_design(shape, cfg).designs) == expected


def test_a_partial_lm_head_config_that_cannot_tile_is_an_error():
    from tilepilot.kernels import lm_head
    from tilepilot.npu.validate import DesignError

    shape = lm_head.Shape(vocab=151936, k=896, m=1)
    with pytest.raises(DesignError, match="partition_rows must be positive"):
        lm_head.complete_config(shape, {"partition_rows": 0})
    with pytest.raises(DesignError, match="does not fit"):
        lm_head.complete_config(shape, {"partition_rows": 8192, "tile_k": 1000})
