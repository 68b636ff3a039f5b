"""The phase gates: every numerical bound tilepilot holds a deployment to, each with its source.

Bounds come from DESIGN.md section 6 (the phase table), issue 2 (the oracle vs transformers) and
the gates of the paper's skills as recorded in reference/xdna2.md "Numerical gates". Where
tilepilot is stricter than the paper, the constant says why. Measurement names are constants too,
so the phases that measure and the gates that judge cannot spell them differently.

Why phase 3 uses 0.99 for the final-logit cosine instead of the paper's 0.95: a bf16 pipeline is
far better than 0.95 on the models we deploy. Measured (2 cores, transformers 5.24, eager
attention, 64 random prompt tokens, weights rounded to bf16 on both sides, cosine of the logits):
  Llama-3.2-1B config (16 layers), HF init std 0.02: cosine 0.99968, per-position min 0.99956
  Llama-3.2-1B config, init std 1/sqrt(fan_in):      cosine 0.99988, per-position min 0.99986
  Qwen3-0.6B config (28 layers), HF init:            cosine 0.99991, per-position min 0.99986
  Qwen3-0.6B config, init std 1/sqrt(fan_in):        cosine 0.99983, per-position min 0.99978
Per-layer cosines were >= 0.9997 with adjacent drops <= 3e-5, so 0.99 keeps ~30x headroom in
1 - cos. It also catches faults 0.95 lets through: a wrong rope_theta on a tiny Qwen3 scores 0.96
with every other phase-3 check passing (tests/gates/test_gates_with_oracle.py).
The block-FP16 GEMM mode was not measured here (no executor yet); if it cannot reach 0.99, that is
a finding to report, not a reason to loosen silently: pass ``final_cosine=PAPER_PHASE3_LOGITS_COSINE``.
"""

from __future__ import annotations

from tilepilot.gates.gate import Gate, Threshold

# ---- sources -----------------------------------------------------------------------------------
SRC_DESIGN = "DESIGN.md section 6 (phase gate table)"
SRC_ISSUE2 = "issue 2 item 6 (oracle vs transformers FP32)"
SRC_PAPER = "reference/xdna2.md 'Numerical gates' (Xilinx/mlir-air .claude/skills, paper-era branch)"
SRC_VLLM = "reference/xdna2.md 'Numerical gates': greedy 32 tokens, vLLM check_logprobs_close style"
SRC_IRON_KL = (
    "reference/published.json iron_accuracy_gate (amd/IRON iron/applications/llama_3_2_1b/test.py): teacher-forced "
    "KL(fp32 || NPU) of next-token distributions over 40 steps of real text"
)
SRC_FINITE = "DESIGN.md section 6 (no NaN/Inf); a non-finite value is never a pass"
SRC_PHASE3_STRICT = (
    "tilepilot, stricter than the paper's 0.95: bf16 vs FP32 measured 0.9997-0.9999 on full-size configs "
    "(gates/thresholds.py)"
)

# ---- measurement names -------------------------------------------------------------------------
LOGITS_MAX_REL_ERR = "logits.max_rel_err"
LOGITS_COSINE = "logits.cosine"
LOGITS_TOP1 = "logits.top1_agreement"
LAYERS_MIN_COSINE = "layers.min_cosine"
LAYERS_MAX_DROP = "layers.max_drop"
GREEDY_IDENTICAL = "greedy.identical"
GREEDY_TOKEN_SET = "greedy.token_set_ok"
PEARSON = "pearson"
COSINE = "cosine"
MIN_POSITION_COSINE = "min_position_cosine"
TILE_VS_FAST = "tile_vs_fast.max_abs_err"
NONFINITE = "nonfinite"
KL_MEAN = "kl.mean"
KL_P90 = "kl.p90"
KL_MAX = "kl.max"
TTFT_MODELED_MS = "prefill.ttft_modeled_ms"
DECODE_MODELED_MS = "decode.latency_modeled_ms"

# ---- bounds ------------------------------------------------------------------------------------
PHASE0_LOGITS_MAX_REL_ERR = 1e-4  # SRC_DESIGN, SRC_ISSUE2
PHASE0_LOGITS_COSINE = 0.999  # SRC_PAPER phase 0
PHASE0_LAYER_COSINE = 0.99  # SRC_PAPER phase 0
GREEDY_STEPS = 32  # SRC_ISSUE2 / SRC_VLLM: greedy continuations are compared over 32 tokens

PHASE1_MIN_CORRELATION_MATRIX = 0.999  # SRC_DESIGN / SRC_PAPER: GEMM (and GEMV, same arithmetic)
PHASE1_MIN_CORRELATION_OTHER = 0.99  # SRC_DESIGN / SRC_PAPER: RMSNorm, FlashAttention, the rest
MATRIX_KERNELS = frozenset({"gemm", "gemv", "lm_head"})  # LM head is a vocab-partitioned GEMV/GEMM

PHASE2_COSINE = 0.99  # SRC_DESIGN / SRC_PAPER
# (largest head_dim, per-position minimum cosine), SRC_PAPER phase 2: 0.99 / 0.98 / 0.97 for
# head_dim <= 64 / <= 128 / >= 256. The table is silent on 129..255; we use the stricter 0.98.
PHASE2_POSITION_COSINE_STEPS: tuple[tuple[int, float], ...] = ((64, 0.99), (255, 0.98))
PHASE2_POSITION_COSINE_LARGE = 0.97

PAPER_PHASE3_LOGITS_COSINE = 0.95  # SRC_PAPER phase 3, kept for reference and for paper-equivalent runs
PHASE3_LOGITS_COSINE = 0.99  # SRC_PHASE3_STRICT
PHASE3_LAYER_COSINE = 0.85  # SRC_PAPER phase 3
PHASE3_MAX_LAYER_DROP = 0.05  # SRC_PAPER phase 3: no jump > 0.05 between adjacent layers

# IRON's Llama-3.2-1B accuracy gate (SRC_IRON_KL), in nats; held for every model, not only Llama-3.2-1B.
KL_STEPS = 40
KL_MEAN_MAX = 0.02
KL_P90_MAX = 0.04
KL_MAX_MAX = 0.2


def kl_thresholds() -> list[Threshold]:
    """The teacher-forced KL gate; the model gate (``harness/model_gate.py``) adds it to phase 3's thresholds, so
    phases 3-6 and the evaluator hold it (the plain ``phase3_gate`` stays the paper's table for other callers)."""
    return [
        Threshold(KL_MEAN, "<=", KL_MEAN_MAX, SRC_IRON_KL),
        Threshold(KL_P90, "<=", KL_P90_MAX, SRC_IRON_KL),
        Threshold(KL_MAX, "<=", KL_MAX_MAX, SRC_IRON_KL),
    ]


def _no_nonfinite() -> Threshold:
    return Threshold(NONFINITE, "<=", 0, SRC_FINITE)


def min_correlation(kernel_family: str) -> float:
    """Pearson bound of a kernel family in phase 1 (0.999 for matrix kernels, 0.99 otherwise)."""
    if kernel_family.lower() in MATRIX_KERNELS:
        return PHASE1_MIN_CORRELATION_MATRIX
    return PHASE1_MIN_CORRELATION_OTHER


def per_position_min_cosine(head_dim: int) -> float:
    """Phase-2 per-position cosine bound for a head dimension (larger heads tolerate slightly less)."""
    for largest, bound in PHASE2_POSITION_COSINE_STEPS:
        if head_dim <= largest:
            return bound
    return PHASE2_POSITION_COSINE_LARGE


def phase0_gate(*, with_greedy: bool = True) -> Gate:
    """build-cpu-oracle: the oracle against transformers FP32."""
    thresholds = [
        Threshold(LOGITS_MAX_REL_ERR, "<=", PHASE0_LOGITS_MAX_REL_ERR, SRC_DESIGN),
        Threshold(LOGITS_TOP1, ">=", 1.0, SRC_DESIGN + ": top-1 equal"),
        Threshold(LOGITS_COSINE, ">=", PHASE0_LOGITS_COSINE, SRC_PAPER),
        Threshold(LAYERS_MIN_COSINE, ">=", PHASE0_LAYER_COSINE, SRC_PAPER),
        _no_nonfinite(),
    ]
    if with_greedy:
        source = f"{SRC_ISSUE2}: identical greedy {GREEDY_STEPS} tokens"
        thresholds.append(Threshold(GREEDY_IDENTICAL, ">=", 1, source))
    return Gate("phase0-build-cpu-oracle", thresholds)


def phase1_gate(kernel_family: str, *, tile_path: bool = True) -> Gate:
    """kernel-validation of one kernel instance; max abs/rel errors are recorded, not bounded.

    ``tile_path`` adds the check that the exact tile-level executor and the fast path agree bit
    for bit (only on shapes small enough for the tile path).
    """
    thresholds = [
        Threshold(PEARSON, ">=", min_correlation(kernel_family), SRC_DESIGN),
        _no_nonfinite(),
    ]
    if tile_path:
        thresholds.append(Threshold(TILE_VS_FAST, "<=", 0.0, SRC_DESIGN + ": tile path == fast path"))
    return Gate(f"phase1-kernel-validation-{kernel_family.lower()}", thresholds)


def phase2_gate(head_dim: int) -> Gate:
    """single-block-validation: one decoder block on the NPU against the oracle's block output."""
    return Gate(
        "phase2-single-block-validation",
        [
            Threshold(COSINE, ">=", PHASE2_COSINE, SRC_DESIGN),
            Threshold(MIN_POSITION_COSINE, ">=", per_position_min_cosine(head_dim), SRC_PAPER),
            _no_nonfinite(),
        ],
    )


def phase3_thresholds(final_cosine: float = PHASE3_LOGITS_COSINE) -> list[Threshold]:
    source = SRC_PHASE3_STRICT if final_cosine == PHASE3_LOGITS_COSINE else SRC_PAPER
    return [
        Threshold(LOGITS_COSINE, ">=", final_cosine, source),
        Threshold(LAYERS_MIN_COSINE, ">=", PHASE3_LAYER_COSINE, SRC_PAPER),
        Threshold(LAYERS_MAX_DROP, "<=", PHASE3_MAX_LAYER_DROP, SRC_PAPER),
        Threshold(GREEDY_TOKEN_SET, ">=", 1, SRC_VLLM),
        _no_nonfinite(),
    ]


def phase3_gate(final_cosine: float = PHASE3_LOGITS_COSINE) -> Gate:
    """full-model-validation: final logits, per-layer outputs and greedy tokens against the oracle.

    ``final_cosine=PAPER_PHASE3_LOGITS_COSINE`` reproduces the paper's looser gate.
    """
    return Gate("phase3-full-model-validation", phase3_thresholds(final_cosine))


def phase4_gate(ttft_before_ms: float) -> Gate:
    """prefill-optimization: the phase-3 gate still holds and modeled TTFT is strictly lower."""
    return Gate(
        "phase4-prefill-optimization",
        [*phase3_thresholds(), Threshold(TTFT_MODELED_MS, "<", ttft_before_ms, SRC_DESIGN + ": strictly lower")],
    )


def phase5_gate(decode_before_ms: float) -> Gate:
    """decode-optimization: the phase-3 gate still holds and modeled decode latency is strictly lower."""
    return Gate(
        "phase5-decode-optimization",
        [*phase3_thresholds(), Threshold(DECODE_MODELED_MS, "<", decode_before_ms, SRC_DESIGN + ": strictly lower")],
    )
