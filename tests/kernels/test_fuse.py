from dataclasses import replace

import pytest
import torch
from kernel_checks import rand_bf16

from tilepilot.gates.metrics import cosine
from tilepilot.kernels import attention as at
from tilepilot.kernels import fuse, rope
from tilepilot.kernels import rmsnorm as rn
from tilepilot.model.spec import ModelSpec, RopeScaling
from tilepilot.model.weights import LayerWeights
from tilepilot.npu.execute import run_fast, run_group_tile
from tilepilot.npu.timing import time_group
from tilepilot.npu.validate import DesignError, validate_group
from tilepilot.oracle import ops
from tilepilot.oracle.kv_cache import KVCache
from tilepilot.oracle.layers import decoder_layer
from tilepilot.oracle.rope import inv_freq_for


def tiny_spec(family: str) -> ModelSpec:
    """A 4-head / 2-KV-head block of each family: Llama (llama3 rope scaling), Qwen2 (QKV bias), Qwen3 (Q/K norm)."""
    return ModelSpec(
        architecture={"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[family],
        family=family,
        n_layers=1,
        hidden=64,
        intermediate=128,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16 if family != "qwen3" else 32,
        vocab=256,
        rms_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=RopeScaling(8.0, 1.0, 4.0, 32) if family == "llama" else None,
        qkv_bias=family == "qwen2",
        o_bias=False,
        qk_norm=family == "qwen3",
        tied_embeddings=True,
        max_positions=512,
        bos_id=None,
        eos_ids=(1,),
    )


def tiny_layer(spec: ModelSpec, seed: int = 0) -> LayerWeights:
    h, q, kv, f, d = spec.hidden, spec.q_dim, spec.kv_dim, spec.intermediate, spec.head_dim

    def w(*shape: int, scale: float | None = None, offset: float = 0.0, s: int = 0) -> torch.Tensor:
        return rand_bf16(*shape, seed=seed * 100 + s, scale=scale or shape[-1] ** -0.5, offset=offset)

    return LayerWeights(
        attn_norm=w(h, scale=0.1, offset=1.0, s=1),
        wq=w(q, h, s=2),
        wk=w(kv, h, s=3),
        wv=w(kv, h, s=4),
        wo=w(h, q, s=5),
        ffn_norm=w(h, scale=0.1, offset=1.0, s=6),
        w_gate=w(f, h, s=7),
        w_up=w(f, h, s=8),
        w_down=w(h, f, s=9),
        bq=w(q, scale=0.3, s=10) if spec.qkv_bias else None,
        bk=w(kv, scale=0.3, s=11) if spec.qkv_bias else None,
        bv=w(kv, scale=0.3, s=12) if spec.qkv_bias else None,
        q_norm=w(d, scale=0.1, offset=1.0, s=13) if spec.qk_norm else None,
        k_norm=w(d, scale=0.1, offset=1.0, s=14) if spec.qk_norm else None,
    )


def group_inputs(group, spec, layer, x, cs, attn=None) -> dict[str, torch.Tensor]:
    ins = fuse.weight_inputs(group, spec, layer)
    for launch, t in group.group_inputs():
        key = f"{launch}.{t.name}"
        if key in ins:
            continue
        if t.name == "cs":
            ins[key] = cs
        elif launch in ("attn_norm", "resid1"):
            ins[key] = x
        elif launch == "o_proj":
            ins[key] = attn
    return ins


def run_block(spec: ModelSpec, layer: LayerWeights, x: torch.Tensor, exact: bool = True) -> dict[str, torch.Tensor]:
    """One decoder block as 3 dispatches: fused RMSNorm+QKV(+bias,+norm)+RoPE | attention | fused O+FFN."""
    rows = x.shape[0]
    cs = rope.table_for(spec, 0, rows)
    g1 = fuse.qkv_rope_group(spec, rows)
    out1 = fuse.run_group_fast(g1, group_inputs(g1, spec, layer, x, cs), exact=exact)
    v_op = "v_bias" if spec.qkv_bias else "v_proj"
    v = out1[f"{v_op}.{fuse.TENSORS[g1.design(v_op).meta['family']][2]}"]
    d = at.make_design(at.shape_for(spec, rows))
    attn = run_fast(d, at.prepare_inputs(d, out1["rope_q.y"], out1["rope_k.y"], v), exact=exact)["o"]
    g2 = fuse.o_ffn_group(spec, rows)
    out2 = fuse.run_group_fast(g2, group_inputs(g2, spec, layer, x, cs, attn), exact=exact)
    return {"groups": (g1, g2), "attention": d, "out": out2["resid2.c"], **out1, **out2}


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_fused_block_matches_the_fp32_oracle_layer(family):
    spec = tiny_spec(family)
    layer = tiny_layer(spec, seed=1)
    x = rand_bf16(16, spec.hidden, seed=2)
    res = run_block(spec, layer, x)
    g1, g2 = res["groups"]
    assert [d.name for d in g1.designs][0] == "attn_norm" and "rope_k" in [d.name for d in g1.designs]
    assert ("q_norm" in [d.name for d in g1.designs]) == spec.qk_norm
    assert ("q_bias" in [d.name for d in g1.designs]) == spec.qkv_bias
    cos, sin = ops.rope_tables(torch.arange(16), inv_freq_for(spec))
    ref = decoder_layer(x.float(), layer, spec, cos, sin, KVCache(1, spec.n_kv_heads, spec.head_dim), 0)
    assert cosine(ref, res["out"]) >= 0.999
    assert res["out"].shape == (16, spec.hidden) and res["out"].dtype == torch.bfloat16


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_fused_group_equals_unfused_launches_bit_for_bit_and_is_modeled_faster(family):
    spec = tiny_spec(family)
    layer = tiny_layer(spec, seed=4)
    x = rand_bf16(16, spec.hidden, seed=5)
    cs = rope.table_for(spec, 3, 16)
    attn = rand_bf16(16, spec.q_dim, seed=6)
    for group in (fuse.qkv_rope_group(spec, 16), fuse.o_ffn_group(spec, 16)):
        assert validate_group(group) == []
        ins = group_inputs(group, spec, layer, x, cs, attn)
        for exact in (True, False):
            fused = fuse.run_group_fast(group, ins, exact=exact)
            unfused = fuse.run_unfused_fast(group, ins, exact=exact)
            assert fused.keys() == unfused.keys()
            assert all(torch.equal(fused[k], unfused[k]) for k in fused)
        fused_t = time_group(group).seconds
        unfused_t = sum(time_group(d).seconds for d in group.designs)  # one dispatch per launch (modeled)
        assert fused_t < unfused_t
        assert time_group(group).launches == len(group.designs)


def test_fused_group_tile_path_equals_fast_path():
    spec = tiny_spec("qwen3")
    layer = tiny_layer(spec, seed=7)
    group = fuse.qkv_rope_group(spec, 8)
    ins = group_inputs(group, spec, layer, rand_bf16(8, spec.hidden, seed=8), rope.table_for(spec, 0, 8))
    tile = run_group_tile(group, ins)
    fast = fuse.run_group_fast(group, ins, exact=True)
    assert all(torch.equal(tile[k], fast[k]) for k in fast)


def test_decode_groups_use_gemv_and_bind():
    spec = tiny_spec("qwen2")
    group = fuse.qkv_rope_group(spec, 1, stage="decode")
    assert {d.meta["family"] for d in group.designs if d.name.endswith("_proj")} == {"gemv"}
    layer = tiny_layer(spec, seed=9)
    ins = group_inputs(group, spec, layer, rand_bf16(1, spec.hidden, seed=10), rope.table_for(spec, 40, 1))
    out = fuse.run_group_fast(group, ins)
    assert out["rope_q.y"].shape == (1, spec.q_dim) and bool(torch.isfinite(out["rope_q.y"].float()).all())


def test_argument_mismatch_is_a_group_binding_error():
    spec = tiny_spec("llama")
    good = [
        fuse.Launch("norm", "rmsnorm", rn.Shape(8, 64)),
        ("proj_k", "gemm", fuse.family_module("gemm").Shape(m=8, n=spec.kv_dim, k=64), None, {"a": "norm.y"}),
        fuse.Launch("rope_q", "rope", rope.Shape(8, 4, 16), bindings={"x": "proj_k.c"}),  # 32-wide into 64-wide
    ]
    with pytest.raises(DesignError) as e:
        fuse.build_group("bad", good)
    assert e.value.codes == ["GROUP_BINDING"]
    with pytest.raises(DesignError) as e:
        fuse.build_group("typo", [good[0], fuse.Launch("r", "rope", rope.Shape(8, 4, 16), bindings={"x": "norm.out"})])
    assert "GROUP_BINDING" in e.value.codes
    with pytest.raises(DesignError):
        fuse.build_group("order", [fuse.Launch("r", "rope", rope.Shape(8, 4, 16), bindings={"x": "norm.y"}), good[0]])


def test_run_group_rechecks_bindings_after_a_rename():
    """A group edited after it was built (an argument renamed in one launch) fails before computing anything."""
    spec = tiny_spec("qwen3")
    group = fuse.qkv_rope_group(spec, 8)
    broken = replace(group, bindings=[replace(b, src_tensor="y") if b.dst_launch == "q_norm" else b
                                      for b in group.bindings])  # fmt: skip
    layer = tiny_layer(spec)
    ins = group_inputs(group, spec, layer, rand_bf16(8, spec.hidden), rope.table_for(spec, 0, 8))
    with pytest.raises(DesignError) as e:
        fuse.run_group_fast(broken, ins)
    assert e.value.codes == ["GROUP_BINDING"]


def test_views_reinterpret_flat_elementwise_tensors_without_copying_semantics():
    spec = tiny_spec("llama")
    group = fuse.o_ffn_group(spec, 16)
    resid = group.design("resid1")
    assert resid.tensor("a").shape == (16, 64) and resid.tensor("c").shape == (16, 64)
    assert all(t.tap.tensor_shape == (16, 64) for t in resid.runtime.tasks)
    with pytest.raises(Exception, match="keeps the size"):
        fuse.view_design(resid, {"a": (15, 64)})
