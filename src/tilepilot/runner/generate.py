"""Text in, streamed text out: tokenizer + NpuRunner + sampling.

Streaming must never print half a UTF-8 character: byte-level BPE tokens can split a character across
tokens, so text is released only when the decoded suffix no longer ends in the replacement character.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tilepilot.errors import InputError
from tilepilot.runner.npu_runner import GenerationResult, NpuRunner
from tilepilot.runner.sampling import SamplingParams

REPLACEMENT = "\ufffd"


class TextTokenizer(Protocol):
    def encode(self, text: str, add_bos: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class IncrementalDecoder:
    """Feeds token ids, returns only newly completed text (never a dangling partial character)."""

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self._ids: list[int] = []
        self._emitted = ""

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        text = self._decode(self._ids)
        if text.endswith(REPLACEMENT):
            return ""
        if not text.startswith(self._emitted):
            # a merge changed earlier text (rare with byte-level BPE): emit nothing, resync at the end
            return ""
        new = text[len(self._emitted) :]
        self._emitted = text
        return new

    def flush(self) -> str:
        text = self._decode(self._ids)
        new = text[len(self._emitted) :] if text.startswith(self._emitted) else ""
        self._emitted = text
        return new


@dataclass
class TextGeneration:
    prompt_ids: list[int]
    text: str
    result: GenerationResult


def encode_prompt(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    """Token ids of the prompt; with ``chat`` the tokenizer's chat template wraps it as one user turn."""
    if not prompt:
        raise InputError("the prompt is empty; pass some text with --prompt")
    if chat:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        if isinstance(rendered, str):
            return list(tokenizer.encode(rendered, add_bos=False))
        return list(rendered)
    return list(tokenizer.encode(prompt, add_bos=True))


def generate_text(
    runner: NpuRunner,
    tokenizer: Any,
    prompt: str,
    *,
    max_new_tokens: int = 64,
    sampling: SamplingParams | None = None,
    chat: bool = False,
    on_text: Callable[[str], None] | None = None,
) -> TextGeneration:
    """Generate from ``prompt`` and stream completed text to ``on_text`` as tokens arrive."""
    ids = encode_prompt(tokenizer, prompt, chat)
    dec = IncrementalDecoder(tokenizer.decode)
    pieces: list[str] = []
    eos = set(runner.spec.eos_ids) | set(getattr(tokenizer, "eos_ids", ()) or ())

    def stream(tok: int) -> None:
        if tok in eos:
            return
        piece = dec.push(tok)
        if piece:
            pieces.append(piece)
            if on_text is not None:
                on_text(piece)

    result = runner.generate(ids, max_new_tokens, sampling, stream_callback=stream, stop_ids=sorted(eos))
    tail = dec.flush()
    if tail:
        pieces.append(tail)
        if on_text is not None:
            on_text(tail)
    return TextGeneration(prompt_ids=ids, text="".join(pieces), result=result)
