"""LM head: vocabulary partitions as one multi-launch dispatch, both executor paths, per-partition fault finding."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kernel_checks import kernel_gate, rand_bf16, zoo_specs

from tilepilot.gates.metrics import pearson
from tilepilot.kernels import lm_head
from tilepilot.npu.execute import run_group_fast, run_group_tile
from tilepilot.npu.timing import time_group
from tilepilot.npu.validate import validate_group


def _inputs(shape: lm_head.Shape, seed: int = 0) -> dict[str, torch.Tensor]:
    return {
        "x": rand_bf16(shape.m, shape.k, seed=seed),
        "w": rand_bf16(shape.vocab, shape.k, seed=seed + 1, scale=0.05),
    }


SMALL = lm_head.Config(partition_rows=128, cols=2, rows=1, tile_m=8, tile_k=32)


@pytest.mark.parametrize("m", [1, 2])
def test_ragged_vocab_partitions_run_on_both_paths_bit_for_bit(m):
    shape = lm_head.Shape(vocab=300, k=64, m=m)  # 128 + 128 + 44 (padded to 48) rows
    head = lm_head.make_design(shape, SMALL)
    assert head.ranges == [(0, 128), (128, 256), (256, 300)]
    assert validate_group(head) == []
    ins = _inputs(shape)
    tile = head.assemble_group_outputs(run_group_tile(head, head.group_inputs(ins)))
    fast = head.fast(ins, exact=True)["logits"]
    assert tile.shape == (m, 300) and torch.equal(tile, fast)
    via_group = head.assemble_group_outputs(run_group_fast(head, head.group_inputs(ins), exact=True))
    assert torch.equal(via_group, fast)
    kernel_gate("lm_head", lm_head.reference(ins)["logits"], fast, tile=tile)


def test_partition_weights_are_views_of_the_embedding_not_copies():
    shape = lm_head.Shape(vocab=256, k=64)
    head = lm_head.make_design(shape, SMALL)
    ins = _inputs(shape)
    parts = head.partition_inputs(ins)
    starts = [start for start, _ in head.ranges]
    assert all(p["w"].data_ptr() == ins["w"][s].data_ptr() for p, s in zip(parts, starts, strict=True))


def test_one_wrong_partition_is_found_per_partition_even_when_the_whole_looks_fine():
    shape = lm_head.Shape(vocab=4096, k=64)
    cfg = lm_head.Config(partition_rows=256, cols=2, rows=1, tile_m=8, tile_k=64)  # 16 partitions
    head = lm_head.make_design(shape, cfg)
    ins = _inputs(shape, seed=7)
    good = head.fast(ins)["logits"]
    assert lm_head.bad_partitions(lm_head.partition_report(head, ins, good)) == []
    # fault: partition 5 computed with the rows of partition 4 (a wrong weight offset, amd/IRON #83 style)
    faulty_w = ins["w"].clone()
    faulty_w[1280:1536] = ins["w"][1024:1280]
    bad = good.clone()
    bad[:, 1280:1536] = head.fast({"x": ins["x"], "w": faulty_w})["logits"][:, 1280:1536]
    ref = lm_head.reference(ins)["logits"]
    # the whole-vocabulary correlation only says "something is off" (and looks plausible); it cannot say where
    assert 0.9 < pearson(ref, bad) < 0.999
    report = lm_head.partition_report(head, ins, bad, ref)
    assert lm_head.bad_partitions(report) == [5]
    assert report[5].pearson < 0.5


def test_partitions_form_one_dispatch_and_fewer_launches_model_faster():
    shape = lm_head.Shape(vocab=128256, k=2048)
    base = lm_head.default_config(shape)
    assert base.partition_rows == lm_head.PARTITION_ROWS
    eight = lm_head.make_design(shape, base)
    assert len(eight.designs) == 8 and validate_group(eight) == []
    t8 = time_group(eight)
    assert t8.launches == 8
    # one dispatch: a single host round trip however many partitions
    assert t8.seconds < sum(time_group(d).seconds for d in eight.designs)
    wider = lm_head.make_design(shape, replace(base, partition_rows=32768))
    assert len(wider.designs) == 4 and time_group(wider).seconds < t8.seconds


def test_many_tokens_use_gemm_partitions():
    shape = lm_head.Shape(vocab=512, k=64, m=32)
    head = lm_head.make_design(shape, lm_head.Config(256, 2, 1, 8, 32))
    assert {d.meta["family"] for d in head.designs} == {"gemm"}
    ins = _inputs(shape, seed=2)
    kernel_gate("lm_head", lm_head.reference(ins)["logits"], head.fast(ins)["logits"])


def _heads() -> list[lm_head.Shape]:
    return sorted({lm_head.Shape(s.vocab, s.hidden) for s in zoo_specs()}, key=lambda s: (s.vocab, s.k))


@pytest.mark.parametrize("shape", _heads(), ids=lambda s: f"{s.vocab}x{s.k}")
def test_zoo_lm_heads_validate_and_every_partition_kernel_passes_the_gate(shape):
    """Real heads: the full dispatch validates; each distinct partition launch (the kernel instances the plan
    runs) passes the phase-1 gate on the fast path. Assembly of partitions is covered on small shapes above."""
    head = lm_head.make_design(shape, lm_head.default_config(shape))
    assert validate_group(head) == []
    assert head.ranges[-1][1] == shape.vocab and len(head.designs) == -(-shape.vocab // lm_head.PARTITION_ROWS)
    seen = set()
    for d in head.designs:
        w_shape = d.tensor("w").shape
        if w_shape in seen:
            continue
        seen.add(w_shape)
        ins = {"x": rand_bf16(1, shape.k, seed=len(seen)), "w": rand_bf16(*w_shape, seed=shape.k, scale=0.05)}
        out = d.fast(ins)["y"]
        kernel_gate("lm_head", lm_head.reference(ins)["logits"], out)


def test_a_shifted_ragged_tail_spoils_only_the_last_partition():
    """``tail="shift"`` launches the ragged last partition over the vocabulary's last full partition (one design
    shape) but assembles it at its own offset: the last slice holds the wrong rows, the others are untouched, and
    the fault is invisible when the partition divides the vocabulary. Only "pad" is ever a candidate."""
    shape = lm_head.Shape(vocab=300, k=64, m=1)
    ins = _inputs(shape)
    good = lm_head.make_design(shape, SMALL)
    bad = lm_head.make_design(shape, lm_head.Config(**{**SMALL.__dict__, "tail": "shift"}))
    assert bad.reads[-1] == (172, 300) and [d.tensor("w").shape[0] for d in bad.designs] == [128, 128, 128]
    ref = lm_head.reference(ins)["logits"]
    checks = lm_head.partition_report(bad, ins, bad.fast(ins)["logits"].float(), ref)
    assert lm_head.bad_partitions(checks) == [2]
    assert torch.equal(bad.fast(ins)["logits"][:, :256], good.fast(ins)["logits"][:, :256])
    even = lm_head.Shape(vocab=256, k=64, m=1)
    shifted = lm_head.make_design(even, lm_head.Config(**{**SMALL.__dict__, "tail": "shift"}))
    assert shifted.reads == shifted.ranges
    assert all(c.tail == "pad" for c in lm_head.candidate_configs(lm_head.Shape(1024, 512, 1)))
