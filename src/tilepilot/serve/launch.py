"""The uvicorn launcher: serve an engine's app, and shut down cleanly on SIGINT/SIGTERM.

uvicorn already turns SIGINT/SIGTERM into a graceful shutdown: stop accepting, wait for open responses,
run the lifespan shutdown. Two things are added here:

- the signal also stops the engine *at once*, so a generation in flight ends at its next token instead
  of the shutdown waiting for it (``timeout_graceful_shutdown`` is the backstop for anything else);
- uvicorn re-raises the captured signal after shutting down (so the default action would kill the
  process with -15 or raise KeyboardInterrupt); we install a handler that only notes the signal, so a
  requested shutdown is a normal return and the command exits 0.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from types import FrameType

import uvicorn

from tilepilot.serve.app import create_app
from tilepilot.serve.engine import Engine

GRACEFUL_SHUTDOWN_S = 5.0


class _Server(uvicorn.Server):
    """uvicorn's server, stopping the engine as soon as a shutdown signal arrives."""

    def __init__(self, config: uvicorn.Config, engine: Engine):
        super().__init__(config)
        self.engine = engine

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.engine.stop()
        super().handle_exit(sig, frame)


@contextlib.contextmanager
def _signals_noted() -> Iterator[list[int]]:
    """While serving, SIGINT/SIGTERM re-raised by uvicorn after its shutdown are only recorded."""
    seen: list[int] = []

    def note(sig: int, frame: FrameType | None) -> None:
        seen.append(sig)

    sigs = [signal.SIGINT, signal.SIGTERM]
    old = {s: signal.signal(s, note) for s in sigs}
    try:
        yield seen
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def serve(engine: Engine, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Run the HTTP server in this (main) thread until SIGINT/SIGTERM."""
    config = uvicorn.Config(
        create_app(engine),
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        lifespan="on",
    )
    server = _Server(config, engine)
    print(
        f"tilepilot: serving {engine.model_id!r} at http://{host}:{port}/v1 (context {engine.context} tokens; "
        "NPU figures modeled, host times measured); Ctrl-C to stop",
        file=sys.stderr,
        flush=True,
    )
    with _signals_noted():
        server.run()
    engine.close(timeout=GRACEFUL_SHUTDOWN_S)
