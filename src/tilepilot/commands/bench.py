"""``tilepilot bench PATH [--prompt-len 2048] [--decode-tokens N] [--plan ...] [--json] [--trace FILE]``.

Two kinds of numbers, side by side and labelled:

- **modeled**: the plan timed at ``--prompt-len`` (TTFT) and one decode step at that context
  (``runtime.timing.time_plan``): NPU dispatches, buffer syncs and the CPU groups' host cost, all from
  the timing model and its constants (so they do not depend on this machine's load); the CPU groups'
  wall clock measured on this machine at those shapes is printed beside, labelled measured;
- **measured**: host wall clock of a short *functional* run of the same plan on this machine
  (prefill of ``--run-prompt-len`` tokens, default min(prompt-len, 32), then ``--decode-tokens`` greedy
  steps). The functional run executes fewer prompt tokens than are modeled, to keep it short; both
  lengths are printed.

PATH is a workspace (``deployment.json``) or, until a deployment exists, a Hugging Face model directory:
then ``--plan`` picks a built-in plan (default ``paper-like``) and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from tilepilot.commands.deploy import _published
from tilepilot.errors import InputError, WorkspaceError
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.spec import load_spec
from tilepilot.model.tokenizer import Tokenizer
from tilepilot.model.zoo import get_zoo_model
from tilepilot.npu.trace import Trace, library_layouts
from tilepilot.plan.builtin import BUILTIN_PLANS, builtin_plan
from tilepilot.plan.paper_deployments import PAPER_DECODE_CONTEXT
from tilepilot.runtime.dispatcher import KernelLibrary
from tilepilot.runtime.eta import ddr_floor_tok_s, weight_streaming_bound_tok_s
from tilepilot.runtime.runner import NpuRunner, one_dispatch_name
from tilepilot.runtime.timing import same_model_claims, time_plan
from tilepilot.runtime.workspace import is_workspace, load_workspace

PLANS = ("deployed", *BUILTIN_PLANS)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench",
        help="modeled TTFT/decode of a plan plus the measured host time of a short functional run",
        description="Benchmark a deployment (WORKSPACE) or a model directory with a built-in plan. "
        "NPU times are modeled; host wall-clock times are measured.",
    )
    p.add_argument("path", type=Path, metavar="WORKSPACE|MODEL_DIR")
    p.add_argument("--prompt-len", type=int, default=2048, metavar="N", help="prompt length modeled for TTFT")
    p.add_argument("--decode-tokens", type=int, default=8, metavar="N", help="decode steps of the functional run")
    p.add_argument(
        "--run-prompt-len", type=int, default=None, metavar="N", help="prompt tokens the functional run executes"
    )
    p.add_argument("--plan", choices=PLANS, default=None, help="deployed (workspace default) or a built-in plan")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--trace", type=Path, default=None, metavar="FILE", help="write the functional run's Chrome trace")
    return p


def _resolve(path: Path, plan_name: str | None):
    """(plan, spec, model_dir, runner options) from a workspace or a model directory."""

    if is_workspace(path):
        ws = load_workspace(path)
        if plan_name in (None, "deployed"):
            return ws.plan, ws.spec, ws.model_dir, ws.runner_options
        return builtin_plan(plan_name, ws.spec), ws.spec, ws.model_dir, {}
    if (path / "config.json").is_file():
        if plan_name == "deployed":
            raise WorkspaceError(
                f"{path} is a model directory, not a workspace; pick a built-in --plan ({', '.join(BUILTIN_PLANS)})"
            )
        spec = load_spec(path)
        return builtin_plan(plan_name or "paper-like", spec), spec, path, {}
    raise WorkspaceError(f"{path} is neither a workspace nor a model directory; pass one of them")


def _run_ids(tokenizer: Any, n: int, vocab: int) -> list[int]:
    """A deterministic prompt of exactly ``n`` tokens (tokenized text, repeated, or plain ids without one)."""
    if tokenizer is not None:
        text = "The quick brown fox jumps over the lazy dog while the NPU streams weights through its tiles. "
        ids = list(tokenizer.encode(text * (1 + n // 8), add_bos=False))
        if len(ids) >= n:
            return ids[:n]
    return [(7 * i + 3) % vocab for i in range(n)]


def bench(
    path: Path,
    prompt_len: int = 2048,
    decode_tokens: int = 8,
    plan_name: str | None = None,
    run_prompt_len: int | None = None,
    trace_path: Path | None = None,
) -> dict[str, Any]:

    if prompt_len < 1 or decode_tokens < 0:
        raise InputError("--prompt-len must be >= 1 and --decode-tokens >= 0")
    plan, spec, model_dir, options = _resolve(Path(path), plan_name)
    if prompt_len + 1 > spec.max_positions:  # the decode step timed after the prompt needs one more position
        raise InputError(
            f"--prompt-len {prompt_len} does not fit the model's context of {spec.max_positions} tokens (the decode "
            f"step after it needs one more); pass --prompt-len {spec.max_positions - 1} or less"
        )

    library = KernelLibrary()
    modeled = time_plan(plan, spec, prompt_len=prompt_len, cpu="measured", library=library)
    # a one-dispatch decode's launches by kind (the dispatch this plan's decode step was just timed as)
    one = library.timed_dispatches(one_dispatch_name("decode")) if plan.decode.one_dispatch else []
    launches = None
    if one:
        g = one[-1]
        launches = {
            "clock": "modeled",
            "launches": g.launches,
            "seconds": g.seconds,
            "dispatch_s": g.dispatch_overhead_s,
            "switches_and_config_s": g.launch_overhead_s,
            "kinds": g.by_kind(library.cal.ddr_bytes_per_s),
            # a resident pass's weight prefetch (``npu/prefetch.py``): launches that fetched ahead, bytes, time saved
            "prefetch": {
                "launches": len(g.prefetched),
                "bytes": sum(p.nbytes for p in g.prefetched),
                "saved_s": sum(p.saved_s for p in g.prefetched),
            }
            if plan.decode.prefetch
            else None,
        }
    # same-model comparison: the same model's paper-like and iron-like plans, timed by the same model in this run
    plans = {name: builtin_plan(name, spec) for name in ("paper-like", "iron-like")}
    baselines = {name: time_plan(p, spec, prompt_len=prompt_len, library=library) for name, p in plans.items()}
    try:
        full = spec.n_layers == get_zoo_model(spec.name).spec().n_layers
    except Exception:  # noqa: BLE001 - not a zoo model: no published figure
        full = False
    fig = {n: {"ttft_s": t.ttft_s, "decode_tok_s": t.decode_tok_s} for n, t in baselines.items()}
    published = _published(spec.name, prompt_len, full)
    as_measured = None
    if published:  # the model's error is taken where the paper measured: decode at its short prompt
        t = time_plan(plans["paper-like"], spec, prompt_len, PAPER_DECODE_CONTEXT, library=library)
        as_measured = {"ttft_s": t.ttft_s, "decode_tok_s": t.decode_tok_s}
    claims = same_model_claims(
        {"ttft_s": modeled.ttft_s, "decode_tok_s": modeled.decode_tok_s},
        fig["paper-like"],
        fig["iron-like"],
        published,
        as_measured,
    )
    claims["baselines_modeled"] = fig
    bound = weight_streaming_bound_tok_s(spec, plan.weight_format(), library.cal.ddr_bytes_per_s)
    kv_rows = plan.decode.kv_readback(modeled.context_len)
    floor = ddr_floor_tok_s(spec, plan.weight_format(), kv_rows, library.cal.ddr_bytes_per_s)
    run_len = min(prompt_len, run_prompt_len or 32)
    try:
        tokenizer = Tokenizer.from_dir(model_dir)
    except Exception:  # noqa: BLE001 - a model without a usable tokenizer still benches on plain ids
        tokenizer = None
    t0 = time.perf_counter()
    weights = load_checkpoint(model_dir)
    trace = Trace()
    runner = NpuRunner(plan, weights, trace=trace, **options)
    load_s = time.perf_counter() - t0
    result = runner.generate(_run_ids(tokenizer, run_len, spec.vocab), decode_tokens + 1, stop_ids=())
    if trace_path is not None:
        trace.to_chrome(trace_path, library_layouts(runner.library))  # + per-column / tile / channel tracks
    return {
        "model": spec.name,
        "plan": plan.name,
        "modeled": {
            "clock": "modeled (NPU dispatches, syncs and CPU groups' host cost); *_measured_* fields are measured",
            "prompt_len": prompt_len,
            "ttft_s": modeled.ttft_s,
            "decode_ms_per_token": modeled.decode_s_per_token * 1e3,
            "decode_tok_s": modeled.decode_tok_s,
            "decode_context_len": modeled.context_len,
            # the plan's decode weights per token at the model's usable DDR rate: no plan of this model is faster
            "weight_streaming_bound_tok_s": bound,
            "decode_of_bound": modeled.decode_tok_s / bound,
            # ... and with the KV readback it streams at that context added: the floor of its DDR bytes
            "ddr_floor_tok_s": floor,
            "decode_kv_rows": kv_rows,
            "decode_of_floor": modeled.decode_tok_s / floor,
            "weights_preload_s": modeled.load_s,
            "dispatches_per_token": dict(modeled.dispatches),
            "decode_launches": launches,
            "dispatches_per_layer": {s: plan.dispatches_per_layer(s) for s in ("prefill", "decode")},
            "groups": [{"name": g.name, **per_layer_entry(g)} for g in modeled.groups],
            "cpu_measured_ms": {
                st: sum(g.cpu_measured_s or 0.0 for g in modeled.stage_groups(st)) * 1e3 for st in ("prefill", "decode")
            },
        },
        "claims": claims,
        "functional_run": {
            "clock": "measured host wall clock on this machine",
            "prompt_tokens_executed": run_len,
            "decode_steps": result.n_decode_steps,
            "load_s": load_s,
            "prefill_s": result.prefill_host_s,
            "decode_s": result.decode_host_s,
            "host_decode_tok_s": result.host_decode_tok_s,
            "modeled_ttft_s_at_run_len": result.modeled_ttft_s,
            "cpu_groups_measured_s": sum(e.measured_s or 0.0 for e in trace.events if e.kind == "cpu"),
            "dispatches_traced": trace.count("dispatch"),
            "trace": str(trace_path) if trace_path else None,
        },
    }


def per_layer_entry(g) -> dict[str, Any]:
    return {
        "stage": g.stage,
        "part": g.part,
        "where": g.where,
        "calls": g.calls,
        "dispatch_ms": g.dispatch_s * 1e3,
        "sync_ms": g.sync_s * 1e3,
        "cpu_ms": g.cpu_s * 1e3,
        "cpu_measured_ms": None if g.cpu_measured_s is None else g.cpu_measured_s * 1e3,
        "per_call_ms": g.per_call_s * 1e3,
    }


def _print(res: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    con = Console()
    m, f = res["modeled"], res["functional_run"]
    top = Table(title=f"tilepilot bench: {res['model']} / plan {res['plan']}")
    top.add_column("figure")
    top.add_column("value", justify="right")
    top.add_column("clock")
    top.add_row(f"TTFT @ {m['prompt_len']} tokens", f"{m['ttft_s'] * 1e3:,.1f} ms", "modeled")
    top.add_row(f"decode @ context {m['decode_context_len']}", f"{m['decode_ms_per_token']:,.2f} ms/token", "modeled")
    top.add_row("decode throughput", f"{m['decode_tok_s']:,.2f} tok/s", "modeled")
    top.add_row(
        "decode weight-streaming bound (weights per token / DDR rate)",
        f"{m['weight_streaming_bound_tok_s']:,.2f} tok/s; plan at {100 * m['decode_of_bound']:.0f} %",
        "modeled",
    )
    top.add_row(
        f"decode DDR floor (weights + KV readback of {m['decode_kv_rows']} rows per token / DDR rate)",
        f"{m['ddr_floor_tok_s']:,.2f} tok/s; plan at {100 * m['decode_of_floor']:.0f} %",
        "modeled",
    )
    d = m["dispatches_per_token"]
    top.add_row("dispatches per token", f"{d['prefill']} prefill / {d['decode']} decode", "plan")
    dl = m["dispatches_per_layer"]
    top.add_row("dispatches per layer", f"{dl['prefill']} prefill / {dl['decode']} decode", "plan")
    top.add_row("weight preload (once)", f"{m['weights_preload_s'] * 1e3:,.1f} ms", "modeled")
    top.add_row(
        f"functional run: prefill {f['prompt_tokens_executed']} tokens", f"{f['prefill_s']:.3f} s", "measured (host)"
    )
    top.add_row(
        f"functional run: {f['decode_steps']} decode steps",
        f"{f['decode_s']:.3f} s = {f['host_decode_tok_s']:.2f} tok/s",
        "measured (host)",
    )
    con.print(top)
    c = res["claims"]
    for label, key in (("paper-like", "speedup_over_paper_like"), ("iron-like", "speedup_over_iron_like")):
        con.print(
            f"speed-up over this model's {label} plan (same model, same run, modeled): TTFT {c[key]['ttft']:.3f}x, "
            f"decode {c[key]['decode']:.3f}x"
        )
    if c["model_error_vs_silicon"]:
        e = c["model_error_vs_silicon"]
        con.print(
            f"timing model vs the paper's silicon ({e['basis']}, / published; an error, not a speed-up): "
            f"TTFT {e['ttft_modeled_over_published']:.2f}x, "
            f"decode tok/s {e['decode_tok_s_modeled_over_published']:.2f}x"
        )
    if m.get("decode_launches"):
        dl = m["decode_launches"]
        kinds = Table(
            title=f"one decode dispatch by launch kind (modeled, ms per token; dispatch {dl['dispatch_s'] * 1e3:.3f}, "
            f"switches + tile configuration {dl['switches_and_config_s'] * 1e3:.3f})"
        )
        for col in ("kind", "launches", "time", "fill + drain", "DDR MB", "at DDR rate", "bound"):
            kinds.add_column(col, justify="left" if col in ("kind", "bound") else "right")
        for k in dl["kinds"]:
            kinds.add_row(
                k["kind"], str(k["launches"]), f"{k['seconds'] * 1e3:.3f}", f"{k['fill_drain_s'] * 1e3:.3f}",
                f"{k['ddr_bytes'] / 1e6:.2f}", f"{k['ddr_s'] * 1e3:.3f}",
                ", ".join(f"{b} {n}" for b, n in sorted(k["bounds"].items())),
            )  # fmt: skip
        con.print(kinds)
        if dl.get("prefetch"):
            pf = dl["prefetch"]
            con.print(
                f"weight prefetch (modeled): {pf['launches']} launches fetched {pf['bytes'] / 1e6:.1f} MB ahead into "
                f"memory-tile regions, {pf['saved_s'] * 1e3:.3f} ms per token saved"
            )
    # one table per stage, headers over two lines and no outer edge: readable whole in an 80-column terminal
    for stage in dict.fromkeys(g["stage"] for g in m["groups"]):
        groups = Table(
            title=f"{stage} groups (modeled ms; block groups per layer)",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            collapse_padding=True,
        )
        for col in ("group", "where", "calls", "per\ncall", "dispatch", "syncs", "cpu", "cpu\nmeasured"):
            left = col in ("group", "where")
            groups.add_column(col, justify="left" if left else "right", no_wrap=True)
        for g in (g for g in m["groups"] if g["stage"] == stage):
            groups.add_row(
                g["name"],
                g["where"],
                str(g["calls"]),
                f"{g['per_call_ms']:.3f}",
                f"{g['dispatch_ms']:.3f}",
                f"{g['sync_ms']:.3f}",
                f"{g['cpu_ms']:.3f}",
                "" if g["cpu_measured_ms"] is None else f"{g['cpu_measured_ms']:.3f}",
            )
        con.print(groups)
    con.print(
        f"NPU, sync and CPU-group times are modeled; 'cpu measured' is the CPU groups' wall clock on this machine, "
        f"beside the model, not in it. The functional run "
        f"executed {f['prompt_tokens_executed']} prompt tokens (the modeled TTFT is for {m['prompt_len']})."
    )
    if f["trace"]:
        con.print(f"Chrome trace of the functional run: {f['trace']}")


def run(args) -> int:
    res = bench(args.path, args.prompt_len, args.decode_tokens, args.plan, args.run_prompt_len, args.trace)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        _print(res)
    return 0
