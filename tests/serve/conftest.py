"""A real ``tilepilot serve`` process over a 1-layer zoo workspace, driven over loopback.

The server runs as its own process (``python -m tilepilot serve``) on 127.0.0.1 with a free port, so the
tests exercise what a user runs: argument parsing, uvicorn, signals. The fixture waits for ``/health``
and always kills the process in teardown, whatever the test did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from serve_helpers import REQUEST_TIMEOUT_S, Server, start_server, stop_server

from tilepilot.runtime.workspace import make_workspace

MODEL = "qwen2.5-0.5b"  # the smallest hidden size of the zoo; one layer keeps the server quick


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
