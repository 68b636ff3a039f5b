"""Text in, streamed text out: tokenizer + NpuRunner + sampling.

Streaming must never print half a UTF-8 character: byte-level BPE tokens can split a character across
tokens, so text goes through the tokenizer's incremental decoder (``model.tokenizer.IncrementalDecoder``),
which releases text only once it can no longer change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tilepilot.errors import InputError
from tilepilot.model.tokenizer import IncrementalDecoder
from tilepilot.runtime.runner import GenerationResult, NpuRunner
from tilepilot.runtime.sampling import SamplingParams


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
    dec = IncrementalDecoder(tokenizer)
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
