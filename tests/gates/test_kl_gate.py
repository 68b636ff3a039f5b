"""The teacher-forced KL gate (issue 12 item 4): IRON's Llama-3.2-1B accuracy gate, in phase 3 and the evaluator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tilepilot.gates import metrics as M
from tilepilot.gates import thresholds as T
from tilepilot.harness import prompts as P
from tilepilot.harness.model_gate import model_gate_thresholds

PUBLISHED = Path(__file__).resolve().parents[3] / "shared" / "reference" / "published.json"


def test_thresholds_are_irons_published_ones():
    if not PUBLISHED.exists():
        pytest.skip("reference/published.json is not next to this checkout")
    gate = json.loads(PUBLISHED.read_text())["iron_accuracy_gate"]
    assert (T.KL_MEAN_MAX, T.KL_P90_MAX, T.KL_MAX_MAX) == (gate["kl_mean_max"], gate["kl_p90_max"], gate["kl_max_max"])
    assert T.KL_STEPS == 40


def test_the_model_gate_holds_the_kl_bounds():
    by_metric = {t.metric: t for t in model_gate_thresholds().thresholds}
    for metric, bound in ((T.KL_MEAN, 0.02), (T.KL_P90, 0.04), (T.KL_MAX, 0.2)):
        assert by_metric[metric].op == "<=" and by_metric[metric].value == bound
        assert "iron" in by_metric[metric].source.lower()


def test_teacher_forced_kl_statistics():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(40, 300, generator=g) * 3
    same = M.teacher_forced_kl(ref, ref)
    assert same["steps"] == 40 and same["max"] == 0.0
    noisy = ref + 0.3 * torch.randn(40, 300, generator=g)
    kl = M.teacher_forced_kl(ref, noisy)
    per = np.array(kl["per_step"])
    lp, lq = torch.log_softmax(ref.double(), -1), torch.log_softmax(noisy.double(), -1)
    direct = (lp.exp() * (lp - lq)).sum(-1).numpy()
    assert np.allclose(per, direct, rtol=1e-9)
    assert kl["mean"] == pytest.approx(direct.mean()) and kl["p90"] == pytest.approx(np.percentile(direct, 90))
    assert kl["max"] == pytest.approx(direct.max()) and kl["mean"] > 0.01
    bad = noisy.clone()
    bad[3, 7] = float("inf")
    assert all(np.isnan(M.teacher_forced_kl(ref, bad)[k]) for k in ("mean", "p90", "max"))


def test_a_nan_kl_never_passes():
    report = model_gate_thresholds().evaluate({T.KL_MEAN: float("nan"), T.KL_P90: 0.0, T.KL_MAX: 0.0})
    assert any("kl.mean" in f for f in report.failures)


def test_kl_texts_are_real_varied_and_disjoint():
    assert not set(P.KL_TEXTS) & set(P.EVAL_KL_TEXTS)
    for pool in (P.KL_TEXTS, P.EVAL_KL_TEXTS):
        assert len(pool) >= 3 and all(len(t.split()) >= 50 for t in pool)
        assert any("def " in t or "SELECT" in t for t in pool)  # code
        assert any(t.count("\n") >= 3 and ("?" in t) for t in pool)  # dialogue


def test_kl_ids_use_the_tokenizer_and_fall_back_without_one(smollm2_dir):
    from tilepilot.model.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(smollm2_dir(layers=1))
    ids, real = P.kl_text_ids(tok, 49152, 24 + T.KL_STEPS, 0)
    assert real and len(ids) == 64
    assert "river" in tok.decode(ids)
    ids, real = P.kl_text_ids(None, 1000, 64, 0)
    assert not real and len(ids) == 64


def test_the_degraded_gemv_rounds_every_running_sum_and_its_paths_agree():
    """The negative control of the KL gate's test (tests/skills/test_trained_model.py): a GEMV adding each product to
    its bf16 output. Both executor paths agree bit for bit, it equals bf16 accumulation with a K chunk of 1, it is
    several times less accurate than the deployed kernel, and the default kernel is untouched by the option."""
    from tilepilot.kernels import gemv
    from tilepilot.npu import numerics as nx
    from tilepilot.npu.execute import run_fast, run_tile
    from tilepilot.npu.validate import validate

    g = torch.Generator().manual_seed(0)
    shape = gemv.Shape(64, 256, 2)
    x = torch.randn(2, 256, generator=g).bfloat16()
    w = (torch.randn(64, 256, generator=g) * 0.05).bfloat16()
    ins = {"x": x, "w": w}
    ref = gemv.reference(ins)["y"]
    err = {}
    for acc in ("fp32", gemv.SERIAL_BF16):
        design = gemv.make_design(shape, gemv.Config(cols=2, rows=2, tile_m=4, tile_k=64, acc=acc))
        assert validate(design) == []
        tile, fast = run_tile(design, ins)["y"], run_fast(design, ins)["y"]
        assert torch.equal(tile, run_fast(design, ins, exact=True)["y"])
        err[acc] = float((fast.float() - ref).abs().mean())
        if acc == gemv.SERIAL_BF16:
            assert torch.equal(tile, fast) and torch.equal(fast, nx.matmul(x, w, acc="bf16", k_chunk=1))
            assert design.numerics.accumulate == "bf16" and design.numerics.k_chunk == 1
        else:
            assert gemv.Config().acc == "fp32" and design.numerics.k_chunk == 64
    assert err[gemv.SERIAL_BF16] > 4 * err["fp32"], err
    assert gemv.SERIAL_BF16 not in {c.acc for c in gemv.candidate_configs(gemv.Shape(576, 576))}
