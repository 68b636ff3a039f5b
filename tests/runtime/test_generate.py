from __future__ import annotations

from tilepilot.model.tokenizer import IncrementalDecoder
from tilepilot.plan.builtin import builtin_plan
from tilepilot.runtime.generate import generate_text
from tilepilot.runtime.runner import NpuRunner


class ByteTokenizer:
    """Token id = one UTF-8 byte (+3); 0/1/2 are pad/bos/eos. Multi-byte characters span several tokens."""

    eos_ids = (2,)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return ([1] if add_bos else []) + [b + 3 for b in text.encode()]

    def decode(self, ids, skip_special: bool = True) -> str:
        return bytes((i - 3) % 256 for i in ids if i >= 3).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt=True) -> str:
        turns = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return turns + ("<assistant>" if add_generation_prompt else "")


def test_streaming_decoder_never_emits_half_a_character():
    tok = ByteTokenizer()
    ids = tok.encode("añ€🙂!", add_bos=False)
    dec = IncrementalDecoder(tok)
    pieces = [dec.push(i) for i in ids]
    assert "".join(pieces) + dec.flush() == "añ€🙂!"
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[1] == "" and pieces[2] == "ñ"  # the two bytes of ñ are released together


def test_generate_text_streams_what_it_returns(weights_of):
    w = weights_of("llama")
    runner = NpuRunner(builtin_plan("paper-like", w.spec), w)
    streamed: list[str] = []
    out = generate_text(runner, ByteTokenizer(), "hi", max_new_tokens=12, on_text=streamed.append)
    assert "".join(streamed) == out.text
    assert out.prompt_ids == [1, 107, 108]
    assert len(out.result.tokens) <= 12
    chat = generate_text(runner, ByteTokenizer(), "hi", max_new_tokens=2, chat=True)
    assert chat.prompt_ids == ByteTokenizer().encode("<user>hi<assistant>", add_bos=False)
