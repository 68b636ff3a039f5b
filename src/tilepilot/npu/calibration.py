"""Every constant of the timing model, each with its source or the measurement it was fitted to.

Two kinds of numbers, kept apart on purpose:

- **Physical** figures are read off the hardware and never fitted. Those that describe the array (clock,
  MACs per cycle per operand format, stream port width, DMA channel counts per tile) live in
  ``npu/device.py`` and the timing model reads them from ``design.device``, so a column partition or a
  different device times correctly; ``physical_constants(device)`` lists them here for reports. The few
  physical figures the device does not carry (core load width, vector lanes) are fields below, marked
  physical.
- **Fitted** constants cannot be read off the hardware (dispatch overhead, usable DDR bandwidth, kernel
  efficiency, host copy speed). They are fields of ``Calibration`` with a best estimate from
  ``/work/shared/reference`` and, where a fit has been done, the figures they were fitted to.
  ``FITTED`` names them; ``Calibration.tuned(**changes)`` changes only those (a fit may not move a
  physical constant).

Functions take a ``Calibration`` as a parameter; nothing here is mutated at run time. ``CALIBRATION`` is
the frozen default.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from tilepilot.errors import ConfigError
from tilepilot.npu.device import DDR_BYTES_PER_S_THEORETICAL, Device

# Kernel families whose efficiency the table below names; any other family uses ``default_efficiency``.
# The numbers are what fraction of the variant's peak rate (MACs/cycle or vector ops/cycle) the tile
# kernel sustains inside its loop, loop overhead excluded.
_EFFICIENCY_TABLE: tuple[tuple[str, float], ...] = (  # sorted by family name
    # ESTIMATE: elementwise add/mul keep up with DMA (npu2_kernel_measurements.json "eltwise_add" is DDR-bound).
    ("eltwise", 0.5),
    # FITTED by hand (grid 0.18-0.30, loop_overhead_cycles 100-500, with shim_channel_bytes_per_s) to the 25
    # bf16-output "drain"/"direct" GEMM rows of npu2_kernel_measurements.json, each timed as
    # kernels.gemm.make_design with the row's tile_m/tile_k and the largest tile_n <= the row's that fits L1
    # without padding N: median |modeled/measured - 1| = 15 %, ratios 0.72-1.43. (AIR's best GEMMs reach 24-33 %
    # of the 29.5 TFLOP/s peak end to end.)
    ("gemm", 0.20),
)


@dataclass(frozen=True)
class Calibration:
    """The timing model's constants. Frozen: make a variant with ``tuned(...)`` or ``dataclasses.replace``."""

    # --- physical, not fitted (figures the Device does not carry) ---------------------------------------------------
    # AMD AM027: a compute tile core issues two 512-bit loads per cycle -> 128 B/cycle from L1.
    core_load_bytes_per_cycle: float = 128.0
    # ASSUMPTION (AM027 vector unit, 512-bit registers): 16 fp32 lanes, one elementwise vector op per lane per
    # cycle; non-linear and elementwise kernels (add, exp, rsqrt, SiLU) compute in fp32 (DESIGN.md 4).
    vector_ops_per_cycle: float = 16.0

    # --- fitted: dispatch -------------------------------------------------------------------------------------------
    # Host round trip of one dispatch (kernel() + wait() through XRT, run-list setup). FITTED by hand to the
    # intercept of latency vs bytes over the four eltwise_add rows N=1M..8M of npu2_kernel_measurements.json
    # (latency ~= 86 us + bytes / 70.7 GB/s, i.e. 78.5 us + 8 tiles x tile_config_s); consistent with "tiny
    # launches floored at ~80-115 us" there and with empty/trivial XRT kernels at 45-60 us plus a harness
    # (xdna2.md: mlir-aie #2381, XRT #9018).
    dispatch_overhead_s: float = 78.5e-6
    # Configuring one tile for a launch (core program, BDs, locks, switch routes), per compute tile with a worker
    # and per memory tile with a link. ESTIMATE from the two launch floors of npu2_kernel_measurements.json:
    # GEMM (32 workers + 8 mem tiles) floors at ~116 us, eltwise (8 workers) at ~86 us -> (116-86)/32 ~ 0.94 us.
    tile_config_s: float = 0.94e-6
    # Extra cost of each launch after the first inside one multi-launch dispatch (reconfigure cores, BDs,
    # switches). ESTIMATE from AIR's decode layer (xdna2.md): o_gemv_ffn = 3.6 ms for 8 fused launches whose
    # kernels' own time adds up to ~3.2 ms -> ~50 us per launch.
    launch_in_group_s: float = 50e-6

    # --- fitted: memory --------------------------------------------------------------------------------------------
    # Usable NPU share of DDR bandwidth, reads + writes together. FITTED by hand to the slope of the same four
    # eltwise_add rows (70.7 GB/s); xdna2.md: streaming kernels reach >= ~60 GB/s; physical ceiling 120 GB/s.
    ddr_bytes_per_s: float = 70e9
    # What one shim DMA channel sustains to or from DDR: outstanding NoC requests x DDR latency cap it below the
    # 14.4 GB/s stream port. Evidence (xdna2.md): AIR's best GEMVs (8 weight streams) plateau at 30-33 GB/s, "half
    # of what DDR allows", i.e. ~4 GB/s per stream. FITTED by hand jointly with the gemm efficiency (grid 4-6 GB/s)
    # to the GEMV rows (via kernels.gemv.from_air_tile) and the GEMM rows: 5.0 GB/s gives GEMV median error 13 %
    # (ratios 0.71-1.12) while keeping GEMM at 15 % (0.72-1.43); eltwise rows stay DDR-bound (2 %).
    shim_channel_bytes_per_s: float = 5.0e9
    # Fixed latency of one DMA hop (BD fetch, lock hand-off, DDR access latency) paid when a pipeline fills or
    # drains. ESTIMATE (~0.3 us per hop); only matters for small launches.
    dma_hop_latency_cycles: float = 500.0

    # --- fitted: tile kernels --------------------------------------------------------------------------------------
    # Fraction of the variant's peak a family's inner loop sustains; see _EFFICIENCY_TABLE for sources.
    efficiency_table: tuple[tuple[str, float], ...] = _EFFICIENCY_TABLE
    # ESTIMATE for families not in the table.
    default_efficiency: float = 0.5
    # Scalar variants (the "scalar" kernels IRON ships next to vectorized ones) run on the scalar core.
    # ASSUMPTION: ~1 bf16 MAC or elementwise op per cycle (AIE-ML's scalar unit has no vector datapath; IRON's
    # scalar kernels are 1-2 orders of magnitude slower than the vector ones).
    scalar_macs_per_cycle: float = 1.0
    scalar_ops_per_cycle: float = 1.0
    # Per kernel call: lock acquire/release, call, loop prologue/epilogue of the software pipeline. ESTIMATE.
    loop_overhead_cycles: float = 150.0

    # --- fitted: host ------------------------------------------------------------------------------------------------
    # Host -> device buffer copy + cache sync speed. FITTED by hand to AIR's "per-layer weight buffers preloaded
    # once: -240 ms" (xdna2.md) for Llama-3.2-1B prefill: 16 layers x 121.6 MB of block weights = 1.95 GB per
    # pass -> 1.95 GB / 0.240 s = 8.1 GB/s.
    host_copy_bytes_per_s: float = 8.1e9
    # Fixed cost of one buffer sync (XRT bo.sync ioctl + bookkeeping). ESTIMATE.
    host_sync_fixed_s: float = 20e-6
    # Allocating and mapping one device buffer (XRT bo constructor) when buffers are not reused. ESTIMATE.
    host_alloc_s: float = 50e-6
    # For plans timed analytically (nothing run): a CPU fallback's time is estimated from the bytes it streams.
    # FITTED to the paper's LM head on the CPU, 258 ms for 525 MB of bf16 weights (xdna2.md) -> ~2.0 GB/s.
    # When a CPU op really runs, its measured time is used instead (HostCost.cpu_fallback_s).
    host_cpu_bytes_per_s: float = 2.03e9

    def __post_init__(self) -> None:
        positive = [f.name for f in fields(self) if f.name != "efficiency_table" and getattr(self, f.name) < 0]
        if positive:
            raise ConfigError(f"Calibration constants {positive} are negative; every constant must be >= 0.")
        for name in ("core_load_bytes_per_cycle", "vector_ops_per_cycle", "ddr_bytes_per_s", "host_copy_bytes_per_s",
                     "host_cpu_bytes_per_s", "scalar_macs_per_cycle", "scalar_ops_per_cycle",
                     "shim_channel_bytes_per_s"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ConfigError(f"Calibration rate {name} must be > 0, got {getattr(self, name)}.")
        effs = dict(self.efficiency_table)
        effs["default"] = self.default_efficiency
        bad = {k: v for k, v in effs.items() if not 0.0 < v <= 1.0}
        if bad:
            # An efficiency above 1 would let a modeled kernel beat the hardware's peak.
            raise ConfigError(f"Kernel efficiencies {bad} are outside (0, 1]; a kernel cannot beat its peak rate.")
        if self.ddr_bytes_per_s > DDR_BYTES_PER_S_THEORETICAL:
            raise ConfigError(
                f"Usable DDR bandwidth {self.ddr_bytes_per_s / 1e9:.1f} GB/s exceeds the theoretical "
                f"{DDR_BYTES_PER_S_THEORETICAL / 1e9:.0f} GB/s; fit it below the physical ceiling."
            )

    def efficiency(self, family: str | None) -> float:
        """Efficiency of a kernel family's inner loop (the family name, or a kernel name starting with it)."""
        if family:
            table = dict(self.efficiency_table)
            if family in table:
                return table[family]
            for name, eff in self.efficiency_table:
                if family.startswith(name):
                    return eff
        return self.default_efficiency

    def with_efficiency(self, family: str, value: float) -> Calibration:
        """A copy with one family's efficiency set (added to the table if new)."""
        table = dict(self.efficiency_table)
        table[family] = float(value)
        return replace(self, efficiency_table=tuple(sorted(table.items())))

    def tuned(self, **changes: float) -> Calibration:
        """A copy with fitted constants changed; refuses physical constants (they are read, not fitted)."""
        physical = set(PHYSICAL_FIELDS) & set(changes)
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"Unknown calibration constants {sorted(unknown)}; fit one of {sorted(FITTED)}.")
        if physical:
            raise ConfigError(f"{sorted(physical)} are physical constants; only {sorted(FITTED)} may be fitted.")
        return replace(self, **changes)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["efficiency_table"] = dict(self.efficiency_table)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        """Inverse of ``to_dict`` (e.g. a fit's result read back); unknown keys are an error, missing ones default."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"Unknown calibration constants {unknown}; use names from Calibration ({sorted(names)}).")
        values = dict(data)
        if "efficiency_table" in values:
            values["efficiency_table"] = tuple(
                sorted((str(k), float(v)) for k, v in dict(values["efficiency_table"]).items())
            )
        return cls(**values)


PHYSICAL_FIELDS: tuple[str, ...] = ("core_load_bytes_per_cycle", "vector_ops_per_cycle")
FITTED: tuple[str, ...] = tuple(f.name for f in fields(Calibration) if f.name not in PHYSICAL_FIELDS)

CALIBRATION = Calibration()


def physical_constants(device: Device) -> dict[str, float]:
    """The device's hardware figures the timing model reads (sources in npu/device.py), for reports."""
    return {
        "clock_hz": device.clock_hz,
        "bf16_macs_per_cycle_per_tile": device.bf16_macs_per_cycle,
        "bfp16_macs_per_cycle_per_tile": device.bfp16_macs_per_cycle,
        "stream_bytes_per_cycle_per_channel": device.stream_bytes_per_cycle,
        "compute_tile_dma_in_out": (device.compute.s2mm_channels, device.compute.mm2s_channels),
        "mem_tile_dma_in_out": (device.mem.s2mm_channels, device.mem.mm2s_channels),
        "shim_tile_dma_in_out": (device.shim.s2mm_channels, device.shim.mm2s_channels),
        "compute_tiles": device.n_compute_tiles,
        "ddr_bytes_per_s_theoretical": device.ddr_bytes_per_s_theoretical,
    }
