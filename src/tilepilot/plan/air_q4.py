"""The ``air-q4`` built-in plan: a 4-bit deployment built the way AIR built its Q4NX Llama-3.2-1B, for any model shape.

What AIR did (reference/xdna2.md, "AIR's own 4-bit deployments", Xilinx/mlir-air ``llama32_1b_q4nx`` and
``fused_decode``), and how this plan says it:

- weights Q4NX: per-block affine 4-bit, w = q * scale + min (``q4_1`` here, GGUF's 32-value blocks: AIR's block
  size is not published), the LM head included (AIR's ~35.7 GB/s at 58.6 tok/s is ~610 MB per token, which a bf16
  head of 525 MB alone would nearly fill); the embedding gather stays bf16;
- decode in **one dispatch per token** (all layers and the LM head, ``StagePlan.one_dispatch``), built as one
  resident module as AIR's ``fused_decode.py`` builds it (``StagePlan.resident``: every launch packed into the
  array and configured once, no design switch between them; ``plan/resident.py`` picks the configs that fit, the
  weight feed kept), attention and the KV writes on the NPU (every key of a KV head on one compute unit:
  ``fused_decode.py`` runs 4 attention units of 2 KV heads each and splits no head's keys, so the flash-decoding
  tilings, ``attention.decode_cascade_configs``, are refused: ``attention.keeps_kv_heads_whole``), the projections
  as quantized GEMVs over the packed blocks fed by one or both shim MM2S channels of each column
  (``weight_channels``), on 4 compute rows per column (AIR's decode cascade uses up to 4 core rows), falling back
  to what the shape allows;
- a KV readback sized to the context window (``windowed``: a template every ``KV_WINDOW_STEP`` rows) or padded to
  ATTN_MAXL = 2048 (``KV_TEMPLATE_ROWS``);
- prefill as bf16 GEMMs over the dequantized weights, grouped as the paper deployed that model (its paper-like
  plan: ``plan/paper_deployments.py``; 3 dispatches per layer for Llama-3.2-1B) with causal attention that skips
  fully masked blocks (the attention family does).

The helpers ``fused_stage`` and ``window_ladder`` are the same transforms the decode phase's skills
(``one-dispatch-decode``, ``windowed-kv-readback``) propose, so a deployment optimized by them and this plan share
one definition of "one dispatch" and "windowed".
"""

from __future__ import annotations

import copy

from tilepilot.errors import ConfigError
from tilepilot.kernels.attention import keeps_kv_heads_whole
from tilepilot.kernels.registry import family
from tilepilot.model.graph import block_graph, weight_shape
from tilepilot.model.quant import WeightFormat
from tilepilot.model.spec import ModelSpec
from tilepilot.npu.validate import DesignError
from tilepilot.plan.plan import KV_TEMPLATE_ROWS, DeploymentPlan, apply_kv_cache, check_plan, npu_family, with_weights
from tilepilot.plan.resident import fit_resident

# Distance between readback templates of the windowed fused decode: 256 positions = 4 key blocks of the attention
# family's 64-row tiles. ESTIMATE of a sensible template count (AIR does not publish its window list).
KV_WINDOW_STEP = 256
# AIR's fused decode runs its GEMV cascade on up to 4 core rows (reference/xdna2.md, "the fused o_gemv_ffn cascade
# is capped at 4 cascade core-rows").
AIR_COMPUTE_ROWS = 4


def fused_stage(plan: DeploymentPlan, stage: str = "decode") -> DeploymentPlan | None:
    """A copy of ``plan`` whose ``stage`` runs as one dispatch per pass, CPU groups moved to their NPU kernels, the
    block's groups joined into one group and the head's into another (``StagePlan.join``: then the merges and folds
    see across the paper's group boundaries), and attention compiled for the padded template readback; None when the
    stage already is one dispatch."""
    if plan.stage(stage).one_dispatch:
        return None
    spec = plan.model_spec()
    graph = block_graph(spec)
    new = copy.deepcopy(plan)
    st = new.stage(stage)
    for g in st.groups():
        if g.where == "cpu":
            g.where = "npu"
            for c in g.calls:
                c.family, c.config = npu_family(graph.node(c.op), stage), {}
    st.one_dispatch = True
    st.join()
    st.kv_windows = [min(KV_TEMPLATE_ROWS, spec.max_positions)]
    return apply_kv_cache(new)


def window_ladder(largest: int, step: int = KV_WINDOW_STEP) -> list[int]:
    """Readback templates every ``step`` rows up to ``largest`` (which stays the top template)."""
    return sorted({*range(step, largest, step), largest})


def _feed(spec: ModelSpec, weights: str, fmt: WeightFormat, channels: int) -> dict:
    """The quantized GEMV config of one projection: ``channels`` shim channels per column and AIR's 4 compute rows,
    or the nearest feed the shape tiles into (fewer rows, then one channel); tiles are left to the family default."""
    n, k = weight_shape(spec, weights)
    qgemv = family("qgemv")
    shape = qgemv.Shape(n=n, k=k, m=1, fmt=fmt.format, block=fmt.block)
    for ch in dict.fromkeys((channels, 1)):
        for rows in (AIR_COMPUTE_ROWS, 2, 1):
            try:
                cols = qgemv.default_config(shape, channels=ch, rows=rows).cols
            except DesignError:
                continue
            return {"fmt": fmt.format, "block": fmt.block, "weight_channels": ch, "rows": rows, "cols": cols}
    return {"fmt": fmt.format, "block": fmt.block}


def air_q4_plan(
    paper_like: DeploymentPlan, *, weight_channels: int = 2, windowed: bool = True, fmt: WeightFormat | None = None
) -> DeploymentPlan:
    """AIR's Q4NX deployment of the model of ``paper_like`` (its paper-like plan, ``plan.builtin``: the prefill
    grouping AIR kept); the variants AIR measured are ``weight_channels`` 1 or 2 and ``windowed`` False (readback
    padded to 2048) or True. See the module docstring."""
    if weight_channels not in (1, 2):
        raise ConfigError(f"weight_channels is {weight_channels}; AIR fed weights over 1 or 2 shim MM2S channels")
    fmt = fmt or WeightFormat("q4_1", bf16_tensors=("embed",))
    spec = paper_like.model_spec()
    plan = fused_stage(with_weights(paper_like, fmt, packed_prefill=False))
    assert plan is not None
    graph = block_graph(spec)
    for g in plan.decode.groups():
        for c in g.calls:
            if c.family == "qgemv":
                node = graph.node(c.op)
                c.config = _feed(spec, node.weights[0] if node.kind == "linear" else "lm_head", fmt, weight_channels)
    if windowed:
        plan.decode.kv_windows = window_ladder(max(plan.decode.kv_windows))
    # AIR's configs are repaired only where they do not fit together (no improvement pass): the plan stands for AIR's
    # design, not for the fastest one under its rules
    plan, _ = fit_resident(
        plan, spec, keep=("weight_channels", "fmt", "block"), allowed=keeps_kv_heads_whole, improve=False
    )
    plan.name = "air-q4"
    readback = f"windowed every {KV_WINDOW_STEP} rows" if windowed else f"padded to {max(plan.decode.kv_windows)}"
    plan.notes = [
        "air-q4: AIR's Q4NX deployment (reference/xdna2.md): q4_1 (affine 4-bit) layer weights and LM head, bf16 "
        "embeddings",
        f"decode: one resident dispatch per token (every launch packed into the array, no design switch), attention "
        f"on the NPU, weights fed on {weight_channels} shim channel(s) per column, KV readback {readback}",
        "prefill: bf16 GEMMs over the dequantized weights, grouped as the paper deployed this model (paper-like plan)",
    ]
    check_plan(plan, spec)
    return plan
