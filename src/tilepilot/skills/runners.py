"""Runners and timings of the deployment's plans: one kernel library and one host timer per run.

Designs are built once per (family, shape, config) for every runner and timing of a run, and a plan's modeled
timing is cached by its content, because the optimization skills time the same plan many times.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

from tilepilot.model.quant import WeightFormat
from tilepilot.model.weights import WeightSource
from tilepilot.plan.builtin import default_plan, iron_like_plan, paper_like_plan
from tilepilot.plan.paper_deployments import PAPER_DECODE_CONTEXT
from tilepilot.plan.plan import DeploymentPlan, with_weights
from tilepilot.runtime.dispatcher import CpuOpTimer, KernelLibrary
from tilepilot.runtime.runner import NpuRunner
from tilepilot.runtime.timing import PlanTiming, time_plan
from tilepilot.skills.weights import WEIGHTS_KEY, describe
from tilepilot.skills.workspace import DeployWorkspace, plan_digest


def perf_figures(plan: DeploymentPlan, timing: PlanTiming) -> dict[str, Any]:
    """The figures the summary, the claims and the perf trajectory quote for one plan.

    Totals are modeled throughout: NPU dispatches, syncs and the CPU groups' modeled host cost
    (``*_cpu_modeled_*``). The ``*_cpu_measured_*`` keys name the part of a total that is measured: none
    any more (0.0); they stay for readers of claims recorded when CPU groups were timed by wall clock.
    """
    decode_s = float(timing.decode_s_per_token)
    cpu = {st: sum(g.cpu_s for g in timing.stage_groups(st)) for st in ("prefill", "decode")}
    return {
        "plan": plan.name,
        "ttft_s": float(timing.ttft_s),
        "decode_ms_per_token": decode_s * 1e3,
        "decode_tok_s": 1.0 / decode_s if decode_s > 0 else float("inf"),
        "ttft_cpu_modeled_s": cpu["prefill"],
        "decode_cpu_modeled_ms": cpu["decode"] * 1e3,
        "ttft_cpu_measured_s": 0.0,
        "decode_cpu_measured_ms": 0.0,
        "dispatches_per_layer": {s: plan.dispatches_per_layer(s) for s in ("prefill", "decode")},
    }


class RunnerFactory:
    """Production runners over the workspace's checkpoint and the modeled timing of any plan of it."""

    def __init__(
        self, workspace: DeployWorkspace, weights: Callable[[WeightFormat], WeightSource], timing_prompt_len: int
    ):
        self.workspace = workspace
        self._weights = weights  # the weights of a plan's format, owned (and opened on first use) by the reference
        self.timing_prompt_len = timing_prompt_len
        self._timing_cache: dict[tuple[str, int, int], PlanTiming] = {}
        self.tuning_stats: dict[str, dict[str, int]] = {}  # per stage: registry lookups vs configs searched

    @cached_property
    def library(self) -> KernelLibrary:
        """Designs built once per (family, shape, config) for every runner and timing of this run."""
        return KernelLibrary()

    @cached_property
    def host_timer(self) -> CpuOpTimer:
        """One CPU-step timer per run. CPU groups get a modeled host cost (HostCost.cpu_model_s), so every figure
        phases 4-5 keep or revert on is a function of the plan, the code and the constants only."""
        return CpuOpTimer()

    def make_runner(self, plan: DeploymentPlan | None = None, trace=None, **options) -> NpuRunner:
        """The production runner for ``plan`` (default: the deployed one) with the workspace's runtime options."""
        plan = plan or self.workspace.plan
        return NpuRunner.open(
            self.workspace.load(),
            plan=plan,
            weights=self._weights(plan.weight_format()),
            trace=trace,
            library=self.library,
            **options,
        )

    def draft(self, prefix: list[int], n: int) -> list[int]:
        """The production runner's greedy on the current plan: a cheap guess the oracle verifies (one bf16 pass
        over the weights per token instead of an FP32 one; a wrong guess only costs time)."""
        return self.make_runner().generate(prefix, n, stop_ids=()).tokens

    def timing(self, plan: DeploymentPlan, prompt_len: int | None = None, context_len: int | None = None) -> PlanTiming:
        """Modeled timing of ``plan`` (cached by plan content: skills time the same plan many times); decode at
        ``context_len`` positions (default: the prompt's)."""
        n = prompt_len or self.timing_prompt_len
        key = (plan_digest(plan), n, context_len or n)  # the same timing whether the context is named or not
        if key not in self._timing_cache:
            self._timing_cache[key] = time_plan(
                plan, plan.model_spec(), n, context_len, library=self.library, timer=self.host_timer
            )
        return self._timing_cache[key]

    def performance_summary(self) -> dict[str, Any]:
        """Modeled TTFT / decode before (default plan) and after (deployed), with paper-like for scale."""
        deployed = self.workspace.plan
        spec, fmt = deployed.model_spec(), deployed.weight_format()
        out: dict[str, Any] = {
            "prompt_len": self.timing_prompt_len,
            "clock": "modeled",
            "weights": describe(self.workspace.get_extra(WEIGHTS_KEY)),
        }
        # "before" is the plan the deployment started from (the default plan in the deployed weight format); the
        # paper-like and IRON-like plans are those systems' own, in bf16.
        paper = paper_like_plan(spec)
        for label, plan in (
            (
                "before",
                with_weights(default_plan(spec), fmt)
                if fmt.quantized or fmt.kv_cache != "bf16"
                else default_plan(spec),
            ),
            ("after", self.workspace.plan),
            ("paper_like", paper),
            ("iron_like", iron_like_plan(spec)),  # same-model speed-ups are against both (issue 11 item 8)
        ):
            out[label] = perf_figures(plan, self.timing(plan))
        # the paper-like plan under the paper's own measurement conditions (decode at its short prompt), the figure
        # the timing model's error against the paper's silicon is taken on (runtime.timing.same_model_claims)
        out["paper_like_as_measured"] = perf_figures(paper, self.timing(paper, context_len=PAPER_DECODE_CONTEXT))
        return out
