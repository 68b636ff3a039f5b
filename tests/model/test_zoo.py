"""Zoo: published numbers, the streaming sharded writer, determinism, atomicity, and loading by transformers."""

import json

import pytest
import torch

from tilepilot.errors import ConfigError
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.tokenizer import Tokenizer
from tilepilot.model.zoo import ZOO, get_zoo_model, plan_shards, write_zoo_model
from tilepilot.model.zoo_weights import generate_tensor

L3 = (32.0, 1.0, 4.0, 8192)
# name: (arch, hidden, inter, layers, heads, kv, head_dim, vocab, eps, theta, llama3 scaling, max_pos, bos, eos)
PUBLISHED = {
    "llama-3.2-1b": ("LlamaForCausalLM", 2048, 8192, 16, 32, 8, 64, 128256, 1e-5, 5e5, L3, 131072, 128000, 128001),
    "llama-3.2-3b": ("LlamaForCausalLM", 3072, 8192, 28, 24, 8, 128, 128256, 1e-5, 5e5, L3, 131072, 128000, 128001),
    "smollm2-1.7b": ("LlamaForCausalLM", 2048, 8192, 24, 32, 32, 64, 49152, 1e-5, 130000, None, 8192, 1, 2),
    "qwen2.5-0.5b": ("Qwen2ForCausalLM", 896, 4864, 24, 14, 2, 64, 151936, 1e-6, 1e6, None, 32768, 151643, 151643),
    "qwen2.5-1.5b": ("Qwen2ForCausalLM", 1536, 8960, 28, 12, 2, 128, 151936, 1e-6, 1e6, None, None, 151643, 151643),
    "qwen2.5-3b": ("Qwen2ForCausalLM", 2048, 11008, 36, 16, 2, 128, 151936, 1e-6, 1e6, None, None, 151643, 151643),
    "qwen3-0.6b": ("Qwen3ForCausalLM", 1024, 3072, 28, 16, 8, 128, 151936, 1e-6, 1e6, None, 40960, 151643, 151645),
    "qwen3-1.7b": ("Qwen3ForCausalLM", 2048, 6144, 28, 16, 8, 128, 151936, 1e-6, 1e6, None, 40960, 151643, 151645),
    "qwen3-4b": ("Qwen3ForCausalLM", 2560, 9728, 36, 32, 8, 128, 151936, 1e-6, 1e6, None, 40960, 151643, 151645),
}
# Parameter counts the model cards state (billions), to 2-3 significant digits.
CARD_PARAMS = {
    "llama-3.2-1b": 1.24,
    "llama-3.2-3b": 3.21,
    "smollm2-1.7b": 1.71,
    "qwen2.5-0.5b": 0.49,
    "qwen2.5-1.5b": 1.54,
    "qwen2.5-3b": 3.09,
    "qwen3-0.6b": 0.6,
    "qwen3-1.7b": 1.7,
    "qwen3-4b": 4.0,
}
# A small config for fast tests of the writer itself (not a published model).
TINY = {"hidden_size": 64, "intermediate_size": 1280, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_configs_are_the_published_ones(name):
    arch, h, f, n, q, kv, hd, v, eps, theta, scaling, max_pos, bos, eos = PUBLISHED[name]
    s = get_zoo_model(name).spec()
    assert (s.architecture, s.hidden, s.intermediate, s.n_layers, s.n_heads, s.n_kv_heads) == (arch, h, f, n, q, kv)
    assert (s.head_dim, s.vocab, s.rms_eps, s.rope_theta, s.bos_id, s.eos_ids) == (hd, v, eps, theta, bos, (eos,))
    assert s.tied_embeddings
    rs = s.rope_scaling
    if rs is None:
        assert scaling is None
    else:
        assert (rs.factor, rs.low_freq_factor, rs.high_freq_factor, rs.original_max_position_embeddings) == scaling
    if max_pos is not None:
        assert s.max_positions == max_pos
    assert s.qkv_bias == (s.family == "qwen2") and s.qk_norm == (s.family == "qwen3")
    assert abs(s.n_params / 1e9 - CARD_PARAMS[name]) <= 0.011 * CARD_PARAMS[name] + 0.005


def test_qwen25_sliding_window_is_present_but_disabled():
    cfg = get_zoo_model("qwen2.5-0.5b").hf_config()
    assert cfg["sliding_window"] == 32768 and cfg["use_sliding_window"] is False
    assert cfg["rope_theta"] == 1e6 and cfg["torch_dtype"] == "bfloat16" and cfg["model_type"] == "qwen2"


def test_lookup_is_case_insensitive_and_unknown_names_list_the_zoo():
    assert get_zoo_model(" Qwen3-0.6B ") is ZOO["qwen3-0.6b"]
    with pytest.raises(ConfigError, match="unknown zoo model 'gpt2'.*llama-3.2-1b"):
        get_zoo_model("gpt2")
    with pytest.raises(ConfigError, match="at least one layer"):
        get_zoo_model("qwen3-0.6b").hf_config(0)


def test_reduced_config_keeps_the_rest():
    full, small = ZOO["qwen3-4b"].hf_config(), ZOO["qwen3-4b"].hf_config(2)
    assert small["num_hidden_layers"] == 2 and small["max_window_layers"] == 2
    assert {k: v for k, v in small.items() if k not in ("num_hidden_layers", "max_window_layers")} == {
        k: v for k, v in full.items() if k not in ("num_hidden_layers", "max_window_layers")
    }


def test_sharding_plan_keeps_file_order_and_limits():
    spec = get_zoo_model("llama-3.2-1b").spec()
    shards = plan_shards(spec, torch.bfloat16, 2 * 1024**3)
    names = [t.name for s in shards for t in s]
    assert names == list(spec.tensor_shapes())
    assert len(shards) == 2 and all(sum(t.nbytes for t in s) <= 2 * 1024**3 for s in shards)


DTYPE_CASES = [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)]


@pytest.mark.parametrize("dtype, torch_dtype", DTYPE_CASES)
def test_tiny_write_is_sharded_deterministic_and_loadable(tmp_path, dtype, torch_dtype):
    kw = dict(layers=2, dtype=dtype, shard_bytes=40_000, overrides=dict(TINY, vocab_size=2048))
    out = write_zoo_model("smollm2-1.7b", tmp_path / "a", **kw)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == {"bf16": "bfloat16", "fp16": "float16"}.get(
        dtype, "float32"
    )
    ck = load_checkpoint(out)
    spec = ck.spec
    for name in ("model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight"):
        t = ck.get(name)
        assert t.dtype == torch_dtype
        assert torch.equal(t, generate_tensor(spec, name, 0, live=ZOO["smollm2-1.7b"].live_vocab(2048)).to(torch_dtype))
    assert torch.equal(ck.lm_head(), ck.embed())  # tied
    again = write_zoo_model("smollm2-1.7b", tmp_path / "b", **kw)
    for f in sorted(p.name for p in out.iterdir()):
        assert (out / f).read_bytes() == (again / f).read_bytes(), f
    other = write_zoo_model("smollm2-1.7b", tmp_path / "c", seed=1, **{k: v for k, v in kw.items()})
    assert not torch.equal(load_checkpoint(other).get("model.layers.0.self_attn.q_proj.weight"), ck.layer(0).wq)


def test_interrupted_write_leaves_nothing(tmp_path):
    calls = []

    def boom(name, nbytes):
        calls.append(name)
        if len(calls) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_zoo_model("qwen3-0.6b", tmp_path / "m", layers=1, progress=boom, overrides=dict(TINY, vocab_size=152000))
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("keep me")
    with pytest.raises(ConfigError, match="not empty"):
        write_zoo_model("qwen3-0.6b", tmp_path / "taken", layers=1)
    assert (tmp_path / "taken" / "x").read_text() == "keep me"


def test_tokenizer_files_of_a_zoo_model(zoo_model):
    d = zoo_model("qwen2.5-0.5b", layers=1)
    tok = Tokenizer.from_dir(d)
    assert tok.eos_ids == (151643,) and tok.bos_id is None
    gen = json.loads((d / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 151643


FAMILIES = ["llama-3.2-1b", "smollm2-1.7b", "qwen2.5-0.5b", "qwen3-0.6b"]


@pytest.mark.parametrize("name", FAMILIES)
def test_transformers_loads_reduced_zoo_models(zoo_model, name):
    transformers = pytest.importorskip("transformers")
    d = zoo_model(name, layers=1)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    assert type(model).__name__ == get_zoo_model(name).config["architectures"][0]
    hf_tok = transformers.AutoTokenizer.from_pretrained(d)
    ours = Tokenizer.from_dir(d)
    text = "The river rises in the mountains, naïve café 🙂"
    assert hf_tok(text)["input_ids"] == ours.encode(text, add_bos=ours.bos_id is not None and name.startswith("llama"))
    msgs = [{"role": "user", "content": "Hello"}]
    hf_chat = hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert hf_chat == ours.apply_chat_template(msgs)
    ck = load_checkpoint(d)
    sd = model.state_dict()
    assert torch.equal(sd["model.layers.0.mlp.up_proj.weight"], ck.layer(0).w_up)
    with torch.no_grad():
        logits = model(torch.tensor([ours.encode(text)])).logits
    assert logits.shape[-1] == ck.spec.vocab and torch.isfinite(logits).all()
