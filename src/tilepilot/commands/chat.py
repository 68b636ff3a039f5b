"""``tilepilot chat WORKSPACE``: multi-turn chat in the terminal with the deployment's chat template.

Replies stream as they are generated; after each one a line gives the modeled NPU figures (timing
model) and the measured host time. ``/reset``, ``/system TEXT``, ``/exit``; Ctrl-C stops a reply.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from tilepilot.errors import InputError
from tilepilot.runtime.sampling import SamplingParams
from tilepilot.serve.engine import Engine
from tilepilot.serve.launch import GRACEFUL_SHUTDOWN_S
from tilepilot.serve.repl import ChatRepl
from tilepilot.skills.status import warn_if_unvalidated


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "chat",
        help="chat with a deployment in the terminal (NPU times modeled, host time measured)",
        description="Multi-turn chat with the deployment in WORKSPACE. NPU times are modeled.",
    )
    p.add_argument("workspace", type=Path, metavar="WORKSPACE")
    p.add_argument("--system", default=None, metavar="TEXT", help="system prompt of the conversation")
    p.add_argument("--max-new-tokens", type=int, default=256, metavar="N")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="1 = off")
    p.add_argument("--seed", type=int, default=None, metavar="S")
    return p


def run(args) -> int:

    if args.max_new_tokens < 1:
        raise InputError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    # Ctrl-C stops a reply (the REPL catches KeyboardInterrupt); a chat started from a parent that ignores SIGINT
    # (a non-interactive shell's background job) inherits SIG_IGN and would never stop one
    signal.signal(signal.SIGINT, signal.default_int_handler)
    engine = Engine.from_workspace(args.workspace)
    warn_if_unvalidated(args.workspace)
    try:
        ChatRepl(engine, sampling=sampling, max_new_tokens=args.max_new_tokens, system=args.system).run()
    finally:
        engine.close(timeout=GRACEFUL_SHUTDOWN_S)
    return 0
