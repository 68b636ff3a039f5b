"""``tilepilot chat`` in a pseudo-terminal: streamed replies, labelled figures, commands, Ctrl-C, KV reuse."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest
from serve_helpers import subprocess_env

STARTUP_TIMEOUT_S = 90.0
TURN_TIMEOUT_S = 30.0
FIGURES = re.compile(
    r"\[modeled TTFT [\d.]+ ms \| modeled decode [\d.]+ tok/s( \(incl. CPU groups measured [\d.]+ ms\))? \| "
    r"measured host [\d.]+ s \| "
    r"prompt (?P<prompt>\d+) tokens(, (?P<reused>\d+) reused from the KV cache)? \| "
    r"(?P<generated>\d+) generated \((?P<reason>\w+)\)\]"
)


class Terminal:
    """A child process on a pty; ``expect`` reads until a pattern shows up or the timeout passes."""

    def __init__(self, argv: list[str]):
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=subprocess_env(), start_new_session=True
        )
        os.close(slave)
        self.buffer = ""

    def expect(self, pattern: str | re.Pattern, timeout: float = TURN_TIMEOUT_S) -> re.Match:
        rx = re.compile(re.escape(pattern)) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.buffer)
            if m:
                self.buffer = self.buffer[m.end() :]
                return m
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None and not select.select([self.master], [], [], 0)[0]:
                raise AssertionError(f"{rx.pattern!r} not seen within {timeout} s; output so far:\n{self.buffer}")
            if select.select([self.master], [], [], min(left, 0.5))[0]:
                try:
                    self.buffer += os.read(self.master, 65536).decode("utf-8", errors="replace")
                except OSError:  # EIO once the child has closed its side
                    time.sleep(0.05)

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        os.close(self.master)


@pytest.fixture
def terminal():
    opened: list[Terminal] = []

    def open_(workspace, *args: str) -> Terminal:
        t = Terminal([sys.executable, "-m", "tilepilot", "chat", str(workspace), *args])
        opened.append(t)
        t.expect("you> ", timeout=STARTUP_TIMEOUT_S)
        return t

    yield open_
    for t in opened:
        t.close()


def test_multi_turn_chat_streams_replies_with_labelled_figures_and_commands(terminal, serve_workspace):
    t = terminal(serve_workspace, "--max-new-tokens", "5")
    t.send("Tell me about the sea.")
    t.expect("assistant> ")
    first = t.expect(FIGURES)
    assert first["reused"] is None and first["generated"] == "5" and first["reason"] == "length"
    t.expect("you> ")
    t.send("And the mountains?")
    second = t.expect(FIGURES)
    assert int(second["prompt"]) > int(first["prompt"])  # the conversation grew
    assert int(second["reused"]) >= int(first["prompt"])  # and the first turn's KV rows were reused
    t.expect("you> ")
    t.send("/system Answer in one word.")
    t.expect("[system prompt set; new conversation]")
    t.send("Hello")
    third = t.expect(FIGURES)
    assert int(third["prompt"]) < int(second["prompt"])  # a new conversation: only system + one user turn
    t.send("/reset")
    t.expect("[new conversation]")
    t.send("/nonsense")
    t.expect("[unknown command /nonsense")
    t.send("/exit")
    assert t.proc.wait(timeout=15) == 0


def test_ctrl_c_stops_a_reply_and_the_chat_goes_on(terminal, serve_workspace):
    t = terminal(serve_workspace, "--max-new-tokens", "2000")
    t.send("Write a very long story.")
    t.expect("assistant> ")
    t.expect(re.compile(r"\S"))  # the reply has begun: interrupt it mid-stream, not before its first token
    t.proc.send_signal(signal.SIGINT)  # what Ctrl-C delivers
    stopped = t.expect(FIGURES, timeout=10)
    assert stopped["reason"] == "interrupted" and int(stopped["generated"]) < 2000
    t.expect("you> ")
    t.send("/exit")
    assert t.proc.wait(timeout=15) == 0
