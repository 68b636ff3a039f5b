"""The phase-0 reference: transformers loaded in BF16 computing one module at a time in FP32 must equal
transformers loaded in FP32, and must leave the BF16 weights as they were."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, build_tiny, prompt_ids
from transformers import AutoModelForCausalLM

from tilepilot.model.checkpoint import Checkpoint
from tilepilot.oracle.model import Oracle
from tilepilot.oracle.transformers_reference import (
    fp32_units,
    load_reference_model,
    one_module_in_fp32,
    run_reference,
    stored_dtype,
)


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request, tmp_path_factory):
    tiny = build_tiny(request.param, dtype=torch.bfloat16)
    out = tmp_path_factory.mktemp(f"ref-{request.param}")
    tiny.hf.save_pretrained(out)
    return tiny, out


@pytest.mark.parametrize("shared", [False, True], ids=["from_pretrained", "shared_tensors"])
def test_bf16_checkpoint_computes_like_fp32_transformers(saved, shared):
    tiny, path = saved
    assert stored_dtype(path) == torch.bfloat16
    model = load_reference_model(path, Checkpoint(path).get if shared else None)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fp32 = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    ids, cont = prompt_ids(11), prompt_ids(6, seed=3)
    run = run_reference(model, ids, cont, tiny.spec.n_layers)
    with torch.no_grad():
        full = fp32(torch.tensor([ids + cont[:-1]]), output_hidden_states=True)
    assert torch.allclose(run.logits, full.logits[0, : len(ids)], rtol=0, atol=1e-5)
    assert run.choices == torch.argmax(full.logits[0, len(ids) - 1 :], dim=-1).tolist()
    assert torch.allclose(run.hidden[0], full.hidden_states[1][0, : len(ids)], rtol=0, atol=1e-5)
    # afterwards the weights are the BF16 ones again, unchanged, and no hook is left behind
    after = model.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    ours = [
        h
        for u in fp32_units(model)
        for h in (*u._forward_pre_hooks.values(), *u._forward_hooks.values())
        if "one_module_in_fp32" in getattr(h, "__qualname__", "")
    ]
    assert ours == []  # (transformers adds hooks of its own to capture hidden states)


def test_choices_equal_the_oracle_greedy(saved):
    """transformers' one-pass choices on the oracle's own greedy reproduce it (what phase 0 checks)."""
    tiny, path = saved
    ids = prompt_ids(9)
    g = Oracle(tiny.weights).greedy(ids, 10)
    assert run_reference(load_reference_model(path), ids, g.tokens, tiny.spec.n_layers).choices == g.tokens


def test_units_hold_fp32_only_while_they_run(saved):
    tiny, path = saved
    model = load_reference_model(path)
    seen: list[torch.dtype] = []
    layer = [u for u in fp32_units(model) if "DecoderLayer" in type(u).__name__][0]
    handle = layer.register_forward_hook(lambda m, a, o: seen.append(next(m.parameters()).dtype))
    with one_module_in_fp32(model), torch.no_grad():
        model(torch.tensor([prompt_ids(5)]))
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    handle.remove()
    assert seen == [torch.float32]


def test_shared_tensors_are_the_checkpoints_own_memory(saved):
    """Built from the checkpoint's tensors, the model holds no copy: its weights are the mapped ones."""
    tiny, path = saved
    ckpt = Checkpoint(path)
    model = load_reference_model(path, ckpt.get)
    name = "model.layers.1.mlp.down_proj.weight"
    assert model.get_parameter(name).data_ptr() == ckpt.get(name).data_ptr()
    if tiny.spec.tied_embeddings:
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert all(b.device.type == "cpu" for b in model.buffers())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_other_stored_dtypes_load_in_their_own_dtype_and_compute_fp32(dtype, tmp_path):
    tiny = build_tiny("qwen2", dtype=dtype)
    tiny.hf.save_pretrained(tmp_path)
    assert stored_dtype(tmp_path) == dtype
    model = load_reference_model(tmp_path, Checkpoint(tmp_path).get)
    assert {p.dtype for p in model.parameters()} == {dtype}
    fp32 = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ids = prompt_ids(10)
    with torch.no_grad():
        want = fp32(torch.tensor([ids])).logits[0]
    assert torch.allclose(run_reference(model, ids, [1], tiny.spec.n_layers).logits, want, rtol=0, atol=1e-5)
