"""Modeled timing of a whole plan: TTFT at a prompt length, decode latency at a context length.

``time_plan`` runs the plan *dry* through the production runner (``NpuRunner(dry=True)`` over meta
weights): every call builds its design for its real shape and is timed by ``npu.timing``, every buffer
sync the host policy causes is modeled by the same ``BufferPool`` a real run uses, and CPU groups get their
modeled host cost (``HostCost.cpu_model_s``: bytes and FLOPs at the calibration's host rates). Nothing is computed,
so every figure is a function of the plan, the code and the constants, whatever the machine's load. With
``cpu="measured"`` each CPU group is also run once per shape on zero tensors and its measured wall clock is
reported beside (``GroupTime.cpu_measured_s``), never in a modeled total.

Conventions:
- TTFT = the prefill pass of ``prompt_len`` tokens from an empty cache, all layers plus the head. The LM
  head at prefill computes only the last position's logits, as real deployments do.
- decode latency = one steady-state decode step whose attention reads ``context_len`` cached positions
  (default ``prompt_len``, at least 2: a decode step after a prompt reads its token and its own), timed as the
  second of two steps so one-time uploads are excluded.
- one-time uploads of preloaded weights are reported as ``load_s`` and are not part of TTFT.
Every figure is modeled; ``cpu_measured_s`` fields (None unless measured) are the only measured ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tilepilot.model.graph import block_graph, weight_shape
from tilepilot.model.spec import ModelSpec
from tilepilot.model.weights import LayerWeights
from tilepilot.npu.calibration import CALIBRATION, Calibration
from tilepilot.npu.device import Device
from tilepilot.npu.trace import Trace, on_modeled_timeline
from tilepilot.plan.plan import DeploymentPlan
from tilepilot.runtime.dispatcher import CpuOpTimer, KernelLibrary
from tilepilot.runtime.runner import NpuRunner, one_dispatch_name


class MetaWeights:
    """A WeightSource of meta tensors: right shapes and dtype, no storage (for dry runs)."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec

    def _t(self, name: str) -> torch.Tensor:
        return torch.empty(weight_shape(self.spec, name), dtype=torch.bfloat16, device="meta")

    def layer(self, i: int) -> LayerWeights:
        names = {w for n in block_graph(self.spec).block for w in n.weights}
        return LayerWeights(**{n: self._t(n) for n in names})

    def embed(self) -> torch.Tensor:
        return self._t("lm_head")

    def final_norm(self) -> torch.Tensor:
        return self._t("final_norm")

    def lm_head(self) -> torch.Tensor:
        return self._t("lm_head")


@dataclass
class GroupTime:
    """One group's modeled time in one pass; ``per_call_s`` is per layer for block groups."""

    stage: str
    part: str  # "block" | "head" | "host" (syncs outside any group)
    name: str
    where: str
    calls: int
    dispatch_s: float
    sync_s: float
    cpu_s: float  # modeled host cost of the group's CPU steps
    cpu_measured_s: float | None = None  # their measured wall clock on this machine (cpu="measured"), beside

    @property
    def total_s(self) -> float:
        return self.dispatch_s + self.sync_s + self.cpu_s

    @property
    def per_call_s(self) -> float:
        return self.total_s / self.calls if self.calls else 0.0

    @property
    def dispatch_per_call_s(self) -> float:
        return self.dispatch_s / self.calls if self.calls else 0.0


@dataclass
class PlanTiming:
    plan: str
    model: str
    prompt_len: int
    context_len: int
    ttft_s: float
    decode_s_per_token: float
    load_s: float
    dispatches: dict[str, int]
    groups: list[GroupTime] = field(default_factory=list)
    cpu_clock: str = "modeled"  # CPU groups are modeled; their measured wall clock (if any) is in cpu_measured_s
    clock: str = "modeled"

    @property
    def decode_tok_s(self) -> float:
        return 1.0 / self.decode_s_per_token if self.decode_s_per_token > 0 else 0.0

    def group(self, stage: str, name: str) -> GroupTime:
        for g in self.groups:
            if g.stage == stage and g.name == name:
                return g
        raise KeyError(f"{stage}/{name}")

    def stage_groups(self, stage: str) -> list[GroupTime]:
        return [g for g in self.groups if g.stage == stage]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["decode_tok_s"] = self.decode_tok_s
        for g, gd in zip(self.groups, d["groups"], strict=True):
            gd["total_s"] = g.total_s
            gd["per_call_s"] = g.per_call_s
        return d


def _measured(events) -> float | None:
    """Summed measured wall clock of CPU events, None when none of them was measured."""
    vals = [e.measured_s for e in events if e.measured_s is not None]
    return sum(vals) if vals else None


def _groups(plan: DeploymentPlan, stage: str, events: list) -> list[GroupTime]:
    st = plan.stage(stage)
    out: list[GroupTime] = []
    layout = [("block", g) for g in st.block] + [("head", g) for g in st.head]
    names = {g.name for _, g in layout}
    for part, g in layout:
        mine = [e for e in events if e.group == g.name and on_modeled_timeline(e)]
        calls = len({e.layer for e in mine if e.kind in ("dispatch", "cpu")}) or (1 if mine else 0)
        out.append(
            GroupTime(
                stage=stage,
                part=part,
                name=g.name,
                where=g.where,
                calls=calls,
                dispatch_s=sum(e.duration_s for e in mine if e.kind == "dispatch"),
                sync_s=sum(e.duration_s for e in mine if e.kind == "sync"),
                cpu_s=sum(e.duration_s for e in mine if e.kind == "cpu"),
                cpu_measured_s=_measured(e for e in mine if e.kind == "cpu"),
            )
        )
    fused = one_dispatch_name(stage)
    one = [e for e in events if e.kind == "dispatch" and e.group == fused]
    if one:  # the stage ran as one dispatch per pass: its groups hold no dispatch of their own
        out.append(GroupTime(stage, "pass", fused, "npu", len(one), sum(e.duration_s for e in one), 0.0, 0.0))
        names = names | {fused}
    loose = [e for e in events if on_modeled_timeline(e) and e.group not in names]
    if loose:
        out.append(
            GroupTime(
                stage=stage,
                part="host",
                name="host io",
                where="cpu",
                calls=1,
                dispatch_s=0.0,
                sync_s=sum(e.duration_s for e in loose if e.kind == "sync"),
                cpu_s=sum(e.duration_s for e in loose if e.kind == "cpu"),
                cpu_measured_s=_measured(e for e in loose if e.kind == "cpu"),
            )
        )
    return out


def time_plan(
    plan: DeploymentPlan,
    spec: ModelSpec | None = None,
    prompt_len: int = 2048,
    context_len: int | None = None,
    *,
    device: Device | None = None,
    cal: Calibration = CALIBRATION,
    cpu: str = "modeled",
    library: KernelLibrary | None = None,
    timer: CpuOpTimer | None = None,
) -> PlanTiming:
    """Modeled TTFT and decode latency of ``plan`` (see the module docstring for the conventions)."""

    spec = spec or plan.model_spec()
    context_len = context_len or max(prompt_len, 2)
    if prompt_len < 1 or context_len < 2:
        raise ValueError(f"prompt_len must be >= 1 and context_len >= 2, got {prompt_len} and {context_len}")
    trace = Trace()
    runner = NpuRunner(
        plan,
        MetaWeights(spec),
        device,
        trace,
        cal=cal,
        library=library or KernelLibrary(device, cal),
        timer=timer or CpuOpTimer(cpu, cal),
        max_context=max(prompt_len, context_len),
        dry=True,
    )
    mark = len(trace.events)
    runner.prefill([0] * prompt_len, all_logits=False)
    prefill_events = trace.events[mark:]
    _warm_up_decode(runner, context_len)
    mark = len(trace.events)
    runner.decode(0)
    decode_events = trace.events[mark:]
    return PlanTiming(
        plan=plan.name,
        model=spec.name,
        prompt_len=prompt_len,
        context_len=context_len,
        ttft_s=sum(e.duration_s for e in prefill_events if on_modeled_timeline(e)),
        decode_s_per_token=sum(e.duration_s for e in decode_events if on_modeled_timeline(e)),
        load_s=runner.load_s,
        dispatches={
            "prefill": sum(e.kind == "dispatch" for e in prefill_events),
            "decode": sum(e.kind == "dispatch" for e in decode_events),
        },
        groups=_groups(plan, "prefill", prefill_events) + _groups(plan, "decode", decode_events),
        cpu_clock="modeled",
    )


def _warm_up_decode(runner: NpuRunner, context_len: int) -> None:
    """Run the untimed first decode step and leave the cache where the timed one reads ``context_len`` positions.

    The warm-up steps from ``context_len - 2`` cached positions, so the timed step follows it at the next position.
    At a context of 2 there is no such position (a decode step needs a cached token before it), so the warm-up
    steps from 1 and the cache is set back to 1 for the timed step."""
    runner.cache.seek(max(context_len - 2, 1))
    runner.decode(0)
    runner.cache.seek(context_len - 1)


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if not num or not den else float(num) / float(den)


# The label of the model-error figure per basis (``same_model_claims``): the paper-like plan under the paper's
# measurement conditions, or, for records without that figure, at the deployment's own decode context.
MODEL_ERROR_BASIS = {
    "as_measured": "modeled paper-like, decode at the paper's short prompt",
    "deployment_context": "modeled paper-like, decode at the deployment's own context; this record has no "
    "figure at the paper's short prompt",
}


def same_model_claims(
    deployed: dict[str, Any],
    paper_like: dict[str, Any] | None,
    iron_like: dict[str, Any] | None = None,
    published: dict[str, Any] | None = None,
    paper_like_as_measured: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The only two kinds of claim tilepilot makes about speed (DESIGN.md section 1, issue 11 item 8).

    ``speedup_over_*``: the deployed plan against the same model's paper-like / iron-like plan, all timed by the
    same model in the same run (> 1 = the deployed plan is faster). ``model_error_vs_silicon``: the modeled
    paper-like plan over the paper's published silicon figure for that model (TTFT ratio; decode tok/s ratio),
    which measures the timing model's error and says nothing about the deployed plan; it is taken on
    ``paper_like_as_measured`` when given (the paper-like plan under the paper's measurement conditions: decode at its
    short prompt, ``plan.paper_deployments.PAPER_DECODE_CONTEXT``), else on ``paper_like``. Each figure dict needs
    ``ttft_s`` and ``decode_tok_s`` (``perf_figures`` / ``PlanTiming``); ``published`` needs the same keys.
    """

    def speedup(base: dict[str, Any] | None) -> dict[str, float | None] | None:
        if not base:
            return None
        return {
            "ttft": _ratio(base.get("ttft_s"), deployed.get("ttft_s")),
            "decode": _ratio(deployed.get("decode_tok_s"), base.get("decode_tok_s")),
        }

    error = None
    measured_as = paper_like_as_measured or paper_like
    if measured_as and published:
        error = {
            "ttft_modeled_over_published": _ratio(measured_as.get("ttft_s"), published.get("ttft_s")),
            "decode_tok_s_modeled_over_published": _ratio(
                measured_as.get("decode_tok_s"), published.get("decode_tok_s")
            ),
            # what the modeled figure was taken on, for the label beside it: a record written before the
            # as-measured figures existed holds the paper-like decode at the deployment's own context only
            "basis": MODEL_ERROR_BASIS["as_measured" if paper_like_as_measured else "deployment_context"],
            "modeled": {"ttft_s": measured_as.get("ttft_s"), "decode_tok_s": measured_as.get("decode_tok_s")},
        }
    return {
        "speedup_over_paper_like": speedup(paper_like),
        "speedup_over_iron_like": speedup(iron_like),
        "model_error_vs_silicon": error,
        "note": "speed-ups: two plans of one model timed by the same model in one run; model error: modeled "
        "paper-like plan / the paper's measured silicon figure",
    }
