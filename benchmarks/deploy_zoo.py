"""Deploy reduced zoo checkpoints of the four families with ``tilepilot deploy`` and compare the plans.

For each model: write the zoo checkpoint with ``--layers`` decoder layers (real hidden sizes, heads and
vocabulary), deploy it through phases 0-7, and report the verdict, the measured host seconds per phase,
and the modeled TTFT at 2048 tokens and decode latency of three plans *timed on the full published
model*: the unoptimized default plan, the paper-like plan, and the plan the deployment produced. Plans
describe one block and the head, so a plan found on a 2-layer checkpoint times the 16-layer model exactly
as it would run there. Every NPU figure is modeled (calibrated XDNA2 model); host seconds are measured.

    python benchmarks/deploy_zoo.py                       # the four families, 2 layers each
    python benchmarks/deploy_zoo.py --models llama-3.2-1b --layers 2 --json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

DEFAULT_MODELS = ("llama-3.2-1b", "smollm2-1.7b", "qwen2.5-0.5b", "qwen3-0.6b")


def full_model_figures(name: str, deployed_plan) -> dict:
    from tilepilot.model.zoo import get_zoo_model
    from tilepilot.plan.builtin import default_plan, paper_like_plan
    from tilepilot.runtime.timing import time_plan
    from tilepilot.skills.context import perf_figures

    spec = get_zoo_model(name).spec()
    out = {}
    plans = (("default", default_plan(spec)), ("paper_like", paper_like_plan(spec)), ("deployed", deployed_plan))
    for label, plan in plans:
        out[label] = perf_figures(plan, time_plan(plan, spec, prompt_len=2048))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--work", type=Path, default=None, help="directory for checkpoints and workspaces (default: temp)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from tilepilot.model.zoo import write_zoo_model
    from tilepilot.runtime.workspace import load_workspace
    from tilepilot.skills.context import Settings
    from tilepilot.skills.orchestrator import deploy

    work = args.work or Path(tempfile.mkdtemp(prefix="tilepilot-deploy-zoo-"))
    knowledge = work / "knowledge"
    rows = []
    for name in args.models:
        model = work / f"{name}-{args.layers}l"
        if not model.exists():
            write_zoo_model(name, model, layers=args.layers)
        ws = work / f"ws-{name}"
        t0 = time.perf_counter()
        resume = (ws / "deployment.json").exists()
        summary = deploy(model, ws, resume=resume, settings=Settings(knowledge_dir=knowledge))
        wall = time.perf_counter() - t0
        figures = full_model_figures(name, load_workspace(ws).plan) if summary.ok else {}
        rows.append(
            {
                "model": name,
                "layers_deployed": args.layers,
                "verdict": summary.verdict,
                "host_seconds_measured": wall,
                "phase_seconds_measured": {p.name: round(p.seconds, 2) for p in summary.phases},
                "full_model_modeled": figures,
                "review": summary.review,
            }
        )
        if not args.json:
            print(f"\n{name} ({args.layers} layers deployed): {summary.verdict} in {wall:.0f} s (host, measured)")
            for label, f in figures.items():
                d = f["dispatches_per_layer"]
                print(
                    f"  {label:>10}: TTFT@2048 {f['ttft_s']:.3f} s, decode {f['decode_ms_per_token']:.1f} ms/token "
                    f"({f['decode_tok_s']:.2f} tok/s), dispatches/layer {d['prefill']}/{d['decode']} "
                    f"[full {name}, modeled]"
                )
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0 if all(r["verdict"] in ("PASS", "PASS-with-warnings") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
