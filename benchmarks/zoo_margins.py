"""How decisive and how bf16-proof the greedy tokens of zoo checkpoints are, measured with transformers.

For each model this writes the zoo checkpoint (reduced to ``--layers`` or full size), loads it with
``transformers.AutoModelForCausalLM`` in float32 and in bfloat16 (weights and activations), and runs
32 greedy steps from a few text prompts. It reports, over all steps: the top-1 probability and the
top1-top2 logit margin of the FP32 model, the fraction of tokens that follow the planted circuit
(``succ`` of the token two positions back), how many greedy steps bf16 reproduces exactly, and the
largest |activation| of the residual stream over all layers. transformers is the independent
implementation here; nothing of tilepilot's own forward pass is involved. docs/zoo.md quotes the output.

    python benchmarks/zoo_margins.py [--models qwen3-0.6b ...] [--layers 2 | --full] [--steps 32] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

PROMPTS = [
    "The river rises in the mountains",
    "Good writing is clear writing.",
    "The train to the capital leaves from platform four at 9:15",
    "Once upon a time there was a fox",
]


@torch.no_grad()
def greedy(model, ids: list[int], steps: int) -> tuple[list[int], list[float], list[float]]:
    tokens, margins, top1 = [], [], []
    out = model(torch.tensor([ids]), use_cache=True)
    for _ in range(steps):
        logits = out.logits[0, -1].float()
        top = logits.topk(2)
        tokens.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        top1.append(float(logits.softmax(-1).max()))
        out = model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens, margins, top1


def measure(name: str, layers: int | None, steps: int, workdir: Path) -> dict:
    from transformers import AutoModelForCausalLM

    from tilepilot.model.tokenizer import Tokenizer
    from tilepilot.model.zoo import get_zoo_model, write_zoo_model
    from tilepilot.model.zoo_weights import successors

    t0 = time.perf_counter()
    d = write_zoo_model(name, workdir / f"{name}-{layers or 'full'}", layers=layers)
    write_s = time.perf_counter() - t0
    tok = Tokenizer.from_dir(d)
    succ = successors(get_zoo_model(name).live_vocab(), 0)
    fp32 = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    bf16 = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    margins, top1, agree, follows, max_abs, total = [], [], [], 0, 0.0, 0
    with torch.no_grad():
        for text in PROMPTS:
            ids = tok.encode(text)
            ref, m, p = greedy(fp32, ids, steps)
            margins += m
            top1 += p
            seq = ids + ref
            follows += sum(seq[len(ids) + i] == succ.get(seq[len(ids) + i - 2]) for i in range(steps))
            total += steps
            low, _, _ = greedy(bf16, ids, steps)
            agree.append(next((i for i, (a, b) in enumerate(zip(ref, low, strict=True)) if a != b), steps))
            hidden = fp32(torch.tensor([seq]), output_hidden_states=True).hidden_states[:-1]  # before final norm
            max_abs = max(max_abs, max(float(h.abs().max()) for h in hidden))
    spec = get_zoo_model(name).spec(layers)
    margins.sort()
    return {
        "model": name,
        "layers": spec.n_layers,
        "steps": total,
        "top1_prob_median": round(statistics.median(top1), 3),
        "top1_prob_min": round(min(top1), 3),
        "margin_median": round(statistics.median(margins), 2),
        "margin_p5": round(margins[len(margins) // 20], 2),
        "margin_min": round(margins[0], 2),
        "follows_circuit": round(follows / total, 3),
        "bf16_agreeing_steps": agree,
        "max_abs_residual": round(max_abs, 1),
        "write_s": round(write_s, 1),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> int:
    from tilepilot.model.zoo import zoo_names

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=zoo_names())
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--full", action="store_true", help="full-size models (all layers)")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)  # decode-sized steps: one thread is faster on a shared 2-core machine
    rows = []
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix="tilepilot-zoo-margins-") as tmp:
            row = measure(name, None if args.full else args.layers, args.steps, Path(tmp))
        rows.append(row)
        if not args.json:
            print(
                f"{row['model']:>13} L={row['layers']:<2} top1 p med {row['top1_prob_median']:.3f} "
                f"min {row['top1_prob_min']:.3f} | margin med {row['margin_median']:.2f} p5 {row['margin_p5']:.2f} "
                f"min {row['margin_min']:.2f} | circuit {row['follows_circuit']:.3f} | "
                f"bf16 agrees {row['bf16_agreeing_steps']} | max|h| {row['max_abs_residual']} ({row['seconds']} s)",
                flush=True,
            )
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
