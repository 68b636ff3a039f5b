"""Tokenizer: round trips, special tokens at the config's ids, streaming decode, chat templates, errors."""

import json

import pytest

from tilepilot.errors import TokenizerError
from tilepilot.model.tokenizer import Tokenizer
from tilepilot.model.zoo_tokenizer import LAYOUTS, _trained_bpe, tokenizer_config_json, tokenizer_json

VOCAB = {"llama3": 128256, "smollm2": 49152, "qwen2": 151936, "qwen3": 151936}
TEXTS = [
    "Hello world, the quick brown fox.",
    "  leading spaces, tabs\tand\nnew lines\n\n",
    "Café naïve résumé über — α β γ ± × ÷ 21 °C, €20 £15 $30",
    "中文字符和日本語のテキスト 한국어 🙂🚀 emoji",
    "def f(x):\n    return x ** 2  # code\n",
    "",
    "zzzqqqxxx unseen-ish w0rds 1234567890",
]


def _write_tokenizer(root, family, chat=True):
    layout = LAYOUTS[family]
    root.mkdir(parents=True, exist_ok=True)
    (root / "tokenizer.json").write_text(json.dumps(tokenizer_json(layout, VOCAB[family])))
    cfg = tokenizer_config_json(layout, 4096)
    if not chat:
        cfg.pop("chat_template")
    (root / "tokenizer_config.json").write_text(json.dumps(cfg))
    return root


@pytest.fixture(params=sorted(LAYOUTS))
def family_tok(request, tmp_path):
    return request.param, Tokenizer.from_dir(_write_tokenizer(tmp_path / request.param, request.param))


def test_round_trip_and_special_ids(family_tok):
    family, tok = family_tok
    layout = LAYOUTS[family]
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert all(0 <= i < VOCAB[family] for i in ids)
    for sid, content in layout.specials:
        assert tok.encode(content) == [sid]
    assert tok.eos_ids == (dict((c, i) for i, c in layout.specials)[layout.eos_token],)
    if layout.bos_token is None:
        assert tok.bos_id is None and tok.encode("hi", add_bos=True) == tok.encode("hi")
    else:
        bos = dict((c, i) for i, c in layout.specials)[layout.bos_token]
        assert tok.bos_id == bos and tok.adds_bos == layout.add_bos
        assert tok.encode("hi", add_bos=True) == ([bos] if layout.add_bos else []) + tok.encode("hi")


def test_a_sequence_starts_as_transformers_starts_it(family_tok, tmp_path):
    """BOS only where the model's own tokenizer puts it (Llama 3), not wherever a BOS token is named."""
    transformers = pytest.importorskip("transformers")
    family, tok = family_tok
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / family))
    for text in TEXTS[:5]:
        assert tok.encode(text, add_bos=True) == hf(text)["input_ids"], (family, text)


def test_plain_prompt_of_the_trained_model_has_no_bos(smollm2_dir):
    """SmolLM2-135M-Instruct names a BOS (<|im_start|>) but its tokenizer does not add it (GGUF add_bos_token
    false): a plain prompt starts with the text's own tokens, exactly as transformers encodes it."""
    transformers = pytest.importorskip("transformers")
    from tilepilot.runtime.generate import encode_prompt

    model = smollm2_dir(layers=1)
    tok = Tokenizer.from_dir(model)
    hf = transformers.AutoTokenizer.from_pretrained(str(model))
    assert json.loads((model / "tokenizer_config.json").read_text())["add_bos_token"] is False
    assert tok.bos_id == 1 and not tok.adds_bos
    for prompt in ("The capital of France is", "def f(x):\n    return x", "<|im_start|> is a special token"):
        assert encode_prompt(tok, prompt, chat=False) == hf(prompt)["input_ids"], prompt


def test_llama_ids_sit_where_the_config_says():
    specials = dict(LAYOUTS["llama3"].specials)
    assert specials[128000] == "<|begin_of_text|>" and specials[128001] == "<|end_of_text|>"
    assert dict(LAYOUTS["qwen3"].specials)[151645] == "<|im_end|>"
    assert dict(LAYOUTS["smollm2"].specials)[1] == "<|im_start|>"


def test_bpe_is_deterministic_and_has_real_merges():
    _trained_bpe.cache_clear()
    first = _trained_bpe()
    _trained_bpe.cache_clear()
    assert _trained_bpe() == first
    tokens, merges = first
    assert len(merges) > 500 and len(tokens) == 256 + len(merges)
    assert "Ġthe" in tokens  # common words became single tokens


def test_streaming_decode_never_splits_a_character(family_tok):
    _, tok = family_tok
    text = "naïve 🙂 中文 — done"
    ids = tok.encode(text)
    pieces = list(tok.decode_stream(iter(ids)))
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert len(pieces) > 3  # it streams, it does not just flush at the end


def test_streaming_with_special_tokens_skipped(tmp_path):
    tok = Tokenizer.from_dir(_write_tokenizer(tmp_path, "qwen3"))
    ids = tok.encode("<|im_start|>user\nhé<|im_end|>")
    assert "".join(tok.decode_stream(iter(ids))) == "user\nhé"
    assert "".join(tok.decode_stream(iter(ids), skip_special=False)) == "<|im_start|>user\nhé<|im_end|>"


def test_chat_templates_render(tmp_path):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there "}]
    llama = Tokenizer.from_dir(_write_tokenizer(tmp_path / "l", "llama3"))
    assert llama.apply_chat_template(msgs) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    qwen = Tokenizer.from_dir(_write_tokenizer(tmp_path / "q", "qwen2"))
    rendered = qwen.apply_chat_template(msgs, add_generation_prompt=False)
    assert rendered == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there <|im_end|>\n"
    ids = qwen.encode(rendered)
    assert ids[0] == 151644 and ids.count(151645) == 2  # specials inside rendered text are single tokens
    with pytest.raises(TokenizerError, match="Unknown chat role: tool"):
        qwen.apply_chat_template([{"role": "tool", "content": "x"}])


def test_chat_template_from_jinja_file(tmp_path):
    root = _write_tokenizer(tmp_path, "qwen3", chat=False)
    (root / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    assert Tokenizer.from_dir(root).apply_chat_template([{"role": "user", "content": "a"}]) == "[a]"


def test_missing_and_broken_files_are_tokenizer_errors(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot be loaded"):
        Tokenizer.from_dir(tmp_path)
    root = _write_tokenizer(tmp_path / "nochat", "qwen2", chat=False)
    with pytest.raises(TokenizerError, match="no chat template"):
        Tokenizer.from_dir(root).apply_chat_template([{"role": "user", "content": "x"}])
    (root / "tokenizer_config.json").write_text("{")
    with pytest.raises(TokenizerError, match="not valid JSON"):
        Tokenizer.from_dir(root)
    bad = _write_tokenizer(tmp_path / "badtmpl", "qwen2")
    cfg = json.loads((bad / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}"
    (bad / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(TokenizerError, match="cannot be rendered"):
        Tokenizer.from_dir(bad).apply_chat_template([{"role": "user", "content": "x"}])
