"""Cross-validation of the kernel fit: every row judged by constants fitted without it.

An in-sample error says how well the constants fit the rows they were fitted to; it says little about a row the
model has not seen. Here the measurement rows of every table are dealt into ``FOLDS`` folds (row ``i`` of a table,
in file order, goes to fold ``i % FOLDS``: deterministic, and every table spread over the folds); for each fold the
kernel fit (``harness.fit``, the same coordinate search) runs from ``PRIOR`` (published figures outside the registry
and estimates, ``npu/calibration.py``) on the other folds' rows only, and times the fold's rows with the result. The
cross-validated error of a row is its modeled/measured ratio under the constants of its own fold's fit.

Where the fit has alternatives (which constants are free), ``choose`` cross-validates each of ``FIT_CHOICES`` and
picks the lowest cross-validated loss: a choice that fits better only in sample loses here. Every time is modeled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tilepilot.calibrate.frozen import record
from tilepilot.calibrate.harness import (
    E2E_FIT_PARAMS,
    KERNEL_FIT_PARAMS,
    CalibrationReport,
    Figure,
    FitResult,
    KernelRow,
    fit,
    fit_end_to_end,
    kernel_rows,
    loss,
    summarize,
    time_row,
)
from tilepilot.errors import ConfigError
from tilepilot.npu.calibration import (
    FROZEN_FIT,
    IRON_CONFIGURE_S,
    IRON_DESIGN_SWITCH_S,
    IRON_DISPATCH_S,
    IRON_RESET_S,
    PRIOR,
    Calibration,
    FrozenFit,
)

FOLDS = 5
# Rounds of the coordinate search per fold: the full fit's default (a fold must be fitted as the frozen constants
# were, or its error is not theirs).
ROUNDS = 6


@dataclass(frozen=True)
class FitChoice:
    """One way to fit: which constants are free (the rest stay at ``PRIOR``). ``eff:*``: every family with rows."""

    name: str
    params: tuple[str, ...]
    description: str
    fixed: tuple[tuple[str, float], ...] = ()  # constants set before the fit and held (measured elsewhere)

    def start(self, prior: Calibration) -> Calibration:
        return prior.tuned(**dict(self.fixed)) if self.fixed else prior

    def expand(self, rows: dict[str, list[KernelRow]]) -> list[str]:
        families = sorted(set().union(*(r.families() for rs in rows.values() for r in rs)))
        out: list[str] = []
        for p in self.params:
            out += [f"eff:{f}" for f in families] if p == "eff:*" else [p]
        return out


FIT_CHOICES: tuple[FitChoice, ...] = (
    FitChoice(
        "dispatch+memory+efficiencies",
        (*KERNEL_FIT_PARAMS, "eff:*"),
        "dispatch overhead, per-tile configuration, usable DDR, shim channel rate and one efficiency per family",
    ),
    FitChoice(
        "no-per-tile-configuration",
        tuple(p for p in KERNEL_FIT_PARAMS if p != "tile_config_s") + ("eff:*",),
        "as above with the per-tile configuration cost held at its estimate: the dispatch floor does not grow with "
        "the tiles a launch configures",
    ),
    FitChoice(
        "plus-hop-latency",
        (*KERNEL_FIT_PARAMS, "dma_hop_latency_cycles", "eff:*"),
        "as the first, with the DMA hop latency (what a pipeline fill or drain pays per hop) free as well",
    ),
    FitChoice(
        "plus-pipeline-latencies",
        (*KERNEL_FIT_PARAMS, "dma_hop_latency_cycles", "loop_overhead_cycles", "eff:*"),
        "as the first, with the DMA hop latency and the per-call loop overhead free as well",
    ),
    FitChoice(
        "iron-dispatch-floor",
        ("ddr_bytes_per_s", "shim_channel_bytes_per_s", "dma_hop_latency_cycles", "eff:*"),
        "the dispatch floor made of IRON's measured parts, none fitted: a standalone dispatch = dispatch + base "
        "configure, no per-tile term, a further launch in one dispatch = a design switch",
        (
            ("dispatch_overhead_s", IRON_DISPATCH_S + IRON_CONFIGURE_S),
            ("tile_config_s", 0.0),
            ("launch_in_group_s", IRON_DESIGN_SWITCH_S),
        ),  # fmt: skip
    ),
    FitChoice(
        "iron-dispatch-floor-with-reset",
        ("ddr_bytes_per_s", "shim_channel_bytes_per_s", "dma_hop_latency_cycles", "eff:*"),
        "as above with IRON's array reset in every standalone dispatch",
        (
            ("dispatch_overhead_s", IRON_DISPATCH_S + IRON_RESET_S + IRON_CONFIGURE_S),
            ("tile_config_s", 0.0),
            ("launch_in_group_s", IRON_DESIGN_SWITCH_S),
        ),  # fmt: skip
    ),
)
FROZEN_CHOICE = FROZEN_FIT.choice  # the choice npu/calibration.py's kernel constants were fitted with


def fit_choice(name: str) -> FitChoice:
    for c in FIT_CHOICES:
        if c.name == name:
            return c
    raise ConfigError(f"unknown fit choice {name!r}; choose one of {[c.name for c in FIT_CHOICES]}")


def fold_of(rows: dict[str, list[KernelRow]], folds: int = FOLDS) -> dict[str, int]:
    """Row key -> fold: row i of each table (file order) in fold i % folds."""
    if folds < 2:
        raise ConfigError(f"cross-validation needs at least 2 folds, got {folds}")
    return {r.key: i % folds for rs in rows.values() for i, r in enumerate(rs)}


@dataclass(frozen=True)
class CrossValidation:
    """Held-out predictions of every row under one fit choice."""

    choice: FitChoice
    folds: int
    figures: dict[str, list[Figure]]  # table -> each row timed with the constants fitted without its fold
    fold: dict[str, int]
    fold_calibrations: tuple[Calibration, ...]

    @property
    def loss(self) -> float:
        return loss(self.figures)

    def summary(self) -> dict[str, Any]:
        """Per table: the cross-validated median |error| and worst ratio (the in-sample summary's shape)."""
        out = {}
        for table, figs in self.figures.items():
            s = summarize(table, figs)
            out[table] = {"cv_modeled_rows": s.modeled_rows, "cv_median_abs_err": s.median_abs_err,
                          "cv_worst_ratio": s.worst_ratio}  # fmt: skip
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": f"{self.folds}-fold over the rows of every table (row i of a table in fold i % {self.folds}); "
            "each fold fitted from the prior constants on the other folds' rows only",
            "folds": self.folds,
            "choice": self.choice.name,
            "free_constants": list(self.choice.params),
            "cv_loss": self.loss,
            "families": self.summary(),
        }


def cross_validate(
    rows: dict[str, list[KernelRow]],
    choice: FitChoice | str = FROZEN_CHOICE,
    *,
    folds: int = FOLDS,
    start: Calibration = PRIOR,
    rounds: int = ROUNDS,
    progress: Callable[[str], None] | None = None,
) -> CrossValidation:
    """Fit ``choice`` once per fold on the rows outside it (from ``start``) and time the fold's rows with it."""
    choice = fit_choice(choice) if isinstance(choice, str) else choice
    fold = fold_of(rows, folds)
    params = choice.expand(rows)
    held: dict[str, dict[str, Figure]] = {t: {} for t in rows}
    cals = []
    for f in range(folds):
        train = {t: [r for r in rs if fold[r.key] != f] for t, rs in rows.items()}
        cal = fit(train, choice.start(start), rounds=rounds, params=params).calibration
        cals.append(cal)
        for t, rs in rows.items():
            for r in rs:
                if fold[r.key] == f:
                    held[t][r.key] = time_row(r, cal)
        if progress:
            progress(f"cv {choice.name}: fold {f + 1}/{folds} fitted")
    figures = {t: [held[t][r.key] for r in rs] for t, rs in rows.items()}
    return CrossValidation(choice, folds, figures, fold, tuple(cals))


def choose(
    rows: dict[str, list[KernelRow]],
    choices: Sequence[FitChoice] = FIT_CHOICES,
    *,
    folds: int = FOLDS,
    start: Calibration = PRIOR,
    rounds: int = ROUNDS,
    progress: Callable[[str], None] | None = None,
) -> tuple[CrossValidation, list[CrossValidation]]:
    """Cross-validate every choice; the best is the one with the lowest cross-validated loss (ties: listed first)."""
    results = [cross_validate(rows, c, folds=folds, start=start, rounds=rounds, progress=progress) for c in choices]
    best = min(results, key=lambda cv: cv.loss)
    return best, results


def attach(report: CalibrationReport, rows: dict[str, list[KernelRow]], cv: CrossValidation | None = None) -> None:
    """Put a cross-validation of ``rows`` (computed now under the frozen choice unless given) into ``report``."""
    cv = cv if cv is not None else cross_validate(rows)
    report.held_out = cv.figures
    report.cross_validation = cv.to_dict()


@dataclass(frozen=True)
class FullFit:
    """What ``calibrate --fit`` proposes: the cross-validated choice, its fit on every row, then end to end."""

    choices: list[CrossValidation]
    chosen: CrossValidation
    kernel: FitResult
    end_to_end: FitResult
    record: FrozenFit  # what to freeze beside the constants (npu/calibration.FROZEN_FIT)


def fit_all(progress: Callable[[str], None] | None = None, *, end_to_end: bool = True) -> FullFit:
    """Choose the fit by cross-validated loss, fit it on every row from ``PRIOR``, then fit the end-to-end-only
    constants to Llama-3.2-1B. Reproducible: the same reference files and prior give the same result."""
    rows = kernel_rows()
    chosen, results = choose(rows, progress=progress)
    kernel = fit(rows, chosen.choice.start(PRIOR), params=chosen.choice.expand(rows), progress=progress)
    held = {name for name, _ in chosen.choice.fixed}  # measured elsewhere: the end-to-end stage leaves them too
    e2e_params = [p for p in E2E_FIT_PARAMS if p not in held]
    e2e = (
        fit_end_to_end(kernel.calibration, params=e2e_params, progress=progress)
        if end_to_end
        else FitResult(kernel.calibration, 0.0, 0.0, {}, 0)
    )
    rec = record(rows, e2e.calibration, choice=chosen.choice.name, cv_loss=chosen.loss, end_to_end=end_to_end)
    return FullFit(results, chosen, kernel, e2e, rec)
