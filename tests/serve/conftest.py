"""A real ``tilepilot serve`` process over a 1-layer zoo workspace, driven over loopback.

The server runs as its own process (``python -m tilepilot serve``) on 127.0.0.1 with a free port, so the
tests exercise what a user runs: argument parsing, uvicorn, signals. The fixture waits for ``/health``
and always kills the process in teardown, whatever the test did.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from serve_helpers import subprocess_env

from tilepilot.runtime.workspace import make_workspace

MODEL = "qwen2.5-0.5b"  # the smallest hidden size of the zoo; one layer keeps the server quick
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


@pytest.fixture(scope="session")
def serve_model_dir(zoo_model) -> Path:
    return zoo_model(MODEL, layers=1)


@pytest.fixture(scope="session")
def serve_workspace(serve_model_dir, tmp_path_factory) -> Path:
    return make_workspace(serve_model_dir, "default", tmp_path_factory.mktemp("serve-ws") / "ws").path


@pytest.fixture(scope="session")
def launch(serve_workspace, serve_model_dir, tmp_path_factory) -> Iterator[Callable[[], Server]]:
    """Start extra servers (e.g. one a test will SIGTERM); every one is killed at the end of the session."""
    started: list[Server] = []

    def make() -> Server:
        log = tmp_path_factory.mktemp("serve-log") / "server.log"
        server = start_server(serve_workspace, serve_model_dir, log)
        started.append(server)
        return server

    yield make
    for s in started:
        stop_server(s)


@pytest.fixture(scope="session")
def server(launch) -> Server:
    return launch()


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)


@pytest.fixture(scope="session")
def model_id(client) -> str:
    models = client.models.list().data
    assert len(models) == 1
    return models[0].id


@pytest.fixture(scope="session")
def tokenizer(serve_model_dir):
    from tilepilot.model.tokenizer import Tokenizer

    return Tokenizer.from_dir(serve_model_dir)
