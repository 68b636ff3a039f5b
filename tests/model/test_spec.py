"""ModelSpec parsing and scope checks on hand-written configs."""

import pytest

from tilepilot.errors import ConfigError, ScopeError
from tilepilot.model.spec import spec_from_config

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
}


def test_llama_spec_fields():
    s = spec_from_config(LLAMA)
    assert (s.family, s.head_dim, s.group_size, s.q_dim, s.kv_dim) == ("llama", 64, 4, 2048, 512)
    assert s.rope_scaling is not None and s.rope_scaling.factor == 32.0
    assert not s.qkv_bias and not s.qk_norm and s.tied_embeddings
    assert s.eos_ids == (128001,)
    # Llama-3.2-1B has 1.236 B parameters with tied embeddings
    assert abs(s.n_params - 1_235_814_400) < 1_000


def test_roundtrip_dict():
    s = spec_from_config(LLAMA)
    assert type(s).from_dict(s.to_dict()) == s


def test_qwen3_explicit_head_dim_and_qk_norm():
    cfg = dict(LLAMA, architectures=["Qwen3ForCausalLM"], head_dim=128, hidden_size=1024, num_attention_heads=16)
    cfg.pop("rope_scaling")
    s = spec_from_config(cfg)
    assert s.head_dim == 128 and s.qk_norm and s.q_dim == 2048 and s.rope_scaling is None


def test_qwen2_has_qkv_bias():
    s = spec_from_config(dict(LLAMA, architectures=["Qwen2ForCausalLM"], rope_scaling=None))
    assert s.qkv_bias and not s.o_bias


@pytest.mark.parametrize(
    "patch, needle",
    [
        ({"architectures": ["MixtralForCausalLM"], "num_local_experts": 8}, "mixture-of-experts"),
        ({"architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": 512}, "latent attention"),
        ({"architectures": ["T5ForConditionalGeneration"], "is_encoder_decoder": True}, "encoder-decoder"),
        ({"architectures": ["GPT2LMHeadModel"]}, "not supported"),
        ({"architectures": ["MistralForCausalLM"], "sliding_window": 4096}, "sliding-window"),
        ({"num_key_value_heads": 5}, "not divisible by num_key_value_heads"),
        ({"num_attention_heads": 30}, "not divisible by num_attention_heads"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ],
)
def test_out_of_scope(patch, needle):
    with pytest.raises(ScopeError, match=needle):
        spec_from_config(dict(LLAMA, **patch))


def test_missing_field_is_config_error():
    cfg = dict(LLAMA)
    del cfg["hidden_size"]
    with pytest.raises(ConfigError, match="hidden_size"):
        spec_from_config(cfg)


def test_qwen_sliding_window_disabled_is_in_scope():
    cfg = dict(LLAMA, architectures=["Qwen2ForCausalLM"], sliding_window=32768, use_sliding_window=False)
    assert spec_from_config(cfg).family == "qwen2"


def test_an_architecture_and_a_model_type_that_disagree_are_refused():
    """transformers builds the config class from model_type, tilepilot the family from the architecture: a config
    naming two different models is refused rather than deployed as one of them."""
    with pytest.raises(ConfigError, match="architecture LlamaForCausalLM but model_type 'gpt2'"):
        spec_from_config(dict(LLAMA, model_type="gpt2"))
    assert spec_from_config(dict(LLAMA, model_type="llama")).family == "llama"
