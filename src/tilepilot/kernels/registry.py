"""Kernel families by name, and the registry of validated (family, shape, config) rows.

Plans name kernels by family string (``KernelCall.family``); ``family(name)`` turns that string into
the module that builds designs, so nothing above ``kernels/`` imports a family module directly.

The ``Registry`` is what makes knowledge accumulate across deployments: every config the tuner or a
phase has validated and timed becomes a row (family, shape, config, dtype, gate metrics, modeled time,
where it came from, and the calibration it was timed under). "Best config for this shape" is a lookup
over those rows; a later deployment of another model with the same projection shape reuses them.
Rows are plain JSON, written atomically, so a registry file can be diffed, merged and shipped.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

from tilepilot.errors import ConfigError
from tilepilot.files import write_text_atomic

# Every family module tilepilot knows, in the order plans list them. A family whose module is not in the
# tree yet is simply absent from FAMILIES (an import error *inside* a present module still raises).
FAMILY_NAMES = (
    "gemm", "qgemm", "gemv", "qgemv", "eltwise", "lm_head", "rmsnorm", "rope", "attention", "swiglu", "bias",
    "kvquant",
)  # fmt: skip

REGISTRY_VERSION = 1


def _load_families() -> Mapping[str, ModuleType]:
    found: dict[str, ModuleType] = {}
    for name in FAMILY_NAMES:
        qual = f"tilepilot.kernels.{name}"
        try:
            found[name] = importlib.import_module(qual)
        except ModuleNotFoundError as e:
            if e.name != qual:
                raise
    return MappingProxyType(found)


FAMILIES: Mapping[str, ModuleType] = _load_families()


def family(name: str) -> ModuleType:
    """The kernel family module called ``name`` (e.g. "gemv"); ConfigError names the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ConfigError(f"Unknown kernel family {name!r}; use one of {', '.join(sorted(FAMILIES))}.") from None


# ----------------------------------------------------------------------------------------------------------------------
# rows
# ----------------------------------------------------------------------------------------------------------------------
def as_dict(obj: Any) -> dict[str, Any]:
    """A Shape/Config dataclass (or a mapping) as a JSON-ready dict with tuples turned into lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        raw = dataclasses.asdict(obj)
    elif isinstance(obj, Mapping):
        raw = dict(obj)
    else:
        raise ConfigError(f"Expected a Shape/Config dataclass or a dict, got {type(obj).__name__}; pass one of those.")
    return json.loads(json.dumps(raw, sort_keys=True))


def canonical(obj: Any) -> str:
    """A stable string key for a shape or config (sorted keys, no whitespace)."""
    return json.dumps(as_dict(obj), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class RegistryRow:
    """One validated kernel instance and what was measured or modeled about it.

    ``gate``: per-kernel gate metrics when the kernel was run against its reference (e.g. ``pearson``,
    ``max_abs``, ``max_rel``); empty when only validated and timed (the tuner never runs kernels).
    ``modeled_s``: modeled NPU time of one launch, seconds. ``timing_key``: fingerprint of the
    calibration the time was modeled with, so a row timed under old constants is not trusted as current.
    ``source``: who wrote it ("tune", "phase1", "calibrate", "manual", ...).
    """

    family: str
    shape: dict[str, Any]
    config: dict[str, Any]
    modeled_s: float
    dtype: str = "bf16"
    gate: dict[str, float] = field(default_factory=dict)
    source: str = "manual"
    timing_key: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", as_dict(self.shape))
        object.__setattr__(self, "config", as_dict(self.config))
        object.__setattr__(self, "gate", {k: float(v) for k, v in dict(self.gate).items()})
        if not self.modeled_s > 0:
            raise ConfigError(f"Registry row for {self.family} has modeled time {self.modeled_s}; it must be positive.")

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.family, canonical(self.shape), self.dtype)

    @property
    def config_key(self) -> str:
        return canonical(self.config)

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "shape": self.shape,
            "config": self.config,
            "dtype": self.dtype,
            "modeled_s": self.modeled_s,
            "gate": self.gate,
            "source": self.source,
            "timing_key": self.timing_key,
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RegistryRow:
        try:
            return cls(
                family=str(d["family"]),
                shape=d["shape"],
                config=d["config"],
                modeled_s=float(d["modeled_s"]),
                dtype=str(d.get("dtype", "bf16")),
                gate=d.get("gate", {}),
                source=str(d.get("source", "manual")),
                timing_key=str(d.get("timing_key", "")),
                notes=str(d.get("notes", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"A registry row is malformed ({e}); fix or remove it from the registry file.") from None


# ----------------------------------------------------------------------------------------------------------------------
# the registry
# ----------------------------------------------------------------------------------------------------------------------
class Registry:
    """Validated rows keyed by (family, shape, dtype) and then by config; one row per config (newest wins)."""

    def __init__(self, rows: Iterable[RegistryRow] = ()) -> None:
        self._rows: dict[tuple[str, str, str], dict[str, RegistryRow]] = {}
        for row in rows:
            self.add(row)

    def __len__(self) -> int:
        return sum(len(v) for v in self._rows.values())

    def add(self, row: RegistryRow) -> RegistryRow:
        """Insert or replace the row for this config; gate metrics already known are kept unless re-measured."""
        by_config = self._rows.setdefault(row.key, {})
        old = by_config.get(row.config_key)
        if old is not None and old.gate and old.timing_key == row.timing_key:
            row = dataclasses.replace(row, gate={**old.gate, **row.gate})
        by_config[row.config_key] = row
        return row

    def merge(self, other: Registry) -> Registry:
        """Add every row of ``other`` (its rows win on the same config); returns self for chaining."""
        for row in other.rows():
            self.add(row)
        return self

    def rows(self, family: str | None = None, shape: Any = None, dtype: str | None = None) -> list[RegistryRow]:
        """Rows matching the filters, in a stable order (family, shape, dtype, modeled time, config)."""
        shape_key = canonical(shape) if shape is not None else None
        if family is not None and shape_key is not None and dtype is not None:
            found = list(self._rows.get((family, shape_key, dtype), {}).values())
            return sorted(found, key=lambda r: (r.modeled_s, r.config_key))
        out = [
            r
            for (fam, sk, dt), by_config in self._rows.items()
            if (family is None or fam == family) and (shape_key is None or sk == shape_key) and (dtype in (None, dt))
            for r in by_config.values()
        ]
        return sorted(out, key=lambda r: (r.family, canonical(r.shape), r.dtype, r.modeled_s, r.config_key))

    def best(self, family: str, shape: Any, dtype: str = "bf16", timing_key: str | None = None) -> RegistryRow | None:
        """The fastest row for this shape (restricted to one calibration when ``timing_key`` is given)."""
        candidates = [r for r in self.rows(family, shape, dtype) if timing_key in (None, r.timing_key)]
        return min(candidates, key=lambda r: (r.modeled_s, r.config_key), default=None)

    def tuned(self, family: str, shape: Any, dtype: str = "bf16", timing_key: str | None = None) -> bool:
        """Whether the tuner already searched this shape (under this calibration)."""
        return any(
            r.source == "tune" and (timing_key is None or r.timing_key == timing_key)
            for r in self.rows(family, shape, dtype)
        )

    # --- persistence --------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"version": REGISTRY_VERSION, "rows": [r.to_dict() for r in self.rows()]}

    def save(self, path: str | Path) -> Path:
        """Write the registry as JSON atomically (temp file in the same directory, then rename)."""
        return write_text_atomic(path, json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n")

    @classmethod
    def load(cls, path: str | Path, missing_ok: bool = True) -> Registry:
        """Read a registry file; a missing file is an empty registry unless ``missing_ok`` is False."""
        path = Path(path)
        if not path.exists():
            if missing_ok:
                return cls()
            raise ConfigError(f"Registry file {path} does not exist; run the tuner or pass an existing file.")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"Registry file {path} cannot be read as JSON ({e}); restore it or delete it.") from None
        if (
            not isinstance(data, dict)
            or data.get("version") != REGISTRY_VERSION
            or not isinstance(data.get("rows"), list)
        ):
            raise ConfigError(
                f"Registry file {path} is not a version-{REGISTRY_VERSION} tilepilot registry; "
                "delete it to start a new one."
            )
        return cls(RegistryRow.from_dict(d) for d in data["rows"])
