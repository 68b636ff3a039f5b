"""What the debug skills share: find the culprit calls with probes, pick a config that passes, apply, log.

Repairs change the plan (or the workspace's runtime options) and nothing else; the orchestrator then
re-runs the failed phase, whose gate decides whether the repair worked. A replacement config must pass
the same kernel probe the culprit failed (plus the skill's own extra condition) and be legal at every
size the deployment runs, so a repair cannot trade one fault for another silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any, ClassVar

from tilepilot.harness.probes import CallRef, Probe, call_shape, config_for, probe, probe_plan, stage_rows
from tilepilot.kernels import rowwise
from tilepilot.kernels.bind import family_module
from tilepilot.plan.plan import DATA_FIELDS
from tilepilot.skills.base import DebugSkill, SkillInput, SkillResult
from tilepilot.skills.optimize.common import clone
from tilepilot.skills.optimize.kernels import legal_at, set_config, sizes_for

# Replacement configs tried per culprit call (the family default first, then its own ranking).
MAX_CANDIDATES = 24

WS_INPUT = SkillInput("workspace", "the deployment workspace whose phase failed with this skill's signature")
# Config values that compute in a narrower type than the family's full-precision design (block-FP16 operands, bf16
# partial sums, an fp16 sum of squares, a narrow output store, bf16 RoPE angles). A repair never picks one: it must
# not trade a fault for a quieter precision loss.
REDUCED_NUMERICS: dict[str, tuple[str, ...]] = {
    "variant": ("bfp16",),
    "acc": ("bf16", "fp16"),
    "store": tuple(s for s in rowwise.STORES if s != "bf16"),
    "angles": ("bf16",),
}


def reduced_fields(config: dict[str, Any]) -> list[str]:
    """The fields of ``config`` set to a reduced-precision value."""
    return [k for k, bad in REDUCED_NUMERICS.items() if config.get(k) in bad]


def full_config(spec, call: CallRef, rows: int, context: int) -> dict[str, Any]:
    """The call's config as every field the design is built with (the plan's, or the per-shape default)."""
    shape = call_shape(spec, call, rows, context)
    return asdict(config_for(call.family, shape, call.config_dict))


def neighbours(call: CallRef, current: dict[str, Any]) -> list[dict[str, Any]]:
    """``current`` with one named option (the family's ``OPTIONS``) switched: the smallest repairs, tried first."""
    options = getattr(family_module(call.family), "OPTIONS", {})
    return [{**current, k: v} for k, choices in options.items() if k in current for v in choices if v != current[k]]


def changed_fields(old: dict[str, Any], new: dict[str, Any]) -> dict[str, list[Any]]:
    """``{field: [old, new]}`` of the fields a repair changed."""
    return {k: [old.get(k), v] for k, v in new.items() if old.get(k) != v}


def resume_commands(name: str) -> tuple[str, ...]:
    return (
        "tilepilot deploy MODEL_DIR --out WORKSPACE --resume   # the orchestrator picks this skill by signature",
        f"tilepilot skills list   # {name} is listed under debug skills",
    )


def candidates(spec, call: CallRef, rows: int, context: int) -> list[dict[str, Any]]:
    """Plan config dicts to try, current one excluded and none of reduced precision: the current config with one
    named option switched, the per-shape family default ({}), the default for this shape, then the family's
    candidate configs in its own ranking."""

    mod = family_module(call.family)
    shape = call_shape(spec, call, rows, context)
    try:
        out: list[dict[str, Any]] = neighbours(call, full_config(spec, call, rows, context))
    except Exception:
        out = []  # the current config does not even build: nothing to keep of it
    # Then the empty config: "the family default for whatever shape the call meets", legal at every size.
    out.append({})
    try:
        out.append(asdict(mod.default_config(shape)))
    except Exception:
        pass
    try:
        out += [asdict(c) for c in mod.candidate_configs(shape)[:MAX_CANDIDATES]]
    except Exception:
        pass
    current = call.config_dict
    data = {k: v for k, v in current.items() if k in DATA_FIELDS}  # the data's format is never reconfigured
    seen, uniq = set(), []
    for c in out:
        c = {**c, **data}
        key = tuple(sorted(c.items()))
        if key not in seen and c != current and not reduced_fields(c):
            seen.add(key)
            uniq.append(c)
    return uniq


def reconfigure(
    ctx,
    culprits: list[Probe],
    accept: Callable[[Probe], bool] = lambda p: p.ok,
    prefer: Callable[[dict[str, Any], dict[str, Any]], float] | None = None,
    also: Callable[[CallRef, dict[str, Any]], bool] | None = None,
) -> tuple[Any, list[str], dict[str, dict[str, list[Any]]]]:
    """A copy of the plan where each culprit call runs the first candidate config that passes its probe, ``accept``
    and ``also(call, config)`` (e.g. the same call on the model's activations); returns (plan, one sentence per
    change, ``{call label: {field: [old, new]}}``). ``prefer(candidate, current)`` sorts candidates."""

    plan = clone(ctx.plan)
    changes: list[str] = []
    changed: dict[str, dict[str, list[Any]]] = {}
    n = ctx.settings.gate_prompt_len
    done: set[tuple[str, str]] = set()
    for bad in culprits:
        call = bad.call
        if (call.stage, call.op) in done:
            continue
        rows, context = stage_rows(call.stage, n)
        cands = candidates(ctx.spec, call, rows, context)
        if prefer is not None:
            cands.sort(key=lambda c: prefer(c, bad.config))
        for cfg in cands:
            # {} is the family default for each shape the call meets: legal everywhere by construction.
            if cfg and not legal_at(ctx.spec, call, cfg, sizes_for(call.stage, ctx)):
                continue
            p = probe(ctx.spec, call, rows, context, config=cfg, seed=ctx.settings.seed, tile=False)
            if p.ok and accept(p) and (also is None or also(call, cfg)):
                set_config(plan, call, cfg)
                diff = changed_fields(bad.config, p.config)
                changed[call.label()] = diff
                what = {k: v[1] for k, v in diff.items()} if cfg else f"family default {diff}"
                changes.append(f"{call.label()}: config {what} (probe Pearson {p.measurements['pearson']:.6f})")
                done.add((call.stage, call.op))
                break
    return plan, changes, changed


def probes_now(ctx) -> list[Probe]:
    """Probe every kernel instance of the current plan at the gate sizes (no tile path: speed)."""
    return probe_plan(ctx.plan, ctx.spec, ctx.settings.gate_prompt_len, seed=ctx.settings.seed, tile=False)


class ReconfigureSkill(DebugSkill):
    """A debug skill whose remedy is a new config for the culprit calls; subclasses pick culprits."""

    abstract = True
    inputs = (WS_INPUT,)

    def culprits(self, ctx, probes: list[Probe]) -> list[Probe]:  # pragma: no cover - contract
        raise NotImplementedError

    def accept(self, p: Probe) -> bool:
        return p.ok

    def also(self, ctx) -> Callable[[CallRef, dict[str, Any]], bool] | None:
        """An extra condition a replacement config must meet (none by default)."""
        return None

    prefer: ClassVar[Callable[[dict[str, Any], dict[str, Any]], float] | None] = None

    def run(self, ctx) -> SkillResult:
        probes = probes_now(ctx)
        bad = self.culprits(ctx, probes)
        if not bad:
            return self.result(
                "unrepaired", "no kernel instance of the plan shows this fault when probed alone", evidence={}
            )
        plan, changes, changed = reconfigure(ctx, bad, self.accept, type(self).prefer, self.also(ctx))
        evidence = {"culprits": [p.call.label() for p in bad], "changes": changes, "changed": changed}
        if len(changes) < len({p.call.label() for p in bad}):
            missing = sorted({p.call.label() for p in bad} - {c.split(":")[0] for c in changes})
            return self.result("unrepaired", f"no passing config found for {', '.join(missing)}", evidence=evidence)
        ctx.save_plan(plan)
        return self.result("repaired", "; ".join(changes), evidence=evidence)
