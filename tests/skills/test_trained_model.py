"""The trained SmolLM2-135M-Instruct, cut to its first two layers (real weights, tokenizer and chat template), deployed
through all eight phases in the suite (issue 12 item 3), and the KL gate judged on it (issue 12 item 4).

Random-weight checkpoints cannot show that the teacher-forced KL gate catches a kernel mistake: their next-token
distributions are nearly flat, so any rounding barely moves KL. On trained weights a realistic mistake must fail it
while the deployed plan passes, on the same model and the same prompts.
"""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stdout
from dataclasses import replace

import pytest
import torch
from fresh_evaluation import rewrite_plan_digests

from tilepilot.cli import main
from tilepilot.gates import thresholds as T
from tilepilot.harness.model_gate import model_gate
from tilepilot.kernels.gemv import SERIAL_BF16
from tilepilot.runtime.workspace import load_workspace
from tilepilot.skills.context import DeployContext, Settings
from tilepilot.skills.evaluator import evaluate

LAYERS = 2


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread here and in the evaluator's fresh process. On the shared 2-core machine a second thread spins
    against other processes: one model gate of this model took 34 s with two threads and 3 s with one (measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def deployed(smollm2_dir, tmp_path_factory, one_thread):
    """``tilepilot deploy`` of the truncated trained model, once for this module: (model dir, workspace, summary)."""
    model = smollm2_dir(layers=LAYERS)
    base = tmp_path_factory.mktemp("trained-deploy")
    ws = base / "ws"
    buf = io.StringIO()
    with redirect_stdout(buf):
        code = main(["deploy", str(model), "--out", str(ws), "--json", "--knowledge", str(base / "knowledge"),
                     "--tune-candidates", "4"])  # fmt: skip
    return model, ws, code, json.loads(buf.getvalue())


def test_truncated_trained_model_deploys_to_the_evaluators_pass(deployed):
    model, ws, code, summary = deployed
    assert code == 0 and summary["verdict"] == "PASS", summary.get("review")
    assert [p["status"] for p in summary["phases"]] == ["passed"] * 8
    evaluation = json.loads((ws / "gates" / "independent-evaluator.json").read_text())["evidence"]
    assert evaluation["verdict"] == "PASS", evaluation["reasons"]
    phase0 = json.loads((ws / "gates" / "build-cpu-oracle.json").read_text())
    assert phase0["passed"] and "transformers" in summary["phases"][0]["summary"]  # oracle cross-checked, not skipped
    gate = json.loads((ws / "gates" / "full-model-validation.json").read_text())
    assert gate["measurements"][T.KL_MEAN] <= T.KL_MEAN_MAX  # the KL gate ran on the real tokenizer's text
    assert "KL_TEXTS" in gate["evidence"]["kl_text"]


def _with_lm_head_acc(plan, acc: str):
    """The same plan with its LM head's GEMV partitions accumulating as ``acc`` (every other kernel unchanged)."""
    out = replace(plan, prefill=replace(plan.prefill), decode=replace(plan.decode))
    for stage in (out.prefill, out.decode):
        stage.head = [
            replace(g, calls=[replace(c, config={**c.config, "acc": acc}) if c.op == "lm_head" else c for c in g.calls])
            for g in stage.head
        ]
    return out


def test_kl_gate_passes_the_deployed_plan_and_fails_a_bf16_accumulating_lm_head(deployed):
    """One realistic kernel mistake, the LM head's GEMV adding each product to its bf16 output (every running sum
    rounded, no fp32 accumulator): the same model and prompts, the gate's verdict flips on KL.

    The prefill's logits, the layers and the greedy tokens stay within the other bounds: only the KL gate sees it.
    The milder mistake, bf16 partial sums rounded once per K chunk (acc="bf16"), moves KL too little on trained weights
    to be a useful negative control (measured: mean 0.0006 against 0.0004 here, 0.003 with every projection and the
    head degraded on four layers)."""
    model, ws, _, _ = deployed
    ctx = DeployContext.create(model, ws, resume=True, settings=Settings(greedy_steps=4))
    plan = ctx.plan
    heads = [c for st in (plan.prefill, plan.decode) for g in st.head for c in g.calls if c.op == "lm_head"]
    assert heads and all(c.family == "lm_head" for c in heads)  # the deployed LM head runs on the NPU
    good, good_ev = model_gate(ctx, plan)
    assert good.passed, good.failures
    bad, bad_ev = model_gate(ctx, _with_lm_head_acc(plan, SERIAL_BF16))
    assert "error" not in bad_ev and not bad.passed  # measured, not refused: the degraded design is legal
    assert bad.failures and all(f.startswith("kl.") for f in bad.failures), bad.failures
    kl_good, kl_bad = good.measurements[T.KL_MEAN], bad.measurements[T.KL_MEAN]
    assert kl_good <= T.KL_MEAN_MAX < kl_bad and kl_bad > 10 * kl_good, (kl_good, kl_bad)


def test_evaluator_kl_rerun_alone_catches_a_serial_bf16_lm_head_swapped_in_with_rewritten_digests(deployed, tmp_path):
    """A sabotage only the evaluator's own KL re-run can catch (issue 13 item 3): after deployment the plan's LM head
    is switched to the serial-bf16 accumulator (a legal design, the same modeled time) and every gate's plan digest is
    rewritten to the new plan. Every other check passes; the phase-3 gate re-run on the evaluator's own real text
    (EVAL_KL_TEXTS) fails on KL (measured: mean 0.057)."""
    _, ws, _, _ = deployed
    dst = tmp_path / "ws"
    shutil.copytree(ws, dst)
    w = load_workspace(dst)
    w.set_plan(_with_lm_head_acc(w.plan, SERIAL_BF16))
    rewrite_plan_digests(dst)
    ev = evaluate(dst, seed=5)
    fails = {c.name: c.detail for c in ev.checks if c.status == "fail"}
    assert ev.verdict == "FAIL" and set(fails) == {"model-gate-fresh-prompts"}, fails
    assert "kl.mean" in fails["model-gate-fresh-prompts"]
