"""``tilepilot evaluate WORKSPACE [--json] [--seed S]``: the independent evaluator, in this fresh process.

Exit code 0 on PASS or PASS-with-warnings, 1 on FAIL. The file-read audit hook is installed here, before
anything reads the workspace, so the report can state which files were read before measuring.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tilepilot.errors import WorkspaceError
from tilepilot.skills.evaluator import ReadAudit, evaluate
from tilepilot.skills.phases.evaluate import IndependentEvaluator
from tilepilot.skills.status import unfinished_reason


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "evaluate",
        help="independently audit and re-measure a deployment (writes evaluation_report.md)",
        description="Audit and re-measure a deployment workspace without trusting its journal. NPU times are modeled.",
    )
    p.add_argument("workspace", type=Path, metavar="WORKSPACE")
    p.add_argument("--json", action="store_true", help="print the evaluation as JSON")
    p.add_argument("--seed", type=int, default=None, help="evaluation seed (default: fresh random)")
    return p


def run(args) -> int:

    if not (args.workspace / "deployment.json").is_file():
        raise WorkspaceError(f"{args.workspace} is not a deployment workspace; create one with `tilepilot deploy`")
    audit = ReadAudit(args.workspace).install()
    ev = evaluate(args.workspace, seed=args.seed, read_audit=audit)
    audit.active = False
    # after measuring, so the journal's gates are read only once the measurement is done (the audit's rule)
    unfinished = unfinished_reason(args.workspace, before=IndependentEvaluator.phase)
    if unfinished:
        print(
            f"tilepilot: note: {args.workspace}: {unfinished}; this evaluation judges it as it stands, so finish it "
            f"first with `tilepilot deploy MODEL --out {args.workspace} --resume`",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(ev.to_dict(), indent=2, default=str))
    else:
        from rich.console import Console

        c = Console()
        color = {"PASS": "green", "PASS-with-warnings": "yellow"}.get(ev.verdict, "red")
        c.print(f"[bold {color}]{ev.verdict}[/] {args.workspace} (seed {ev.seed})")
        for chk in ev.checks:
            mark = {"pass": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}[chk.status]
            c.print(f"  {mark} {chk.name}: {chk.detail}")
        c.print(f"report: {args.workspace / 'evaluation_report.md'}")
    return 0 if ev.verdict in ("PASS", "PASS-with-warnings") else 1
