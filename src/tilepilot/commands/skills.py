"""``tilepilot skills list | export DIR | run NAME WORKSPACE``: the skill catalogue, its Agent Skills export,
and one skill run by hand on a workspace (what a coding agent driving the chain step by step calls)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tilepilot.errors import InputError, WorkspaceError
from tilepilot.skills import registry
from tilepilot.skills.context import DeployContext, Settings
from tilepilot.skills.export import export


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("skills", help="list, export or run the deployment skills")
    sub = p.add_subparsers(dest="skills_command", metavar="ACTION")
    ls = sub.add_parser("list", help="list every skill with its kind and description")
    ls.add_argument("--json", action="store_true", help="print the catalogue as JSON")
    ex = sub.add_parser("export", help="write one Agent Skills folder (SKILL.md) per skill into DIR")
    ex.add_argument("dir", type=Path)
    run = sub.add_parser("run", help="run one skill on an existing deployment workspace")
    run.add_argument("name", help="skill name, e.g. kernel-validation or merge-launches")
    run.add_argument("workspace", type=Path)
    run.add_argument("--json", action="store_true", help="print the skill result as JSON")
    run.add_argument("--knowledge", type=Path, default=None, help="shared registry/lessons directory")
    return p


def _list(args) -> int:

    skills = registry.all_skills()
    if args.json:
        rows = [
            {
                "name": s.name,
                "kind": s.kind,
                "phase": getattr(s, "phase", None) if s.kind == "phase" else None,
                "description": s.description,
            }
            for s in skills
        ]
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tilepilot skills")
    table.add_column("name")
    table.add_column("kind")
    table.add_column("description")
    for s in skills:
        kind = f"phase {s.phase}" if s.kind == "phase" else s.kind
        table.add_row(s.name, kind, " ".join(s.description.split()))
    Console().print(table)
    return 0


def _export(args) -> int:

    written = export(registry.all_skills(), args.dir)
    print(f"wrote {len(written)} Agent Skills folders under {args.dir}")
    return 0


def _run(args) -> int:

    try:
        cls = registry.get(args.name)
    except KeyError:
        raise InputError(f"no skill is called {args.name!r}; see `tilepilot skills list`") from None
    if not (args.workspace / "deployment.json").is_file():
        raise WorkspaceError(f"{args.workspace} is not a deployment workspace; create one with `tilepilot deploy`")
    if cls.kind == "debug":
        raise InputError(
            f"{args.name} is a debug skill chosen by failure signature; run the failing phase (or `tilepilot deploy "
            "--resume`) and the orchestrator will pick it"
        )
    ctx = DeployContext(args.workspace, Settings(knowledge_dir=args.knowledge))
    t0 = time.perf_counter()
    result = cls().run(ctx)
    secs = time.perf_counter() - t0
    if args.json:
        print(json.dumps({**result.to_dict(), "seconds_measured": secs}, indent=2, default=str))
    else:
        print(f"{result.skill}: {result.status} in {secs:.2f} s (host, measured): {result.summary}")
    return 0 if result.ok else 1


def run(args) -> int:
    action = getattr(args, "skills_command", None)
    if action == "list":
        return _list(args)
    if action == "export":
        return _export(args)
    if action == "run":
        return _run(args)
    raise InputError("choose an action: `tilepilot skills list`, `skills export DIR` or `skills run NAME WORKSPACE`")
