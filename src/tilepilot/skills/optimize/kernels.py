"""Per-kernel optimization skills: vectorized / block-FP16 variants and tile tuning through the registry.

A config in a plan is used for every prompt length the runner will meet, while tuning looks at one shape
(the 2048-token prefill or the decode step). So a tuned config is accepted only if it also builds and
validates at the other row counts the deployment runs (gate prompt, a short odd prompt, one token);
otherwise the next-best row of the registry is tried. Tuning keeps the kernel's numerics (variant and
accumulator) unchanged: accuracy trade-offs belong to ``vectorized-variants``, where the gate judges them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import asdict, fields, replace
from typing import Any

from tilepilot.harness.probes import CallRef, call_shape, config_for, group_checks, plan_calls, stage_rows
from tilepilot.kernels import gemv
from tilepilot.kernels.bind import config_key, config_of_key, family_module
from tilepilot.kernels.registry import as_dict
from tilepilot.kernels.tuning import timing_key, tune
from tilepilot.npu.design import MultiLaunchGroup
from tilepilot.npu.validate import validate, validate_group
from tilepilot.skills.base import SkillInput
from tilepilot.skills.optimize.common import PlanOptimization, Proposal, clone
from tilepilot.skills.optimize.host import _GATE

_WS = SkillInput("workspace", "a deployment workspace whose full-model gate passed (phase 3)")
_KNOW = SkillInput("knowledge", "shared kernel registry (registry.json) from earlier deployments", required=False)

# Prompt lengths a tuned prefill config must also be legal at besides the timed one: a single token (chunked prefill
# of one token), the longest prompt whose all-positions LM head (a gate's prefill) is still a multi-token GEMV (its x
# buffer is largest there: a tile_k legal at 1 and 17 rows can overflow L1 at 16) and the shortest one past it (the
# GEMM path); the gate prompt length is added at run time.
EXTRA_PREFILL_ROWS = (1, gemv.MAX_TOKENS, gemv.MAX_TOKENS + 1)
MATRIX_FAMILIES = ("gemm", "gemv", "lm_head")


def resolved_config(spec, call: CallRef, rows: int, context: int):
    """The family Config a call runs with at this size (its plan config, or the family default)."""

    mod = family_module(call.family)
    return mod, config_for(call.family, call_shape(spec, call, rows, context), call.config_dict)


def legal_at(spec, call: CallRef, config: dict[str, Any], sizes: list[tuple[int, int]]) -> bool:
    """Whether ``config`` builds and validates for this call at every (rows, context) in ``sizes``; an unknown
    family is the plan's error, not an illegal config, so it raises."""

    family_module(call.family)
    for rows, context in sizes:
        try:
            # a prefill head also runs over every row when a gate asks for all positions' logits
            shapes = [call_shape(spec, call, rows, context, config)]
            if (
                call.stage == "prefill"
                and (every := call_shape(spec, call, rows, context, config, all_logits=True)) != shapes[0]
            ):
                shapes.append(every)
            if not all(_legal(call.family, shape, config) for shape in shapes):
                return False
        except Exception:
            return False
    return True


def _legal(family: str, shape: Any, config: dict[str, Any]) -> bool:
    key = config_key(config)
    try:
        hash((shape, key))
    except TypeError:  # a config holding a list (read back from JSON): build it without the memo
        return _legal_shape.__wrapped__(family, shape, key)
    return _legal_shape(family, shape, key)


@functools.lru_cache(maxsize=4096)
def _legal_shape(family: str, shape: Any, config: tuple) -> bool:
    """Whether the family's design for ``shape`` at ``config`` builds and validates: a function of the three alone,
    remembered because tuning asks it of every registry row at five sizes, for ops of one shape again and again
    (Q and O, gate and up), in both optimization phases (a 2048-row GEMM design takes ~40 ms to build)."""
    mod = family_module(family)
    try:
        d = mod.make_design(shape, config_for(family, shape, config_of_key(config)))
    except Exception:
        return False
    return not (validate_group(d) if isinstance(d, MultiLaunchGroup) else validate(d))


def sizes_for(stage: str, ctx) -> list[tuple[int, int]]:
    s = ctx.settings
    if stage == "prefill":
        return [(r, r) for r in (s.timing_prompt_len, s.gate_prompt_len, *EXTRA_PREFILL_ROWS)]
    return [(1, s.timing_prompt_len + 1), (1, s.gate_prompt_len + 1), (1, 2)]


def set_config(plan, call: CallRef, config: dict[str, Any]) -> None:
    for g in plan.stage(call.stage).groups():
        for c in g.calls:
            if c.op == call.op:
                c.config = dict(config)


class VectorizedVariants(PlanOptimization):
    name = "vectorized-variants"
    description = (
        "Switches kernels running a scalar variant to the vectorized (AIE MMUL/vector unit) variant and, when "
        "enabled (--try-bfp16), tries the block-FP16 matrix mode (8x8x8 MACs, twice the bf16 peak) on GEMM/GEMV/"
        "LM-head calls, keeping each only if modeled time drops and the full-model gate still passes. Use after "
        "the plan's structure is settled."
    )
    purpose = "Uses the array's fast arithmetic; the gate decides whether block-FP16 accuracy is good enough."
    commands = ("tilepilot skills run vectorized-variants WORKSPACE --json",)
    gate_text = _GATE
    inputs = (_WS,)
    failure_modes = (
        "Block-FP16 error compounding over layers fails the gate: the change is rejected (or, if it slipped in, "
        "`fix-error-growth` restores fp32 accumulation and the bf16 variant).",
    )

    def _with_variant(self, ctx, stage: str, families, want: str, only_from: str | None):
        plan = clone(ctx.plan)
        changed = []
        for call in plan_calls(plan):
            if call.stage != stage or call.family not in families:
                continue
            rows, context = stage_rows(stage, ctx.settings.timing_prompt_len)
            try:
                mod, cfg = resolved_config(ctx.spec, call, rows, context)
            except Exception:
                continue
            names = {f.name for f in fields(cfg)}
            if "variant" not in names or cfg.variant == want or (only_from and cfg.variant != only_from):
                continue
            new = asdict(replace(cfg, variant=want))
            if legal_at(ctx.spec, call, new, sizes_for(stage, ctx)):
                set_config(plan, call, new)
                changed.append(call.op)
        return plan, changed

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        all_families = ("gemm", "gemv", "lm_head", "rmsnorm", "rope", "attention", "swiglu", "bias", "eltwise")
        new, changed = self._with_variant(ctx, stage, all_families, "vector", only_from="scalar")
        if changed:
            yield Proposal(new, f"{stage}: vector variant for {', '.join(changed)}")
        if not ctx.settings.try_bfp16:
            return
        new, changed = self._with_variant(ctx, stage, MATRIX_FAMILIES, "bfp16", only_from="vector")
        if changed:
            yield Proposal(new, f"{stage}: block-FP16 matrix mode for {', '.join(changed)}")


class TileTuning(PlanOptimization):
    name = "tile-tuning"
    description = (
        "Tunes the tiling of every NPU kernel call for its shape with the validator and the timing model only "
        "(no kernel runs), through the shared kernel registry so a shape tuned by an earlier deployment is a "
        "lookup; keeps each call's numerics. Use after merging and placement, when only per-kernel speed is left."
    )
    purpose = "Picks the fastest legal tile configuration per shape and makes that knowledge reusable."
    commands = (
        "tilepilot skills run tile-tuning WORKSPACE --json --knowledge ~/.cache/tilepilot/knowledge",
        "tilepilot calibrate   # how the timing model that ranks configs compares with published kernels",
    )
    gate_text = _GATE
    inputs = (_WS, _KNOW)
    failure_modes = (
        "A tuned config legal at 2048 tokens but not at the gate prompt length is skipped for the next-best one.",
        "No legal config for a shape: the call keeps its current config.",
    )

    def run(self, ctx):
        """As every optimization, plus how much tuning was searched vs looked up (the registry's payoff)."""
        result = super().run(ctx)
        result.evidence["tuning"] = dict(ctx.tuning_stats)
        return result

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        import time

        t0 = time.perf_counter()

        registry = ctx.kernel_registry
        new = clone(ctx.plan)
        changed, lookups, searched = [], 0, 0
        merged = {(g.name, op) for g in new.stage(stage).groups() for m in g.merged for op in m}
        for call in plan_calls(new):
            if call.stage != stage or (call.group, call.op) in merged:
                continue  # a multi-matrix launch was tuned at its merged shape (multi-matrix-launches)
            rows, context = stage_rows(stage, ctx.settings.timing_prompt_len)
            try:
                mod, current = resolved_config(ctx.spec, call, rows, context)
                shape = call_shape(ctx.spec, call, rows, context)
                result = tune(call.family, shape, registry, max_candidates=ctx.settings.tune_max_candidates)
            except Exception:
                continue
            lookups += int(result.from_registry)
            searched += result.candidates
            cur = as_dict(current)
            cur_plan_config = call.config_dict
            same_numerics = [
                r
                for r in registry.rows(call.family, as_dict(shape))
                if r.timing_key == timing_key()
                and all(r.config.get(k) == cur.get(k) for k in ("variant", "acc") if k in cur)
            ]
            for row in sorted(same_numerics, key=lambda r: r.modeled_s):
                if not legal_at(ctx.spec, call, row.config, sizes_for(stage, ctx)):
                    continue  # the current config too: a config illegal at some size is replaced
                if row.config == cur:
                    break  # the current config is already the fastest legal one
                set_config(new, call, row.config)
                if all(g.ok for g in group_checks(new, ctx.spec, ctx.settings.gate_prompt_len, (stage, call.op))):
                    changed.append(call.op)
                    break
                set_config(new, call, cur_plan_config)  # breaks its merged group's bindings: next row
        ctx.tuning_stats[stage] = {
            "lookups": lookups,
            "candidates_searched": searched,
            "seconds_measured": time.perf_counter() - t0,
        }
        if changed:
            yield Proposal(
                new, f"{stage}: tuned {len(changed)} call(s) ({lookups} registry lookups, {searched} configs searched)"
            )
