"""Tile tuning: search a family's candidate configs for one shape with the validator and the timing model only.

No kernel is run: a candidate is kept if the validator accepts its design and ranked by the modeled time
of one dispatch of it (``time_group``; every NPU time here is modeled). The family's hand default is
always among the candidates, so the result is never slower than the default (when the default is legal).
Every legal candidate becomes a registry row (source "tune"), so a second tune of the same shape under
the same calibration is a lookup, and a later deployment with the same projection shape starts there.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from tilepilot.errors import TilepilotError
from tilepilot.kernels.registry import Registry, RegistryRow, as_dict, family
from tilepilot.npu.calibration import CALIBRATION, Calibration
from tilepilot.npu.design import Design, MultiLaunchGroup, fallbacks
from tilepilot.npu.device import Device, npu2
from tilepilot.npu.timing import time_group
from tilepilot.npu.validate import Violation, validate, validate_group

# Candidates a tune times by default: the family ranks its candidates, and the first few dozen hold the good ones
# (tiles used, tile sizes); a full sweep of a GEMM is thousands of designs. Pass None to search everything.
DEFAULT_MAX_CANDIDATES = 64


# The code a modeled time and a family's candidate space depend on. A tuned row found under other code may miss
# configs the families offer now (a new dataflow) or time differently, so it must not answer for this code.
_MODEL_CODE = ("kernels", "npu")


@cache
def _code_digest() -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for sub in _MODEL_CODE:
        for path in sorted((root / sub).glob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def calibration_key(cal: Calibration = CALIBRATION, device: Device | None = None) -> str:
    """Fingerprint of the calibration constants and device (short hex): what performance claims are tied to, so the
    evaluator re-checks them strictly whenever these are unchanged (a code change that moves a modeled time then
    shows up as a claim that no longer holds)."""
    device = device or npu2()
    blob = json.dumps({"cal": cal.to_dict(), "device": repr(device)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def timing_key(cal: Calibration = CALIBRATION, device: Device | None = None) -> str:
    """Fingerprint of what a tuned registry row depends on: the calibration key plus the kernel and NPU-model code
    (short hex). A row tuned under other code may miss configs a family offers now or time differently."""
    blob = json.dumps({"cal": calibration_key(cal, device), "code": _code_digest()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def violations_of(obj: Design | MultiLaunchGroup) -> list[Violation]:
    return validate_group(obj) if isinstance(obj, MultiLaunchGroup) else validate(obj)


def modeled_seconds(obj: Design | MultiLaunchGroup, cal: Calibration = CALIBRATION) -> float:
    """Modeled time of one dispatch of a design (or of a multi-launch group such as a partitioned LM head)."""
    return time_group(obj, cal).seconds


@dataclass(frozen=True)
class TuneResult:
    """What a tune found. ``modeled_s`` / ``default_s`` are modeled dispatch times of the best and the default."""

    family: str
    shape: dict[str, Any]
    config: Any
    modeled_s: float
    default_config: Any
    default_s: float | None
    candidates: int
    valid: int
    rejected: dict[str, int] = field(default_factory=dict)
    from_registry: bool = False
    wall_s: float = 0.0

    @property
    def speedup(self) -> float:
        """Default time / tuned time (1.0 = no improvement); NaN when the default is illegal."""
        return self.default_s / self.modeled_s if self.default_s else float("nan")

    @property
    def improved(self) -> bool:
        return self.default_s is not None and self.modeled_s < self.default_s * (1 - 1e-9)

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "shape": self.shape,
            "config": as_dict(self.config),
            "modeled_s": self.modeled_s,
            "default_config": as_dict(self.default_config),
            "default_s": self.default_s,
            "speedup": self.speedup,
            "candidates": self.candidates,
            "valid": self.valid,
            "rejected": dict(self.rejected),
            "from_registry": self.from_registry,
            "clock": "modeled",
        }


def tune(
    family_name: str,
    shape: Any,
    registry: Registry | None = None,
    *,
    device: Device | None = None,
    cal: Calibration = CALIBRATION,
    max_candidates: int | None = DEFAULT_MAX_CANDIDATES,
) -> TuneResult:
    """Best legal config for ``shape`` by modeled time; writes every legal candidate to ``registry``.

    A candidate legal only by a fallback construction (``npu.design.fallbacks``) is taken only when no usual one is
    legal; otherwise it counts as rejected ("fallback"), and the default's time is None if it is one.

    ``max_candidates`` bounds the search to the family's first N candidates (its own ranking), the
    default always included. If the shape was already tuned under this calibration, the registry answers.
    """
    t0 = time.perf_counter()
    device = device or npu2()
    mod = family(family_name)
    shape_d = as_dict(shape)
    key = timing_key(cal, device)
    default = mod.default_config(shape, device)

    if registry is not None and registry.tuned(family_name, shape_d, timing_key=key):
        best = registry.best(family_name, shape_d, timing_key=key)
        assert best is not None
        default_row = next(
            (
                r
                for r in registry.rows(family_name, shape_d, "bf16")
                if r.timing_key == key and r.config == as_dict(default)
            ),
            None,
        )
        return TuneResult(
            family=family_name,
            shape=shape_d,
            config=mod.Config(**best.config),
            modeled_s=best.modeled_s,
            default_config=default,
            default_s=default_row.modeled_s if default_row else None,
            candidates=0,
            valid=0,
            from_registry=True,
            wall_s=time.perf_counter() - t0,
        )

    cands = mod.candidate_configs(shape, device)
    if max_candidates is not None:
        cands = cands[:max_candidates]
    cands = [default] + [c for c in cands if c != default]
    rejected: Counter[str] = Counter()
    timed: list[tuple[float, int, Any]] = []
    default_s: float | None = None
    # legal only by a fallback construction (``npu.design.fallbacks``): timed only if no usual design is legal, so
    # a shape that had a legal design keeps its choice, registry rows and figures
    later: list[tuple[int, Any, Design | MultiLaunchGroup]] = []

    def record(i: int, cfg: Any, obj: Design | MultiLaunchGroup) -> None:
        nonlocal default_s
        seconds = modeled_seconds(obj, cal)
        timed.append((seconds, i, cfg))
        if i == 0:
            default_s = seconds
        if registry is not None:
            registry.add(
                RegistryRow(
                    family=family_name,
                    shape=shape_d,
                    config=cfg,
                    modeled_s=seconds,
                    source="tune",
                    timing_key=key,
                    notes="default" if i == 0 else "",
                )
            )

    for i, cfg in enumerate(cands):
        try:
            obj = mod.make_design(shape, cfg, device)
        except TilepilotError as e:
            rejected[_code(e)] += 1
            continue
        problems = violations_of(obj)
        if problems:
            for code in sorted({v.code for v in problems}):
                rejected[code] += 1
            continue
        if fallbacks(obj):
            later.append((i, cfg, obj))
            continue
        record(i, cfg, obj)
    if not timed:  # no usual design is legal: the fallback ones compete
        for i, cfg, obj in later:
            record(i, cfg, obj)
    elif later:
        rejected["fallback"] += len(later)
    if not timed:
        raise TilepilotError(
            f"No {family_name} config for {shape_d} passes the validator ({dict(rejected)}); "
            "the shape needs padding or a family change."
        )
    seconds, _, best_cfg = min(timed, key=lambda t: (t[0], t[1]))
    return TuneResult(
        family=family_name,
        shape=shape_d,
        config=best_cfg,
        modeled_s=seconds,
        default_config=default,
        default_s=default_s,
        candidates=len(cands),
        valid=len(timed),
        rejected=dict(rejected),
        from_registry=False,
        wall_s=time.perf_counter() - t0,
    )


def _code(e: Exception) -> str:
    codes = getattr(e, "codes", None)
    return codes[0] if codes else type(e).__name__
