"""Checkpoint loading and every header error path, on tiny checkpoints written with safetensors."""

import json

import pytest
import torch
from safetensors.torch import save_file

from tilepilot.cli import main
from tilepilot.errors import CheckpointError
from tilepilot.model.checkpoint import check_headers, load_checkpoint
from tilepilot.model.spec import spec_from_config

CFG = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 50,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 128,
}


def _tensors(spec, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(s, generator=g).to(dtype) for n, s in spec.tensor_shapes().items()}


def _write(tmp_path, tensors, cfg=CFG, name="model.safetensors"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(tmp_path / name))
    return tmp_path


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_loads_every_dtype_with_tied_embeddings(tmp_path, dtype):
    spec = spec_from_config(CFG)
    t = _tensors(spec, dtype)
    ck = load_checkpoint(_write(tmp_path, t))
    lw = ck.layer(1)
    assert lw.bq is not None and lw.bo is None and lw.q_norm is None
    assert torch.equal(lw.wk, t["model.layers.1.self_attn.k_proj.weight"]) and lw.wk.dtype == dtype
    assert torch.equal(ck.lm_head(), t["model.embed_tokens.weight"])
    assert ck.report.n_tensors == len(t)


def test_sharded_checkpoint(tmp_path):
    spec = spec_from_config(CFG)
    t = _tensors(spec)
    names = list(t)
    half = len(names) // 2
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(CFG))
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for fname, ns in shards.items():
        save_file({n: t[n] for n in ns}, str(tmp_path / fname))
        weight_map.update({n: fname for n in ns})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    ck = load_checkpoint(tmp_path)
    assert len(ck.report.files) == 2
    assert torch.equal(ck.final_norm(), t["model.norm.weight"])
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="shard model-00002-of-00002.safetensors .* missing"):
        load_checkpoint(tmp_path)


def test_missing_tensor(tmp_path):
    spec = spec_from_config(CFG)
    t = _tensors(spec)
    del t["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(CheckpointError, match="model.layers.1.mlp.up_proj.weight is missing"):
        load_checkpoint(_write(tmp_path, t))


def test_shape_disagrees_with_config(tmp_path):
    spec = spec_from_config(CFG)
    t = _tensors(spec)
    t["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(8, 32, dtype=torch.bfloat16)
    with pytest.raises(CheckpointError, match=r"shape \[8, 32\] but config.json implies \[16, 32\]"):
        load_checkpoint(_write(tmp_path, t))


def test_truncated_and_corrupt_files(tmp_path):
    spec = spec_from_config(CFG)
    d = _write(tmp_path, _tensors(spec))
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        check_headers(d, spec)
    f.write_bytes(data[:8] + b"{not json" + data[17:])
    with pytest.raises(CheckpointError, match="corrupt"):
        check_headers(d, spec)


def test_extra_tensor_warns(tmp_path):
    spec = spec_from_config(CFG)
    t = _tensors(spec)
    t["model.layers.0.mystery.weight"] = torch.zeros(3, dtype=torch.bfloat16)
    ck = load_checkpoint(_write(tmp_path, t))
    assert ck.report.extra == ["model.layers.0.mystery.weight"]
    assert "ignored" in ck.warnings[0]


def test_pickle_only_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CFG))
    torch.save({"x": torch.zeros(1)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="safetensors only"):
        load_checkpoint(tmp_path)


def test_inspect_exit_codes(tmp_path, capsys):
    spec = spec_from_config(CFG)
    good = _write(tmp_path / "good", _tensors(spec))
    assert main(["inspect", str(good)]) == 0
    bad = dict(CFG, architectures=["MixtralForCausalLM"], num_local_experts=8)
    (tmp_path / "moe").mkdir()
    (tmp_path / "moe" / "config.json").write_text(json.dumps(bad))
    assert main(["inspect", str(tmp_path / "moe")]) != 0
    err = capsys.readouterr().err
    assert "mixture-of-experts" in err and err.count("\n") == 1
    t = _tensors(spec)
    del t["model.norm.weight"]
    assert main(["inspect", str(_write(tmp_path / "broken", t))]) != 0
    assert "model.norm.weight is missing" in capsys.readouterr().err
