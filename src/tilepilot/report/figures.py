"""The report's figures as inline SVG strings (matplotlib, Agg backend), one function per figure.

The page must open offline and in any browser, so text stays text (``svg.fonttype = 'none'``: the browser
draws it with a local sans-serif font, nothing is fetched), and each figure gets its own ``svg.hashsalt``
so the clip-path ids of several SVGs inlined in one page never collide. Every title says whether its
numbers are modeled (NPU, timing model) or measured (host wall clock, numerics of the functional run).
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

_STYLE = {
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Helvetica", "Arial", "sans-serif"],
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
}
_STATUS_COLOR = {"passed": "#2b8a3e", "failed": "#c92a2a", "needs-human-review": "#e67700"}
_PLAN_COLOR = {"deployed": "#1864ab", "paper-like": "#e8590c", "iron-like": "#868e96"}
_DECODE = "#ae3ec9"


def _svg(fig: Figure, salt: str) -> str:
    """The figure as an ``<svg>`` element (no XML prolog), with ids unique to this figure."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def render(name: str, draw: Callable[[], Figure]) -> str:
    with matplotlib.rc_context(_STYLE):
        fig = draw()
        return _svg(fig, salt=re.sub(r"\W", "", name))


def _family_colors(families: list[str]) -> dict[str, Any]:
    cmap = plt.get_cmap("tab10")
    return {f: cmap(i % 10) for i, f in enumerate(sorted(set(families)))}


# ----------------------------------------------------------------------------------------------------------------------
def phase_timeline(data: dict[str, Any]) -> str:
    """Gantt of phase attempts on the measured host clock; the gate verdict is written on each bar."""

    def draw() -> Figure:
        rows = data["rows"]
        fig, ax = plt.subplots(figsize=(8.5, 0.42 * len(rows) + 1.2))
        labels = []
        for i, r in enumerate(rows):
            y = len(rows) - 1 - i
            color = _STATUS_COLOR.get(r["status"], "#495057")
            ax.barh(y, max(r["seconds"], 1e-3), left=r["start_s"], color=color, height=0.6)
            gate = r["gate"] or "no gate file"
            mark = "PASS" if r["gate_passed"] else gate
            ax.text(
                r["start_s"] + r["seconds"],
                y,
                f"  {r['seconds']:.1f} s · gate {mark}",
                va="center",
                fontsize=8,
            )
            labels.append(f"{r['phase']} {r['skill']}" + (f" (#{r['attempt']})" if r["attempt"] > 1 else ""))
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(list(reversed(labels)))
        end = max(r["start_s"] + r["seconds"] for r in rows)
        ax.set_xlim(0, end * 1.25 + 1)
        ax.set_xlabel("seconds since the first phase started (measured host wall clock)")
        ax.set_title("Phase timeline with gate verdicts — host wall clock, measured")
        ax.grid(axis="y", visible=False)
        return fig

    return render("phases", draw)


def trajectory(data: dict[str, Any]) -> str:
    """Modeled TTFT and decode latency after each applied optimization; rejected proposals as red crosses."""

    def draw() -> Figure:
        steps = data["steps"]
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for ax, key, scale, unit, title in (
            (axes[0], "ttft", 1e3, "ms", "TTFT"),
            (axes[1], "decode", 1e3, "ms/token", "decode latency"),
        ):
            first = next((s for s in steps if s[f"{key}_before_s"] is not None), None)
            xs, ys = [0], [first[f"{key}_before_s"] * scale] if first else [math.nan]
            rx, ry = [], []
            for s in steps:
                after = s[f"{key}_after_s"]
                if s["applied"] and after is not None:
                    xs.append(s["step"])
                    ys.append(after * scale)
                elif after is not None:
                    rx.append(s["step"])
                    ry.append(after * scale)
            ax.step(xs, ys, where="post", color="#1864ab", lw=1.6, label="kept plan (applied skill)")
            ax.plot(xs, ys, "o", color="#1864ab", ms=4)
            if rx:
                ax.plot(rx, ry, "x", color="#c92a2a", ms=7, mew=2, label="rejected proposal")
            prev = ys[0]
            for s in steps:  # name only the applied skills that moved this figure by 5 % or more
                after = s[f"{key}_after_s"]
                if not s["applied"] or after is None:
                    continue
                if prev and abs(after * scale - prev) / prev >= 0.05:
                    ax.annotate(
                        s["skill"], (s["step"], after * scale), fontsize=6.5, xytext=(4, 3), textcoords="offset points"
                    )
                prev = after * scale
            ax.set_yscale("log")
            ax.set_xlabel("proposal # (0 = default plan)")
            ax.set_ylabel(f"{title} ({unit}, modeled)")
            ax.set_title(f"{title} after each proposal — modeled")
            ax.legend(fontsize=7, loc="lower left")
        fig.tight_layout()
        return fig

    return render("trajectory", draw)


def _per_layer_bars(stage: dict[str, Any], n_layers: int) -> list[dict[str, Any]]:
    """A stage's per-layer bar segments: its block groups, plus (a stage run as one dispatch per pass, whose groups
    hold no dispatch of their own) the pass's time spread over the layers as one "one dispatch" segment."""
    bars = list(stage["block"])
    if stage.get("one_dispatch_ms") is not None:
        ms = stage["one_dispatch_ms"] / max(1, n_layers)
        bars.append({"name": "one dispatch (pass / layers)", "where": "npu", "per_layer_ms": ms})
    return bars


def per_layer(data: dict[str, Any]) -> str:
    """Stacked bars: modeled time per layer of each kernel group, for each compared plan, prefill and decode."""

    def draw() -> Figure:
        plans = [p for p in data["plans"] if "stages" in p]
        fig, axes = plt.subplots(2, 1, figsize=(10, 1.0 + 1.1 * len(plans) * 2))
        cmap = plt.get_cmap("tab20")
        rows = {(p["label"], stage): _per_layer_bars(p["stages"][stage], data["n_layers"]) for p in plans
                for stage in ("prefill", "decode")}  # fmt: skip
        names = sorted({g["name"] for bars in rows.values() for g in bars})
        color = {n: cmap(i % 20) for i, n in enumerate(names)}
        for ax, stage in zip(axes, ("prefill", "decode"), strict=True):
            for i, p in enumerate(plans):
                y = len(plans) - 1 - i
                left = 0.0
                total = sum(g["per_layer_ms"] for g in rows[(p["label"], stage)])
                for g in rows[(p["label"], stage)]:
                    w = g["per_layer_ms"]
                    hatch = "//" if g["where"] == "cpu" else None
                    ax.barh(
                        y, w, left=left, color=color[g["name"]], edgecolor="white", lw=0.5, hatch=hatch, height=0.65
                    )
                    if total > 0 and w / total > 0.09:
                        ax.text(left + w / 2, y, g["name"], ha="center", va="center", fontsize=6.5, clip_on=True)
                    left += w
                ax.text(left, y, f"  {total:.3g} ms", va="center", fontsize=8)
            ax.set_yticks(range(len(plans)))
            ax.set_yticklabels([f"{p['label']} ({p['dispatches_per_layer'][stage]} disp.)" for p in reversed(plans)])
            ax.set_xlim(0, max(sum(g["per_layer_ms"] for g in rows[(p["label"], stage)]) for p in plans) * 1.18)
            where = f"prompt {data['prompt_len']} tokens" if stage == "prefill" else f"context {data['prompt_len']}"
            ax.set_xlabel(f"ms per layer ({where}), modeled; hatched = CPU group")
            ax.set_title(f"{stage}: per-layer time by kernel group — modeled, same timing model for every plan")
            ax.grid(axis="y", visible=False)
        fig.tight_layout()
        return fig

    return render("layers", draw)


def roofline(data: dict[str, Any]) -> str:
    """Achieved MAC/s against arithmetic intensity (MACs per DDR byte) for every kernel instance."""

    def draw() -> Figure:
        pts = [p for p in data["points"] if p["macs"] > 0 and p["bytes"] > 0 and p["seconds"] > 0]
        fig, ax = plt.subplots(figsize=(8.5, 4.6))
        colors = _family_colors([p["family"] for p in pts])
        for p in pts:
            ai = p["macs"] / p["bytes"]
            perf = p["macs"] / p["seconds"]
            marker = "o" if p["stage"] == "prefill" else "^"
            ax.scatter(ai, perf, color=colors[p["family"]], marker=marker, s=28, edgecolor="black", lw=0.3, zorder=3)
        xs = [p["macs"] / p["bytes"] for p in pts] or [1.0]
        lo, hi = min(xs) / 4, max(xs) * 4
        grid = [lo * (hi / lo) ** (i / 100) for i in range(101)]
        for name, peak in data["peak_macs_per_s"].items():
            style = "-" if name == "bf16" else ":"
            ax.plot(grid, [peak] * len(grid), style, color="black", lw=1)
            ax.text(hi, peak, f" {name} peak {peak / 1e12:.1f} TMAC/s", va="center", fontsize=7)
        for name, bw in data["ddr_bytes_per_s"].items():
            style = "--" if "usable" in name else ":"
            ys = [bw * x for x in grid]
            ax.plot(grid, ys, style, color="#5c940d", lw=1)
            ax.text(
                grid[10],
                bw * grid[10] * 1.3,
                f"DDR {name} {bw / 1e9:.0f} GB/s",
                fontsize=7,
                color="#5c940d",
                rotation=28,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi * 6)
        ys = [p["macs"] / p["seconds"] for p in pts] or [1.0]
        ax.set_ylim(min(ys) / 5, max(data["peak_macs_per_s"].values()) * 3)
        for fam, c in colors.items():
            ax.scatter([], [], color=c, label=fam, s=20)
        ax.scatter([], [], marker="o", color="white", edgecolor="black", label="prefill")
        ax.scatter([], [], marker="^", color="white", edgecolor="black", label="decode")
        ax.legend(fontsize=7, ncol=2, loc="lower right")
        ax.set_xlabel("arithmetic intensity (MACs per DDR byte)")
        ax.set_ylabel("MAC/s (modeled)")
        ax.set_title(f"Roofline of every kernel instance — modeled ({data['device']})")
        return fig

    return render("roofline", draw)


def gate_numerics(data: dict[str, Any]) -> str:
    """Per-layer cosine of each gate that recorded one, with its threshold; KL divergence beside it."""

    def draw() -> Figure:
        has_kl = bool(data["kl"])
        fig, axes = plt.subplots(1, 2 if has_kl else 1, figsize=(10 if has_kl else 7, 3.6), squeeze=False)
        ax = axes[0][0]
        cmap = plt.get_cmap("tab10")
        for i, g in enumerate(data["layers"]):
            ax.plot(range(len(g["cosine"])), [1 - c for c in g["cosine"]], "o-", ms=3, color=cmap(i), label=g["gate"])
        bounds = {g["threshold"] for g in data["layers"] if g["threshold"] is not None}
        for b in bounds:
            ax.axhline(1 - b, color="#c92a2a", ls="--", lw=1)
            ax.text(0, (1 - b) * 1.1, f"gate: cosine >= {b:g}", color="#c92a2a", fontsize=7)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("layer")
        ax.set_ylabel("1 - cosine vs FP32 oracle (lower is better)")
        ax.set_title("Per-layer cosine — measured (real computation)")
        if data["layers"]:
            ax.legend(fontsize=7)
        if has_kl:
            ax2 = axes[0][1]
            names = [k["gate"] for k in data["kl"]]
            ax2.bar(range(len(names)), [k["kl"] for k in data["kl"]], color="#1864ab")
            for b in {k["threshold"] for k in data["kl"] if k["threshold"] is not None}:
                ax2.axhline(b, color="#c92a2a", ls="--", lw=1, label=f"gate bound {b:g}")
                ax2.legend(fontsize=7)
            ax2.set_xticks(range(len(names)))
            ax2.set_xticklabels(names, rotation=25, ha="right", fontsize=7)
            ax2.set_yscale("log")
            ax2.set_ylabel("KL(oracle || NPU) of final logits")
            ax2.set_title("Logit KL divergence — measured")
        fig.tight_layout()
        return fig

    return render("gates", draw)


def calibration_scatter(data: dict[str, Any]) -> str:
    """Modeled vs measured (published, XDNA2 silicon) seconds per kernel row; cross-validated when present."""

    def draw() -> Figure:
        rows = data["rows"]
        fig, ax = plt.subplots(figsize=(6.8, 5.4))
        colors = _family_colors([r["family"] for r in rows])
        for r in rows:
            ax.scatter(r["measured_s"] * 1e3, r["modeled_s"] * 1e3, color=colors[r["family"]], s=18, zorder=3)
            if r["cv_modeled_s"] is not None:
                ax.scatter(
                    r["measured_s"] * 1e3,
                    r["cv_modeled_s"] * 1e3,
                    facecolor="none",
                    edgecolor=colors[r["family"]],
                    marker="D",
                    s=22,
                    zorder=3,
                )
        vals = [r["measured_s"] * 1e3 for r in rows] + [r["modeled_s"] * 1e3 for r in rows]
        lo, hi = min(vals) / 1.5, max(vals) * 1.5
        ax.plot([lo, hi], [lo, hi], color="black", lw=1)
        tol = float(data["tolerances"].get("kernel_max_ratio") or 0)
        if tol > 1:
            ax.fill_between(
                [lo, hi],
                [lo / tol, hi / tol],
                [lo * tol, hi * tol],
                color="#adb5bd",
                alpha=0.25,
                label=f"within {tol:g}x",
            )
        for fam, c in colors.items():
            med = (data["families"].get(fam) or {}).get("median_abs_err")
            ax.scatter([], [], color=c, label=f"{fam}" + (f" (median err {med:.0%})" if med is not None else ""))
        if data["has_cv"]:
            ax.scatter([], [], marker="D", facecolor="none", edgecolor="black", label="cross-validated (held out)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured on XDNA2 silicon (published), ms")
        ax.set_ylabel("modeled by tilepilot, ms")
        kind = "in-sample and cross-validated" if data["has_cv"] else "in-sample"
        ax.set_title(f"Calibration per kernel row — modeled vs measured ({kind})")
        ax.legend(fontsize=7, loc="upper left")
        return fig

    return render("calibration", draw)


FIGURES: dict[str, Callable[[dict[str, Any]], str]] = {
    "phases": phase_timeline,
    "trajectory": trajectory,
    "layers": per_layer,
    "roofline": roofline,
    "gates": gate_numerics,
    "calibration": calibration_scatter,
}
