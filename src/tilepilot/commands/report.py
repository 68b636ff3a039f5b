"""``tilepilot report WORKSPACE [--out FILE.html]``: a self-contained HTML page with the deployment's figures.

The page opens offline in any browser (inline SVG, no scripts, no fonts). It re-times the deployed plan and
the built-in paper-like and iron-like plans of the same model with the timing model (modeled), and runs the
kernel part of ``tilepilot calibrate`` unless ``--calibration`` names a saved ``calibrate --json`` report.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tilepilot.errors import InputError
from tilepilot.report import build_report


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report",
        help="write a self-contained HTML report with plots of a deployment (NPU times modeled)",
        description="Write WORKSPACE/report.html (or --out): phase timeline, optimization trajectory, per-layer "
        "time vs built-in plans, roofline, gate numerics and calibration. NPU times are modeled.",
    )
    p.add_argument("workspace", type=Path, metavar="WORKSPACE")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.html", help="default WORKSPACE/report.html")
    p.add_argument(
        "--calibration",
        type=Path,
        default=None,
        metavar="FILE.json",
        help="a saved `tilepilot calibrate --json` report (default: compute the kernel rows now, ~10 s)",
    )
    p.add_argument(
        "--prompt-len", type=int, default=None, metavar="N", help="modeled prompt length (default: the deployment's)"
    )
    p.add_argument(
        "--cpu",
        choices=("measured", "modeled", "estimated"),
        default="measured",
        help="CPU groups of the compared plans are modeled either way (bytes and FLOPs at the host rates); "
        "'measured' (default) also runs each once here and shows its wall clock beside; 'modeled' "
        "(older name 'estimated') does not",
    )
    return p


def run(args) -> int:

    if args.calibration is not None and not args.calibration.is_file():
        raise InputError(f"--calibration {args.calibration} is not a file; save one with `tilepilot calibrate --json`")
    path, data = build_report(
        args.workspace, args.out, calibration=args.calibration, prompt_len=args.prompt_len, cpu=args.cpu
    )
    shown = sum(s.ok for s in data.sections)
    print(f"wrote {path}: {shown}/{len(data.sections)} figures; NPU figures are modeled, host times measured")
    for s in data.sections:
        if not s.ok:
            print(f"  no figure for {s.title.lower()}: {s.missing}")
    return 0
