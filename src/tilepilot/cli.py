"""The ``tilepilot`` command: a thin dispatcher over one module per sub-command in ``commands/``.

Each command module exposes ``add_parser(subparsers)`` and ``run(args) -> int``; this file only wires
them and turns user-facing errors into one sentence and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Before torch is imported (commands import it lazily): OpenMP threads that sleep when idle instead of
# spinning. On a 2-core machine shared with other jobs the default active spin made every small bf16 GEMV
# wait for a descheduled sibling thread: a Qwen2.5-0.5B decode step of the production runner took
# 1.6-3.3 s instead of 0.4-0.6 s (benchmarks/results/seed_models.md, "host cost"). The user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tilepilot.errors import TilepilotError  # noqa: E402

# sub-command name -> module under tilepilot.commands; imported lazily so `--help` stays fast.
COMMANDS = (
    "zoo", "import", "inspect", "deploy", "generate", "chat", "serve", "bench", "evaluate", "calibrate",
    "report", "skills",
)  # fmt: skip

# commands whose module name differs from the command (`import` is a Python keyword)
MODULES = {"import": "import_gguf"}


def _load(name: str):
    module = f"tilepilot.commands.{MODULES.get(name, name)}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            return None
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilepilot",
        description=(
            "Deploy decoder-only LLMs onto a modeled AMD XDNA2 NPU. NPU times are modeled; host times are measured."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        mod = _load(name)
        if mod is not None:
            p = mod.add_parser(sub)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except TilepilotError as e:
        print(f"tilepilot: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("tilepilot: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
