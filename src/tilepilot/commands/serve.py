"""``tilepilot serve WORKSPACE [--host H] [--port P]``: the deployment as an OpenAI-compatible ``/v1`` API.

Endpoints: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions`` (streaming or not) and
``/health``. Each response carries a ``tilepilot`` field with the modeled NPU figures of the request
(timing model, no NPU here) beside the measured host time. SIGINT/SIGTERM stop it cleanly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tilepilot.errors import InputError
from tilepilot.serve.engine import Engine
from tilepilot.serve.launch import serve
from tilepilot.skills.status import warn_if_unvalidated


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve",
        help="serve a deployment as an OpenAI-compatible API (NPU times modeled, host time measured)",
        description="Serve the deployment in WORKSPACE over HTTP with the OpenAI /v1 API. NPU times are modeled.",
    )
    p.add_argument("workspace", type=Path, metavar="WORKSPACE")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--max-queue", type=int, default=64, metavar="N", help="requests that may wait (then 429)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    return p


def run(args) -> int:

    if not 0 <= args.port <= 65535:
        raise InputError(f"--port must be in 0..65535, got {args.port}")
    if args.max_queue < 1:
        raise InputError(f"--max-queue must be >= 1, got {args.max_queue}")
    engine = Engine.from_workspace(args.workspace, max_queue=args.max_queue)
    warn_if_unvalidated(args.workspace)
    serve(engine, host=args.host, port=args.port, log_level=args.log_level)
    return 0
