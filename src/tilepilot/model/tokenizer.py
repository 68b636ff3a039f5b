"""Tokenizer: ``tokenizer.json`` through the ``tokenizers`` library, chat templates through jinja2.

We do not go through transformers at run time: the fast tokenizer file alone carries the vocabulary,
merges, normalizer and special tokens, and the chat template is a jinja2 string in
``tokenizer_config.json``. Rendering it in a sandboxed environment with the helpers Hugging Face
templates expect (``raise_exception``, ``bos_token``...) gives the same prompt text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tilepilot.errors import TokenizerError


def _token_text(value: Any) -> str | None:
    """tokenizer_config stores special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """Encode/decode with the model's own tokenizer and render its chat template."""

    def __init__(self, backend, config: dict[str, Any], bos_id: int | None, eos_ids: Sequence[int]):
        self._tok = backend
        self.config = config
        self.bos_id = bos_id
        self.eos_ids = tuple(eos_ids)
        self.chat_template: str | None = config.get("chat_template")

    @classmethod
    def from_dir(cls, model_dir: str | Path, bos_id: int | None = None, eos_ids: Sequence[int] = ()) -> Tokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{model_dir} has no tokenizer.json; tilepilot needs the fast tokenizer file")
        try:
            backend = HFTokenizer.from_file(str(path))
        except Exception as e:
            raise TokenizerError(f"tokenizer.json in {model_dir} cannot be loaded ({e}); re-download it") from None
        config: dict[str, Any] = {}
        cfg_path = model_dir / "tokenizer_config.json"
        if cfg_path.is_file():
            try:
                config = json.loads(cfg_path.read_text())
            except json.JSONDecodeError as e:
                raise TokenizerError(f"tokenizer_config.json in {model_dir} is not valid JSON ({e.msg})") from None
        tmpl = config.get("chat_template")
        if isinstance(tmpl, list):  # named templates: take the default one
            named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
            config["chat_template"] = named.get("default") or next(iter(named.values()), None)
        jinja_file = model_dir / "chat_template.jinja"  # where transformers >= 4.43 saves the template
        if not config.get("chat_template") and jinja_file.is_file():
            config["chat_template"] = jinja_file.read_text(encoding="utf-8")
        if bos_id is None:
            bos_id = _id_of(backend, _token_text(config.get("bos_token")))
        if not eos_ids:
            eos = _id_of(backend, _token_text(config.get("eos_token")))
            eos_ids = (eos,) if eos is not None else ()
        return cls(backend, config, bos_id, eos_ids)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return list(ids)

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def token_text(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def decode_stream(self, ids: Iterator[int], skip_special: bool = True) -> Iterator[str]:
        """Yield text as tokens arrive, holding back bytes until they form complete UTF-8 characters.

        Byte-level BPE splits a multi-byte character across tokens; decoding each token alone would
        print replacement characters. We decode the growing tail and emit only the stable prefix.
        """
        decoder = IncrementalDecoder(self, skip_special)
        for token in ids:
            piece = decoder.push(token)
            if piece:
                yield piece
        tail = decoder.flush()
        if tail:
            yield tail

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise TokenizerError("this model has no chat template in tokenizer_config.json; pass a plain prompt")
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TokenizerError(f"the chat template rejected the messages: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            template = env.from_string(self.chat_template)
            return template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=_token_text(self.config.get("bos_token")) or "",
                eos_token=_token_text(self.config.get("eos_token")) or "",
            )
        except TemplateError as e:
            raise TokenizerError(f"the chat template cannot be rendered: {e}") from None


class IncrementalDecoder:
    """Streaming decoder: push token ids, get back only text that can no longer change.

    Keeps two offsets into the ids (the technique of Hugging Face's text-generation-inference): text is
    decoded from ``prefix`` on, and what lies beyond the text of ``ids[prefix:read]`` is new. Decoding
    only this short window keeps each push O(1) in the length of the generation.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self._tok = tokenizer
        self._skip = skip_special
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        done = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        text = self._tok.decode(self._ids[self._prefix :], self._skip)
        if len(text) <= len(done) or text.endswith("\ufffd"):  # nothing new, or a character still incomplete
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(done) :]

    def flush(self) -> str:
        """Whatever is left at the end, even an incomplete character (then shown as U+FFFD)."""
        done = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        text = self._tok.decode(self._ids[self._prefix :], self._skip)
        self._prefix = self._read = len(self._ids)
        return text[len(done) :] if len(text) > len(done) else ""


def _id_of(backend, token: str | None) -> int | None:
    if token is None:
        return None
    return backend.token_to_id(token)
