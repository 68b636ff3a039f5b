"""GGUF vocabulary + merges -> ``tokenizer.json`` (through the ``tokenizers`` library) and its config.

Only byte-level BPE (``tokenizer.ggml.model == "gpt2"``), the kind SmolLM2, Qwen2/2.5/3 and Llama 3 use.
The file stores tokens already spelled in GPT-2's byte alphabet, merges as "left right" strings, a type
per token (3 = control, 4 = user-defined) and a pre-tokenizer name (``tokenizer.ggml.pre``). The name
picks the split llama.cpp applies before BPE; we reproduce each with the same expressions, since a
different split gives different ids for the same text even with the same merges.
"""

from __future__ import annotations

from typing import Any

from tilepilot.errors import TokenizerError
from tilepilot.model.gguf.reader import GGUFFile, int_array, string_array

CONTROL, USER_DEFINED = 3, 4

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> (how to split, ignore_merges); names and groups as in llama.cpp's llama-vocab.cpp.
PRE_TOKENIZERS: dict[str, tuple[str, bool]] = {
    **dict.fromkeys(("default", "gpt2", "gpt-2", "mpt", "olmo", "jais"), ("gpt2", False)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"), ("digits+gpt2", False)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2"), ("qwen2", False)),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3"), ("llama3", True)),
}


def _pre_tokenizer(kind: str):
    from tokenizers import Regex, pre_tokenizers

    if kind == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if kind == "digits+gpt2":  # each digit alone, then GPT-2's split (llama.cpp: "\p{N}" then the GPT-2 regex)
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ]
        )
    split = {"qwen2": _QWEN2_SPLIT, "llama3": _LLAMA3_SPLIT}[kind]
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )


def build_tokenizer(gguf: GGUFFile):
    """A ``tokenizers.Tokenizer`` equivalent to the GGUF's vocabulary; TokenizerError if it cannot be."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    model = gguf.metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise TokenizerError(
            f"the GGUF's tokenizer is {model!r}, but tilepilot imports byte-level BPE ('gpt2') tokenizers only; "
            "convert the model from its Hugging Face checkpoint instead"
        )
    pre = str(gguf.metadata.get("tokenizer.ggml.pre") or "default")
    if pre not in PRE_TOKENIZERS:
        raise TokenizerError(
            f"the GGUF's pre-tokenizer {pre!r} is unknown to tilepilot, so its token ids could differ from the "
            "model's; convert the model from its Hugging Face checkpoint instead"
        )
    kind, ignore_merges = PRE_TOKENIZERS[pre]
    tokens = string_array(gguf, "tokenizer.ggml.tokens")
    merges = string_array(gguf, "tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise TokenizerError(
            "the GGUF has no tokenizer.ggml.tokens or tokenizer.ggml.merges; it carries no usable tokenizer"
        )
    types = int_array(gguf, "tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise TokenizerError(
            f"the GGUF lists {len(tokens)} tokens but {len(types)} token types; the tokenizer data is corrupt"
        )
    vocab = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)  # a duplicate spelling keeps its first id, as llama.cpp's lookup does
    pairs = []
    for m in merges:
        left, sep, right = m.partition(" ")
        if not sep:
            raise TokenizerError(f"the GGUF merge {m!r} is not 'left right'; the tokenizer data is corrupt")
        pairs.append((left, right))
    bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False, ignore_merges=ignore_merges)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = _pre_tokenizer(kind)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    typed = list(zip(tokens, types, strict=True))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in typed if ty == CONTROL])
    user = [AddedToken(t, special=False, normalized=False) for t, ty in typed if ty == USER_DEFINED]
    if user:
        tok.add_tokens(user)
    return tok


def tokenizer_config(gguf: GGUFFile, tokenizer, max_length: int) -> dict[str, Any]:
    """``tokenizer_config.json``: special tokens by text, BOS/EOS flags, chat template, added tokens."""
    md = gguf.metadata

    def text(key: str) -> str | None:
        i = md.get(f"tokenizer.ggml.{key}")
        return tokenizer.id_to_token(int(i)) if isinstance(i, int) else None

    added = {
        str(i): {
            "content": t.content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t.special,
        }
        for i, t in sorted(tokenizer.get_added_tokens_decoder().items())
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text("bos_token_id"),
        "eos_token": text("eos_token_id"),
        "unk_token": text("unknown_token_id"),
        "pad_token": text("padding_token_id"),
        "add_bos_token": bool(md.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(md.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "added_tokens_decoder": added,
        "chat_template": md.get("tokenizer.chat_template"),
    }
