"""The zoo's tokenizer: a real byte-level BPE trained on the embedded corpus, with each family's special tokens.

Real Llama-3 / SmolLM2 / Qwen tokenizers cannot be shipped, so the zoo trains a small one with the same
machinery (``tokenizers`` byte-level BPE, the GPT-2 byte alphabet, so every UTF-8 string round-trips)
and places the family's special tokens at the ids its config names (e.g. Llama-3's
``<|begin_of_text|>`` = 128000). The model's vocab is larger than the BPE's; ids between them are
simply never produced by the tokenizer, as with the reserved tokens of real checkpoints.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tilepilot.model.zoo_corpus import CORPUS

# Requested BPE size (256 byte symbols + merges). The trainer stops earlier if the corpus has fewer
# pairs that occur at least MIN_PAIR_FREQUENCY times; a few thousand merges is enough to look real.
BPE_VOCAB_SIZE = 4096
MIN_PAIR_FREQUENCY = 2

LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('Unknown chat role: ' + message['role']) }}"
    "{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{- message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('Unknown chat role: ' + message['role']) }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TokenizerLayout:
    """Where a family's special tokens live and how its tokenizer behaves around them."""

    specials: tuple[tuple[int, str], ...]  # (id, content), the ids the model config refers to
    bos_token: str | None
    eos_token: str
    pad_token: str | None
    add_bos: bool
    chat_template: str


LAYOUTS: dict[str, TokenizerLayout] = {
    # Llama 3.x: <|begin_of_text|> is prepended to every encoding; chat turns use header tokens.
    "llama3": TokenizerLayout(
        specials=(
            (128000, "<|begin_of_text|>"),
            (128001, "<|end_of_text|>"),
            (128006, "<|start_header_id|>"),
            (128007, "<|end_header_id|>"),
            (128009, "<|eot_id|>"),
        ),
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        pad_token=None,
        add_bos=True,
        chat_template=LLAMA3_CHAT_TEMPLATE,
    ),
    # SmolLM2: ChatML tokens at the very start of the vocab; no BOS prepended.
    "smollm2": TokenizerLayout(
        specials=((0, "<|endoftext|>"), (1, "<|im_start|>"), (2, "<|im_end|>")),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        add_bos=False,
        chat_template=CHATML_TEMPLATE,
    ),
    # Qwen2.5 base: no BOS token in the tokenizer; <|endoftext|> ends documents.
    "qwen2": TokenizerLayout(
        specials=((151643, "<|endoftext|>"), (151644, "<|im_start|>"), (151645, "<|im_end|>")),
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        add_bos=False,
        chat_template=CHATML_TEMPLATE,
    ),
    # Qwen3: as Qwen2.5, but generation ends at <|im_end|>.
    "qwen3": TokenizerLayout(
        specials=((151643, "<|endoftext|>"), (151644, "<|im_start|>"), (151645, "<|im_end|>")),
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        add_bos=False,
        chat_template=CHATML_TEMPLATE,
    ),
}


@functools.lru_cache(maxsize=1)
def _trained_bpe() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """Train the BPE once per process: (tokens in trainer id order, merges). Deterministic for a given corpus."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=MIN_PAIR_FREQUENCY,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = tuple(t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]))
    merges = tuple(tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"])
    return tokens, merges  # type: ignore[return-value]


def bpe_size() -> int:
    """Number of ordinary (non-special) tokens of the trained BPE."""
    return len(_trained_bpe()[0])


def token_ids(layout: TokenizerLayout, model_vocab: int) -> dict[str, int]:
    """Token -> id: the specials on their fixed ids, the BPE tokens in training order on the free ids."""
    tokens, _ = _trained_bpe()
    special_ids = {i for i, _ in layout.specials}
    if max(special_ids) >= model_vocab or len(tokens) + len(special_ids) > model_vocab:
        raise ValueError(f"a model vocab of {model_vocab} cannot hold the zoo tokenizer")
    vocab: dict[str, int] = {}
    next_id = 0
    for t in tokens:
        while next_id in special_ids:
            next_id += 1
        vocab[t] = next_id
        next_id += 1
    for i, content in layout.specials:
        vocab[content] = i
    return vocab


def tokenizer_json(layout: TokenizerLayout, model_vocab: int) -> dict[str, Any]:
    """A complete ``tokenizer.json`` with BPE tokens on the free ids and the specials on their fixed ids."""
    _, merges = _trained_bpe()
    vocab = token_ids(layout, model_vocab)
    added = [
        {
            "id": i,
            "content": c,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, c in sorted(layout.specials)
    ]
    if layout.add_bos and layout.bos_token is not None:
        bos_id = vocab[layout.bos_token]
        post: dict[str, Any] = {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": layout.bos_token, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": layout.bos_token, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": layout.bos_token, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {
                layout.bos_token: {"id": layout.bos_token, "ids": [bos_id], "tokens": [layout.bos_token]}
            },
        }
    else:
        post = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
    # Build through the library so the JSON is exactly what `tokenizers` itself would write.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges), ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    data = json.loads(tok.to_str())
    data["added_tokens"] = added
    data["post_processor"] = post
    return data


def tokenizer_config_json(layout: TokenizerLayout, max_length: int) -> dict[str, Any]:
    """``tokenizer_config.json`` as transformers writes it for a fast tokenizer, with the chat template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": layout.bos_token,
        "eos_token": layout.eos_token,
        "pad_token": layout.pad_token,
        "add_bos_token": layout.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "added_tokens_decoder": {
            str(i): {
                "content": c,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for i, c in sorted(layout.specials)
        },
        "chat_template": layout.chat_template,
    }
