"""A headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``).

The pipe needs no port, no websocket library and no network: Chromium reads NUL-terminated JSON commands
on fd 3 and writes replies and events on fd 4. Everything is bounded by a deadline, and the browser is
killed (by its own pid) whatever happens.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-pipe",
)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class PageResult:
    """What a page did: the value of the probe expression and every console error or uncaught exception."""

    value: Any
    errors: list[str] = field(default_factory=list)


class _Pipe:
    def __init__(self, proc: subprocess.Popen, to_chrome: int, from_chrome: int, deadline: float):
        self.proc, self.w, self.r, self.deadline = proc, to_chrome, from_chrome, deadline
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []

    def _read_message(self) -> dict:
        while b"\0" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self.r], [], [], left)
            if ready:
                chunk = os.read(self.r, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"chromium closed the pipe (exit code {self.proc.poll()})")
                self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._read_message()
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str) -> dict:
        for i, m in enumerate(self.events):
            if m.get("method") == method:
                return self.events.pop(i)
        while True:
            m = self._read_message()
            if m.get("method") == method:
                return m
            self.events.append(m)


def _errors(events: list[dict]) -> list[str]:
    out = []
    for m in events:
        p = m.get("params", {})
        if m.get("method") == "Runtime.exceptionThrown":
            out.append(f"exception: {p.get('exceptionDetails', {}).get('text')}")
        elif m.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append(
                "console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", []))
            )
        elif m.get("method") == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            out.append(f"log {e.get('source')}: {e.get('text')} {e.get('url', '')}".strip())
    return out


def probe_page(path: Path, expression: str, timeout_s: float = 40.0, width: int = 1200) -> PageResult:
    """Open ``path`` in headless Chromium, wait for the load event, evaluate ``expression`` (JSON-returning),
    and collect console errors, uncaught exceptions and failed loads (Log domain)."""
    exe = chromium()
    if exe is None:
        raise RuntimeError("chromium is not installed (apt-get install -y chromium)")
    deadline = time.monotonic() + timeout_s
    to_r, to_w = os.pipe()  # we write, chromium reads on fd 3
    from_r, from_w = os.pipe()  # chromium writes on fd 4, we read
    with tempfile.TemporaryDirectory(prefix="tp-chromium-", ignore_cleanup_errors=True) as profile:

        def child_fds() -> None:
            # Move both ends above any fd we target first, so dup2 onto 3 and 4 never clobbers the other one;
            # dup2 makes 3 and 4 inheritable, everything else the parent holds is close-on-exec.
            a, b = fcntl.fcntl(to_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},900", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=False,
            start_new_session=True,  # its own process group: the browser's helpers end with it
            preexec_fn=child_fds,
        )
        os.close(to_r)
        os.close(from_w)
        try:
            pipe = _Pipe(proc, to_w, from_r, deadline)
            targets = pipe.call("Target.getTargets")["targetInfos"]
            page = next(t for t in targets if t["type"] == "page")
            session = pipe.call("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                pipe.call(f"{domain}.enable", session=session)
            pipe.events.clear()
            pipe.call("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
            pipe.wait_event("Page.loadEventFired")
            res = pipe.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=session)
            value = res.get("result", {}).get("value")
            errors = _errors(pipe.events)
            try:
                pipe.call("Browser.close")
            except (RuntimeError, TimeoutError, OSError):
                pass
            return PageResult(value, errors)
        finally:
            os.close(to_w)
            os.close(from_r)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the group of the browser we started, by its id
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
