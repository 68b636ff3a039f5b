"""`tilepilot zoo list | make`: the supported models, and random-weight checkpoints of them written to disk."""

from __future__ import annotations

import argparse
import json
import time

from tilepilot.model.zoo import DTYPES, ZOO, check_out_dir, dtype_from_name, get_zoo_model, write_zoo_model

# Below this many bytes a checkpoint is written in about a second; a progress bar would only flicker.
PROGRESS_MIN_BYTES = 256 * 1024**2


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("zoo", help="list the supported models or write a random-weight checkpoint of one")
    zsub = p.add_subparsers(dest="zoo_command", metavar="ACTION", required=True)
    lp = zsub.add_parser("list", help="the nine supported models with their published dimensions")
    lp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    mp = zsub.add_parser("make", help="write a Hugging Face checkpoint (config, tokenizer, random weights)")
    mp.add_argument("name", help=f"model name, one of: {', '.join(ZOO)}")
    mp.add_argument("--out", required=True, help="new directory to write (must not exist or be empty)")
    mp.add_argument("--layers", type=int, default=None, help="keep only the first N decoder layers (default: all)")
    mp.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    mp.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="stored dtype (default bf16)")
    mp.add_argument(
        "--shard-gib", type=float, default=2.0, help="split weights into safetensors shards of at most this size"
    )
    return p


def run(args) -> int:
    if args.zoo_command == "list":
        return _list(args.json)
    return _make(args)


def _list(as_json: bool) -> int:
    rows = []
    for m in ZOO.values():
        spec = m.spec()
        rows.append(
            {
                "name": m.name,
                "hf_repo": m.hf_repo,
                "architecture": spec.architecture,
                "layers": spec.n_layers,
                "hidden": spec.hidden,
                "intermediate": spec.intermediate,
                "heads": f"{spec.n_heads}/{spec.n_kv_heads}x{spec.head_dim}",
                "vocab": spec.vocab,
                "params": spec.n_params,
                "bf16_bytes": spec.weight_bytes(2),
            }
        )
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tilepilot zoo: published configs (`zoo make` writes random weights)")
    for col in ("name", "architecture", "layers", "hidden", "params", "bf16 size"):
        table.add_column(col, justify="left" if col in ("name", "architecture") else "right", no_wrap=True)
    for r in rows:
        table.add_row(
            r["name"],
            r["architecture"],
            str(r["layers"]),
            str(r["hidden"]),
            f"{r['params'] / 1e9:.3f} B",
            f"{r['bf16_bytes'] / 2**30:.2f} GiB",
        )
    Console().print(table)
    return 0


def _make(args) -> int:
    model = get_zoo_model(args.name)
    spec = model.spec(args.layers)
    dtype = dtype_from_name(args.dtype)
    total = spec.weight_bytes(4 if dtype == DTYPES["fp32"] else 2)
    shard_bytes = max(1, int(args.shard_gib * 1024**3))
    check_out_dir(args.out)  # fail before any progress bar appears
    t0 = time.perf_counter()
    if total >= PROGRESS_MIN_BYTES:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(
            TextColumn("writing {task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn()
        ) as bar:
            task = bar.add_task(model.name, total=total)
            out = write_zoo_model(
                model.name,
                args.out,
                layers=args.layers,
                seed=args.seed,
                dtype=args.dtype,
                shard_bytes=shard_bytes,
                progress=lambda _name, n: bar.advance(task, n),
            )
    else:
        out = write_zoo_model(
            model.name, args.out, layers=args.layers, seed=args.seed, dtype=args.dtype, shard_bytes=shard_bytes
        )
    seconds = time.perf_counter() - t0
    print(
        f"wrote {out}: {model.name} with {spec.n_layers} layers, {spec.n_params / 1e9:.3f} B parameters, "
        f"{total / 2**30:.2f} GiB of {args.dtype} weights in {seconds:.1f} s (measured)"
    )
    return 0
