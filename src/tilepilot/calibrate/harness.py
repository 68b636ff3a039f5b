"""Modeled vs published: the timing model held against what was measured on real XDNA2 silicon.

Two levels, both from ``tilepilot/data`` (copies of ``reference/npu2_kernel_measurements.json`` and
``reference/published.json``, whose sources they name):

- **Per kernel**: every GEMM, GEMV, RMSNorm, RoPE, SiLU x mul, residual add and FlashAttention row of
  AIR's kernel registry on NPU2, expressed as our design of the same family with the same shape and,
  where our validator accepts it, the same tiling (else the closest legal tiling, said in the row's
  note), timed as one standalone dispatch (``time_dispatch``), against the measured latency. Per
  family: median absolute relative error and the worst ratio. A family whose module is not in the tree
  is reported "not modeled yet" with no number.
- **End to end** (Llama-3.2-1B, through the plan timer ``plan.timing.time_plan``): the iron-like plan
  against IRON's 2.744 s prefill at 2048 tokens and 370 ms/token decode; the paper-like plan against
  AIR's 1.27 s and 92 ms/token, its three prefill groups per layer (7.3 / 21.6 / 41.0 ms) and its LM
  head (13.6 ms).

Tolerances (issue 4): per family median |error| <= 20 % and no row off by more than 2x; every end-to-
end figure within +-20 %. ``fit`` tunes only the fitted constants of ``npu/calibration.py`` (a
deterministic coordinate search on a log grid, documented below) and reports what it found; the values
frozen in ``calibration.py`` name this fit. Every time here is modeled; published times were measured.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from tilepilot.errors import ConfigError, TilepilotError
from tilepilot.kernels.registry import FAMILIES
from tilepilot.model.zoo import get_zoo_model
from tilepilot.npu.calibration import CALIBRATION, FITTED, SINGLE_SHOT_EXTRA_S, Calibration
from tilepilot.npu.design import Design, MultiLaunchGroup, fallbacks
from tilepilot.npu.device import Device, npu2
from tilepilot.npu.timing import GroupProfile, group_profile, time_group_profile
from tilepilot.npu.validate import DesignError, validate, validate_group
from tilepilot.plan.builtin import iron_like_plan, paper_like_plan
from tilepilot.plan.paper_deployments import PAPER_DECODE_CONTEXT
from tilepilot.runtime.timing import time_plan

# --- tolerances (issue 4 "Calibration": median <= 20 % per family, no row off by more than 2x, end to end +-20 %)
KERNEL_MEDIAN_ABS_ERR = 0.20
KERNEL_MAX_RATIO = 2.0
END_TO_END_ABS_ERR = 0.20

# Families of the measurement file, in report order: (key in the JSON, our kernel family).
KERNEL_TABLES: tuple[tuple[str, str], ...] = (
    ("gemm", "gemm"),
    ("gemv", "gemv"),
    ("rmsnorm", "rmsnorm"),
    ("rope", "rope"),
    ("silu_mul", "swiglu"),
    ("eltwise_add", "eltwise"),
    ("flash_attention", "attention"),
)
E2E_MODEL = "llama-3.2-1b"
E2E_PROMPT = 2048


def load_reference(name: str) -> dict[str, Any]:
    """One of the packaged reference files: "npu2_kernel_measurements" or "published"."""
    text = resources.files("tilepilot.data").joinpath(f"{name}.json").read_text(encoding="utf-8")
    return json.loads(text)


# ----------------------------------------------------------------------------------------------------------------------
# figures and reports
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Figure:
    """One modeled-vs-published comparison. Seconds; ``modeled`` is None when our side is not modeled yet."""

    key: str
    family: str
    label: str
    published: float
    modeled: float | None
    note: str = ""
    checked: bool = True  # False: shown for insight, not held to a tolerance

    @property
    def ratio(self) -> float | None:
        return None if self.modeled is None else self.modeled / self.published

    @property
    def abs_err(self) -> float | None:
        r = self.ratio
        return None if r is None else abs(r - 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "modeled": self.modeled,
            "published": self.published,
            "ratio": self.ratio,
            "unit": "s",
            "checked": self.checked,
            "note": self.note,
        }


@dataclass(frozen=True)
class FamilySummary:
    family: str
    rows: int
    modeled_rows: int
    median_abs_err: float | None
    worst_ratio: float | None  # the ratio farthest from 1 (in log terms)
    ok: bool
    status: str  # "modeled" | "not modeled yet" | "partly modeled"

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "rows": self.rows,
            "modeled_rows": self.modeled_rows,
            "median_abs_err": self.median_abs_err,
            "worst_ratio": self.worst_ratio,
            "ok": self.ok,
        }


def worst_ratio(ratios: Iterable[float]) -> float | None:
    rs = list(ratios)
    return max(rs, key=lambda r: abs(math.log(r))) if rs else None


def summarize(family: str, figures: Sequence[Figure]) -> FamilySummary:
    """Median |modeled/published - 1| and worst ratio over a family's modeled rows, and whether both hold."""
    ratios = [f.ratio for f in figures if f.ratio is not None]
    if not ratios:
        return FamilySummary(family, len(figures), 0, None, None, False, "not modeled yet")
    med = statistics.median(abs(r - 1.0) for r in ratios)
    worst = worst_ratio(ratios)
    ok = med <= KERNEL_MEDIAN_ABS_ERR and all(1 / KERNEL_MAX_RATIO <= r <= KERNEL_MAX_RATIO for r in ratios)
    status = "modeled" if len(ratios) == len(figures) else "partly modeled"
    return FamilySummary(family, len(figures), len(ratios), med, worst, ok and status == "modeled", status)


@dataclass(frozen=True)
class Limit:
    """A hardware limit the paper's authors hit, and whether our validator reports it with the expected code."""

    key: str
    description: str
    expected_code: str
    codes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.expected_code in self.codes

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "description": self.description,
            "expected_code": self.expected_code,
            "codes": list(self.codes),
            "ok": self.ok,
        }


@dataclass
class CalibrationReport:
    kernels: dict[str, list[Figure]]
    end_to_end: list[Figure]
    limits: list[Limit] = field(default_factory=list)
    calibration: Calibration = CALIBRATION
    # Cross-validation (calibrate/crossval.py attaches it): each row timed with the constants fitted without its
    # fold (table -> figures, same order as ``kernels``), and how that was done.
    held_out: dict[str, list[Figure]] | None = None
    cross_validation: dict[str, Any] | None = None
    paper: list[PaperPrediction] = field(default_factory=list)
    # Whether the constants are the recorded fit (calibrate/frozen.py fills it): each objective recomputed against
    # npu/calibration.FROZEN_FIT; a mismatch fails the report.
    frozen_fit: dict[str, Any] | None = None

    @property
    def families(self) -> dict[str, FamilySummary]:
        return {fam: summarize(fam, figs) for fam, figs in self.kernels.items()}

    @property
    def cv_families(self) -> dict[str, FamilySummary]:
        """Per table, the summary of the held-out predictions (empty without cross-validation)."""
        return {fam: summarize(fam, figs) for fam, figs in (self.held_out or {}).items()}

    def failures(self) -> list[str]:
        out = []
        for fam, s in self.families.items():
            if s.status != "modeled":
                out.append(f"kernel family {fam} is {s.status}")
            elif not s.ok:
                out.append(
                    f"kernel family {fam}: median error {s.median_abs_err:.0%} (limit {KERNEL_MEDIAN_ABS_ERR:.0%}), "
                    f"worst ratio {s.worst_ratio:.2f} (limit {KERNEL_MAX_RATIO:g}x)"
                )
        for f in (f for f in self.end_to_end if f.checked):
            if f.ratio is None:
                out.append(f"{f.label}: not modeled yet ({f.note})")
            elif f.abs_err > END_TO_END_ABS_ERR:
                out.append(f"{f.label}: modeled/published = {f.ratio:.2f} (limit +-{END_TO_END_ABS_ERR:.0%})")
        for m in (self.frozen_fit or {}).get("mismatches", []):
            out.append(f"the constants are not the recorded fit ({m}); refit with calibrate --fit and freeze it")
        for lim in self.limits:
            if not lim.ok:
                out.append(
                    f"limit {lim.key}: validator said {list(lim.codes) or 'nothing'}, expected {lim.expected_code}"
                )
        return out

    @property
    def passed(self) -> bool:
        return not self.failures()

    def to_dict(self) -> dict[str, Any]:
        """JSON form with a stable key order (families and figures in the reference files' order)."""
        fams = self.families
        return {
            "clock": "modeled",
            "published_clock": "measured",
            "passed": self.passed,
            "tolerances": {
                "kernel_median_abs_err": KERNEL_MEDIAN_ABS_ERR,
                "kernel_max_ratio": KERNEL_MAX_RATIO,
                "end_to_end_abs_err": END_TO_END_ABS_ERR,
            },
            "end_to_end": [f.to_dict() for f in self.end_to_end],
            "kernels": {fam: self._family_dict(fam, figs, fams[fam]) for fam, figs in self.kernels.items()},
            "cross_validation": self.cross_validation,
            "paper_predictions": [p.to_dict() for p in self.paper],
            "limits": [lim.to_dict() for lim in self.limits],
            "fitted_constants": fitted_values(self.calibration),
            "frozen_fit": self.frozen_fit,
            "failures": self.failures(),
        }

    def _family_dict(self, fam: str, figs: list[Figure], summary: FamilySummary) -> dict[str, Any]:
        """In-sample summary, then the cross-validated one (None when not computed), then the rows with both."""
        cv = self.cv_families.get(fam)
        held = {f.key: f for f in (self.held_out or {}).get(fam, [])}
        rows = []
        for f in figs:
            h = held.get(f.key)
            rows.append({**f.to_dict(), "cv_modeled": h.modeled if h else None, "cv_ratio": h.ratio if h else None})
        return {
            **summary.to_dict(),
            "cv_median_abs_err": cv.median_abs_err if cv else None,
            "cv_worst_ratio": cv.worst_ratio if cv else None,
            "figures": rows,
        }


def fitted_values(cal: Calibration) -> dict[str, Any]:
    d = cal.to_dict()
    return {name: d[name] for name in FITTED}


# ----------------------------------------------------------------------------------------------------------------------
# per-kernel rows as our designs
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class KernelRow:
    """A measurement row turned into something we can time: a design (or group) or the reason we cannot."""

    key: str
    family: str
    label: str
    published: float
    build: Callable[[], Design | MultiLaunchGroup] | None
    note: str = ""
    # further dispatches the measurement includes, each single-shot (a fused-cast GEMM row's cast launch)
    build_single_shot: Callable[[], list[Design]] | None = None
    # what the row's dispatches are and what the timing model reads of them, built once on first use: the main
    # dispatch (None when the row is not expressible) and the single-shot ones, then their profiles
    _built: tuple[Design | MultiLaunchGroup | None, list[Design]] | None = None
    _profiles: tuple[GroupProfile | None, tuple[GroupProfile, ...]] | None = None

    def _dispatches(self) -> tuple[Design | MultiLaunchGroup | None, list[Design]]:
        if self._built is None:
            main = self.build() if self.build is not None else None
            self._built = (main, self.build_single_shot() if self.build_single_shot is not None else [])
        return self._built

    def design(self) -> Design | MultiLaunchGroup | None:
        return self._dispatches()[0]

    def single_shot_dispatches(self) -> list[Design]:
        return self._dispatches()[1]

    def families(self) -> set[str]:
        """Kernel families of the row's launches (a fused-cast GEMM row also has its cast's eltwise launch)."""
        found = _families_in(self.design()).union(*(_families_in(d) for d in self.single_shot_dispatches()))
        return found - {"None"}

    def _profiled(self) -> tuple[GroupProfile | None, tuple[GroupProfile, ...]]:
        """The row's dispatches reduced to what the timing model reads: built once, timed under any calibration."""
        if self._profiles is None:
            main, extra = self._dispatches()
            self._profiles = (group_profile(main) if main is not None else None, tuple(map(group_profile, extra)))
        return self._profiles

    def profile(self) -> GroupProfile | None:
        return self._profiled()[0]

    def seconds(self, cal: Calibration) -> float:
        """The row's modeled time: its dispatch, then each single-shot dispatch at its extra host cost."""
        main, extra = self._profiled()
        t = time_group_profile(main, cal, detail=False).seconds
        for gp in extra:
            t += time_group_profile(gp, cal, detail=False).seconds + SINGLE_SHOT_EXTRA_S
        return t


def _family(name: str):

    return FAMILIES.get(name)


def _legal(obj: Design | MultiLaunchGroup) -> bool:

    return not (validate_group(obj) if isinstance(obj, MultiLaunchGroup) else validate(obj))


def closest_legal(
    mod: Any,
    shape: Any,
    wanted: Any,
    device: Device,
    keep: Sequence[str] = (),
    first: Sequence[Any] = (),
) -> tuple[Any, str]:
    """``wanted`` if its design is legal here; else the first legal config of ``first`` (hand-picked near
    equivalents); else the legal candidate nearest to it (log2 distance over numeric fields, ``keep`` fields
    equal). Returns (config, note naming what changed).

    Legal here means legal as the kernel usually builds it: a design made legal only by a fallback construction
    (``Design.meta``'s ``fallback``: eltwise's whole-object cuts and packed task groups, for long prompts) is not
    taken while a usual one near it is. The frozen fit was timed before those existed, on the nearest usual
    design (the 8388608-element residual add at chunk 1024, not its published 2048), so every row keeps the design
    the fit was made on; a refit may take them as published. Only a row with no usual legal design gets the
    fallback one, as published."""

    def build(cfg: Any) -> Design | MultiLaunchGroup | None:
        try:
            obj = mod.make_design(shape, cfg, device)
        except DesignError:
            return None
        return obj if _legal(obj) else None

    def legal(cfg: Any) -> bool:
        obj = build(cfg)
        return obj is not None and not fallbacks(obj)

    as_published = build(wanted)
    if as_published is not None and not fallbacks(as_published):
        return wanted, ""
    why = "as published it breaks a rule of our validator"
    if as_published is not None:
        why = f"as published it needs the {' and '.join(fallbacks(as_published))} the frozen fit was timed without"
    w = dataclasses.asdict(wanted)

    def distance(cfg: Any) -> float:
        c = dataclasses.asdict(cfg)
        d = 0.0
        for k, v in w.items():
            if isinstance(v, bool) or not isinstance(v, int | float):
                d += 0.0 if c[k] == v else 5.0
            elif v > 0 and c[k] > 0:
                d += abs(math.log2(c[k] / v))
        return d

    ranked = list(first) + sorted(mod.candidate_configs(shape, device), key=distance)[:40]
    for cfg in ranked:
        if all(getattr(cfg, k) == getattr(wanted, k) for k in keep) and legal(cfg):
            changed = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(cfg).items() if w.get(k) != v)
            return cfg, f"closest legal config ({changed}): {why}"
    if as_published is not None:
        return wanted, f"as published, built with the {' and '.join(fallbacks(as_published))} (no usual design fits)"
    raise TilepilotError(f"No legal {mod.FAMILY} config near {wanted} for {shape}; the row cannot be modeled.")


def legal_design(mod: Any, shape: Any, wanted: Any, device: Device, **closest: Any) -> Design:
    """The design at ``wanted``'s tiling or the nearest legal one, with ``calibration_note`` in its meta saying
    which (the row's figure reads it), so every family's row reports a changed tiling, not only GEMM's."""
    cfg, note = closest_legal(mod, shape, wanted, device, **closest)
    design = mod.make_design(shape, cfg, device)
    design.meta["calibration_note"] = note
    return design


def _dims(text: str) -> tuple[int, int]:
    a, b = text.replace("\u00d7", "x").split("x")
    return int(a), int(b)


def air_gemm_herd(herd: Sequence[int], device: Device) -> tuple[int, int, str]:
    """AIR's GEMM herd [herd_m, herd_n] as our (rows, cols, orient): herd_m on the columns and herd_n on the compute
    rows, as AIR places it ("N=32 -> tile_n=32, herd_n=1"); a herd whose herd_n exceeds the compute rows but fits
    the other way round is placed M-on-rows."""
    herd_m, herd_n = (int(v) for v in herd)
    if herd_n <= device.compute_rows and herd_m <= device.columns:
        return herd_n, herd_m, "m_cols"
    return herd_m, herd_n, "m_rows"


def _gemm_rows(rows: list[dict], device: Device) -> list[KernelRow]:
    out = []
    for r in rows:
        m, k, n, method, out_dtype = r["M"], r["K"], r["N"], r["method"], r["out_dtype"]
        key = f"gemm/{m}x{k}x{n}/{method}/{out_dtype}"
        label = f"GEMM {m}x{k}x{n} {method} ({out_dtype} out)"
        published = 2.0 * m * n * k / (r["gflops"] * 1e9)

        def build(r=r, m=m, n=n, k=k, method=method, out_dtype=out_dtype) -> Design | MultiLaunchGroup:
            gemm = _family("gemm")
            t = r["tile"]
            rows_, cols, orient = air_gemm_herd(r["herd"], device)
            acc = "bf16" if method == "direct" else "fp32"
            # f32 outputs drained at 4 B per element; fused-cast's GEMM launch writes f32 too (its cast launch reads it)
            out = "fp32" if out_dtype == "f32" or method == "fused-cast" else "bf16"
            wanted = gemm.Config(rows_, cols, t["tile_m"], t["tile_k_l1"], t["tile_n"], "vector", acc, orient=orient,
                                 tile_k_l2=int(t.get("tile_k_l2", 0) or 0), out_dtype=out)  # fmt: skip
            shape = gemm.Shape(m, n, k)
            # AIR accumulates in its C buffer; with a bf16 C our fp32 accumulator is a separate buffer, which may not
            # fit L1 at AIR's tiling: then time the same tiling with the in-buffer (bf16) accumulator
            other = dataclasses.replace(wanted, acc="bf16" if acc == "fp32" else "fp32")
            keep = ("rows", "cols", "variant", "orient")
            return legal_design(gemm, shape, wanted, device, keep=keep, first=[other])

        def cast(m=m, n=n) -> list[Design]:
            # the f32 GEMM's cast launch: an eltwise design over M*N elements moves the same DDR bytes (4 B in + 2 B
            # out per element) as the fp32 -> bf16 cast; dispatched single-shot (SINGLE_SHOT_EXTRA_S)
            eltwise = _family("eltwise")
            design = eltwise.make_design(
                eltwise.Shape(m * n, "add"), eltwise.default_config(eltwise.Shape(m * n)), device
            )
            design.name = f"gemm_{m}x{n}_cast"
            return [design]

        notes = []
        if method == "fused-cast":
            notes.append(
                "cast launch modeled as an eltwise design with the cast's DDR traffic, its own single-shot "
                f"dispatch (+{SINGLE_SHOT_EXTRA_S * 1e6:.0f} us, published)"
            )
        if out_dtype == "f32":
            notes.append("f32 output: C drained at 4 B per element, accumulated in its one fp32 buffer")
        if method == "direct":
            psum = "fp32" if out_dtype == "f32" else "bf16"
            notes.append(f"{psum} partial sums round-trip the memory tile per L2 K tile ({r['tile']['tile_k_l2']})")
        ok = _family("gemm") is not None and (method != "fused-cast" or _family("eltwise") is not None)
        single = cast if method == "fused-cast" else None
        notes_s = "; ".join(notes)
        out.append(KernelRow(key, "gemm", label, published, build if ok else None, notes_s, build_single_shot=single))
    return out


def _gemv_rows(rows: list[dict], device: Device) -> list[KernelRow]:
    out = []
    for r in rows:
        n, k = _dims(r["shape_MxK"])

        def build(n=n, k=k, tile=r["tile"]) -> Design:
            gemv = _family("gemv")
            shape = gemv.Shape(n, k)
            return gemv.make_design(shape, gemv.from_air_tile(shape, tile, device), device)

        out.append(
            KernelRow(
                f"gemv/{n}x{k}/{r['tile'].replace('/', '-')}",
                "gemv",
                f"GEMV {n}x{k} tile {r['tile']}",
                r["latency_us"] * 1e-6,
                build if _family("gemv") else None,
                r.get("used_by", ""),
            )
        )
    return out


def _rmsnorm_rows(rows: list[dict], device: Device) -> list[KernelRow]:
    out = []
    for r in rows:
        m, w = _dims(r["shape_MxN"])
        tiles = int(r["herd_x"])

        def build(m=m, w=w, tiles=tiles) -> Design:
            mod = _family("rmsnorm")
            shape = mod.Shape(m, w)
            return legal_design(mod, shape, dataclasses.replace(mod.default_config(shape, device), tiles=tiles), device)

        out.append(
            KernelRow(
                f"rmsnorm/{m}x{w}",
                "rmsnorm",
                f"RMSNorm {m}x{w} on {tiles} tiles",
                r["latency_us"] * 1e-6,
                build if _family("rmsnorm") else None,
                r.get("used_by", ""),
            )
        )
    return out


def _rope_rows(rows: list[dict], device: Device) -> list[KernelRow]:
    out = []
    for r in rows:
        n, d = int(r["rows"]), int(r["head_dim"])
        tiles = int(str(r["config"]).split("/")[0])

        def build(n=n, d=d, tiles=tiles) -> Design:
            mod = _family("rope")
            # AIR's kernel streams one cos/sin row per work row (its GB/s counts them), i.e. rows x 1 head here
            shape = mod.Shape(n, 1, d)
            return legal_design(mod, shape, dataclasses.replace(mod.default_config(shape, device), tiles=tiles), device)

        out.append(
            KernelRow(
                f"rope/{n}x{d}",
                "rope",
                f"RoPE {n} rows x {d}",
                r["latency_us"] * 1e-6,
                build if _family("rope") else None,
                r.get("used_by", "") + "; a cos/sin row streamed per work row, as AIR's kernel does",
            )
        )
    return out


def _flat_rows(table: str, family: str, rows: list[dict], device: Device) -> list[KernelRow]:
    """SiLU x mul and residual add: flat element streams, config "tiles/herd_y/chunk"."""
    out = []
    for r in rows:
        n = int(r["N"])
        tiles, _herd_y, chunk = (int(v) for v in str(r["config"]).split("/"))
        as_2d = r.get("as_2d", "")

        def build(n=n, tiles=tiles, chunk=chunk, as_2d=as_2d) -> Design:
            mod = _family(family)
            if family == "swiglu":
                rows_, width = _dims(as_2d) if "x" in as_2d.replace("\u00d7", "x") else (n // 1024, 1024)
                shape = mod.Shape(rows_, width)
            else:
                shape = mod.Shape(n, "add")
            wanted = dataclasses.replace(mod.default_config(shape, device), tiles=tiles, chunk=chunk)
            return legal_design(mod, shape, wanted, device)

        label = "SiLU x mul" if family == "swiglu" else "residual add"
        out.append(
            KernelRow(
                f"{table}/{n}",
                family,
                f"{label} N={n} ({as_2d})",
                r["latency_us"] * 1e-6,
                build if _family(family) else None,
                str(r.get("status", "")).replace("\u2705", "").strip(),
            )
        )
    return out


# How AIR's registry FlashAttention rows are timed. AIR's kernel (programming_examples/flash_attention/
# kernel_fusion_based/attn_npu2.py, the one the registry page names) splits each 64-query tile's keys over
# num_cascade_stages = 4 rows in contiguous segments merged down a cascade, feeds one head's K/V to num_q_tiles = 4
# columns, runs its outer launch (query chunks of lqp = 256 x head pairs x value chunks) in sequence, and computes
# masked blocks (its ``causal_skip`` is off by default: "the channel gets stay unconditional"). That structure is
# ``attention.cascade_configs`` ("cascade"). The frozen fit times the rows with our own dataflow ("ours": a worker
# takes a query tile's whole key range, units stream back to back) and masked-block skipping, chosen by CV loss
# (0.01286 vs 0.01388 for computing every block). Timing them with AIR's structure was judged on the registry's
# eight further rows, held out (benchmarks/data/flash_attention_more_rows.json): with the attention efficiency
# refitted to the two fitted rows (0.105 -> 0.25) their median error rose 20.1 % -> 46.6 % and the two rows' own
# loss 0.0030 -> 0.0085, so the frozen fit keeps "ours"; the structure lacks AIR's per-launch-iteration cost and
# its ~0.6 ms floor (docs/calibration.md, blind spots). ``kernel_rows(attention="cascade")`` times it.
AIR_ATTENTION_STRUCTURE = "ours"
AIR_ATTENTION_SKIPS_MASKED = {"ours": True, "cascade": False}
AIR_ATTENTION_CASCADE_STAGES = 4  # attn_npu2.py num_cascade_stages (one per compute row)


def _yes(mark: Any) -> bool:
    """A registry flag: a check mark, true/yes/1, or a JSON boolean."""
    return mark is True or "\u2713" in str(mark) or str(mark).strip().lower() in ("true", "yes", "1")


def _attention_rows(rows: list[dict], device: Device, structure: str | None = None) -> list[KernelRow]:
    structure = structure or AIR_ATTENTION_STRUCTURE
    if structure not in AIR_ATTENTION_SKIPS_MASKED:
        raise TilepilotError(
            f"Attention structure {structure!r} is unknown; use one of {list(AIR_ATTENTION_SKIPS_MASKED)}."
        )
    skips = AIR_ATTENTION_SKIPS_MASKED[structure]
    out = []
    for r in rows:
        lq, lk = _dims(r["lq_x_lk"])
        d = int(r["dk_dv"].split("/")[0])
        hq, hkv = (int(v) for v in r["heads_q_kv"].split("/"))
        lat = [float(v) for v in r["latency_ms"].replace("ms", "").replace("\u2013", "-").split("-")]
        published = statistics.mean(lat) * 1e-3
        causal = "\u2713" in str(r.get("causal", "")) or str(r.get("causal", "")).strip().lower() in (
            "true",
            "yes",
            "1",
        )

        def build(lq=lq, lk=lk, d=d, hq=hq, hkv=hkv, causal=causal) -> Design:
            mod = _family("attention")
            shape = mod.Shape(lq, lk, hq, hkv, d, causal=causal)
            if structure == "cascade":
                # AIR: tile_q = lkp = 64, one head and one query tile per column, 4 cascade stages (one per compute
                # row), units in sequential launch iterations; the nearest legal cascade tiling when ours cannot
                first = mod.cascade_configs(shape, device, AIR_ATTENTION_CASCADE_STAGES)
                wanted = mod.Config(8, 1, 64, 64, 2, "vector", 1, False, AIR_ATTENTION_CASCADE_STAGES, True, 4)
                cfg, note = closest_legal(mod, shape, wanted, device, keep=("kv_stages", "rounds"), first=first)
            else:
                # our dataflow at AIR's tile_q = lkp = 64 where legal, 8 columns, 4 rows
                wanted = dataclasses.replace(
                    mod.default_config(shape, device), cols=8, heads_per_col=4, tile_q=64, tile_k=64
                )
                cfg, note = closest_legal(mod, shape, wanted, device)
            # the tiling is legal either way; whether masked blocks are computed is the kernel's, not the tiling's
            design = mod.make_design(shape, dataclasses.replace(cfg, skip_masked=skips), device)
            design.meta["calibration_note"] = note
            return design

        notes = ["published as a range, midpoint used"] if len(lat) > 1 else []
        if causal and not skips:
            notes.append("every key block computed (AIR's registry kernel does not skip masked blocks)")
        out.append(
            KernelRow(
                f"flash_attention/{lq}x{lk}/d{d}/{hq}-{hkv}" + ("" if causal else "/noncausal"),
                "attention",
                f"FlashAttention {lq}x{lk} d={d} {hq}q/{hkv}kv {'causal' if causal else 'non-causal'}",
                published,
                build if _family("attention") else None,
                "; ".join(notes),
            )
        )
    return out


def kernel_rows(
    device: Device | None = None,
    tables: Sequence[str] | None = None,
    data: dict[str, Any] | None = None,
    attention: str | None = None,
) -> dict[str, list[KernelRow]]:
    """Every comparable measurement row, grouped by measurement table, designs built lazily. ``data``: a file in the
    reference format (default the packaged ``npu2_kernel_measurements.json``); tables it lacks are skipped.
    ``attention``: how FlashAttention rows are timed ("ours", the frozen fit's, or "cascade", AIR's structure)."""
    device = device or npu2()
    data = load_reference("npu2_kernel_measurements") if data is None else data
    builders = {
        "gemm": lambda rows: _gemm_rows(rows, device),
        "gemv": lambda rows: _gemv_rows(rows, device),
        "rmsnorm": lambda rows: _rmsnorm_rows(rows, device),
        "rope": lambda rows: _rope_rows(rows, device),
        "silu_mul": lambda rows: _flat_rows("silu_mul", "swiglu", rows, device),
        "eltwise_add": lambda rows: _flat_rows("eltwise_add", "eltwise", rows, device),
        "flash_attention": lambda rows: _attention_rows(rows, device, attention),
    }
    wanted = [t for t, _ in KERNEL_TABLES if (tables is None or t in tables) and t in data]
    return {t: builders[t](data[t]) for t in wanted}


def time_row(row: KernelRow, cal: Calibration = CALIBRATION) -> Figure:
    obj = row.design() if row.build is not None else None
    if obj is None:
        return Figure(row.key, row.family, row.label, row.published, None, f"not modeled yet: no {row.family} family")
    note = row.note
    extra = (
        obj.meta.get("calibration_note", "")
        if isinstance(obj, Design)
        else obj.designs[0].meta.get("calibration_note", "")
    )
    if extra:
        note = f"{extra}; {note}" if note else extra
    return Figure(
        row.key,
        row.family,
        row.label,
        row.published,
        row.seconds(cal),
        note,
    )


def kernel_figures(rows: dict[str, list[KernelRow]], cal: Calibration = CALIBRATION) -> dict[str, list[Figure]]:
    return {table: [time_row(r, cal) for r in rs] for table, rs in rows.items()}


# ----------------------------------------------------------------------------------------------------------------------
# end to end
# ----------------------------------------------------------------------------------------------------------------------
def end_to_end_figures(cal: Calibration = CALIBRATION, cpu: str = "estimated") -> list[Figure]:
    """Llama-3.2-1B through the iron-like and paper-like plans at 2048 tokens, against published.json; the
    paper-like decode at the context the paper measured it at (``PAPER_DECODE_CONTEXT``)."""
    pub = load_reference("published")[E2E_MODEL]
    iron, paper = pub["iron_baseline"], pub["paper_air"]
    expected = [
        ("iron/prefill", "iron-like prefill @2048 (TTFT)", iron["prefill_s_at_2048"]),
        ("iron/decode", "iron-like decode per token", iron["decode_ms_per_token"] * 1e-3),
        ("paper/prefill", "paper-like prefill @2048 (TTFT)", paper["prefill_s_at_2048"]),
        ("paper/decode", "paper-like decode per token", paper["decode_ms_per_token"] * 1e-3),
    ]
    expected += [
        (f"paper/prefill/{g}", f"paper-like prefill {g} per layer", ms * 1e-3)
        for g, ms in paper["prefill_ms_per_layer"].items()
    ]
    expected.append(("paper/prefill/lm_head", "paper-like prefill LM head", paper["prefill_lm_head_ms"] * 1e-3))
    n_checked = len(expected)
    # shown for insight (the issue holds only the figures above to +-20 %)
    expected += [
        (f"paper/decode/{g}", f"paper-like decode {g} per layer", ms * 1e-3)
        for g, ms in paper["decode_ms_per_layer"].items()
    ]
    expected.append(("paper/decode/lm_head", "paper-like decode LM head", paper["decode_lm_head_ms"] * 1e-3))
    spec = get_zoo_model(E2E_MODEL).spec()
    iron_t = time_plan(iron_like_plan(spec), spec, E2E_PROMPT, cal=cal, cpu=cpu)
    # the paper's decode ran at its real prompt length, not the padded 2048 (PAPER_DECODE_CONTEXT); IRON does not say
    paper_t = time_plan(paper_like_plan(spec), spec, E2E_PROMPT, PAPER_DECODE_CONTEXT, cal=cal, cpu=cpu)
    modeled: dict[str, float | None] = {
        "iron/prefill": iron_t.ttft_s,
        "iron/decode": iron_t.decode_s_per_token,
        "paper/prefill": paper_t.ttft_s,
        "paper/decode": paper_t.decode_s_per_token,
    }
    for key, _, _ in expected[4:]:
        _, stage, name = key.split("/")
        try:
            modeled[key] = paper_t.group(stage, name).per_call_s
        except (KeyError, ValueError, TilepilotError):
            modeled[key] = None
    cpu_note = "CPU groups modeled (host bytes + FLOPs constants)"
    return [
        Figure(
            k,
            "end_to_end",
            label,
            p,
            modeled[k],
            cpu_note if modeled[k] is not None else "group not in the plan",
            i < n_checked,
        )
        for i, (k, label, p) in enumerate(expected)
    ]


@dataclass(frozen=True)
class PaperPrediction:
    """One of the paper's nine autonomous deployments (published TTFT at 2048, decode tok/s at its short prompt:
    ``PAPER_DECODE_CONTEXT``) beside our
    paper-like plan of the same model timed by the same model. Only Llama-3.2-1B informs any constant (the
    end-to-end stage); the other eight are predictions."""

    model: str
    role: str  # "fit" | "prediction"
    ttft_modeled_s: float
    ttft_published_s: float
    decode_tok_s_modeled: float
    decode_tok_s_published: float
    dispatches_modeled: tuple[int, int]  # NPU dispatches per layer of our plan (prefill, decode)
    dispatches_published: tuple[int, int] | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "role": self.role,
            "ttft_modeled_s": self.ttft_modeled_s,
            "ttft_published_s": self.ttft_published_s,
            "ttft_ratio": self.ttft_modeled_s / self.ttft_published_s,
            "decode_tok_s_modeled": self.decode_tok_s_modeled,
            "decode_tok_s_published": self.decode_tok_s_published,
            "decode_ratio": self.decode_tok_s_modeled / self.decode_tok_s_published,
            "dispatches_per_layer_modeled": list(self.dispatches_modeled),
            "dispatches_per_layer_published": list(self.dispatches_published) if self.dispatches_published else None,
        }


def paper_predictions(
    cal: Calibration = CALIBRATION, cpu: str = "estimated", models: Sequence[str] | None = None
) -> list[PaperPrediction]:
    """Every model (or ``models``) of published.json's ``paper_autonomous_deployments_2048`` through our paper-like
    plan: TTFT at 2048 tokens, decode at ``PAPER_DECODE_CONTEXT`` positions, the paper's conditions."""
    pub = load_reference("published")
    deployed = pub.get("paper_autonomous_deployments_2048", {})
    structure = pub.get("paper_deployment_structure", {}).get("dispatches_per_layer", {})
    out = []
    for model, figs in deployed.items():
        if models is not None and model not in models:
            continue
        spec = get_zoo_model(model).spec()
        plan = paper_like_plan(spec)
        t = time_plan(plan, spec, E2E_PROMPT, PAPER_DECODE_CONTEXT, cal=cal, cpu=cpu)
        per_layer = (plan.dispatches_per_layer("prefill"), plan.dispatches_per_layer("decode"))
        role = "fit" if model == E2E_MODEL else "prediction"
        published = tuple(structure[model]) if model in structure else None
        out.append(PaperPrediction(model, role, t.ttft_s, figs["ttft_s"], t.decode_tok_s, figs["decode_tok_s"],
                                   per_layer, published))  # fmt: skip
    return out


# ----------------------------------------------------------------------------------------------------------------------
# limits the authors hit
# ----------------------------------------------------------------------------------------------------------------------
def limit_checks(device: Device | None = None) -> list[Limit]:
    """The published hardware limits, each built as our design and run through the validator."""

    device = device or npu2()
    out: list[Limit] = []

    def codes(build: Callable[[], Design]) -> tuple[str, ...]:
        try:
            return tuple(sorted({v.code for v in validate(build())}))
        except DesignError as e:
            return tuple(e.codes)

    eltwise, swiglu = _family("eltwise"), _family("swiglu")
    if eltwise is not None:
        n = 8192 * 16 * 4
        out.append(
            Limit(
                "shim_channels_16_tiles",
                "residual add on 16 tiles (herd_y 2 on 8 columns), 3 DDR streams each: the shims run out of channels",
                "DMA_CHANNELS",
                codes(lambda: eltwise.make_design(eltwise.Shape(n), eltwise.Config(tiles=16, chunk=2048), device)),
            )
        )
    if swiglu is not None:
        out.append(
            Limit(
                "l1_chunk_8192",
                "SiLU x mul with 8192-element chunks: 3 buffers x ping-pong x 2 B = 96 KiB > 64 KiB of L1",
                "L1_OVERFLOW",
                codes(lambda: swiglu.make_design(swiglu.Shape(2048, 8192), swiglu.Config(tiles=8, chunk=8192), device)),
            )
        )
    return out


# ----------------------------------------------------------------------------------------------------------------------
# the report, and the fit
# ----------------------------------------------------------------------------------------------------------------------
def run(
    cal: Calibration = CALIBRATION,
    *,
    device: Device | None = None,
    tables: Sequence[str] | None = None,
    end_to_end: bool = True,
    cpu: str = "estimated",
    rows: dict[str, list[KernelRow]] | None = None,
) -> CalibrationReport:
    """Build every comparison (kernel rows, end-to-end figures, limits) under ``cal``."""
    rows = rows if rows is not None else kernel_rows(device, tables)
    figs = kernel_figures(rows, cal)
    kernels = {table: figs[table] for table in figs}
    e2e = end_to_end_figures(cal, cpu) if end_to_end else []
    paper = paper_predictions(cal, cpu) if end_to_end else []
    return CalibrationReport(kernels, e2e, limit_checks(device), cal, paper=paper)


# Fitted constants the per-kernel rows determine (the free ones of a fit choice: calibrate/crossval.py). The
# host-side constants are only visible end to end and are fitted there.
KERNEL_FIT_PARAMS: tuple[str, ...] = (
    "dispatch_overhead_s",
    "tile_config_s",
    "ddr_bytes_per_s",
    "shim_channel_bytes_per_s",
)
# Second stage, end to end (Llama-3.2-1B only): the constants the kernel rows cannot see or barely see (launches
# inside one dispatch, host syncs and copies, the host handoff), each one a Llama-3.2-1B figure isolates. Its loss is
# the end-to-end figures alone, so no kernel row informs these and no end-to-end figure moves a kernel constant: the
# kernel rows' cross-validation is then the cross-validation of the constants they are timed with. The host CPU's
# streaming rate left this list on 2026-12-03: the figure that isolated it (the CPU decode attention, ~0.3 ms) was
# measured at the paper's short prompt, where it is a per-head loop (host_cpu_head_s, derived), so nothing isolates
# the rate any more; left free, the stage moved it 13.7 -> 2.4 GB/s to absorb Llama's TTFT residuals through other
# host steps (the K/V copy into the host's cache, the iron-like prefill's host work); docs/calibration.md says what
# that did to the predictions.
E2E_FIT_PARAMS: tuple[str, ...] = (
    "launch_in_group_s",
    "host_copy_bytes_per_s",
    "host_handoff_bytes_per_s",
    "host_sync_fixed_s",
)
# The grid one coordinate step walks: the current value times 2**(i/4), i = -10..10 (0.18x .. 5.7x), wide enough to
# cross the plateau where a constant does not bind yet (e.g. an efficiency above the point where compute matters).
FIT_FACTORS: tuple[float, ...] = tuple(2 ** (i / 4) for i in range(-10, 11) if i != 0)
# Efficiencies are searched on an absolute grid instead, 1 down to 2**-10 (~0.001) in quarter octaves: a family's
# kernel may sustain a tiny fraction of the MMUL peak (a matrix-vector product cannot fill a 4x8x8 MMUL), and a
# relative step from 0.5 would never get there.
EFFICIENCY_GRID: tuple[float, ...] = tuple(2 ** (-i / 4) for i in range(0, 41))
# A parameter moves only if its best grid value lowers the loss by at least this fraction: on a plateau (a constant
# that does not bind any row) it keeps its current, documented value instead of drifting.
MIN_GAIN = 0.005


@dataclass(frozen=True)
class FitResult:
    calibration: Calibration
    loss_before: float
    loss_after: float
    changes: dict[str, tuple[Any, Any]]
    evaluations: int


def table_loss(figs: Sequence[Figure]) -> float:
    """Mean squared log ratio of a table's modeled rows, plus a steep penalty beyond the 2x band."""
    logs = [math.log(f.ratio) for f in figs if f.ratio is not None]
    if not logs:
        return 0.0
    band = math.log(KERNEL_MAX_RATIO)
    return sum(x * x + (10.0 * (abs(x) - band) ** 2 if abs(x) > band else 0.0) for x in logs) / len(logs)


def loss(figures: dict[str, list[Figure]]) -> float:
    """Mean of the tables' losses: every family weighs the same (64 GEMM rows do not drown 2 attention rows)."""
    losses = [table_loss(figs) for figs in figures.values() if any(f.ratio is not None for f in figs)]
    return sum(losses) / max(len(losses), 1)


def _with(cal: Calibration, name: str, value: float) -> Calibration:
    """A trial calibration; ConfigError when it leaves the physically meaningful region."""
    out = cal.with_efficiency(name[4:], min(1.0, value)) if name.startswith("eff:") else cal.tuned(**{name: value})
    if out.launch_in_group_s >= out.dispatch_overhead_s:
        # one more launch inside a dispatch skips the host round trip, so it must cost less than a dispatch;
        # otherwise fusing launches would be modeled slower than dispatching them one by one
        raise ConfigError("launch_in_group_s must stay below dispatch_overhead_s")
    return out


def _value(cal: Calibration, name: str) -> float:
    return cal.efficiency(name[4:]) if name.startswith("eff:") else getattr(cal, name)


def _grid(cal: Calibration, name: str) -> list[float]:
    if name.startswith("eff:"):
        return list(EFFICIENCY_GRID)
    base = _value(cal, name)
    return [base * f for f in FIT_FACTORS]


def _families_in(obj: Design | MultiLaunchGroup | None) -> set[str]:
    designs = obj.designs if isinstance(obj, MultiLaunchGroup) else [obj] if obj is not None else []
    return {str(d.meta.get("family")) for d in designs}


def fit(
    rows: dict[str, list[KernelRow]] | None = None,
    cal: Calibration = CALIBRATION,
    *,
    rounds: int = 6,
    params: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> FitResult:
    """Coordinate search over the fitted constants against the per-kernel rows (deterministic, reproducible).

    Parameters: ``KERNEL_FIT_PARAMS`` plus the efficiency of every family with rows ("eff:<family>"). Each round
    takes the parameters in that order and moves each to the best of its current value times ``FIT_FACTORS``
    (efficiencies capped at 1) by ``loss``; the search stops after ``rounds`` or when a round changes nothing.
    Designs are built once; an efficiency trial re-times only the tables whose designs use that family.
    """
    rows = rows if rows is not None else kernel_rows()
    uses = {t: set().union(*(r.families() for r in rs)) if rs else set() for t, rs in rows.items()}
    families = sorted(set().union(*uses.values()))
    names = list(params) if params is not None else list(KERNEL_FIT_PARAMS) + [f"eff:{f}" for f in families]
    evals = 0
    table_losses = {t: table_loss([time_row(r, cal) for r in rs]) for t, rs in rows.items()}

    def total(tl: dict[str, float]) -> float:
        vals = [v for t, v in tl.items() if any(r.build is not None for r in rows[t])]
        return sum(vals) / max(len(vals), 1)

    def trial_losses(c: Calibration, name: str) -> dict[str, float]:
        nonlocal evals
        evals += 1
        touched = [t for t in rows if not name.startswith("eff:") or name[4:] in uses[t]]
        return {**table_losses, **{t: table_loss([time_row(r, c) for r in rows[t]]) for t in touched}}

    start, best = cal, cal
    first = best_loss = total(table_losses)
    for rnd in range(rounds):
        changed = False
        for name in names:
            pick: tuple[float, Calibration, dict[str, float]] | None = None
            for value in _grid(best, name):
                try:
                    trial = _with(best, name, value)
                except ConfigError:  # beyond a physical ceiling (e.g. DDR above its theoretical bandwidth)
                    continue
                tl = trial_losses(trial, name)
                if pick is None or total(tl) < pick[0]:
                    pick = (total(tl), trial, tl)
            if pick is not None and pick[0] < best_loss * (1 - MIN_GAIN):
                best_loss, best, table_losses = pick
                changed = True
            if progress:
                progress(f"round {rnd + 1}: {name} = {_value(best, name):.4g} (loss {best_loss:.4f})")
        if not changed:
            break
    changes = {n: (_value(start, n), _value(best, n)) for n in names if _value(start, n) != _value(best, n)}
    return FitResult(best, first, best_loss, changes, evals)


def e2e_loss(figures: Sequence[Figure]) -> float:
    """Mean squared log ratio over the end-to-end figures (unchecked, insight-only ones at half weight)."""
    terms = [(1.0 if f.checked else 0.5) * math.log(f.ratio) ** 2 for f in figures if f.ratio is not None]
    return sum(terms) / max(len(terms), 1)


def fit_end_to_end(
    cal: Calibration = CALIBRATION,
    *,
    rounds: int = 3,
    params: Sequence[str] = E2E_FIT_PARAMS,
    progress: Callable[[str], None] | None = None,
) -> FitResult:
    """Second stage: coordinate search over ``E2E_FIT_PARAMS`` against the end-to-end figures (same grid).

    The plans are timed analytically with CPU groups modeled (deterministic). Slow (each trial times both
    Llama-3.2-1B plans, ~1 s): a command, never a test.
    """
    evals = 0

    def score(c: Calibration) -> float:
        nonlocal evals
        evals += 1
        return e2e_loss(end_to_end_figures(c))

    start = best = cal
    first = best_loss = score(cal)
    for rnd in range(rounds):
        changed = False
        for name in params:
            pick: tuple[float, Calibration] | None = None
            for value in _grid(best, name):
                try:
                    trial = _with(best, name, value)
                except ConfigError:
                    continue
                sc = score(trial)
                if pick is None or sc < pick[0]:
                    pick = (sc, trial)
            if pick is not None and pick[0] < best_loss * (1 - MIN_GAIN):
                best_loss, best = pick
                changed = True
            if progress:
                progress(f"e2e round {rnd + 1}: {name} = {_value(best, name):.4g} (loss {best_loss:.4f})")
        if not changed:
            break
    changes = {n: (_value(start, n), _value(best, n)) for n in params if _value(start, n) != _value(best, n)}
    return FitResult(best, first, best_loss, changes, evals)
