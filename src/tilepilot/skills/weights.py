"""The weight format a deployment deploys: choosing it, recording it, and fingerprinting the packed bytes.

``deployment.json`` records the chosen format under ``weights`` (format, block size, tensors kept in bf16 and how
the packed blocks are obtained: the GGUF's blocks as stored, or round-to-nearest from the bf16 checkpoint), beside
the plan whose ``weights`` field the runner reads. Phase 0 fingerprints the packed bytes every projection streams
(``packed_digest``); the evaluator recomputes both from the files and refuses a deployment whose record, plan and
files disagree.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tilepilot.errors import ConfigError, InputError
from tilepilot.model.quant import (
    DEFAULT_BF16_TENSORS,
    FORMATS,
    GGUF_BLOCK,
    LINEAR_FIELDS,
    QuantizedWeights,
    WeightFormat,
    check_kv_format,
)
from tilepilot.model.spec import ModelSpec
from tilepilot.model.stored_blocks import StoredBlocks
from tilepilot.model.weights import LAYER_TENSOR_NAMES

WEIGHTS_KEY = "weights"  # deployment.json key of the recorded weight format
AS_STORED = "gguf blocks as stored"
ROUND_TO_NEAREST = "round-to-nearest from the bf16 checkpoint"
UNPACKED = "bf16 (not packed)"
BLOCK_FORMATS = tuple(f for f in FORMATS if f != "bf16")  # the formats --block and --keep-bf16 shape


def projection_names(spec: ModelSpec, fmt: WeightFormat) -> list[tuple[int, str, str]]:
    """(layer, field, HF name) of every projection ``fmt`` packs in this model."""
    present = spec.tensor_shapes()
    out = []
    for i in range(spec.n_layers):
        for f in LINEAR_FIELDS:
            hf = f"model.layers.{i}.{LAYER_TENSOR_NAMES[f]}"
            if fmt.packs(f) and hf in present:
                out.append((i, f, hf))
    return out


def check_block_options(format_name: str, block_given: bool, keep_given: bool) -> None:
    """Refuse --block or --keep-bf16 when the weights deploy as bf16. Both only shape how a block format packs the
    projections; with nothing packed they would only make the recorded format differ from the plan's, which the
    evaluator refuses at phase 7, after the whole deployment has run."""
    given = [name for name, on in (("--block", block_given), ("--keep-bf16", keep_given)) if on]
    if format_name != "bf16" or not given:
        return
    options = " and ".join(given)
    raise InputError(
        f"{options} {'apply' if len(given) > 1 else 'applies'} only to a block format ({', '.join(BLOCK_FORMATS)}) "
        f"but these weights deploy as bf16; add --weights with one of those formats or drop {options}"
    )


def check_format(fmt: WeightFormat, spec: ModelSpec) -> None:
    """Refuse, in one sentence, a format this model cannot be packed in (block size not dividing a K), options a bf16
    format has no use for, and a block format that would pack nothing."""
    if fmt.format not in FORMATS:
        raise InputError(f"--weights {fmt.format!r} is not a weight format; use one of {', '.join(FORMATS)}")
    try:
        check_kv_format(fmt.kv_cache, spec.head_dim)
    except ConfigError as e:
        raise InputError(f"--kv-cache {fmt.kv_cache}: {e}") from None
    if not fmt.quantized:  # the CLI refuses an explicit --block already; this catches what differs from the default
        check_block_options(fmt.format, fmt.block != GGUF_BLOCK, fmt.bf16_tensors != DEFAULT_BF16_TENSORS)
    if fmt.quantized and (fmt.block < 2 or fmt.block % 2):
        raise InputError(
            f"--block {fmt.block} is not an even number of at least 2; use an even block size dividing every "
            f"projection's input width (GGUF uses {GGUF_BLOCK})"
        )
    unknown = [t for t in fmt.bf16_tensors if t not in (*DEFAULT_BF16_TENSORS, *LINEAR_FIELDS)]
    if unknown:
        raise InputError(
            f"--keep-bf16 names {unknown[0]!r}, which is not a projection tilepilot packs; use any of "
            f"{', '.join(LINEAR_FIELDS)}"
        )
    if fmt.quantized and not fmt.packs_head and not projection_names(spec, fmt):
        raise InputError(
            f"--keep-bf16 keeps every projection in bf16, so nothing would be packed in {fmt.format}; drop --weights "
            "to deploy bf16, or keep fewer projections in bf16"
        )
    shapes = spec.tensor_shapes()
    for _, f, hf in projection_names(spec, fmt):
        k = int(shapes[hf][1])
        if k % fmt.block:
            raise InputError(
                f"--block {fmt.block} does not divide K={k} of {f}; choose a block size dividing every projection's "
                f"input width (GGUF uses {GGUF_BLOCK})"
            )


def stored_format(model_dir: Path, spec: ModelSpec) -> str | None:
    """The one block format every layer projection of the directory's GGUF is stored in (None if mixed or none)."""
    stored = StoredBlocks(model_dir)
    fmts = {stored[hf].fmt for _, _, hf in projection_names(spec, WeightFormat("q8_0")) if hf in stored}
    return next(iter(fmts)) if len(fmts) == 1 else None


def weights_record(fmt: WeightFormat, model_dir: Path, spec: ModelSpec) -> dict[str, Any]:
    """What deployment.json records of the weights: the format and how its blocks are obtained."""
    rec: dict[str, Any] = asdict(fmt) | {"bf16_tensors": list(fmt.bf16_tensors)}
    if not fmt.quantized:
        return rec | {"packing": UNPACKED, "stored_tensors": 0, "packed_tensors": 0}
    stored = StoredBlocks(model_dir)
    names = projection_names(spec, fmt)
    n_stored = 0
    for _, _, hf in names:
        if hf in stored:
            qt = stored[hf]
            n_stored += (qt.fmt, qt.block) == (fmt.format, fmt.block)
    packing = packing_label(n_stored, len(names), fmt)
    return rec | {"packing": packing, "stored_tensors": n_stored, "packed_tensors": len(names)}


def packing_label(n_stored: int, n_packed: int, fmt: WeightFormat) -> str:
    """How the packed projections' blocks are obtained. No projection packed is never "as stored" (that would claim
    the GGUF's blocks are deployed when none is): it is the head's round-to-nearest, or no packing at all."""
    if not n_packed:
        return ROUND_TO_NEAREST if fmt.packs_head else UNPACKED
    return AS_STORED if n_stored == n_packed else ROUND_TO_NEAREST if not n_stored else "mixed"


def packed_digest(weights) -> str | None:
    """SHA-256 over every packed projection's bytes in layer order (None when nothing is packed); packing them all
    also makes ``QuantizedWeights.used_stored`` count every tensor taken as stored."""
    if not isinstance(weights, QuantizedWeights):
        return None
    h = hashlib.sha256()
    for i, f, hf in projection_names(weights.spec, weights.format):
        qt = weights.packed(i, f)
        h.update(f"{hf}:{qt.fmt}:{qt.block}".encode())
        h.update(qt.data.numpy().tobytes())
    return h.hexdigest()


def describe(rec: dict[str, Any] | None) -> str:
    """One phrase for a recorded format, e.g. 'q4_1 (block 32, gguf blocks as stored)'."""
    kv = f", KV cache {rec['kv_cache']}" if rec and rec.get("kv_cache", "bf16") != "bf16" else ""
    if not rec or rec.get("format", "bf16") == "bf16":
        return "bf16" + kv
    return f"{rec['format']} (block {rec.get('block')}, {rec.get('packing', 'packing not recorded')}){kv}"
