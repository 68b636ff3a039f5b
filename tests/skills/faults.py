"""Real faults for the debug-skill tests: a kernel option set to the wrong value in the plan the phase runs, or a
checkpoint whose activations trigger a narrow variant, never a patched design factory.

Each fault is a mistake that happens: a tile config that overflows tile memory, a padded launch inside a merged group
(GROUP_BINDING), a buffer the runtime is told is static although it changes, RoPE run in the interleaved (GPT-J/GGUF)
layout on half-rotation weights, an LM head whose ragged last partition is shifted but assembled unshifted, an FFN
activation stored in fp16 on a model whose activations exceed 65504, RoPE angles computed in bf16, a residual stream
kept in fp8 instead of bf16 and an RMSNorm summing squares in fp16 (both on the trained SmolLM2, whose massive
activations and sharp distributions show them). The debug skill can only repair them by changing the plan, exactly as
with a real deployment.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from tilepilot.harness.probes import call_shape, plan_calls, stage_rows
from tilepilot.kernels.bind import family_module
from tilepilot.skills.debug.common import full_config
from tilepilot.skills.optimize.kernels import legal_at, sizes_for


def set_op_config(ctx, stage: str, op: str, config) -> None:
    """Give ``op`` of ``stage`` a concrete config in the deployed plan."""
    plan = ctx.plan
    for g in plan.stage(stage).groups():
        for c in g.calls:
            if c.op == op:
                c.config = asdict(config) if not isinstance(config, dict) else dict(config)
    ctx.save_plan(plan)


def default_config(ctx, stage: str, op: str, rows: int | None = None) -> dict[str, Any]:
    """The per-shape family default of ``op`` in ``stage`` at the gate prompt's size, as a plan config dict."""
    call = next(c for c in plan_calls(ctx.plan) if c.stage == stage and c.op == op)
    r, context = stage_rows(stage, rows or ctx.settings.gate_prompt_len)
    return asdict(family_module(call.family).default_config(call_shape(ctx.spec, call, r, context)))


def deployable_config(ctx, stage: str, op: str, **option: Any) -> dict[str, Any]:
    """A config of ``op`` a real deployment could hold, with ``option`` set: the family default at the gate size, or
    else its first candidate, that builds and validates at every size the deployment runs (as a tuned plan's do)."""
    call = next(c for c in plan_calls(ctx.plan) if c.stage == stage and c.op == op)
    rows, context = stage_rows(stage, ctx.settings.gate_prompt_len)
    mod = family_module(call.family)
    shape = call_shape(ctx.spec, call, rows, context)
    for cfg in [mod.default_config(shape), *mod.candidate_configs(shape)]:
        full = {**asdict(cfg), **option}
        if legal_at(ctx.spec, call, full, sizes_for(stage, ctx)):
            return full
    raise AssertionError(f"no config of {op} with {option} is legal at every size")


def set_option(ctx, ops: tuple[str, ...], stages: tuple[str, ...] = ("prefill", "decode"), **option: Any) -> None:
    """The fault: ``ops`` run a deployable config with ``option`` set to a wrong value."""
    for stage in stages:
        for op in ops:
            set_op_config(ctx, stage, op, deployable_config(ctx, stage, op, **option))


def plan_option(ctx, stage: str, op: str, field: str) -> Any:
    """The value of ``field`` the design of ``op`` in ``stage`` is built with (the plan's, else the per-shape
    family default's), at the gate prompt's size."""
    call = next(c for c in plan_calls(ctx.plan) if c.stage == stage and c.op == op)
    rows, context = stage_rows(stage, ctx.settings.gate_prompt_len)
    return full_config(ctx.spec, call, rows, context)[field]


def scale_ffn(model: Path, out: Path, factor: float) -> Path:
    """A copy of ``model`` with massive FFN activations: gate and up projections x ``factor``, down / factor**2.

    silu(g) * u then reaches ``factor**2`` times its size (the massive activations trained models carry into their
    down projections), while the layer's output stays about where it was, so the model is the same kind of model.
    """
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(model / "config.json", out / "config.json")
    tensors = load_file(str(model / "model.safetensors"))
    for name, t in tensors.items():
        if name.endswith(("gate_proj.weight", "up_proj.weight")):
            tensors[name] = (t.float() * factor).to(t.dtype)
        elif name.endswith("down_proj.weight"):
            tensors[name] = (t.float() / factor**2).to(t.dtype)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
