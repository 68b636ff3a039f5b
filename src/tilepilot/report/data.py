"""Everything the report shows, gathered from a workspace into plain data (no plotting, no HTML here).

Sources, structured first: ``deployment.json`` (the plan, the optimization baseline), ``gates/*.json`` (gate
verdicts, per-layer cosines, KL), the journal's JSON twins ``phase_timing.json`` and ``perf_opt_traj.json``,
and ``tilepilot calibrate --json``'s report (computed here, or read from a saved file). The per-layer
breakdown and the roofline time the deployed plan and the built-in paper-like and iron-like plans of the
same model with the same timing model in this run, so their differences are the plans', never the model's.
Markdown is never parsed: a workspace written before the twins existed gets a section that says so.

Each section is either data or a one-sentence reason it is missing, so the page never crashes on a
partial workspace (e.g. a deployment stopped before its evaluation).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilepilot.calibrate import harness
from tilepilot.errors import TilepilotError
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.npu.device import npu2
from tilepilot.npu.trace import Trace
from tilepilot.plan.builtin import builtin_plan
from tilepilot.runtime.dispatcher import CpuOpTimer, KernelLibrary
from tilepilot.runtime.runner import NpuRunner
from tilepilot.runtime.timing import GroupTime, MetaWeights, time_plan
from tilepilot.runtime.workspace import load_workspace
from tilepilot.skills import journal as J
from tilepilot.skills import registry

BUILTIN_COMPARED = ("paper-like", "iron-like")


@dataclass
class Section:
    """One part of the report: ``data`` when the workspace has what it needs, else ``missing`` says why."""

    key: str
    title: str
    data: Any = None
    missing: str | None = None

    @property
    def ok(self) -> bool:
        return self.missing is None


@dataclass
class ReportData:
    workspace: Path
    model: str
    plan: str
    verdict: str | None
    headline: dict[str, Any]
    sections: list[Section] = field(default_factory=list)
    generated_at: str = ""

    def section(self, key: str) -> Section:
        return next(s for s in self.sections if s.key == key)


# ----------------------------------------------------------------------------------------------------------------------
# journal and gates
# ----------------------------------------------------------------------------------------------------------------------
def _gates(root: Path) -> dict[str, dict[str, Any]]:
    j = J.Journal(root)
    return {name: g for name in (p.name for p in registry.phases()) if (g := j.read_gate(name)) is not None}


def phases_section(root: Path, gates: dict[str, dict[str, Any]]) -> Section:
    """Phase attempts on the measured host clock, each with its gate verdict when the gate file exists."""
    sec = Section("phases", "Phase timeline")
    rows = J.Journal(root).read_rows(J.PHASE_TIMING_JSON)
    if not rows:
        sec.missing = (
            f"No {J.PHASE_TIMING_JSON} in this workspace (deployed before the journal wrote its JSON twin, or no "
            "phase has finished yet); phase_timing.md has the table."
        )
        return sec
    t0 = min(float(r["ended_at"]) - float(r["seconds"]) for r in rows)
    out = []
    for r in rows:
        g = gates.get(str(r["skill"])) or {}
        end = float(r["ended_at"]) - t0
        out.append(
            {
                "phase": int(r["phase"]),
                "skill": str(r["skill"]),
                "attempt": int(r["attempt"]),
                "status": str(r["status"]),
                "start_s": end - float(r["seconds"]),
                "seconds": float(r["seconds"]),
                "gate": g.get("verdict") if g else None,
                "gate_passed": g.get("passed") if g else None,
            }
        )
    sec.data = {"rows": out, "clock": "measured"}
    return sec


def trajectory_section(root: Path, baseline: dict[str, Any] | None) -> Section:
    """Modeled TTFT and decode before and after every optimization proposal, in the order they were tried."""
    sec = Section("trajectory", "Optimization trajectory")
    rows = J.Journal(root).read_rows(J.PERF_TRAJ_JSON)
    if not rows:
        sec.missing = (
            f"No {J.PERF_TRAJ_JSON} in this workspace (no optimization phase has run, or the deployment predates the "
            "journal's JSON twin); perf_opt_traj.md has the table."
        )
        return sec
    steps = []
    for r in rows:
        steps.append(
            {
                "step": int(r.get("step", len(steps) + 1)),
                "skill": str(r.get("skill", "")),
                "target": str(r.get("target", "")),
                "change": str(r.get("change", "")),
                "applied": str(r.get("decision", "")) == "applied",
                "decision": str(r.get("decision", "")),
                "ttft_before_s": r.get("ttft_before"),
                "ttft_after_s": r.get("ttft_after"),
                "decode_before_s": r.get("decode_before"),
                "decode_after_s": r.get("decode_after"),
            }
        )
    sec.data = {"steps": steps, "baseline": baseline or {}, "clock": "modeled"}
    return sec


def gates_section(gates: dict[str, dict[str, Any]]) -> Section:
    """Per-layer cosines (and the KL gate when a gate measured it) of every phase gate that recorded them."""
    sec = Section("gates", "Gate numerics")
    layers, kl = [], []
    for name, g in gates.items():
        ev = g.get("evidence") or {}
        th = {t.get("metric"): t for t in g.get("thresholds") or [] if isinstance(t, dict)}
        cos = ev.get("layer_cosine")
        if isinstance(cos, list) and cos and all(isinstance(x, (int, float)) for x in cos):
            bound = th.get("layers.min_cosine") or th.get("cosine")
            layers.append(
                {
                    "gate": name,
                    "phase": g.get("phase"),
                    "cosine": [float(x) for x in cos],
                    "threshold": float(bound["value"]) if bound else None,
                }
            )
        m = g.get("measurements") or {}
        if "logits.kl_divergence" in m:
            bound = th.get("logits.kl_divergence")
            kl.append(
                {
                    "gate": name,
                    "phase": g.get("phase"),
                    "kl": float(m["logits.kl_divergence"]),
                    "threshold": float(bound["value"]) if bound else None,
                    "op": bound.get("op") if bound else None,
                }
            )
    if not layers and not kl:
        sec.missing = "No gate in gates/ recorded per-layer cosines or a KL divergence yet (phase 3 writes them)."
        return sec
    sec.data = {"layers": layers, "kl": kl, "clock": "measured numerics of the functional run"}
    return sec


# ----------------------------------------------------------------------------------------------------------------------
# modeled timing of the deployed and built-in plans
# ----------------------------------------------------------------------------------------------------------------------
def _plans(ws: Any) -> list[tuple[str, Any]]:

    return [("deployed", ws.plan)] + [(name, builtin_plan(name, ws.spec)) for name in BUILTIN_COMPARED]


def stage_rows(groups: list[GroupTime]) -> dict[str, Any]:
    """One stage's groups as report rows: each block group per layer, the head's groups (and host io) summed as
    ``head_ms``, and a stage run as one dispatch per pass (``StagePlan.one_dispatch``, the timing's ``part="pass"``
    group) as ``one_dispatch_ms`` (the whole pass: every layer and the head), ``None`` when the stage dispatches per
    group. A one-dispatch pass holds the layers' and the head's launches, so counting it as head time would put the
    whole decode step under the head."""
    passes = [g for g in groups if g.part == "pass"]
    return {
        "block": [
            {
                "name": g.name,
                "where": g.where,
                "per_layer_ms": g.per_call_s * 1e3,
                "dispatch_ms": g.dispatch_per_call_s * 1e3,
                "sync_ms": (g.sync_s / g.calls * 1e3) if g.calls else 0.0,
                "cpu_ms": (g.cpu_s / g.calls * 1e3) if g.calls else 0.0,
                # the CPU group's wall clock on this machine (--cpu measured), beside the modeled cost
                "cpu_measured_ms": (g.cpu_measured_s / g.calls * 1e3)
                if g.calls and g.cpu_measured_s is not None
                else None,
            }
            for g in groups
            if g.part == "block"
        ],
        "head_ms": sum(g.total_s for g in groups if g.part in ("head", "host")) * 1e3,
        "one_dispatch_ms": sum(g.total_s / g.calls for g in passes if g.calls) * 1e3 if passes else None,
    }


def plan_timings(ws: Any, prompt_len: int, cpu: str = "measured") -> tuple[Section, Section]:
    """Per-layer modeled time per kernel group for each compared plan, and every kernel instance of the
    deployed plan for the roofline. One dry run per plan through the production runner (``time_plan``)."""

    layers = Section("layers", "Per-layer modeled time by kernel group")
    roof = Section("roofline", "Roofline of the deployed plan's kernel instances")
    device = npu2()
    timer = CpuOpTimer(cpu, CALIBRATION)  # one timer: a CPU group of the same shape costs the same in each plan
    plans = []
    deployed_lib = None
    for label, plan in _plans(ws):
        lib = KernelLibrary(device, CALIBRATION)
        try:
            t = time_plan(plan, ws.spec, prompt_len=prompt_len, library=lib, timer=timer)
        except TilepilotError as e:
            plans.append({"label": label, "plan": plan.name, "error": str(e)})
            continue
        if label == "deployed":
            deployed_lib = lib
        stages = {stage: stage_rows(t.stage_groups(stage)) for stage in ("prefill", "decode")}
        plans.append(
            {
                "label": label,
                "plan": plan.name,
                "ttft_s": t.ttft_s,
                "decode_s_per_token": t.decode_s_per_token,
                "dispatches_per_layer": {s: plan.dispatches_per_layer(s) for s in ("prefill", "decode")},
                "cpu_clock": t.cpu_clock,
                "stages": stages,
            }
        )
    layers.data = {"prompt_len": prompt_len, "plans": plans, "n_layers": ws.spec.n_layers, "clock": "modeled"}
    if deployed_lib is None:
        roof.missing = "The deployed plan could not be timed, so there are no kernel instances to place."
        return layers, roof
    roof.data = roofline_points(ws, prompt_len, device, timer)
    return layers, roof


def roofline_points(ws: Any, prompt_len: int, device: Any, timer: Any) -> dict[str, Any]:
    """Every distinct kernel instance (launch) of the deployed plan at the modeled prompt length and context:
    its MACs, DDR bytes and modeled time, read off a dry run's trace, plus the array's roofs."""

    trace = Trace()
    runner = NpuRunner(
        ws.plan,
        MetaWeights(ws.spec),
        device,
        trace,
        library=KernelLibrary(device, CALIBRATION),
        timer=timer,
        max_context=prompt_len + 1,
        dry=True,
    )
    runner.prefill([0] * prompt_len, all_logits=False)
    runner.decode(0)
    seen: dict[tuple, dict[str, Any]] = {}
    for e in trace.events:
        if e.kind != "launch":
            continue
        key = (e.stage, e.name, e.macs, e.bytes, round(e.duration_s, 12))
        if key in seen:
            seen[key]["count"] += 1
            continue
        seen[key] = {
            "stage": e.stage,
            "name": e.name,
            "family": e.name.split("_")[0],
            "group": e.group,
            "macs": e.macs,
            "bytes": e.bytes,
            "seconds": e.duration_s,
            "count": 1,
        }
    return {
        "points": list(seen.values()),
        "peak_macs_per_s": {
            "bf16": device.peak_flops("bf16") / 2.0,
            "bfp16": device.peak_flops("bfp16") / 2.0,
        },
        "ddr_bytes_per_s": {
            "usable (fitted)": CALIBRATION.ddr_bytes_per_s,
            "theoretical": device.ddr_bytes_per_s_theoretical,
        },
        "device": f"{device.name}: {device.columns} columns x {device.compute_rows} compute rows at "
        f"{device.clock_hz / 1e9:.2f} GHz",
        "prompt_len": prompt_len,
        "clock": "modeled",
    }


# ----------------------------------------------------------------------------------------------------------------------
# calibration
# ----------------------------------------------------------------------------------------------------------------------
def _cv_value(fig: dict[str, Any]) -> float | None:
    """The cross-validated modeled seconds of a calibration row, if the report carries one.

    ``calibrate --json`` does not have cross-validation yet; another change adds it. Accepted until its name
    settles: a numeric field whose key names cross-validation (``cv``, ``cross_validated``, ``*_cv``...).
    """
    for k, v in fig.items():
        lk = k.lower()
        if ("cross" in lk or lk == "cv" or lk.startswith("cv_") or lk.endswith("_cv")) and k != "modeled":
            if isinstance(v, (int, float)) and v > 0:
                return float(v)
            if isinstance(v, dict) and isinstance(v.get("modeled"), (int, float)):
                return float(v["modeled"])
    return None


def calibration_section(calibration: dict[str, Any] | Path | None) -> Section:
    """Modeled vs published (measured on XDNA2) per kernel row, from ``tilepilot calibrate --json``'s data."""
    sec = Section("calibration", "Calibration: modeled vs measured kernel rows")
    try:
        if isinstance(calibration, Path):
            report = json.loads(calibration.read_text(encoding="utf-8"))
            source = str(calibration)
        elif isinstance(calibration, dict):
            report, source = calibration, "given report"
        else:
            report, source = harness.run(end_to_end=False).to_dict(), "computed now (tilepilot calibrate, kernels)"
    except (OSError, ValueError, TilepilotError) as e:
        sec.missing = f"The calibration report could not be read or computed ({e})."
        return sec
    rows = []
    for fam, body in (report.get("kernels") or {}).items():
        for f in body.get("figures") or []:
            if not isinstance(f.get("modeled"), (int, float)) or not isinstance(f.get("published"), (int, float)):
                continue
            rows.append(
                {
                    "family": fam,
                    "label": f.get("label", f.get("key", "")),
                    "modeled_s": float(f["modeled"]),
                    "measured_s": float(f["published"]),
                    "cv_modeled_s": _cv_value(f),
                }
            )
    if not rows:
        sec.missing = "The calibration report has no kernel rows with both a modeled and a measured time."
        return sec
    sec.data = {
        "rows": rows,
        "source": source,
        "tolerances": report.get("tolerances") or {},
        "families": {
            k: {kk: v.get(kk) for kk in ("median_abs_err", "worst_ratio", "ok")} for k, v in report["kernels"].items()
        },
        "has_cv": any(r["cv_modeled_s"] is not None for r in rows),
    }
    return sec


# ----------------------------------------------------------------------------------------------------------------------
# the whole report
# ----------------------------------------------------------------------------------------------------------------------
def gather(
    workspace: str | Path,
    *,
    calibration: dict[str, Any] | Path | None = None,
    prompt_len: int | None = None,
    cpu: str = "measured",
) -> ReportData:
    """Read a workspace and time its plans; raises only when there is no deployment to report on."""

    root = Path(workspace)
    ws = load_workspace(root)  # a WorkspaceError naming the file when this is not a deployment
    baseline = ws.extra.get("optimization_baseline") or None
    n = int(prompt_len or (baseline or {}).get("prompt_len") or 2048)
    gates = _gates(root)
    ev = (gates.get("independent-evaluator") or {}).get("evidence") or {}
    verdict = ev.get("verdict")
    data = ReportData(
        workspace=root,
        model=ws.spec.name or ws.spec.architecture,
        plan=ws.plan.name,
        verdict=str(verdict) if verdict else None,
        headline={"prompt_len": n, "n_layers": ws.spec.n_layers, "family": ws.spec.family},
        generated_at=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    data.sections.append(phases_section(root, gates))
    data.sections.append(trajectory_section(root, baseline))
    layers, roof = plan_timings(ws, n, cpu)
    data.sections += [layers, roof]
    data.sections.append(gates_section(gates))
    data.sections.append(calibration_section(calibration))
    for p in layers.data["plans"] if layers.data else []:
        if "ttft_s" in p:
            data.headline[p["label"]] = {"ttft_s": p["ttft_s"], "decode_s_per_token": p["decode_s_per_token"]}
    if not (root / J.EVALUATION).exists():
        data.headline["evaluation"] = "not evaluated yet"
    return data
