"""Peak resident memory of loading a full-size zoo checkpoint through ``Checkpoint``, against its bf16 size.

Issue 2 asks that loading never holds two copies of the weights: a full-size model must load within
~1.3x its bf16 size of resident memory. A fresh child process opens the model with ``Checkpoint``, keeps
every tensor in a list and reads every byte of each one (the max of its raw 16/32-bit words, a
reduction in the tensor's own integer dtype that allocates nothing) so the pages are really resident.
An integer *sum* widened to int64 was used before: its cast buffers left 0.0-1.4 GiB of anonymous
memory behind, varying run to run, which measured torch's reduction rather than the loader. The child's
own peak RSS comes from ``os.wait4``, so neither this process nor the writer pollutes it. Everything
recorded is measured on this machine.

Where the model comes from:
  --workdir DIR   the seed-model benchmark's cache (DIR/models/NAME with its ``.zoo-seed`` stamp), written
                  there by ``seed_models.ensure_checkpoint`` in a measured child when absent, so the
                  directory is reused by ``benchmarks/seed_models.py --workdir DIR`` and vice versa
  --dir DIR       an existing model directory
  (neither)       a temporary directory, deleted afterwards

Each run adds its record (keyed by model) to ``benchmarks/results/load_memory.{json,md}``; a run that
reuses a cached checkpoint keeps the write time measured when that checkpoint was written.

    python benchmarks/load_memory.py --model qwen3-4b --workdir /work/seedwork
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET_RATIO = 1.3  # issue 2, "Checkpoints": within ~1.3x the bf16 size of resident memory
REPO = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = REPO / "benchmarks" / "results"
GiB = 2**30
WATCHED = ("src/tilepilot/model", "benchmarks/load_memory.py")  # uncommitted edits here mark a record
BYTE_WALK = "max of raw words"  # how the child touches every byte (earlier runs: "int64 sum", see docstring)


def _child(argv: list[str]) -> tuple[int, float, int, str]:
    """Run this script in a child process; return (exit code, wall s, peak RSS bytes, stdout)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.perf_counter() - t0, usage.ru_maxrss * 1024, out


def _write(name: str, workdir: str, seed: str) -> None:
    """Write through the seed benchmark's own helper, so its stamp marks the directory complete."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from seed_models import ensure_checkpoint

    path, seconds = ensure_checkpoint(name, Path(workdir), None, int(seed))
    print(json.dumps({"path": str(path), "write_seconds": seconds}))


def _load(model_dir: str) -> None:
    import resource

    import torch

    from tilepilot.model.checkpoint import Checkpoint

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    ck = Checkpoint(model_dir)
    kept, touched, nbytes = [], 0, 0
    for name in ck.names():
        t = ck.get(name)
        as_int = t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)
        touched ^= int(as_int.max())  # reads every byte, allocates nothing tensor-sized
        nbytes += t.numel() * t.element_size()
        kept.append(t)
    seconds = time.perf_counter() - t0
    status = {}
    with open("/proc/self/status") as f:  # where the resident bytes live: anonymous (copies) or file pages
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                status[key] = int(value.split()[0]) * 1024
    out = {"tensors": len(kept), "bytes": nbytes, "touched": touched, "rss_before_load": base, "seconds": seconds}
    out.update(rss_anon_end=status.get("RssAnon"), rss_file_end=status.get("RssFile"))
    print(json.dumps(out))


def _commit() -> str:
    """HEAD, plus a mark when the loader files differ from it (the measurement is then of uncommitted code)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *WATCHED], cwd=REPO, capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + (" (loader or benchmark modified)" if dirty.stdout.strip() else "")


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def measure(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    """Write (if needed) and load one model; the record, or SystemExit on a failed child."""
    from tilepilot.model.spec import load_spec

    rec: dict[str, Any] = {"model": args.model, "measured": True}
    model_dir = args.dir
    if model_dir is None:
        workdir = args.workdir or tmp
        load_before = os.getloadavg()
        rc, wall, peak, out = _child(["--_write", args.model, str(workdir), str(args.seed)])
        if rc:
            raise SystemExit(f"writing {args.model} failed (exit {rc})")
        wrote = json.loads(out.strip().splitlines()[-1])
        model_dir = wrote["path"]
        if wrote["write_seconds"] is not None:
            rec["write"] = {
                "wall_s": round(wall, 1),
                "write_zoo_model_s": round(wrote["write_seconds"], 1),
                "peak_rss_bytes": peak,
                "load_avg_before": load_before,
                "load_avg_after": os.getloadavg(),
                "seed": args.seed,
                "when": time.strftime("%F %T"),
            }
    spec = load_spec(model_dir)
    bf16 = spec.weight_bytes(2)
    load_before = os.getloadavg()
    rc, wall, peak, out = _child(["--_load", model_dir])
    if rc:
        raise SystemExit(f"loading {model_dir} failed (exit {rc})")
    loaded = json.loads(out.strip().splitlines()[-1])
    rec.update(
        model=spec.name,
        checkpoint=str(model_dir) if args.workdir or args.dir else "(temporary directory)",
        checkpoint_bytes=sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors")),
        bf16_bytes=bf16,
        loaded_bytes=loaded["bytes"],
        tensors=loaded["tensors"],
        load_wall_s=round(wall, 1),
        load_in_child_s=round(loaded["seconds"], 1),
        peak_rss_bytes=peak,
        rss_before_load_bytes=loaded["rss_before_load"],
        rss_anon_end_bytes=loaded["rss_anon_end"],
        rss_file_end_bytes=loaded["rss_file_end"],
        ratio=round(peak / bf16, 3),
        target_ratio=TARGET_RATIO,
        met=peak / bf16 <= TARGET_RATIO,
        load_avg_before=load_before,
        load_avg_after=os.getloadavg(),
        byte_walk=BYTE_WALK,
        when=time.strftime("%F %T"),
        commit=_commit(),
    )
    return rec


def render_markdown(models: dict[str, dict[str, Any]], meta: dict[str, Any], history: list[dict[str, Any]]) -> str:
    lines = [
        "# Checkpoint loading: peak resident memory (measured)",
        "",
        f"Written by `benchmarks/load_memory.py`; host {meta['host']}. Every figure is measured on this machine:",
        "a fresh child process loads the whole checkpoint through `tilepilot.model.checkpoint.Checkpoint`, keeps",
        "every tensor and reads every byte; its peak RSS comes from `wait4`. Issue 2's target: peak RSS within",
        f"{TARGET_RATIO}x the model's bf16 size. Write times are `tilepilot zoo` (`write_zoo_model`) in its own",
        "child, wall clock including interpreter start. The machine is shared; load averages are 1/5/15 min.",
        "",
        "| model | bf16 size | peak RSS | ratio | target | met | load wall | zoo write wall | writer peak RSS "
        "| load avg (load) | commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rec in models.values():
        w = rec.get("write")
        write = f"{w['wall_s']} s ({w['when']})" if w else "not measured"
        wpeak = f"{w['peak_rss_bytes'] / GiB:.2f} GiB" if w else "-"
        la = " / ".join(f"{x:.2f}" for x in rec["load_avg_before"])
        lines.append(
            f"| {rec['model']} | {rec['bf16_bytes'] / GiB:.2f} GiB | {rec['peak_rss_bytes'] / GiB:.2f} GiB "
            f"| {rec['ratio']:.2f}x | {rec['target_ratio']}x | {'met' if rec['met'] else 'NOT met'} "
            f"| {rec['load_wall_s']} s | {write} | {wpeak} | {la} | {rec['commit'][:12]}{rec['commit'][40:]} |"
        )
    lines += [
        "",
        "Peak RSS includes the interpreter and torch before loading "
        + ", ".join(f"{r['model']}: {r['rss_before_load_bytes'] / GiB:.2f} GiB" for r in models.values())
        + ". Load wall includes interpreter start-up and the byte walk, and depends on whether the checkpoint is "
        "still in the page cache (it is right after the write or an earlier load). At the end of loading, "
        "resident memory "
        "was split into anonymous (private copies) and file-backed (the checkpoint's page-cache mapping, which "
        "safetensors hands out zero-copy): "
        + ", ".join(
            f"{r['model']}: {r['rss_anon_end_bytes'] / GiB:.2f} GiB anon + {r['rss_file_end_bytes'] / GiB:.2f} GiB file"
            for r in models.values()
            if r.get("rss_anon_end_bytes") is not None
        )
        + ".",
        "",
        "## Every run (oldest first)",
        "",
        "| when | model | commit | byte walk | peak RSS | ratio | met | load wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for h in history:
        lines.append(
            f"| {h['when']} | {h['model']} | {h['commit'][:12]}{h['commit'][40:]} "
            f"| {h.get('byte_walk', 'int64 sum')} | {h['peak_rss_bytes'] / GiB:.2f} GiB | {h['ratio']:.2f}x "
            f"| {'met' if h['met'] else 'NOT met'} "
            f"| {h['load_wall_s']} s |"
        )
    lines.append("")
    return "\n".join(lines)


def save_results(rec: dict[str, Any], results_dir: Path) -> Path:
    """Merge this record into the results (keeping an earlier write time when this run reused the checkpoint)."""
    path = results_dir / "load_memory.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    models: dict[str, dict[str, Any]] = old.get("models", {})
    prev = models.get(rec["model"])
    if "write" not in rec and prev and prev.get("write") and prev.get("checkpoint") == rec["checkpoint"]:
        rec["write"] = prev["write"]
    models[rec["model"]] = rec
    history = old.get("history", []) + [
        {k: rec[k] for k in ("model", "when", "commit", "byte_walk", "peak_rss_bytes", "ratio", "met", "load_wall_s")}
    ]
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    meta = {
        "measured": True,
        "target_ratio": TARGET_RATIO,
        "host": f"{os.cpu_count()} CPUs, {mem / GiB:.0f} GiB, Python {platform.python_version()}",
        "written": time.strftime("%F %T"),
    }
    _atomic_write(path, json.dumps({"meta": meta, "models": models, "history": history}, indent=2) + "\n")
    md = results_dir / "load_memory.md"
    _atomic_write(md, render_markdown(models, meta, history))
    return md


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-4b", help="zoo model to write and load (default qwen3-4b)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--dir", default=None, help="load this existing model directory instead of writing one")
    src.add_argument("--workdir", type=Path, default=None, help="seed-benchmark cache: DIR/models/NAME (+ stamp)")
    ap.add_argument("--seed", type=int, default=0, help="zoo weight seed (the seed benchmark's default is 0)")
    ap.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS)
    ap.add_argument("--no-save", action="store_true", help="print only; do not touch the results files")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--_write", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--_load", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._write:
        _write(*args._write)
        return 0
    if args._load:
        _load(args._load)
        return 0

    with tempfile.TemporaryDirectory(prefix="tilepilot-load-memory-") as tmp:
        rec = measure(args, tmp)
    wrote_now = "write" in rec
    if not args.no_save:
        rec_path = save_results(rec, args.results_dir)
        print(f"results: {rec_path}", file=sys.stderr)
    if args.json:
        print(json.dumps(rec, indent=2))
    else:
        if "write" in rec:
            w = rec["write"]
            when = "" if wrote_now else f" (reused checkpoint, written {w['when']})"
            print(f"wrote {rec['model']} in {w['wall_s']} s, writer peak RSS {w['peak_rss_bytes'] / GiB:.2f} GiB{when}")
        print(
            f"loaded {rec['tensors']} tensors ({rec['loaded_bytes'] / GiB:.2f} GiB) in {rec['load_wall_s']} s; "
            f"peak RSS {rec['peak_rss_bytes'] / GiB:.2f} GiB = {rec['ratio']:.2f}x the bf16 size "
            f"({rec['bf16_bytes'] / GiB:.2f} GiB; interpreter + torch before loading "
            f"{rec['rss_before_load_bytes'] / GiB:.2f} GiB); target <= {TARGET_RATIO}x (measured)"
        )
    return 0 if rec["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
