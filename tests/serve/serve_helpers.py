"""Helpers shared by the serve tests (a module of its own: conftest files are not importable by name)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

STARTUP_TIMEOUT_S = 90.0
REQUEST_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    model_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def health(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/health", timeout=REQUEST_TIMEOUT_S) as r:
            return json.loads(r.read())


def start_server(workspace: Path, model_dir: Path, log: Path) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "tilepilot", "serve", str(workspace), "--port", str(port), "--log-level", "warning"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=subprocess_env())
    server = Server(proc, port, model_dir)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if server.health()["status"] == "ok":
                return server
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.2)
    stop_server(server)
    raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S} s:\n{log.read_text()}")


def stop_server(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(timeout=10)


def subprocess_env() -> dict[str, str]:
    """One torch thread per process: the test machine has 2 cores shared by the client and the server."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env
