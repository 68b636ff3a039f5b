"""Host speed of tilepilot's functional runner vs Hugging Face transformers bf16 eager, side by side.

A full-size zoo checkpoint (default Llama-3.2-1B, random weights) is written to a temp dir; then each
side runs in its own subprocess (so their peak resident memory never mixes): prefill of
``--prompt-len`` tokens and ``--decode`` greedy decode steps. Printed per side: host prefill seconds,
host decode tokens/s, peak RSS and its ratio to the bf16 weight size; then the decode speed ratio.
All times here are measured wall clock on this machine (the NPU is not involved: this measures how
fast tilepilot's host-side simulation of a deployment runs, which must not be slower than transformers).

    python benchmarks/host_speed.py [--model llama-3.2-1b] [--prompt-len 128] [--decode 32] [--plan paper-like]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_RSS_RATIO = 1.5  # issue 5: peak resident memory <= 1.5x the bf16 weight size


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _prompt(vocab: int, n: int) -> list[int]:
    return [(7919 * i + 13) % min(vocab, 30000) for i in range(n)]


def side_tilepilot(model_dir: Path, prompt_len: int, decode: int, plan_name: str) -> dict:
    from tilepilot.model.checkpoint import load_checkpoint
    from tilepilot.plan.builtin import builtin_plan
    from tilepilot.runtime.runner import NpuRunner

    t0 = time.perf_counter()
    weights = load_checkpoint(model_dir)
    runner = NpuRunner(builtin_plan(plan_name, weights.spec), weights)
    load_s = time.perf_counter() - t0
    ids = _prompt(weights.spec.vocab, prompt_len)
    runner.generate(ids[:8], 3, stop_ids=())  # warm-up: kernel designs of the decode shapes, thread pools
    res = runner.generate(ids, decode + 1, stop_ids=())
    return {
        "side": f"tilepilot NpuRunner ({plan_name} plan)",
        "load_s": load_s,
        "prefill_s": res.prefill_host_s,
        "decode_steps": res.n_decode_steps,
        "decode_tok_s": res.host_decode_tok_s,
        "tokens": res.tokens,
        "weight_bytes": weights.spec.weight_bytes(2),
        "peak_rss_bytes": _peak_rss_bytes(),
    }


def side_transformers(model_dir: Path, prompt_len: int, decode: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

    class Stamp(LogitsProcessor):
        """Records the time each next-token distribution is ready (first = end of prefill)."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores):
            self.times.append(time.perf_counter())
            return scores

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="eager")
    model.eval()
    load_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    ids = torch.tensor([_prompt(model.config.vocab_size, prompt_len)])
    with torch.no_grad():
        model.generate(ids[:, :8], max_new_tokens=3, min_new_tokens=3, do_sample=False)  # warm-up
        stamp = Stamp()
        t1 = time.perf_counter()
        out = model.generate(
            ids,
            max_new_tokens=decode + 1,
            min_new_tokens=decode + 1,
            do_sample=False,
            logits_processor=LogitsProcessorList([stamp]),
        )
    steps = len(stamp.times) - 1
    return {
        "side": "transformers bf16 eager generate",
        "load_s": load_s,
        "prefill_s": stamp.times[0] - t1,
        "decode_steps": steps,
        "decode_tok_s": steps / (stamp.times[-1] - stamp.times[0]) if steps else 0.0,
        "tokens": out[0, ids.shape[1] :].tolist(),
        "weight_bytes": 2 * n_params,
        "peak_rss_bytes": _peak_rss_bytes(),
    }


def _child(args) -> None:
    import torch

    torch.manual_seed(0)
    if args.side == "tilepilot":
        res = side_tilepilot(args.model_dir, args.prompt_len, args.decode, args.plan)
    else:
        res = side_transformers(args.model_dir, args.prompt_len, args.decode)
    res["torch_threads"] = torch.get_num_threads()
    print("RESULT " + json.dumps(res))


def _run_side(side: str, model_dir: Path, args) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--side",
        side,
        "--model-dir",
        str(model_dir),
        "--prompt-len",
        str(args.prompt_len),
        "--decode",
        str(args.decode),
        "--plan",
        args.plan,
    ]
    load_before = os.getloadavg()[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{side} side failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    res = json.loads(lines[-1][len("RESULT ") :])
    res["loadavg_1min"] = [load_before, os.getloadavg()[0]]  # other processes compete for the 2 cores
    return res


def _report(tp: dict, hf: dict, args, write_s: float) -> None:
    gib = 1024**3
    print(f"model {args.model} (random zoo weights), prompt {args.prompt_len} tokens, {args.decode} decode steps")
    print(f"checkpoint written in {write_s:.1f} s; every figure below is measured wall clock / RSS on this host")
    print(f"{'':36} {'prefill s':>10} {'decode tok/s':>13} {'peak RSS GiB':>13} {'RSS / bf16 weights':>19}")
    for r in (tp, hf):
        ratio = r["peak_rss_bytes"] / r["weight_bytes"]
        print(
            f"{r['side']:36} {r['prefill_s']:>10.2f} {r['decode_tok_s']:>13.3f} "
            f"{r['peak_rss_bytes'] / gib:>13.2f} {ratio:>19.2f}"
        )
    speed = tp["decode_tok_s"] / hf["decode_tok_s"] if hf["decode_tok_s"] else float("inf")
    agree = sum(a == b for a, b in zip(tp["tokens"], hf["tokens"], strict=False))
    rss_ratio = tp["peak_rss_bytes"] / tp["weight_bytes"]
    print(f"decode speed ratio tilepilot / transformers = {speed:.2f} (target >= 1.00)")
    print(f"tilepilot peak RSS / bf16 weights = {rss_ratio:.2f} (target <= {TARGET_RSS_RATIO})")
    print(f"greedy tokens identical at {agree}/{len(hf['tokens'])} positions (both bf16; information only)")
    for r in (tp, hf):
        lo, hi = r["loadavg_1min"]
        print(f"host load average (1 min) around the {r['side']} run: {lo:.1f} -> {hi:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--plan", default="paper-like")
    ap.add_argument("--side", choices=("tilepilot", "transformers"), help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", type=Path, help="use an existing checkpoint instead of writing one")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.side:
        _child(args)
        return
    from tilepilot.model.zoo import write_zoo_model

    with tempfile.TemporaryDirectory(prefix="tilepilot-host-speed-") as tmp:
        model_dir = args.model_dir
        write_s = 0.0
        if model_dir is None:
            t0 = time.perf_counter()
            model_dir = write_zoo_model(args.model, Path(tmp) / args.model)
            write_s = time.perf_counter() - t0
        tp = _run_side("tilepilot", model_dir, args)
        hf = _run_side("transformers", model_dir, args)
    if args.json:
        print(json.dumps({"tilepilot": tp, "transformers": hf}, indent=2))
    _report(tp, hf, args, write_s)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
