"""Kernel probes on the model's own activations: a call of the plan run on the oracle's captured inputs.

The phase-1 probes feed seeded unit-scale inputs, so a fault that only large or lopsided values trigger (an fp16
store overflowing at 65504, one massive channel in a trained model's residual stream) passes them and shows only
when the whole model runs. These probes close that gap: the FP32 oracle runs the gate prompt once with every
per-layer capture point recorded, and each NPU call whose inputs are captured is run alone, through its real
binding (``kernels.bind``), on those inputs rounded to bf16, per layer, and compared with the oracle's capture of
its output. Inputs are the oracle's, not the runner's, so an error upstream cannot be blamed on the call probed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tilepilot.gates import metrics as M
from tilepilot.harness.model_gate import gate_prompts
from tilepilot.harness.probes import CallRef, call_shape, config_for, plan_calls
from tilepilot.kernels import rope
from tilepilot.kernels.bind import binding, config_key, family_module
from tilepilot.model.graph import LAYER_INPUT, block_graph
from tilepilot.oracle.capture import all_capture_names, capture_name
from tilepilot.skills.classify import GOOD_COSINE

# Graph values the oracle captures under another name (the rest share theirs: attn_norm, resid1, ffn_norm).
_POINT_OF = {
    "rope_q": "q_rope",
    "rope_k": "k_rope",
    "attention": "attn",
    "gate_proj": "gate",
    "up_proj": "up",
    "swiglu": "act",
    "down_proj": "down",
    "resid2": "out",
}
# Families whose calls need more than captured values (the KV cache) are not probed here.
SKIPPED_FAMILIES = ("attention",)
# A row (token) carries a massive activation when its largest |x| is at least this many times the median row's
# largest |x| (trained models: one channel at the first token and a few delimiters, 10-1000x the other rows'; Sun et
# al. 2024, "Massive activations in large language models"). SmolLM2-135M's first token: 650 vs a median of ~40.
MASSIVE_ROW_RATIO = 10.0


def massive_rows(x: torch.Tensor) -> list[int]:
    """The rows of [rows, width] ``x`` that carry a massive activation (``MASSIVE_ROW_RATIO``); none of a single row."""
    peak = x.float().abs().amax(-1)
    if peak.numel() < 2:
        return []
    median = float(peak.median())
    return [i for i, v in enumerate(peak.tolist()) if v >= MASSIVE_ROW_RATIO * max(median, 1e-30)]


@dataclass
class ActivationProbe:
    """One call of the plan on one layer's captured inputs."""

    call: CallRef
    layer: int | None  # None: a head call
    config: dict[str, Any]
    nonfinite: int = 0
    cosine: float | None = None  # against the oracle's capture of the output, when it is captured
    max_abs_input: float = 0.0
    error: str | None = None
    row_cosine: list[float] = field(default_factory=list)  # per output row, when the output is captured
    massive: list[int] = field(default_factory=list)  # rows whose inputs carry a massive activation

    @property
    def ok(self) -> bool:
        return self.error is None and self.nonfinite == 0 and (self.cosine is None or self.cosine >= GOOD_COSINE)

    def label(self) -> str:
        where = "head" if self.layer is None else f"layer {self.layer}"
        return f"{self.call.label()} at {where}"


@dataclass
class Captures:
    """The oracle's captures of the gate prompt, by graph value name per layer."""

    tensors: dict[str, torch.Tensor]
    rows: int
    names: dict[str, str] = field(default_factory=dict)  # graph value -> capture point
    # built once per probe session: designs by (family, shape, config), bf16 weights by layer
    designs: dict[tuple, Any] = field(default_factory=dict)
    weights: dict[int | None, dict[str, torch.Tensor]] = field(default_factory=dict)

    def value(self, name: str, layer: int | None, n_layers: int) -> torch.Tensor | None:
        """The captured value ``name`` feeding ``layer`` (None for the head), or None when the oracle has none."""
        if layer is None:
            head = {LAYER_INPUT: capture_name(n_layers - 1, "out"), "final_norm": "final_norm", "lm_head": "logits"}
            return self.tensors.get(head[name]) if name in head else None
        if name == LAYER_INPUT:
            return self.tensors.get(capture_name(layer - 1, "out")) if layer > 0 else None
        point = self.names.get(name)
        return self.tensors.get(capture_name(layer, point)) if point else None


def capture_gate_prompt(ctx) -> Captures:
    """Run the oracle once on the first gate prompt with every capture point."""
    spec = ctx.spec
    prompt, _ = gate_prompts(ctx)
    step = ctx.oracle.prefill(list(prompt), capture=all_capture_names(spec.n_layers))
    graph = block_graph(spec)
    names = {n.output: _POINT_OF.get(n.output, n.output) for n in graph.block}
    for n in graph.block:  # q/k/v/o before the end of their projection -> bias -> norm chain are not captured
        if n.kind in ("linear", "bias", "head_norm") and n.output not in _POINT_OF:
            names[n.output] = ""
    # the chains' ends are what the oracle calls q, k, v (after bias and per-head norm) and o_proj (after its bias)
    ends = (graph.node("rope_q").inputs[0], graph.node("rope_k").inputs[0], graph.node("kv_write").inputs[1])
    names.update(dict(zip(ends, ("q", "k", "v"), strict=True)))
    names[graph.node("resid1").inputs[1]] = "o_proj"
    return Captures(dict(step.captures), len(prompt), names)


def _weights(ctx, layer: int | None) -> dict[str, torch.Tensor]:
    w = ctx.weights
    if layer is None:
        head = w.embed() if ctx.spec.tied_embeddings else w.lm_head()
        return {"final_norm": w.final_norm().to(torch.bfloat16), "lm_head": head.to(torch.bfloat16)}
    return {k: v.to(torch.bfloat16) for k, v in w.layer(layer).tensors().items()}


def _design(caps: Captures, family: str, shape, config: dict[str, Any]):
    key = (family, shape, config_key(config))
    if key not in caps.designs:
        caps.designs[key] = family_module(family).make_design(shape, config_for(family, shape, config))
    return caps.designs[key]


def _layer_weights(ctx, caps: Captures, layer: int | None) -> dict[str, torch.Tensor]:
    if layer not in caps.weights:
        caps.weights[layer] = _weights(ctx, layer)
    return caps.weights[layer]


def run_call(
    ctx, caps: Captures, call: CallRef, layer: int | None, config: dict[str, Any], decode_rows: str = "all"
) -> ActivationProbe:
    """``call`` with ``config`` on ``layer``'s captured inputs: all prompt rows at once for a prefill call, each row
    as its own one-token step (at its own position) for a decode call, the last row for the LM head.
    ``decode_rows="massive"`` runs a decode call only at the rows carrying a massive activation (``row_cosine`` and
    ``massive`` then index those rows; none: the probe records an error and runs nothing)."""
    spec = ctx.spec
    graph = block_graph(spec)
    node = graph.node(call.op)
    ap = ActivationProbe(call, layer, dict(config))
    ins = [caps.value(v, layer, spec.n_layers) for v in node.inputs]
    if any(x is None for x in ins):
        ap.error = "inputs not captured"
        return ap
    head = node.kind == "lm_head"
    x = [t.to(torch.bfloat16) for t in ins]
    ap.max_abs_input = max(float(t.float().abs().max()) for t in x)
    massive = [] if head else sorted({r for t in x if t.dim() == 2 for r in massive_rows(t)})
    ap.massive = massive
    steps = [(caps.rows - 1, 1)] if head else [(0, caps.rows)]
    positions = None
    if call.stage == "decode" and not head:  # one decode step per prompt position, each at its own position
        positions = massive if decode_rows == "massive" else list(range(caps.rows))
        if not positions:
            ap.error = "no massive rows"
            return ap
        steps = [(i, 1) for i in positions]
        ap.massive = [j for j, i in enumerate(positions) if i in massive]
    try:
        rows = steps[0][1]
        shape = call_shape(spec, call, rows, caps.rows, config)
        design = _design(caps, call.family, shape, config)
        run = binding(node, call.family).run
        weights = _layer_weights(ctx, caps, layer)
        outs = []
        for start, n in steps:
            args: dict[str, Any] = {"_in": [t[start : start + n] for t in x], "_w": node.weights, **weights}
            if node.kind == "rope":
                args.update(cs=rope.table_for(spec, start, n, "fp32"), start=start)
            outs.append(run(design, args, spec).float())
        out = torch.cat(outs)
    except Exception as e:  # noqa: BLE001 - an illegal config is a finding of this probe, not a crash
        ap.error = f"{type(e).__name__}: {e}"
        return ap
    ap.nonfinite = M.nonfinite_count(out)
    ref = caps.value(node.output, layer, spec.n_layers)
    if ref is not None and head:
        ref = ref[-1:]
    elif ref is not None and positions is not None:
        ref = ref[positions]
    if ref is not None and ref.shape == out.shape and ap.nonfinite == 0:
        ap.cosine = M.cosine(ref.float(), out)
        ap.row_cosine = M.per_position_cosine(ref.float(), out).tolist()
    return ap


def passes_on_activations(
    ctx, caps: Captures, call: CallRef, config: dict[str, Any], check: Callable[[ActivationProbe], bool] | None = None
) -> bool:
    """Whether ``call`` with ``config`` is finite and agrees with the oracle on every layer's captured inputs (and
    meets ``check``, whose probes run a decode call at the massive rows only)."""
    layers = [None] if call.part == "head" else list(range(ctx.spec.n_layers))
    rows = "all" if check is None else "massive"
    runs = [run_call(ctx, caps, call, layer, config, rows) for layer in layers]
    runs = [r for r in runs if r.error not in ("inputs not captured", "no massive rows")]
    return all(r.ok and (check is None or check(r)) for r in runs)


def probe_activations(
    ctx, caps: Captures | None = None, plan=None, stages=("prefill", "decode"), decode_rows: str = "all"
) -> list[ActivationProbe]:
    """Every NPU call of the plan in ``stages`` on every layer's captured inputs (calls without captures skipped;
    ``decode_rows`` as in ``run_call``)."""
    caps = caps or capture_gate_prompt(ctx)
    out = []
    for call in plan_calls(plan or ctx.plan):
        if call.family in SKIPPED_FAMILIES or call.stage not in stages:
            continue
        layers = [None] if call.part == "head" else list(range(ctx.spec.n_layers))
        for layer in layers:
            ap = run_call(ctx, caps, call, layer, call.config_dict, decode_rows)
            if ap.error not in ("inputs not captured", "no massive rows"):
                out.append(ap)
    return out
