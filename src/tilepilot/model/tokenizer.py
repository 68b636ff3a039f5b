"""Tokenizer: ``tokenizer.json`` through the ``tokenizers`` library, chat templates through jinja2.

We do not go through transformers at run time: the fast tokenizer file alone carries the vocabulary,
merges, normalizer and special tokens, and the chat template is a jinja2 string in
``tokenizer_config.json``. Rendering it in a sandboxed environment with the helpers Hugging Face
templates expect (``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII text, the
``loopcontrols`` extension, every special token by name) gives the same prompt text as transformers.
End-of-generation ids come from ``generation_config.json`` when the model has one (it may list several,
e.g. an end-of-turn token besides EOS), else from the tokenizer's ``eos_token``.
"""

from __future__ import annotations

import json
import re
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
        # Whether a sequence starts with BOS, decided as transformers' ``tokenizer(text)`` decides it: by
        # tokenizer.json's post-processor (transformers 5 drops tokenizer_config's add_bos_token when tokenizer.json
        # exists). SmolLM2 names a BOS (<|im_start|>) but never starts plain text with it (add_bos_token false).
        self.adds_bos = bos_id is not None and _post_processor_adds(backend, bos_id)
        # System turn put in front of every conversation that has none (``generate --system``); None keeps
        # the template's own behaviour (SmolLM2's, for one, then writes its built-in system prompt).
        self.system_prompt: str | None = None

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
            eos_ids = _generation_eos(model_dir)
        if not eos_ids:
            eos = _id_of(backend, _token_text(config.get("eos_token")))
            eos_ids = (eos,) if eos is not None else ()
        return cls(backend, config, bos_id, eos_ids)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of ``text``. ``add_bos`` says the text starts a sequence: BOS goes first only when the model's
        tokenizer starts sequences with it (``adds_bos``), so a plain prompt is encoded as transformers encodes it."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_bos and self.adds_bos and (not ids or ids[0] != self.bos_id):
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

    def special_tokens(self) -> dict[str, str]:
        """Special tokens by the names templates use (``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``)."""
        out = {}
        for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
            text = _token_text(self.config.get(name))
            if text is not None:
                out[name] = text
        return out

    def chat_messages(self, prompt: str, system: str | None = None) -> list[dict[str, str]]:
        """One user turn, after a system turn if ``system`` (or ``self.system_prompt``) is set."""
        system = system if system is not None else self.system_prompt
        head = [{"role": "system", "content": system}] if system is not None else []
        return [*head, {"role": "user", "content": prompt}]

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The prompt text the model's own template makes of ``messages`` (as transformers renders it).

        ``self.system_prompt`` is put first when the messages have no system turn; extra keyword arguments
        (``tools``, ``enable_thinking``...) reach the template as variables, as in transformers.
        """
        if not self.chat_template:
            raise TokenizerError("this model has no chat template in tokenizer_config.json; pass a plain prompt")
        if self.system_prompt is not None and not (messages and messages[0].get("role") == "system"):
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        from jinja2 import TemplateError

        try:
            template = _chat_environment().from_string(self.chat_template)
            return template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                **{"bos_token": "", "eos_token": "", **self.special_tokens(), **kwargs},
            )
        except _TemplateRaised as e:
            raise TokenizerError(f"the chat template rejected the messages: {e}") from None
        except TemplateError as e:
            raise TokenizerError(f"the chat template cannot be rendered: {e}") from None

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the rendered conversation (special tokens the template writes become their ids)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt), add_bos=False)


class _TemplateRaised(Exception):
    """``raise_exception`` called by a template (kept apart from jinja's own errors for the message)."""


def _chat_environment():
    """The jinja2 environment transformers renders chat templates in: same extensions, filters and globals."""
    import datetime

    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise _TemplateRaised(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False) -> str:
        # jinja's own tojson escapes HTML characters and non-ASCII text, which changes the prompt
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def _generation_eos(model_dir: Path) -> tuple[int, ...]:
    """``eos_token_id`` of ``generation_config.json`` (an int or a list), or () if there is none."""
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return ()
    try:
        eos = json.loads(path.read_text()).get("eos_token_id")
    except (json.JSONDecodeError, AttributeError):
        raise TokenizerError(
            f"generation_config.json in {model_dir} is not a valid JSON object; fix or remove it"
        ) from None
    if isinstance(eos, int) and not isinstance(eos, bool):
        return (eos,)
    if isinstance(eos, list) and all(isinstance(i, int) for i in eos):
        return tuple(eos)
    return ()


# Special-token literals a chat template writes (<|im_start|>, <|eot_id|>, <|start_header_id|>...).
_TEMPLATE_TOKEN = re.compile(r"<\|[^|<>\s]{1,64}\|>")


def checkpoint_mismatches(
    tok: Tokenizer, model_dir: str | Path, vocab: int, bos_id: int | None, eos_ids: Sequence[int]
) -> list[tuple[str, str]]:
    """How the tokenizer files disagree with the checkpoint (``vocab`` embedding rows; config.json's ``bos_id`` and
    ``eos_ids``), as ``(key, one sentence naming the problem and what to do)``; [] when they agree.

    Each is a mistake that makes a deployment wrong without an error: a tokenizer from another model emits ids past
    the embedding, an end id outside the vocabulary never stops generation, a template token the tokenizer lacks is
    split into ordinary pieces, and two BOS ids start sequences differently from training."""
    out: list[tuple[str, str]] = []
    if tok.vocab_size > vocab:
        out.append(
            (
                "vocab_exceeds_embedding",
                f"tokenizer.json has {tok.vocab_size} tokens but the embedding has {vocab} rows (config.json "
                f"vocab_size), so ids {vocab}..{tok.vocab_size - 1} have no embedding: use the tokenizer that was "
                "trained with this checkpoint.",
            )
        )
    sources = [("generation_config.json", _generation_eos(Path(model_dir))), ("config.json", tuple(eos_ids))]
    for source, ids in sources:
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            eos = tok.special_tokens().get("eos_token")
            hint = f" (the tokenizer's eos_token {eos!r} is id {_id_of(tok._tok, eos)})" if eos else ""
            out.append(
                (
                    f"eos_outside_vocab.{source}",
                    f"{source} names end-of-generation id {', '.join(map(str, bad))}, outside the {vocab}-token "
                    f"vocabulary, so generation can never stop on it: set eos_token_id there to the id of the "
                    f"model's end token{hint}.",
                )
            )
    missing = sorted({t for t in _TEMPLATE_TOKEN.findall(tok.chat_template or "") if tok._tok.token_to_id(t) is None})
    if missing:
        out.append(
            (
                "template_token_missing",
                f"the chat template writes {', '.join(missing)}, which tokenizer.json has no token for, so every chat "
                "prompt would split it into pieces the model never saw: use the chat template (tokenizer_config.json "
                "or chat_template.jinja) that belongs to this tokenizer.",
            )
        )
    bos_text = _token_text(tok.config.get("bos_token"))
    if bos_id is not None and tok.bos_id is not None and bos_id != tok.bos_id:
        out.append(
            (
                "bos_disagrees",
                f"config.json says BOS is id {bos_id} but the tokenizer's bos_token {bos_text!r} is id {tok.bos_id}: "
                "make bos_token_id in config.json and bos_token in tokenizer_config.json name the same token.",
            )
        )
    return out


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


def _post_processor_adds(backend, bos_id: int) -> bool:
    """True when tokenizer.json's post-processor puts ``bos_id`` in front of an encoded text."""
    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    return full[:1] == [bos_id] and plain[:1] != [bos_id]


def _id_of(backend, token: str | None) -> int | None:
    if token is None:
        return None
    return backend.token_to_id(token)
