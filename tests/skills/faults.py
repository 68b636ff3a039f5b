"""Fault injection for the debug-skill tests.

Three faults are real plan/workspace states the production code mishandles on its own: a tile config that
overflows tile memory, a padded launch inside a merged group (GROUP_BINDING), a buffer the runtime is told
is static although it changes. The others simulate a *buggy kernel variant*: ``kernel_bug`` patches a
family's ``make_design`` so that designs built with one specific config compute wrong numbers on the fast
path (NaN, a mis-offset LM-head partition, RoPE rotating interleaved pairs, attention dropping keys past a
tile, extra rounding noise in a reduced-precision GEMM). The fault lives in the deployment (the plan names
the buggy config), so a debug skill can only repair it by changing the plan, exactly as with a real bug.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict

import torch


@contextlib.contextmanager
def kernel_bug(monkeypatch, family: str, trigger: Callable[[object], bool], corrupt: Callable[[dict, dict], dict]):
    """Designs of ``family`` whose Config satisfies ``trigger`` get ``fast = corrupt(inputs, outputs)``."""
    from tilepilot.kernels.registry import family as family_module

    mod = family_module(family)
    original = mod.make_design

    def make_design(shape, config=None, device=None):
        d = original(shape, config, device) if device is not None else original(shape, config)
        cfg = config if config is not None else mod.default_config(shape)
        if trigger(cfg):
            good = d.fast

            def fast(inputs, *, exact=False):
                return corrupt(inputs, good(inputs, exact=exact))

            object.__setattr__(d, "fast", fast)
        return d

    monkeypatch.setattr(mod, "make_design", make_design)
    yield


def nan_output(inputs: dict, outputs: dict) -> dict:
    out = {k: v.clone() for k, v in outputs.items()}
    for v in out.values():
        v.view(-1)[:: max(1, v.numel() // 7)] = float("nan")
    return out


def shifted_partition(index: int, start: int, stop: int, shift: int = 3):
    """Partition ``index`` ([start, stop) of the vocabulary) returns the logits of rows offset by ``shift``."""

    def corrupt(inputs: dict, outputs: dict) -> dict:
        logits = outputs["logits"].clone()
        logits[:, start:stop] = torch.roll(logits[:, start:stop], shifts=shift, dims=1)
        return {"logits": logits}

    return corrupt


def interleaved_rope(head_dim: int):
    """Recompute RoPE rotating adjacent pairs (GPT-J layout) instead of Hugging Face's halves."""

    def corrupt(inputs: dict, outputs: dict) -> dict:
        x, cs = inputs["x"].float(), inputs["cs"].float()
        rows = x.shape[0]
        half = head_dim // 2
        cos, sin = cs[:, :half], cs[:, half:]
        xh = x.reshape(rows, -1, half, 2)
        a, b = xh[..., 0], xh[..., 1]
        c, s = cos[:, None, :], sin[:, None, :]
        y = torch.stack((a * c - b * s, b * c + a * s), dim=-1).reshape(rows, -1)
        return {"y": y.to(outputs["y"].dtype)}

    return corrupt


def drop_late_queries(after_row: int):
    """Attention outputs past ``after_row`` come from a stale tile (rows shifted): late positions go wrong."""

    def corrupt(inputs: dict, outputs: dict) -> dict:
        o = outputs["o"].clone()
        if o.shape[0] > after_row + 1:
            o[after_row:] = torch.roll(o[after_row:], shifts=1, dims=1)
        return {"o": o}

    return corrupt


def noisy(rel: float, seed: int = 0):
    """Add seeded noise of relative size ``rel`` (a reduced-precision accumulation worse than bf16)."""

    def corrupt(inputs: dict, outputs: dict) -> dict:
        out = {}
        g = torch.Generator().manual_seed(seed)
        for k, v in outputs.items():
            f = v.float()
            out[k] = (f + rel * f.abs().mean() * torch.randn(f.shape, generator=g)).to(v.dtype)
        return out

    return corrupt


def set_op_config(ctx, stage: str, op: str, config) -> None:
    """Give ``op`` of ``stage`` a concrete config in the deployed plan."""
    plan = ctx.plan
    for g in plan.stage(stage).groups():
        for c in g.calls:
            if c.op == op:
                c.config = asdict(config) if not isinstance(config, dict) else dict(config)
    ctx.save_plan(plan)
