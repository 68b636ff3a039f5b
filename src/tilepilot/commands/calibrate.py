"""``tilepilot calibrate``: modeled vs published, side by side, per kernel family and end to end.

Every modeled figure is labelled modeled; published ones were measured on XDNA2 by their authors. The
exit code is 0 when every tolerance holds and 1 otherwise, so CI can run it. ``--fit`` re-runs the
calibration fit and prints the constants it proposes (freezing them is a reviewed edit of
``npu/calibration.py``, never a side effect of this command).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tilepilot.calibrate import crossval, frozen
from tilepilot.calibrate import harness as ca
from tilepilot.calibrate.air_q4 import air_q4_figures
from tilepilot.calibrate.predict import predict, render
from tilepilot.plan.paper_deployments import PAPER_DECODE_CONTEXT


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "calibrate",
        help="compare the modeled NPU with published XDNA2 measurements",
        description=(
            "Time our designs of every published kernel measurement and the iron-like / paper-like plans of "
            "Llama-3.2-1B with the timing model, and compare with what was measured on XDNA2 silicon. "
            "All tilepilot times are modeled."
        ),
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (stable key order)")
    p.add_argument("--rows", action="store_true", help="also list every kernel row (human output)")
    p.add_argument(
        "--table",
        action="append",
        choices=[t for t, _ in ca.KERNEL_TABLES],
        help="only these measurement tables (repeatable; default all)",
    )
    p.add_argument("--no-end-to-end", action="store_true", help="skip the Llama-3.2-1B plan figures")
    p.add_argument(
        "--no-cv",
        action="store_true",
        help=f"skip the cross-validation ({crossval.FOLDS} refits of the kernel constants, each without one fold of "
        "the rows; ~half a minute)",
    )
    p.add_argument(
        "--cpu",
        choices=("modeled", "estimated", "measured"),
        default="modeled",
        help="CPU groups of the plans are always modeled (bytes and FLOPs at the host constants); 'measured' also "
        "measures their wall clock on this host, reported beside ('estimated' is an older name of 'modeled')",
    )
    p.add_argument(
        "--predict",
        type=Path,
        default=None,
        metavar="FILE",
        help="time every row of a measurements file (reference format) with the frozen constants, no fit",
    )
    p.add_argument("--fit", action="store_true", help="re-run the fit of the fitted constants and print the result")
    return p


def run(args: argparse.Namespace) -> int:
    if args.predict is not None:
        rep = predict(args.predict)
        print(json.dumps(rep, indent=2) if args.json else render(rep))
        return 0
    if args.fit:
        return _fit(args)
    progress = None if args.json else _status()
    with progress or _Null():
        rows = ca.kernel_rows(tables=args.table)
        report = ca.run(rows=rows, end_to_end=not args.no_end_to_end, cpu=args.cpu)
        frozen.attach(report, tables=args.table)
        if not args.no_end_to_end:  # AIR's 4-bit figures: shown as predictions, never in the fit or the pass
            report.end_to_end += air_q4_figures(cpu=args.cpu)
        if not args.no_cv:
            crossval.attach(report, rows)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        _print(report, rows=args.rows)
    return 0 if report.passed else 1


def _fit(args: argparse.Namespace) -> int:
    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    full = crossval.fit_all(progress=None if args.json else say)
    kernel, e2e = full.kernel, full.end_to_end
    proposed = ca.fitted_values(e2e.calibration)
    choices = {c.choice.name: {"cv_loss": c.loss, "free_constants": list(c.choice.params)} for c in full.choices}
    if args.json:
        out = {
            "fit_choices": choices,
            "chosen": full.chosen.choice.name,
            "kernel_stage": {"loss_before": kernel.loss_before, "loss_after": kernel.loss_after},
            "end_to_end_stage": {"loss_before": e2e.loss_before, "loss_after": e2e.loss_after},
            "changes_from_prior": {k: list(v) for k, v in {**kernel.changes, **e2e.changes}.items()},
            "proposed": proposed,
            "frozen_fit": full.record.to_dict(),
        }
        print(json.dumps(out, indent=1, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    c = Table(title="Fit choices by cross-validated loss (lowest wins)")
    for col in ("choice", "free constants", "CV loss"):
        c.add_column(col)
    for name, body in choices.items():
        mark = " (chosen)" if name == full.chosen.choice.name else ""
        c.add_row(name + mark, ", ".join(body["free_constants"]), f"{body['cv_loss']:.5f}")
    console.print(c)
    t = Table(title="Fitted constants proposed by the fit from the prior (freeze them in npu/calibration.py)")
    t.add_column("constant")
    t.add_column("prior", justify="right")
    t.add_column("fitted", justify="right")
    for name, (old, new) in {**kernel.changes, **e2e.changes}.items():
        t.add_row(name, f"{old:.4g}", f"{new:.4g}")
    console.print(t)
    console.print(
        f"per-kernel loss {kernel.loss_before:.4f} -> {kernel.loss_after:.4f}; "
        f"end-to-end stage {e2e.loss_before:.4f} -> {e2e.loss_after:.4f} "
        f"({kernel.evaluations + e2e.evaluations} trials)"
    )
    console.print(f"frozen record (npu/calibration.FROZEN_FIT): {full.record.to_dict()}")
    return 0


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _status():
    from rich.console import Console

    return Console(stderr=True).status("building and timing the designs of every published measurement (modeled) ...")


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.3f} ms" if x < 1 else f"{x:.3f} s"


def _ratio(r: float | None, bad: bool) -> str:
    if r is None:
        return "[yellow]not modeled yet[/]"
    return f"[red]{r:.2f}[/]" if bad else f"{r:.2f}"


def _print(report: ca.CalibrationReport, rows: bool) -> None:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    if report.end_to_end:
        t = Table(title="Llama-3.2-1B end to end: tilepilot (modeled) vs published (measured on XDNA2)")
        for col, just in (("figure", "left"), ("modeled", "right"), ("published", "right"), ("ratio", "right")):
            t.add_column(col, justify=just)
        t.add_column("")
        for f in report.end_to_end:
            bad = f.ratio is not None and f.checked and f.abs_err > ca.END_TO_END_ABS_ERR
            mark = "" if not f.checked else ("[red]FAIL[/]" if bad or f.ratio is None else "ok")
            t.add_row(f.label, _fmt_s(f.modeled), _fmt_s(f.published), _ratio(f.ratio, bad), mark or "info")
        console.print(t)
    if report.paper:
        t = Table(
            title="The paper's nine deployments (measured) vs our paper-like plan (modeled): TTFT at 2048 tokens, "
            f"decode at {PAPER_DECODE_CONTEXT} positions (the paper's short prompt)",
            box=box.MINIMAL_HEAVY_HEAD,
        )
        # narrow enough for an 80-column terminal: units in the headers, the fitted model starred instead of a
        # role column, one dispatch column (the paper's own count in brackets only where it differs from ours)
        for col in ("model", "TTFT s\nours", "TTFT s\npaper", "ratio", "tok/s\nours", "tok/s\npaper", "ratio",
                    "disp.\n/layer"):  # fmt: skip
            left = col == "model"
            t.add_column(
                col, justify="left" if left else "right", no_wrap=left, min_width=max(map(len, col.split("\n")))
            )
        for p in report.paper:
            d = p.to_dict()
            pub = d["dispatches_per_layer_published"]
            ours = "{}/{}".format(*p.dispatches_modeled)
            paper = "-" if pub is None else "{}/{}".format(*pub)
            t.add_row(p.model + ("*" if p.role == "fit" else ""), f"{p.ttft_modeled_s:.3f}",
                      f"{p.ttft_published_s:.3f}", f"{d['ttft_ratio']:.2f}", f"{p.decode_tok_s_modeled:.1f}",
                      f"{p.decode_tok_s_published:.1f}", f"{d['decode_ratio']:.2f}",
                      ours if paper == ours else f"{ours} ({paper})")  # fmt: skip
        console.print(t)
        console.print(
            "ours = our paper-like plan, modeled; paper = measured on silicon; disp./layer = NPU dispatches per "
            "layer in prefill/decode (the paper's in brackets where they differ). "
            "* only Llama-3.2-1B informs a constant (end-to-end stage); the other eight are predictions. Each "
            "paper-like plan is built from the paper's facts for that model (plan/paper_deployments.py: its "
            "dispatches per layer, what ran on the CPU, the head_dim-128 host transposes)."
        )
    t = Table(title="Per kernel family: modeled vs measured NPU2 latency (AIR kernel registry)")
    cols = ("table", "family", "rows", "median |err|", "worst", "CV median", "CV worst", "")
    for col in cols:
        t.add_column(col, justify="left" if col in ("table", "family") else "right")
    fams, cv = report.families, report.cv_families
    for table, figs in report.kernels.items():
        s = fams[table]
        fam = figs[0].family if figs else table
        if s.status == "not modeled yet":
            t.add_row(table, fam, str(s.rows), "-", "-", "-", "-", "[yellow]not modeled yet[/]")
            continue
        c = cv.get(table)
        t.add_row(
            table,
            fam,
            f"{s.modeled_rows}/{s.rows}",
            f"{s.median_abs_err:.1%}",
            f"{s.worst_ratio:.2f}",
            "-" if c is None or c.median_abs_err is None else f"{c.median_abs_err:.1%}",
            "-" if c is None or c.worst_ratio is None else f"{c.worst_ratio:.2f}",
            "ok" if s.ok else "[red]FAIL[/]",
        )
    console.print(t)
    if report.cross_validation:
        x = report.cross_validation
        console.print(
            f"cross-validated (CV): {escape(x['method'])}; fit choice {x['choice']!r} "
            f"(free: {', '.join(x['free_constants'])}); CV loss {x['cv_loss']:.4f}. In-sample: the frozen constants."
        )
    if rows:
        d = Table(title="Kernel rows (modeled vs measured)")
        for col in ("row", "modeled", "measured", "ratio", "CV ratio", "note"):
            d.add_column(col, justify="right" if col in ("modeled", "measured", "ratio", "CV ratio") else "left")
        for table, figs in report.kernels.items():
            held = {h.key: h for h in (report.held_out or {}).get(table, [])}
            for f in figs:
                bad = f.ratio is not None and not (1 / ca.KERNEL_MAX_RATIO <= f.ratio <= ca.KERNEL_MAX_RATIO)
                h = held.get(f.key)
                cvr = "-" if h is None or h.ratio is None else f"{h.ratio:.2f}"
                d.add_row(f.label, _fmt_s(f.modeled), _fmt_s(f.published), _ratio(f.ratio, bad), cvr, f.note)
        console.print(d)
    for lim in report.limits:
        status = "ok" if lim.ok else "[red]FAIL[/]"
        codes = ", ".join(lim.codes) or "accepts it"
        console.print(f"limit {lim.key}: {escape(lim.description)} -> validator {codes} \\[{status}]")
    ff = report.frozen_fit
    if ff is not None:
        rec = ff["recorded"]
        verdict = "yes" if ff["matches"] else "[red]NO[/]"
        console.print(
            f"frozen constants are the recorded fit (choice {rec['choice']!r}, CV loss {rec['cv_loss']:.5f}, in-sample "
            f"loss {rec['kernel_loss']:.5f}; every recomputed objective equal): {verdict}"
        )
    failures = report.failures()
    if failures:
        console.print("[red]tolerances not met:[/]")
        for f in failures:
            console.print(f"  - {f}")
    else:
        console.print(
            f"all tolerances hold (kernel median <= {ca.KERNEL_MEDIAN_ABS_ERR:.0%}, no row beyond "
            f"{ca.KERNEL_MAX_RATIO:g}x, end to end within +-{ca.END_TO_END_ABS_ERR:.0%}); times are modeled"
        )
