"""How the paper deployed each of its nine models: the facts ``paper_like_plan`` interprets.

``reference/xdna2.md`` ("The paper's autonomous deployments", the table of TTFT / decode / dispatches per layer and
the paragraph above it) says, for all nine: the attention-input ELF fuses RMSNorm, the Q/K/V projections, the QKV
bias (Qwen2.5) or per-head QK-norm (Qwen3) and RoPE; prefill attention is one FlashAttention ELF, head-first with a
host seq<->head transpose around it when head_dim is 128 (BF16 DMA stride limit), seq-first without when it is 64;
decode attention and the final RMSNorm run on the CPU; large or non-aligned FFN widths split the prefill O+FFN ELF;
the fused decode ``o_gemv_ffn`` cascade needs at most 4 cascade core-rows and an FFN width divisible by 512, and a
model without it runs its decode O / gate / up / down as standalone GEMV ELFs with the M=1 glue (residual add,
FFN RMSNorm, SwiGLU) on the CPU. Where the prefill O+FFN splits is per model: each model's
``programming_examples/llms/<model>/ARCHITECTURE.md`` in Xilinx/mlir-air (the source xdna2.md's table cites) lists
its ELF sequence, and ``PAPER_DEPLOYMENTS`` holds those cut points, one row per model.

A model outside the table (any other shape) gets the reference deployment's facts (Llama-3.2-1B's row).
"""

from __future__ import annotations

from dataclasses import dataclass

from tilepilot.model.spec import ModelSpec

XDNA2_SOURCE = "reference/xdna2.md, 'The paper's autonomous deployments' (table row and the paragraph above it)"
# The context the paper's decode tok/s were measured at. Its figures come from `make run` / `make profile`
# (mlir-air llms/README.md), whose Makefiles default to PROMPT "What is the capital of France?" on the instruct
# model: the prompt goes through the chat template (``apply_chat_template``: 15-40 tokens in these templates), the
# prefill is EOS-padded to 2048 for TTFT, and decode starts at ``current_pos = prompt_len``, the real, unpadded
# length (``llama32_1b_inference.py``), until EOT (a short answer here). So the decode steps ran at tens of
# positions, not 2048. ASSUMPTION for the exact figure (the logs are not published): 64 positions. Qwen3's
# template may think before answering, which would put its steps at a few hundred.
PAPER_DECODE_CONTEXT = 64


@dataclass(frozen=True)
class PaperDeployment:
    """One model's deployment facts.

    ``prefill_cuts``: the ops of the block graph after attention before which the paper's prefill starts a new
    dispatch (empty: O + residual + RMSNorm + gate/up + SwiGLU + down + residual in one ``o_ffn`` ELF).
    ``decode_cascade``: decode O+FFN is the fused ``o_gemv_ffn`` cascade (2 dispatches per layer), else every
    post-attention projection is a standalone GEMV ELF and the M=1 glue between them runs on the CPU (5).
    ``head_first``: prefill FlashAttention is head-first, with the host seq<->head transposes around it.
    ``dispatches``: the paper's NPU dispatches per layer (prefill, decode), the table's last column, which the
    plan built from the other facts must reproduce (tested).
    ``lm_head_rows``: vocabulary rows per LM-head partition (one GEMV launch each, at the prefill's end and per
    decode token): 16384 for Llama's 128256 words (8 partitions, ``llama32_1b_inference.py``), 8192 for the
    151936 words of Qwen2.5 and Qwen3 (19 partitions: "n_part/32 - 1 = 255 (at the repeat-count limit)" of the
    input vector's push_queue, ``<model>_decode.py`` of each Qwen deployment in mlir-air llms/).
    """

    model: str
    shape: tuple[str, int, int, int, int, int]  # (family, hidden, intermediate, n_heads, n_kv_heads, head_dim)
    prefill_cuts: tuple[str, ...]
    decode_cascade: bool
    head_first: bool
    dispatches: tuple[int, int]
    source: str
    lm_head_rows: int = 16384


# AIR's LM-head partition for the 151936-word vocabulary of Qwen2.5 and Qwen3 (the push_queue repeat-count limit)
QWEN_LM_HEAD_ROWS = 8192


def _row(model: str, shape: tuple, cuts: tuple[str, ...], cascade: bool, dispatches: tuple[int, int], arch: str):
    head_first = shape[5] >= 128
    src = f"{XDNA2_SOURCE}: {model} {dispatches[0]} / {dispatches[1]}; split: mlir-air llms/{arch}/ARCHITECTURE.md"
    lm_rows = QWEN_LM_HEAD_ROWS if shape[0] in ("qwen2", "qwen3") else 16384
    return PaperDeployment(model, shape, cuts, cascade, head_first, dispatches, src, lm_rows)


_UNMERGED = ("gate_proj", "up_proj", "swiglu")  # o_res_norm | gate | up | swiglu+down_add
PAPER_DEPLOYMENTS: tuple[PaperDeployment, ...] = (
    # the reference exemplar: rms_gemms_rope | flash_attn | o_ffn; decode rms_gemv_rope | o_gemv_ffn
    _row("llama-3.2-1b", ("llama", 2048, 8192, 32, 8, 64), (), True, (3, 2), "llama32_1b"),
    _row("smollm2-1.7b", ("llama", 2048, 8192, 32, 32, 64), (), True, (3, 2), "smollm2_1_7b"),
    # hidden 4864: Down must be launch 0 of its ELF -> o_ffn_head | down_add; K=896/4864 not /512: standalone GEMVs
    _row("qwen2.5-0.5b", ("qwen2", 896, 4864, 14, 2, 64), ("down_proj",), False, (4, 5), "qwen25_0_5b"),
    _row("qwen3-0.6b", ("qwen3", 1024, 3072, 16, 8, 128), (), True, (3, 2), "qwen3_0_6b"),
    _row("qwen3-1.7b", ("qwen3", 2048, 6144, 16, 8, 128), (), True, (3, 2), "qwen3_1_7b"),
    # hidden 8960: o_res_norm | gate_up (fused) | swiglu+down_add
    _row("qwen2.5-1.5b", ("qwen2", 1536, 8960, 12, 2, 128), ("gate_proj", "swiglu"), False, (5, 5), "qwen25_1_5b"),
    # emb 3072 needs > 4 cascade core-rows: prefill o_ffn fused, decode standalone GEMVs
    _row("llama-3.2-3b", ("llama", 3072, 8192, 24, 8, 128), (), False, (3, 5), "llama32_3b"),
    # hidden 11008: o_res_norm | gate | up | swiglu+down_add
    _row("qwen2.5-3b", ("qwen2", 2048, 11008, 16, 2, 128), _UNMERGED, False, (6, 5), "qwen25_3b"),
    # hidden 9728: o_res_norm | gate | up | swiglu | down_add (SwiGLU its own ELF)
    _row("qwen3-4b", ("qwen3", 2560, 9728, 32, 8, 128), (*_UNMERGED, "down_proj"), False, (7, 5), "qwen3_4b"),
)
REFERENCE = PAPER_DEPLOYMENTS[0]


def shape_key(spec: ModelSpec) -> tuple[str, int, int, int, int, int]:
    """What identifies one of the paper's models (the layer count aside, so a model cut to fewer layers keeps it)."""
    return (spec.family, spec.hidden, spec.intermediate, spec.n_heads, spec.n_kv_heads, spec.head_dim)


def paper_deployment(spec: ModelSpec) -> PaperDeployment | None:
    """The paper's deployment of ``spec``'s model, or None when the paper did not deploy that shape."""
    key = shape_key(spec)
    return next((d for d in PAPER_DEPLOYMENTS if d.shape == key), None)
