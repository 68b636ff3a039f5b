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

# The parts of one dispatch IRON measured on NPU2 (amd/IRON iron/applications/llama_3_2_1b/decode_costs_npu2.json,
# 2026-09-26, turbo; published.json "iron_dispatch_costs_us"), midpoints of the published ranges. Measured, not
# fitted: a fit choice that builds the dispatch floor from them (calibrate/crossval.py) holds them fixed.
IRON_DISPATCH_S = (43.7e-6 + 50.1e-6) / 2  # kernel() + wait() through XRT
IRON_RESET_S = (33.5e-6 + 38.7e-6) / 2  # resetting the array between runs
IRON_CONFIGURE_S = (31.7e-6 + 32.4e-6) / 2  # base configuration of a design
IRON_DESIGN_SWITCH_S = (38.5e-6 + 39.3e-6) / 2  # switching to another design (a further launch in one dispatch)
# A single-shot host dispatch on NPU2 costs ~450 us against ~64 us through a persistent worker (xdna2.md "dispatch
# overhead": mlir-aie #2381, #3793). Published, not fitted: what a dispatch made single-shot pays beyond a persistent
# one. AIR's fused-cast GEMM rows dispatch their cast so: their excess over the same shape's f32 GEMM, less the
# cast's DDR bytes, is 379-427 us on five of seven shapes (npu2_kernel_measurements.json).
SINGLE_SHOT_DISPATCH_S = 450e-6
PERSISTENT_DISPATCH_S = 64e-6
SINGLE_SHOT_EXTRA_S = SINGLE_SHOT_DISPATCH_S - PERSISTENT_DISPATCH_S

# Kernel families whose efficiency the table below names; any other family uses ``default_efficiency``.
# The numbers are what fraction of the variant's peak rate (MACs/cycle or vector ops/cycle) the tile
# kernel sustains inside its loop, loop overhead excluded.
_EFFICIENCY_TABLE: tuple[tuple[str, float], ...] = (  # sorted by family name
    # FITTED by `tilepilot calibrate --fit` (calibrate/crossval.fit_all, docs/calibration.md): the fit choice with
    # the lowest cross-validated loss ("plus-hop-latency", CV loss 0.00660, FROZEN_FIT), fitted from
    # PRIOR (every efficiency 0.5) to the 133 rows of npu2_kernel_measurements.json. No end-to-end figure moves an
    # efficiency.
    # attention: the 2 FlashAttention rows (15.4-16.1 ms, 35.0 ms); AIR keeps softmax state in bf16, we in fp32.
    ("attention", 0.10511205190671431),
    # eltwise: the residual-add rows are DDR-bound, so this barely moves them; 0.5 -> 1.0 (the grid's top) when the
    # fused-cast rows' cast launch (an eltwise design) became its own single-shot dispatch (2026-12-02).
    ("eltwise", 1.0),
    # gemm: the 64 GEMM rows (drain / fused-cast / direct / f32 external); 0.297 -> 0.354 when the fused-cast rows'
    # GEMM launch took AIR's f32 C (2026-12-02).
    ("gemm", 0.3535533905932738),
    # gemv: the 30 GEMV rows: AIR's matrix-vector kernel sustains ~1.2 MAC/cycle per tile (a one-row product cannot
    # fill the 4x8x8 MMUL); its rows are kernel-bound at ~30-33 GB/s over 8 tiles.
    ("gemv", 0.004645340292979379),
    # qgemv: DERIVED from a published cycle count, not fitted (no quantized kernel is in the registry). AIR's Q4_0
    # decode kernel (proj_qmm, peano build, xor sign fix) runs a 140-bundle inner-loop body 8x2 times per 32x256
    # weight block at about one bundle per cycle (Xilinx/mlir-air programming_examples/fused_decode/README.md), i.e.
    # 2240 cycles per 8192 weights; our call of that block (8192 MACs at the bf16 vector peak plus
    # qgemv.DEQUANT_OPS["q4_0"] = 3 vector ops per weight) takes that at 0.70: (8192/256 + 3*8192/16) / 2240.
    # tests/kernels/test_qgemv.py holds the two together. The affine (Q4NX / q4_1) kernel's count is not published;
    # q4_1 pays its fourth op per weight at the same efficiency. Was the 0.5 default until 2026-12-02.
    ("qgemv", 0.7),
    # rmsnorm: the 7 RMSNorm rows (18-25 GB/s, "kernel-bound, not DDR-bound" per their authors).
    ("rmsnorm", 0.10511205190671431),
    # rope: the 12 RoPE rows.
    ("rope", 0.1767766952966369),
    # swiglu: the 10 SiLU x mul rows (~22-25 GB/s, kernel-bound).
    ("swiglu", 0.25),
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
    # Host round trip of one dispatch (kernel() + wait() through XRT, run-list setup). FITTED by calibrate --fit
    # (kernel stage, all 133 rows; the launch floor of the small rows sets it) from PRIOR's 60 us (trivial XRT
    # kernel, xdna2.md). Consistent with "tiny launches floored at ~80-115 us". IRON's measured parts
    # (IRON_DISPATCH_S + IRON_CONFIGURE_S = 79 us, no per-tile term) were cross-validated as an alternative and lost
    # (CV loss 0.00703 vs 0.00659, the last comparison of every choice, 2026-12-02). Refitted (chosen choice only)
    # when f32 GEMM outputs got their 4 B: 71.4 -> 84.9 us; with the fused-cast rows' f32 C and the hop latency free
    # (chosen by CV): 84.9 -> 71.4 us; with their cast launch its own single-shot dispatch (SINGLE_SHOT_EXTRA_S,
    # published): 71.4 -> 84.9 us.
    dispatch_overhead_s: float = 8.485281374238571e-05
    # Configuring one tile for a launch (core program, BDs, locks, switch routes), per compute tile with a worker
    # and per memory tile with a link. FITTED by calibrate --fit (kernel stage: the GEMM launches, 32 workers + 8
    # memory tiles, floor at ~116 us against ~86 us for 8-tile streaming kernels) from the estimate 0.94 us; holding
    # it at the estimate cross-validates worse (no per-tile term: 0.01072 vs 0.00982, same choice otherwise).
    # Refitted with f32 outputs at 4 B: 1.88 -> 0.79 us; with the fused-cast f32 C and the hop latency free:
    # 0.79 -> 1.33 us; with the fused-cast rows' single-shot cast dispatch: 1.33 -> 0.03 us, i.e. gone (the fixed
    # cost those rows showed was their cast's dispatch; the fit choices without the term: docs/calibration.md).
    tile_config_s: float = 2.937500000000001e-08
    # Extra cost of each launch after the first inside one multi-launch dispatch (reconfigure cores, BDs,
    # switches). FITTED by calibrate --fit (end-to-end stage, Llama-3.2-1B figures only: AIR's fused groups
    # rms_gemms_rope 7.3 ms with 6 launches and o_ffn 41.0 ms with 8, xdna2.md), constrained below
    # dispatch_overhead_s (a launch inside a dispatch skips the host round trip). IRON measured a design switch at
    # 38.5-39.3 us (IRON_DESIGN_SWITCH_S); the Llama figures want more. 84.1 -> 70.7 us when the paper-like plan
    # got the paper's host handoff (its per-layer groups' remaining gap was host copies, not launches).
    launch_in_group_s: float = 7.07102550580618e-05

    # --- fitted: memory --------------------------------------------------------------------------------------------
    # Usable NPU share of DDR bandwidth, reads + writes together. FITTED by calibrate --fit (kernel stage: the
    # residual-add and RoPE rows) from PRIOR's 60 GB/s; xdna2.md: streaming kernels reach >= ~60 GB/s; ceiling 120.
    ddr_bytes_per_s: float = 71352426900.16325
    # What one shim DMA channel sustains to or from DDR: outstanding NoC requests x DDR latency cap it below the
    # 14.4 GB/s stream port. FITTED by calibrate --fit (kernel stage) jointly with the gemm and gemv efficiencies
    # from PRIOR's 8.9 GB/s (AIR's fused decode: 35.7 GB/s on 4 channels): the GEMM rows' A/W streams need ~6 GB/s
    # per channel, and at that rate the GEMV rows are kernel-bound (see _EFFICIENCY_TABLE). 6.3 -> 7.5 GB/s with the
    # fused-cast f32 C and the hop latency free, 7.5 -> 6.3 GB/s with their single-shot cast dispatch (2026-12-02).
    shim_channel_bytes_per_s: float = 6310928022.089937
    # Fixed latency of one DMA hop (BD fetch, lock hand-off, DDR access latency) paid when a pipeline fills or
    # drains, i.e. once per runtime task group and hop. First an ESTIMATE (~0.3 us per hop); FITTED by calibrate
    # --fit since the fit choice "plus-hop-latency" cross-validates best (CV loss 0.00659 vs 0.00865 without it,
    # 2026-12-02): 500 -> 4000 cycles, then 3364 (~1.9 us per hop at 1.8 GHz) with the fused-cast rows' single-shot
    # cast dispatch. It carries what each task group's refill and drain cost beyond their bytes (the GEMM rows'
    # per-output-block pipeline restarts).
    dma_hop_latency_cycles: float = 3363.5856610148585

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
    # Host -> device buffer copy + cache sync speed. First FITTED by hand to AIR's "per-layer weight buffers
    # preloaded once: -240 ms" (xdna2.md) for Llama-3.2-1B prefill: 16 layers x 121.6 MB of block weights = 1.95 GB
    # per pass -> 8.1 GB/s; FITTED by calibrate --fit (end-to-end stage, Llama-3.2-1B figures only): 6.8 GB/s while
    # it also priced the paper-like plan's host handoff, back to 8.1 GB/s once the handoff got its own rate
    # (host_handoff_bytes_per_s, 2026-12-02): what is left here is XRT's copies (weights, IRON's per-call syncs).
    host_copy_bytes_per_s: float = 8099999999.999999
    # Fixed cost of one buffer sync (XRT bo.sync ioctl + bookkeeping). FITTED by calibrate --fit (end-to-end stage:
    # IRON's per-call syncs, ~194 dispatches per decode token, 370 ms/token, and the paper-like plan's zero-copy
    # result reads); estimate was 20 us; 3.5 -> 0.63 us with the host handoff.
    host_sync_fixed_s: float = 6.25082394568908e-07
    # What the paper's host handoff moves per second: an activation handed from one XRT kernel to the next goes
    # through the host, whose Python/numpy code reshapes and copies it into the next kernel's buffer (profile.md:
    # BO Write 46 ms plus ~125 ms of Python/numpy scheduling in Llama-3.2-1B's 1.27 s prefill). Not the XRT copy of a
    # weight or a static buffer (host_copy_bytes_per_s, what IRON's per-call syncs and AIR's preloading show), so a
    # constant of its own. FITTED by calibrate --fit (end-to-end stage, Llama-3.2-1B figures only: the paper-like
    # plan is the only one handing over through the host) from host_copy_bytes_per_s: 6.8 -> 2.86 GB/s (e2e loss
    # 0.0230 -> 0.0138). The eight other paper deployments are predictions of it: their TTFTs went from 0.75-0.90 to
    # 0.82-1.15 of the published ones, every one within 20 %.
    host_handoff_bytes_per_s: float = 2863782463.805517
    # Allocating and mapping one device buffer (XRT bo constructor) when buffers are not reused. ESTIMATE.
    host_alloc_s: float = 50e-6
    # For plans timed analytically (nothing run): a CPU fallback's time is estimated from the bytes it streams.
    # When a CPU op really runs, its measured time is used instead (HostCost.cpu_fallback_s). FITTED by
    # calibrate/crossval.fit_all (end-to-end stage) to AIR's decode attention on the CPU, ~0.3 ms per layer, while
    # that decode was taken to run at 2048 positions (4.2 MB of KV, ~14 GB/s). It ran at the paper's short prompt
    # (PAPER_DECODE_CONTEXT, ~100 KB of KV), where those 0.3 ms are a per-head loop (host_cpu_head_s): since
    # 2026-12-03 no published figure isolates this rate, so the end-to-end stage no longer frees it
    # (calibrate/harness.py E2E_FIT_PARAMS) and it stays, at its last fitted value, an ESTIMATE of numpy's
    # single-thread streaming. The first value, 2.03 GB/s, came from the CPU LM head (258 ms for 525 MB, a naive CPU
    # GEMV).
    host_cpu_bytes_per_s: float = 13660000000.0
    # Arithmetic rate of the host CPU for a CPU group's matrix work (linear, LM head, attention score/value
    # products), bf16 through torch. ASSUMPTION, not fitted (no published figure isolates it): a Ryzen AI 300 host
    # (Zen 5, 12 cores, AVX-512 with bf16 dot products, ~3 TFLOP/s fp32 peak) sustains a few percent of peak on
    # torch's bf16 CPU GEMMs; 200 GFLOP/s. A CPU group is modeled as a roofline of this rate and
    # host_cpu_bytes_per_s (HostCost.cpu_model_s), so a modeled total never depends on this machine's load (issue 11
    # item 6); the measured wall clock is reported beside it. At decode every CPU group the paper ran is bytes-bound
    # under this rate (attention at 2048 positions: 17 MFLOP = 0.08 ms vs 4.2 MB = 0.31 ms), so the figures
    # host_cpu_bytes_per_s was fitted to do not move.
    host_cpu_flops_per_s: float = 200e9
    # Per query head of a host attention that loops over heads (plan HostPolicy.attention "per_head", set by the
    # paper-like plan; a batched host attention pays none): the paper's decode_attention_cpu (Xilinx/mlir-air
    # llms/<model>/<model>_decode.py) loops over the query heads in Python, six numpy calls per head, so at the
    # context the paper measured its decode at (``plan.paper_deployments.PAPER_DECODE_CONTEXT``: tens of positions,
    # ~100 KB of KV) its cost is the loop, not the bytes. DERIVED, not fitted: Llama-3.2-1B's "attention on the CPU
    # ~0.3 ms" per layer (xdna2.md; the one model allowed to inform a constant), less the bytes / FLOPs term of that
    # step at that context, over its 32 query heads (tests/calibrate/test_calibrate_harness.py holds the two together).
    host_cpu_head_s: float = 8.988433664601404e-06

    def __post_init__(self) -> None:
        positive = [f.name for f in fields(self) if f.name != "efficiency_table" and getattr(self, f.name) < 0]
        if positive:
            raise ConfigError(f"Calibration constants {positive} are negative; every constant must be >= 0.")
        for name in ("core_load_bytes_per_cycle", "vector_ops_per_cycle", "ddr_bytes_per_s", "host_copy_bytes_per_s",
                     "host_cpu_bytes_per_s", "host_cpu_flops_per_s", "scalar_macs_per_cycle", "scalar_ops_per_cycle",
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


@dataclass(frozen=True)
class FrozenFit:
    """What ``CALIBRATION`` is: the fit choice ``calibrate --fit`` chose by cross-validated loss and the objective
    values its constants reach, as that command printed them (its ``frozen_fit`` record). A test recomputes the
    objectives of ``CALIBRATION`` on the rows (``tests/calibrate/test_frozen_fit.py``, the cheap tables and the
    probe rows; ``tilepilot calibrate``, every row and the end-to-end figures) and fails when they differ, so a
    constant edited by hand, or a model change not followed by a refit, cannot pass for the fit.

    ``table_losses``: in-sample ``calibrate/harness.table_loss`` per table over all its rows; ``probe_losses``: the
    same over each table's probe rows (``calibrate/crossval.probe_rows``: the rows whose designs build in well under
    a second, so a fast test can time them); ``kernel_loss``: their mean (the fit's objective); ``e2e_loss``: the
    end-to-end stage's objective (``harness.e2e_loss``) over the Llama-3.2-1B figures; ``cv_loss``: the chosen
    choice's cross-validated loss."""

    choice: str
    cv_loss: float
    kernel_loss: float
    e2e_loss: float
    table_losses: tuple[tuple[str, float], ...]
    probe_losses: tuple[tuple[str, float], ...]

    def to_dict(self) -> dict:
        return {"choice": self.choice, "cv_loss": self.cv_loss, "kernel_loss": self.kernel_loss,
                "e2e_loss": self.e2e_loss, "table_losses": dict(self.table_losses),
                "probe_losses": dict(self.probe_losses)}  # fmt: skip


# FITTED: printed by `tilepilot calibrate --fit --json` ("frozen_fit") with the constants above. 2026-12-02: the kernel
# stage re-run from PRIOR gives the same constants and CV loss; the end-to-end stage re-run after the paper-like plan
# got the paper's host handoff (plan/builtin.py) moved launch_in_group_s, host_copy_bytes_per_s, host_sync_fixed_s.
# Then the whole `calibrate --fit` re-run after the fused-cast GEMM rows took AIR's f32 C (calibrate/harness.py), and
# again when their cast launch became its own single-shot dispatch (SINGLE_SHOT_EXTRA_S): CV loss 0.00918 -> 0.00655,
# the end-to-end stage left its constants where they were. Then again when the paper's host handoff got its own rate
# (host_handoff_bytes_per_s) and PRIOR the hop latency's estimate (a fitted value had leaked into the CV of the choices
# that do not free it): same kernel constants, CV loss 0.00659, end-to-end loss 0.0230 -> 0.0138. 2026-12-03: the
# whole `calibrate --fit` re-run after the iron-like plan's prefill attention took IRON's MHA structure (every key
# block computed, plan/builtin.py IRON_MHA): same kernel constants and CV loss, the end-to-end stage moved nothing,
# end-to-end loss 0.0138 -> 0.0104 (the iron-like TTFT 0.79 -> 0.87 of the published one). Again after the GEMV
# family's runs of output blocks began sharing task groups while the shims' BDs hold them (kernels/gemv.py,
# Runtime.packed): same constants, CV loss 0.006587 -> 0.006597 (gemv rows 0.00810 -> 0.00816 in-sample), end-to-end
# loss 0.01045 -> 0.01034. Again after the paper-like decode took the paper's short-prompt context and host attention
# its per-head cost (host_cpu_head_s, derived), with host_cpu_bytes_per_s no longer free: same constants, the
# end-to-end stage moved nothing, end-to-end loss 0.01034 -> 0.01052; 0.01028 once that per-head cost was the paper
# plan's alone (HostPolicy.attention), the iron-like decode back to 1.129 of IRON's.
FROZEN_FIT = FrozenFit(
    choice="plus-hop-latency",
    cv_loss=0.006597159247630783,
    kernel_loss=0.0064475157576947125,
    e2e_loss=0.010283842876817594,
    table_losses=(
        ("eltwise_add", 0.00046001008331848477),
        ("flash_attention", 0.0029655922341504494),
        ("gemm", 0.015719110961300443),
        ("gemv", 0.00816497568786682),
        ("rmsnorm", 0.010814430323747277),
        ("rope", 0.004400121099623578),
        ("silu_mul", 0.0026083699138559303),
    ),
    probe_losses=(
        ("eltwise_add", 0.00046001008331848477),
        ("gemm", 0.010021775142302706),
        ("gemv", 0.00816497568786682),
        ("rmsnorm", 0.010814430323747277),
        ("rope", 0.004400121099623578),
        ("silu_mul", 0.0026083699138559303),
    ),
)

PHYSICAL_FIELDS: tuple[str, ...] = ("core_load_bytes_per_cycle", "vector_ops_per_cycle")
FITTED: tuple[str, ...] = tuple(f.name for f in fields(Calibration) if f.name not in PHYSICAL_FIELDS)

CALIBRATION = Calibration()

# Where a fit starts when it must not know the rows it is judged on (cross-validation, calibrate/crossval.py): every
# constant the kernel rows determine set to a figure published OUTSIDE the kernel registry, or to its documented
# estimate; the other constants as frozen. A fold's fit starts here, so a held-out row informs nothing it is
# judged with (neither the start nor the fit).
PRIOR = replace(
    CALIBRATION,
    # xdna2.md: an empty XRT kernel ~45 us, a trivial one ~60 us (kernel() + wait(); mlir-aie #2381, XRT #9018).
    dispatch_overhead_s=60e-6,
    # ESTIMATE: ~1 us to write one tile's program, BDs, locks and switch routes (the first hand estimate, 0.94 us).
    tile_config_s=0.94e-6,
    # xdna2.md: AIR's fused decode streams 35.7 GB/s of weights on 4 shim MM2S channels -> 8.9 GB/s per channel.
    shim_channel_bytes_per_s=35.7e9 / 4,
    # xdna2.md: LPDDR5X-7500, ~120 GB/s theoretical; ESTIMATE half of it usable by the NPU.
    ddr_bytes_per_s=60e9,
    # ESTIMATE: every family's inner loop at half its peak before any row is seen (the grid searches 1 .. 2**-10).
    efficiency_table=tuple((name, 0.5) for name, _ in _EFFICIENCY_TABLE),
    # ESTIMATE (~0.3 us per hop), the hop latency's first value: a fit choice that does not free it must not hold it
    # at a value fitted on every row (the held-out ones too), nor may the one that frees it start there.
    dma_hop_latency_cycles=500.0,
)


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
