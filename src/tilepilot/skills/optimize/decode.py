"""Decode as AIR's fused decode runs it: one dispatch per token, and a KV readback sized to the context window.

Batch-1 decode streams every weight once per token, so what is left after the kernels stream at their bound is the
host: AIR runs all 16 layers and the LM head of Llama-3.2-1B in **one dispatch per token** (reference/xdna2.md,
"AIR's own 4-bit deployments"). A single dispatch has one program, so its attention launches are compiled for a
fixed KV readback (AIR pads to ATTN_MAXL = 2048 positions: the DMA moves every padded block even though compute
skips the masked ones); AIR then built a template per window so the readback matches the context
(53.0 -> 58.6 tok/s). Eight skills, tried in this order by the decode phase:

- ``one-dispatch-decode``: every decode group (each layer's and the head's) in one dispatch
  (``StagePlan.one_dispatch``),
  attention compiled for the padded template readback (``KV_TEMPLATE_ROWS``). The timing model charges the one host
  round trip, a design switch and tile configuration per launch inside the dispatch (``npu.timing.time_group``), and
  the dispatcher checks the whole pass against the driver's watchdog (``DISPATCH_WATCHDOG``), so a pass too long for
  one dispatch is refused by its code, not timed. CPU groups are moved onto the NPU first (a dispatch cannot hold
  host work).
- ``windowed-kv-readback``: a fused decode's readback templates become a ladder of windows (``KV_WINDOW_STEP``
  rows apart), so each token streams only the KV blocks of the smallest window holding its context.

- ``multi-matrix-launches``: the linear ops of a group that read the same input (Q/K/V, gate/up) as one
  multi-matrix GEMV launch each, bf16 or quantized, and Q's and K's RoPE as one launch (``plan.merge.merged_stage``):
  one design switch (and one x or table stream) instead of several, bit-identical outputs.

- ``rmsnorm-prologue``: an RMSNorm that only GEMVs (bf16 or quantized) read runs inside their launch, every worker
  normalizing its resident x before the first call (``plan.merge.normed_stage``, ``kernels.bind.FoldedLinear``):
  one launch fewer per norm, bit-identical outputs.

- ``residual-epilogue``: a residual add of a GEMV's output (bf16 or quantized) runs inside that launch, every worker
  adding its rows of the residual (riding in its resident x) before writing them (``plan.merge.residual_stage``,
  ``kernels.bind.FoldedLinear``): one launch fewer per add, bit-identical outputs.

- ``swiglu-epilogue``: the SwiGLU of a gate/up GEMV launch's outputs (bf16 or quantized) runs inside it, every
  worker keeping its gate rows until its up rows are done and writing silu(gate) * up (``plan.merge.gated_stage``):
  one launch fewer per layer, half the launch's output bytes, bit-identical outputs.

- ``rope-epilogue``: the RoPE launch of Q and K runs inside the GEMV launch that computes them (bf16 or quantized),
  every worker holding its rows of a head until it has both halves of each pair, then rotating them with the
  position's table, which rides in its resident x (``plan.merge.roped_stage``, ``kernels.gemv.rope_blocks``): one
  launch fewer per layer, bit-identical outputs.

- ``resident-decode``: the decode step as one dispatch configured into the array once, as AIR's fused decode is one
  module (``StagePlan.resident``, ``npu/resident.py``): every launch's tiles packed together, no design switch
  between launches; the configs that do not fit together are replaced by the cheapest ones that do
  (``plan.resident.fit_resident``), so it runs last, after tile tuning. A decode still dispatched per group (the
  switches made one dispatch slower) is fused first, with the windowed readback. Each fit is compared with its
  weights prefetched when that is faster (``plan.resident.prefetch_if_faster``), as it will run.

- ``weight-prefetch``: in a resident decode, the head of every GEMV launch's weights is fetched into memory-tile
  regions the packing leaves free, during the drain of the weight launch before it and the launches in between
  (``StagePlan.prefetch``, ``npu/prefetch.py``): the launch streams the rest from DDR once half the head is read.
  Same designs, same numbers; a modeled schedule with no silicon figure behind it.

All are proposals: ``optimize.common.try_proposal`` keeps them only when the modeled decode is strictly faster, the
prefill is not slower and the model gate passes; every attempt is a row of ``perf_opt_traj.md`` with its before/after
figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict

from tilepilot.harness.probes import group_checks
from tilepilot.kernels.tuning import tune
from tilepilot.npu.validate import DesignError
from tilepilot.parallel import fork_map
from tilepilot.plan.air_q4 import KV_WINDOW_STEP, fused_stage, window_ladder
from tilepilot.plan.merge import (
    cached_rope_stage,
    every_fold,
    gated_stage,
    merged_stage,
    normed_rope_stage,
    normed_stage,
    packing_alternatives,
    residual_stage,
    roped_stage,
)
from tilepilot.plan.plan import validate_plan
from tilepilot.plan.resident import as_it_will_run, fit_resident, prefetch_if_faster, search_structures, squeezed
from tilepilot.skills.base import SkillInput
from tilepilot.skills.optimize.common import PlanOptimization, Proposal, clone
from tilepilot.skills.optimize.host import _GATE

_WS = SkillInput("workspace", "a deployment workspace whose full-model gate passed (phase 3)")


class OneDispatchDecode(PlanOptimization):
    name = "one-dispatch-decode"
    description = (
        "Runs a whole decode step (every layer and the LM head) as one NPU dispatch, as AIR's fused decode does, with "
        "a design switch per launch inside it and the driver's per-dispatch watchdog checked on the pass. Use when the "
        "decode stage still starts a dispatch per group or per layer."
    )
    purpose = (
        "Removes every host round trip but one per token; what remains is weight streaming and the switches between "
        "launches."
    )
    commands = ("tilepilot skills run one-dispatch-decode WORKSPACE --json",)
    gate_text = _GATE
    inputs = (_WS,)
    failure_modes = (
        "A pass longer than the driver's watchdog is refused with DISPATCH_WATCHDOG (split the pass: keep per-layer "
        "dispatches).",
        "Its attention reads the padded template readback: follow with `windowed-kv-readback`.",
    )
    stages = ("decode",)

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        new = fused_stage(ctx.plan, stage)
        if new is not None:
            rows = new.stage(stage).kv_windows[0]
            yield Proposal(new, f"{stage}: every layer and the head in one dispatch (KV readback template {rows} rows)")


class WindowedKvReadback(PlanOptimization):
    name = "windowed-kv-readback"
    description = (
        "Gives a one-dispatch decode a KV readback template per context window, so each token's attention streams "
        "only the KV blocks of the smallest window holding its context instead of the padded maximum. Use when the "
        "decode stage is one dispatch with a single readback template."
    )
    purpose = "Cuts the KV bytes every token moves at short contexts (AIR: 53.0 -> 58.6 tok/s on Llama-3.2-1B)."
    commands = ("tilepilot skills run windowed-kv-readback WORKSPACE --json",)
    gate_text = _GATE
    inputs = (_WS,)
    failure_modes = ("A window smaller than the context would drop keys: the readback is never below the context.",)
    stages = ("decode",)

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        st = ctx.plan.stage(stage)
        if not st.one_dispatch or not st.kv_windows:
            return
        ladder = window_ladder(max(st.kv_windows))
        if ladder == sorted(st.kv_windows):
            return
        new = clone(ctx.plan)
        new.stage(stage).kv_windows = ladder
        yield Proposal(new, f"{stage}: KV readback templates every {KV_WINDOW_STEP} rows up to {max(ladder)}")


class MultiMatrixLaunches(PlanOptimization):
    name = "multi-matrix-launches"
    description = (
        "Runs the projections of a group that read the same input (Q/K/V, gate/up) as one multi-matrix GEMV launch "
        "each (bf16 or packed weights): one x stream past all of their weights, each matrix's rows drained to its "
        "own output; the RoPE of Q and K as one launch over all their heads; and Q's, K's and V's bias adds as one "
        "launch. Use when a decode group launches several GEMVs over one activation, or RoPE or a bias add once per "
        "projection."
    )
    purpose = (
        "Removes a design switch and the tile configuration of every launch it merges (inside a one-dispatch decode "
        "these switches are most of what is not weight streaming); the outputs are bit-identical."
    )
    commands = ("tilepilot skills run multi-matrix-launches WORKSPACE --json",)
    gate_text = _GATE
    inputs = (_WS,)
    failure_modes = (
        "A merged shape no config tiles (a matrix's rows not a multiple of columns x rows x tile_m) is left unmerged.",
    )
    stages = ("decode",)

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        new = merged_stage(ctx.plan, stage, _tuner(ctx))
        if new is not None:
            runs = [m for g in new.stage(stage).groups() for m in g.merged]
            yield Proposal(new, f"{stage}: one multi-matrix launch each for {runs}")


class _FoldIntoLaunch(PlanOptimization):
    """A small op run inside the launch next to it (a GEMV's, bf16 or quantized, or RoPE's:
    ``plan.merge._folded_stage``), each fused launch at the tile tuner's best config for its shape; ``fold`` is the
    plan function that finds and makes the runs, ``what`` the folded op's part of the launch and ``into`` which
    launch it is."""

    abstract = True
    stages = ("decode",)
    inputs = (_WS,)
    gate_text = _GATE
    what = ""
    into = "GEMV launch"

    @staticmethod
    def fold(plan, stage, tuner):
        raise NotImplementedError

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        new = self.fold(ctx.plan, stage, _tuner(ctx))
        if new is not None:
            before = _runs(ctx.plan, stage)
            ops = [o for m in _runs(new, stage) if m not in before for o in _folded_ops(m, before)]
            yield Proposal(new, f"{stage}: {ops} as the {self.what} of the {self.into} next to each")


def _folded_ops(run: list[str], before: list[list[str]]) -> list[str]:
    """The ops a fold added to a launch: what follows the longest run it had before (or its first op)."""
    had = max((r for r in before if run[: len(r)] == r), key=len, default=run[:1])
    return run[len(had) :]


def _tuner(ctx):
    """A merged or fused launch's config: the tile tuner's best for its shape (the shared kernel registry)."""

    def tuner(family: str, shape) -> dict:
        return asdict(tune(family, shape, ctx.kernel_registry, max_candidates=ctx.settings.tune_max_candidates).config)

    return tuner


def _runs(plan, stage: str) -> list[list[str]]:
    return [m for g in plan.stage(stage).groups() for m in g.merged]


class RmsNormPrologue(_FoldIntoLaunch):
    name = "rmsnorm-prologue"
    description = (
        "Runs each RMSNorm that only GEMVs, bf16 or quantized, read (the attention and FFN norms before Q/K/V and "
        "gate/up) as the prologue of that GEMV launch: every worker normalizes its resident x once before its first "
        "call, the norm weight riding in the same object as x. Use when a decode launches an RMSNorm of one token "
        "before a projection."
    )
    purpose = (
        "Removes a launch per norm (inside a one-dispatch decode a one-token RMSNorm is mostly pipeline fill and "
        "drain) and its DDR round trip; the outputs are bit-identical (the norm kernel's own arithmetic)."
    )
    commands = ("tilepilot skills run rmsnorm-prologue WORKSPACE --json",)
    failure_modes = (
        "A GEMV config without a resident x (x_rides) cannot normalize: the launch is re-tiled by the tuner, and left "
        "unfused when no config of its shape fits.",
        "A norm whose output something else reads (a bias, another group) stays its own launch.",
    )
    what = "prologue"
    fold = staticmethod(normed_stage)


class ResidualEpilogue(_FoldIntoLaunch):
    name = "residual-epilogue"
    description = (
        "Runs each residual add whose other operand is a GEMV's output, bf16 or quantized (after o_proj and "
        "down_proj), as the epilogue of that GEMV launch: the residual rides in the launch's resident x and every "
        "worker adds its rows before writing them. Use when a decode launches a one-token residual add after a "
        "projection."
    )
    purpose = (
        "Removes a launch per residual add and the projection output's DDR round trip; the outputs are bit-identical "
        "(the add kernel's own arithmetic)."
    )
    commands = ("tilepilot skills run residual-epilogue WORKSPACE --json",)
    failure_modes = (
        "A projection whose output something else reads (a bias add) keeps its add as a launch of its own.",
        "A multi-matrix launch cannot take a residual: only single-matrix projections fuse.",
    )
    what = "epilogue"
    fold = staticmethod(residual_stage)


class SwigluEpilogue(_FoldIntoLaunch):
    name = "swiglu-epilogue"
    description = (
        "Runs the SwiGLU of a gate/up GEMV launch's two outputs, bf16 or quantized, as that launch's epilogue: every "
        "worker keeps its rows of gate until it has computed the same rows of up and writes silu(gate) * up only. "
        "Use when a decode launches a one-token SwiGLU after a merged gate/up projection."
    )
    purpose = (
        "Removes the SwiGLU launch of every layer and halves the projection's output bytes (gate is never written); "
        "the outputs are bit-identical (the SwiGLU kernel's own arithmetic)."
    )
    commands = ("tilepilot skills run swiglu-epilogue WORKSPACE --json",)
    failure_modes = (
        "Gate and up not merged into one launch (run multi-matrix-launches first): nothing to fold.",
        "A config whose workers cannot hold their gate rows in tile memory is re-tiled by the tuner.",
    )
    what = "epilogue"
    fold = staticmethod(gated_stage)


class QkNormIntoRope(_FoldIntoLaunch):
    name = "qk-norm-into-rope"
    description = (
        "Runs Qwen3's per-head Q and K RMSNorms inside the RoPE launch that reads them: every head is normalized with "
        "its own norm's weight, held by every worker, then rotated. Use when a decode launches per-head norms right "
        "before RoPE (a model with qk_norm)."
    )
    purpose = (
        "Removes the two per-head norm launches of every layer and their outputs' DDR round trips, as AIR fused "
        "Qwen3's QK-norm into its attention-input ELF; the outputs are bit-identical (the norm kernel's arithmetic)."
    )
    commands = ("tilepilot skills run qk-norm-into-rope WORKSPACE --json",)
    failure_modes = (
        "A norm whose output something else reads, or one run with the fp16 accumulator, keeps the RoPE launch it "
        "feeds unfused (both its norms stay launches of their own).",
        "Q's and K's RoPE not merged (run multi-matrix-launches first): each RoPE launch takes its own norm.",
    )
    what = "prologue"
    into = "RoPE launch"
    fold = staticmethod(normed_rope_stage)


class RopeEpilogue(_FoldIntoLaunch):
    name = "rope-epilogue"
    description = (
        "Runs the RoPE of Q and K as the epilogue of the GEMV launch that computes them, bf16 or quantized: each "
        "worker makes the rows of a head's pairs (i, i + head_dim/2) and holds them until the head's last block, "
        "then rotates them with the position's table, which rides in its resident x. Use when a decode launches RoPE "
        "right after the Q/K/V projection (no bias or per-head norm between them)."
    )
    purpose = (
        "Removes the RoPE launch of every layer (inside a one-dispatch decode mostly pipeline fill and drain) and the "
        "unrotated Q's and K's DDR round trip; the outputs are bit-identical (the RoPE kernel's own arithmetic)."
    )
    commands = ("tilepilot skills run rope-epilogue WORKSPACE --json",)
    failure_modes = (
        "RoPE reading a bias add or a per-head norm (Qwen2, Qwen3) rotates no GEMV output: nothing to fold.",
        "A GEMV tiling whose column's rows per call do not divide half a head, split a head across columns, or "
        "leave a head more than four blocks per worker (its output fifo's depth, each a BD) cannot pair the rows: "
        "the launch is re-tiled by the tuner, and left unfused when no tiling of its shape pairs them.",
        "A RoPE config with another table precision or the interleaved layout stays its own launch.",
    )
    what = "epilogue"
    into = "Q/K/V launch"
    fold = staticmethod(roped_stage)


class KvWriteIntoRope(_FoldIntoLaunch):
    name = "kv-write-into-rope"
    description = (
        "Runs a quantized KV cache's write (the q8_0/q4_0 blocks of the step's K and V rows) inside the RoPE launch "
        "that rotates K: V's rows ride in the same x object, and the launch writes the rotated Q heads and the cache's "
        "stored rows. Use when a decode with a quantized KV cache (deploy --kv-cache) launches a kvquant write per "
        "layer."
    )
    purpose = (
        "Removes the cache write's launch of every layer (inside a one-dispatch decode mostly pipeline fill and drain) "
        "and K's rotated rows' DDR round trip; the stored bytes are bit-identical (the KV-write kernel's quantizer)."
    )
    commands = ("tilepilot skills run kv-write-into-rope WORKSPACE --json",)
    failure_modes = (
        "A bf16 cache has no write launch (the producers' drains land in the cache): nothing to fold.",
        "RoPE already the Q/K/V launch's epilogue (rope-epilogue, tried first): no RoPE launch to write from.",
        "K's RoPE output read by anything but the write, or V computed after the RoPE launch: the write stays its own "
        "launch.",
        "The fused launch's fourth fifo needs two more locks on its tile; in a resident pass packed to the lock limit "
        "(Llama-3.2-1B q4_0 with a q4_0 cache) the refit costs more than the launch saved, and the phase reverts it.",
    )
    what = "epilogue"
    into = "RoPE launch"
    fold = staticmethod(cached_rope_stage)


class ResidentDecode(PlanOptimization):
    name = "resident-decode"
    description = (
        "Configures a whole decode step into the array once as one dispatch, every launch's tiles packed together, as "
        "AIR's fused decode is one module: no design switch between launches, a KV readback template per window. "
        "Configs that do not fit the array together are replaced by the cheapest ones that do. Use when the decode "
        "stage still pays a host round trip per group or a design switch per launch."
    )
    purpose = (
        "Removes the design switch of every launch after the first (inside a one-dispatch decode, most of what is not "
        "weight streaming); what it costs is the smaller tiles the packing needs. When the fastest packing leaves a "
        "weight stream below the DDR rate, it also fits the pass one merged run or fold less at a time, from the best "
        "so far, and proposes the fastest structure it reaches. A pass it joins from per-group dispatches is also "
        "fitted with every merge and fold the joined groups allow (the paper rotates in one ELF and writes the cache "
        "in the next). Each fit is compared as it will run: with its GEMV weights fetched ahead (weight-prefetch) "
        "when that is faster, and a fit of the pass with a run split out also with that run merged again on its "
        "configs, since a packing that leaves memory tiles room for the prefetch can win only with it."
    )
    commands = ("tilepilot skills run resident-decode WORKSPACE --json",)
    gate_text = _GATE
    inputs = (_WS,)
    failure_modes = (
        "No configs let the pass's designs fit the array together (L1_OVERFLOW, LOCK_LIMIT or BD_LIMIT on a packed "
        "tile): the proposal is not made and the pass keeps its design switches.",
        "A later config change (tile tuning) that breaks the packing makes the plan fail to time with the code: "
        "run this skill after tile tuning.",
    )
    stages = ("decode",)

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        st = ctx.plan.stage(stage)
        if st.resident:
            return
        base = ctx.plan
        if not st.one_dispatch:  # a pass the switches made slower than per-group dispatches may pay off resident
            base = fused_stage(ctx.plan, stage)
            base.stage(stage).kv_windows = window_ladder(max(base.stage(stage).kv_windows))
        fused = "" if st.one_dispatch else " (from per-group dispatches, windowed KV readback)"
        # the pass as it is, then with merged runs or folds of a kind split (``plan.merge.packing_alternatives``:
        # RoPE, bias adds, the folds, the multi-matrix GEMVs): each is kept only when faster than the plan of the
        # moment, so a split wins only where it packs better. The fits are independent: they run side by side
        # (``ctx.settings.jobs`` worker processes), which changes no result.
        prompt_len = ctx.settings.gate_prompt_len

        def fit_or_why(alt):
            try:
                return _fit_with_bindings(alt, stage, prompt_len)
            except DesignError as e:
                return str(e)
            except Exception:  # any other failure surfaces where a one-by-one search would have met it
                return _Failed()

        def timed(p):
            return ctx.timing(p).decode_s_per_token

        spec = base.model_spec()

        def checked(p) -> bool:  # what ``_fit_with_bindings`` holds a fit to
            return not validate_plan(p) and all(g.ok for g in group_checks(p, spec, prompt_len) if g.stage == stage)

        alternatives = packing_alternatives(base, stage)
        if not st.one_dispatch:  # the joined pass may merge or fold what the earlier skills saw in separate groups
            folded = every_fold(base, stage, _tuner(ctx))
            if folded is not None:
                alternatives.append((folded, " with the merges and folds the joined pass allows"))
        fits = []
        got = fork_map(fit_or_why, [alt for alt, _ in alternatives], ctx.settings.jobs)
        for n, ((alt, how), fitted) in enumerate(zip(alternatives, got, strict=True)):
            if isinstance(fitted, _Failed):  # after the earlier proposals; fitted again here for the real traceback
                _fit_with_bindings(alt, stage, prompt_len)
                raise RuntimeError(f"resident-decode: fitting the decode pass{how} failed in a worker but not here")
            if isinstance(fitted, str):
                ctx.workspace.journal.progress(f"resident-decode: the decode pass{how} cannot be packed ({fitted})")
                continue
            new, changes = fitted
            new, remade = as_it_will_run(new, timed, stage, base, checked)  # fits compared as they will run
            fits.append((timed(new), n, new, base if remade else alt))
            said = f"; {len(changes)} config change(s) to fit: " + "; ".join(changes) if changes else ""
            again = ", then merged again as before on the fitted configs" if remade else ""
            ahead = ", GEMV weights fetched ahead" if new.stage(stage).prefetch else ""
            change = f"{stage}: one resident dispatch{how}{again}, every launch packed into the array{fused}{ahead}"
            yield Proposal(new, change + said)
        if not fits:
            return
        # the fastest fit squeezes a weight stream below the DDR rate: walk its structure one unit at a time
        seconds, _, best, start = min(fits, key=lambda f: (f[0], f[1]))
        tight = squeezed(best)
        if not tight:
            return

        def fit(p):
            got = fit_or_why(p)
            return None if isinstance(got, str) else prefetch_if_faster(got[0], timed, stage)

        ctx.workspace.journal.progress(f"resident-decode: {', '.join(tight)} below the DDR rate; walking the structure")
        steps = search_structures(start, seconds, fit, timed, stage=stage, jobs=ctx.settings.jobs)
        if not steps:
            ctx.workspace.journal.progress("resident-decode: no structure one merged run or fold less packs faster")
        else:
            undone = "; ".join(w for *_, w in steps)
            yield Proposal(steps[-1][1], f"{stage}: one resident dispatch with {undone} ({', '.join(tight)} squeezed "
                                         f"before), every launch packed into the array{fused}")  # fmt: skip


class WeightPrefetch(PlanOptimization):
    name = "weight-prefetch"
    description = (
        "Lets each GEMV launch of a resident decode fetch the head of its weights into memory-tile regions the "
        "packing leaves free, while the weight launch before it drains and the launches in between run. Use when the "
        "decode stage is one resident dispatch whose GEMVs are bound by the DDR weight stream."
    )
    purpose = (
        "Keeps DDR streaming weights through the gaps between launches (drains, RoPE, the cache write), so a "
        "resident decode comes closer to its weight-streaming bound; the designs and their numbers are unchanged."
    )
    commands = ("tilepilot skills run weight-prefetch WORKSPACE --json",)
    gate_text = _GATE
    inputs = (_WS,)
    failure_modes = (
        "No memory tile has the free memory, BDs or locks for a region, or the launches before a GEMV keep its shim "
        "channels, its memory tiles' S2MM channels or DDR busy: nothing is fetched ahead and the proposal is not "
        "faster, so not kept.",
        "The schedule is the timing model's (no silicon measurement of a prefetching pass exists): read its gain as a "
        "modeled one.",
    )
    stages = ("decode",)

    def proposals(self, plan, ctx, stage) -> Iterator[Proposal]:
        st = ctx.plan.stage(stage)
        if not st.resident or st.prefetch:
            return
        new = clone(ctx.plan)
        new.stage(stage).prefetch = True
        yield Proposal(new, f"{stage}: GEMV weights fetched ahead into free memory-tile regions (resident pass)")


class _Failed:
    """A fit that raised something other than ``DesignError`` (a bug, not an illegal packing): the search raises it in
    its own order, after the proposals of the alternatives before it, however many workers fitted them (a worker's
    exception would otherwise surface when the map returns, before any proposal is tried)."""


# Refits when a fitted config breaks a group's launch bindings (``harness.probes.group_checks``, which the plan layer's
# fit cannot run): each round forbids the changed configs of the ops a failing check names (``op.tensor`` in its
# message; every changed op of the group when it names none), then keeps those ops' configs as they were.
BINDING_ROUNDS = 4


def _fit_with_bindings(base, stage: str, prompt_len: int):
    """``fit_resident`` of ``base`` whose changed configs also keep every multi-call group's bindings legal (a padded
    elementwise launch cannot bind to its neighbours' unpadded tensors, say). When the rounds run out or a refit
    finds no packing, the last fit is returned and the proposal's own checks reject it with the reason."""
    spec = base.model_spec()
    old = {(g.name, c.op): c.config for g in base.stage(stage).groups() for c in g.calls}
    forbidden: set[tuple[str, tuple]] = set()
    kept: set[str] = set()

    def allowed(op: str, config: dict) -> bool:
        return op not in kept and (op, tuple(sorted(config.items()))) not in forbidden

    new, changes = fit_resident(base, spec, allowed=allowed)
    for n in range(BINDING_ROUNDS):
        bad = {g.group: g.message for g in group_checks(new, spec, prompt_len) if g.stage == stage and not g.ok}
        blamed = []
        for g in new.stage(stage).groups():
            if g.name not in bad:
                continue
            changed = [c for c in g.calls if c.config != old.get((g.name, c.op))]
            named = [c for c in changed if f"{c.op}." in bad[g.name]]
            blamed += named or changed
        if not blamed:
            break
        if n == 0:
            forbidden |= {(c.op, tuple(sorted(c.config.items()))) for c in blamed}
        else:
            kept |= {c.op for c in blamed}
        try:
            new, changes = fit_resident(base, spec, allowed=allowed)
        except DesignError:
            break
    return new, changes
