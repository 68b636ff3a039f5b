"""The terminal chat of ``tilepilot chat``: a conversation rendered with the chat template, over the engine.

It uses the same ``Engine`` as the server, so a turn re-sends the whole conversation and the engine
reuses the KV rows of the previous turns (the figures line says how many prompt tokens came from the
cache). Ctrl-C during a reply stops it at the next token; at the prompt, Ctrl-C or Ctrl-D ends the chat.
"""

from __future__ import annotations

import queue
import sys
from typing import TextIO

from tilepilot.errors import TilepilotError
from tilepilot.runtime.sampling import SamplingParams
from tilepilot.serve.engine import Engine, Event, Failed, Finished, GenerationParams, TextDelta

HELP = "commands: /reset (new conversation), /system TEXT (set the system prompt, new conversation), /exit"
USER_PROMPT = "you> "
REPLY_PREFIX = "assistant> "


def figures_line(f: Finished) -> str:
    """Modeled NPU figures of the reply, then the measured host time, each labelled."""
    tok_s = f"{f.modeled_decode_tok_s:.1f} tok/s" if f.modeled_decode_tok_s else "n/a (no decode step)"
    reused = f", {f.cached_tokens} reused from the KV cache" if f.cached_tokens else ""
    reason = "interrupted" if f.finish_reason == "cancelled" else f.finish_reason
    cpu = f.ttft_cpu_measured_s + f.decode_cpu_measured_s
    cpu_note = f" (incl. CPU groups measured {cpu * 1e3:.1f} ms)" if cpu > 0 else ""
    return (
        f"[modeled TTFT {f.modeled_ttft_s * 1e3:.1f} ms | modeled decode {tok_s}{cpu_note} | "
        f"measured host {f.measured_host_s:.2f} s | prompt {f.prompt_tokens} tokens{reused} | "
        f"{f.completion_tokens} generated ({reason})]"
    )


class ChatRepl:
    """Read a line, answer it with streamed text, print the figures; commands start with ``/``."""

    def __init__(
        self,
        engine: Engine,
        *,
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        system: str | None = None,
        stdin: TextIO | None = None,
        stdout: TextIO | None = None,
    ):
        self.engine = engine
        self.sampling = sampling or SamplingParams()
        self.max_new_tokens = max_new_tokens
        self.system = system
        self.stdin = stdin or sys.stdin
        self.out = stdout or sys.stdout
        self.messages: list[dict[str, str]] = []
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def say(self, text: str = "", end: str = "\n") -> None:
        self.out.write(text + end)
        self.out.flush()

    def _read(self) -> str | None:
        self.say(USER_PROMPT, end="")
        if self.stdin is sys.stdin:
            return input()
        line = self.stdin.readline()
        return line.rstrip("\n") if line else None

    def run(self) -> None:
        if not self.engine.has_chat_template:
            raise TilepilotError("this model has no chat template; use `tilepilot generate --prompt` instead")
        self.say(f"tilepilot chat with {self.engine.model_id} (NPU figures modeled, host time measured). {HELP}")
        while True:
            try:
                line = self._read()
            except (EOFError, KeyboardInterrupt):
                line = None
            if line is None:
                self.say()
                return
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if not self.command(line):
                    return
                continue
            self.turn(line)

    def command(self, line: str) -> bool:
        """Run a ``/`` command; False ends the chat."""
        name, _, rest = line.partition(" ")
        if name in ("/exit", "/quit"):
            return False
        if name == "/reset":
            self.reset()
            self.say("[new conversation]")
        elif name == "/system":
            self.system = rest.strip() or None
            self.reset()
            self.say(f"[system prompt {'set' if self.system else 'cleared'}; new conversation]")
        elif name == "/help":
            self.say(HELP)
        else:
            self.say(f"[unknown command {name}; {HELP}]")
        return True

    def turn(self, text: str) -> None:
        """One user turn: render, generate with streaming, keep the reply in the conversation."""
        messages = [*self.messages, {"role": "user", "content": text}]
        try:
            ids = self.engine.chat_ids(messages)
            max_tokens = self.engine.resolve_max_tokens(ids, None, default=self.max_new_tokens)
        except TilepilotError as e:
            self.say(f"[error: {e}; /reset starts a new conversation]")
            return
        events: queue.Queue[Event] = queue.Queue()
        job = self.engine.submit(ids, GenerationParams(max_tokens, self.sampling), events.put)
        end: Finished | None = None
        shown = False
        while end is None:
            try:
                if not shown:
                    shown = True
                    self.say(REPLY_PREFIX, end="")
                ev = events.get()
                if isinstance(ev, TextDelta):
                    self.say(ev.text, end="")
                elif isinstance(ev, Failed):
                    self.say(f"\n[error: {ev.error}]")
                    return
                else:
                    end = ev
            except KeyboardInterrupt:  # wherever it lands: the engine stops at the next token, still sends Finished
                job.cancel()
        self.say()
        self.messages = [*messages, {"role": "assistant", "content": end.text}]
        self.say(figures_line(end))
