"""Peak resident memory of loading a full-size zoo checkpoint through ``Checkpoint``, against its bf16 size.

Issue 2 asks that loading never holds two copies of the weights: a full-size model must load within
~1.3x its bf16 size of resident memory. This writes the model (default qwen3-4b) to a temporary
directory in one child process, then, in a fresh child process, opens it with ``Checkpoint``, keeps
every tensor in a list and reads every byte of each one (an integer sum, which allocates nothing the
size of a tensor) so the pages are really resident. Each child's own peak RSS comes from ``os.wait4``,
so the writer's peak does not pollute the loader's. Everything printed is measured on this machine.

    python benchmarks/load_memory.py [--model llama-3.2-1b] [--dir EXISTING_MODEL_DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_RATIO = 1.3  # issue 2, "Checkpoints": within ~1.3x the bf16 size of resident memory


def _child(argv: list[str]) -> tuple[int, float, int, str]:
    """Run this script in a child process; return (exit code, wall s, peak RSS bytes, stdout)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.perf_counter() - t0, usage.ru_maxrss * 1024, out


def _write(name: str, out: str) -> None:
    from tilepilot.model.zoo import write_zoo_model

    write_zoo_model(name, out)


def _load(model_dir: str) -> None:
    import resource

    import torch

    from tilepilot.model.checkpoint import Checkpoint

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ck = Checkpoint(model_dir)
    kept, checksum, nbytes = [], 0, 0
    for name in ck.names():
        t = ck.get(name)
        as_int = t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)
        checksum += int(as_int.sum(dtype=torch.int64))  # touches every byte
        nbytes += t.numel() * t.element_size()
        kept.append(t)
    print(json.dumps({"tensors": len(kept), "bytes": nbytes, "checksum": checksum, "rss_before_load": base}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-4b", help="zoo model to write and load (default qwen3-4b)")
    ap.add_argument("--dir", default=None, help="load this existing model directory instead of writing one")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--_write", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--_load", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._write:
        _write(*args._write)
        return 0
    if args._load:
        _load(args._load)
        return 0

    from tilepilot.model.spec import load_spec

    result: dict = {"model": args.model}
    with tempfile.TemporaryDirectory(prefix="tilepilot-load-memory-") as tmp:
        model_dir = args.dir
        if model_dir is None:
            model_dir = str(Path(tmp) / args.model)
            rc, wall, peak, _ = _child(["--_write", args.model, model_dir])
            if rc:
                print(f"writing {args.model} failed (exit {rc})", file=sys.stderr)
                return rc
            result.update(write_seconds=round(wall, 1), write_peak_rss=peak)
        spec = load_spec(model_dir)
        bf16 = spec.weight_bytes(2)
        rc, wall, peak, out = _child(["--_load", model_dir])
        if rc:
            print(f"loading {model_dir} failed (exit {rc})", file=sys.stderr)
            return rc
        loaded = json.loads(out.strip().splitlines()[-1])
        result.update(
            model=spec.name,
            bf16_bytes=bf16,
            loaded_bytes=loaded["bytes"],
            tensors=loaded["tensors"],
            load_seconds=round(wall, 1),
            peak_rss=peak,
            rss_before_load=loaded["rss_before_load"],
            ratio=round(peak / bf16, 3),
            target_ratio=TARGET_RATIO,
            load_avg=os.getloadavg(),
        )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        g = 2**30
        if "write_seconds" in result:
            print(
                f"wrote {result['model']} ({bf16 / g:.2f} GiB bf16) in {result['write_seconds']} s, "
                f"writer peak RSS {result['write_peak_rss'] / g:.2f} GiB (measured)"
            )
        print(
            f"loaded {result['tensors']} tensors ({result['loaded_bytes'] / g:.2f} GiB) in {result['load_seconds']} s; "
            f"peak RSS {peak / g:.2f} GiB = {result['ratio']:.2f}x the bf16 size "
            f"(interpreter + torch before loading: {result['rss_before_load'] / g:.2f} GiB); target <= {TARGET_RATIO}x"
        )
    return 0 if result["ratio"] <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
