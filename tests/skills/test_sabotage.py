"""The sabotage suite (issue 13 item 4): each test tampers with a deployed workspace or with the production code the
way a reward-hacking agent would, and the independent evaluator must FAIL it, naming what it caught.

The five historical sabotages (oracle swapped into the runner, stale cached outputs, loosened thresholds, inflated
claims, changed weights) live in ``test_evaluator.py``; the kinds here complete the suite. Workspace edits are
evaluated in-process (the evaluator reads only files); code tampering runs ``tilepilot evaluate`` in a fresh
interpreter whose ``sitecustomize`` patches the installation, so no patched module leaks into other tests.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fresh_evaluation import evaluate_in_fresh_process, rewrite_plan_digests

from tilepilot.runtime.workspace import load_workspace
from tilepilot.skills import journal as J
from tilepilot.skills.evaluator import evaluate

SEED = 5


@pytest.fixture
def ws(deployment, tmp_path) -> Path:
    dst = tmp_path / "ws"
    shutil.copytree(deployment("llama").workspace, dst)
    return dst


def _gate_path(ws: Path, name: str) -> Path:
    return ws / J.GATES_DIR / f"{name}.json"


def _edit_gate(ws: Path, name: str, edit) -> None:
    p = _gate_path(ws, name)
    g = json.loads(p.read_text())
    edit(g)
    p.write_text(json.dumps(g))


def _fails(ev) -> dict[str, str]:
    return {c.name: c.detail for c in ev.checks if c.status == "fail"}


def test_sabotage_illegal_tiling_with_rewritten_digests(ws):
    """A tiling that overflows tile memory only at the timed prompt length (2048 rows), digests rewritten: the
    runner at the evaluation length never builds it, the journal's digests all match, the re-validation refuses it."""
    w = load_workspace(ws)
    plan = w.plan
    for g in plan.stage("prefill").groups():
        for c in g.calls:
            if c.op == "up_proj" and c.family == "gemm":
                c.config = {"tile_m": 64, "tile_n": 64, "tile_k": 512, "pad": True}
    w.set_plan(plan)
    rewrite_plan_digests(ws)
    ev = evaluate(ws, seed=SEED)
    fails = _fails(ev)
    assert ev.verdict == "FAIL"
    assert "legal-designs" in fails or "designs-valid" in fails, fails
    assert "claims-current" not in fails  # the digests were rewritten: only the re-validation can catch it


def test_sabotage_forged_calibration_key(ws):
    """Claims made 'under another calibration' with better numbers: they do not reproduce, so FAIL (no warning)."""

    def forge(g):
        g["evidence"]["claims"]["calibration_key"] = "000000000000"
        g["evidence"]["claims"]["ttft_s"] *= 0.5

    _edit_gate(ws, "decode-optimization", forge)
    ev = evaluate(ws, seed=SEED)
    perf = next(c for c in ev.checks if c.name == "performance-claims")
    assert ev.verdict == "FAIL" and perf.status == "fail"
    assert "calibration 000000000000" in perf.detail and "re-timed" in perf.detail


def test_sabotage_claims_slower_than_retimed_fail_too(ws):
    """A modeled figure that does not reproduce fails in either direction (no warning path)."""
    _edit_gate(
        ws,
        "decode-optimization",
        lambda g: g["evidence"]["claims"].update(ttft_s=g["evidence"]["claims"]["ttft_s"] * 1.5),
    )
    ev = evaluate(ws, seed=SEED)
    assert ev.verdict == "FAIL" and "performance-claims" in _fails(ev)


def test_sabotage_edited_gate_json(ws):
    """A phase-3 report edited to claim a KL the gate forbids while still saying PASS: its own numbers convict it."""

    def edit(g):
        g["measurements"]["kl.mean"] = 0.5
        g["passed"] = True

    _edit_gate(ws, "full-model-validation", edit)
    ev = evaluate(ws, seed=SEED)
    fails = _fails(ev)
    assert ev.verdict == "FAIL" and "report says PASS but its own measurements fail" in fails["thresholds"]


def test_sabotage_gate_recorded_on_other_weights(ws):
    """A gate file whose checkpoint digest is not the files' (copied from another deployment) FAILs."""
    _edit_gate(ws, "full-model-validation", lambda g: g.update(checkpoint_sha256="f" * 64))
    ev = evaluate(ws, seed=SEED)
    assert ev.verdict == "FAIL" and "weights-all-gates" in _fails(ev)


COPY_INPUT = """
    import tilepilot.kernels.eltwise as el

    def _fast(shape):
        def fast(inputs, *, exact=False):
            return {"c": inputs["a"].clone()}  # 'the residual add': returns its input, no work done
        return fast

    el._fast = _fast
"""


def test_sabotage_output_copied_from_an_input(ws, tmp_path):
    out = evaluate_in_fresh_process(ws, COPY_INPUT, tmp_path, SEED)
    names = {c["name"] for c in out["checks"] if c["status"] == "fail"}
    assert out["verdict"] == "FAIL" and "outputs-not-inputs" in names, out["reasons"]


STALE_KV = """
    import tilepilot.runtime.runner as nr

    nr.NpuRunner.reset = lambda self: None  # a new prompt keeps the previous sequence's KV cache
"""


def test_sabotage_stale_kv_cache(ws, tmp_path):
    out = evaluate_in_fresh_process(ws, STALE_KV, tmp_path, SEED)
    names = {c["name"] for c in out["checks"] if c["status"] == "fail"}
    assert out["verdict"] == "FAIL" and names & {"model-gate-fresh-prompts", "deterministic"}, out["reasons"]


LOWER_PRECISION = """
    import dataclasses

    import tilepilot.kernels.gemv as gv

    original = gv._fast

    def _fast(config, shape=None):  # silently bfp16 operands, bf16 partial sums, while the plan says fp32 (any folds
        # of the launch kept, so the launch still writes what the plan expects)
        return original(dataclasses.replace(config, variant="bfp16", acc="bf16"), shape)

    gv._fast = _fast
"""


def test_sabotage_lower_precision_kernel_swapped_in(ws, tmp_path):
    """The GEMV's arithmetic silently narrowed: the re-run of each kernel alone against its FP32 reference says so."""
    out = evaluate_in_fresh_process(ws, LOWER_PRECISION, tmp_path, SEED)
    fails = {c["name"]: c["detail"] for c in out["checks"] if c["status"] == "fail"}
    assert out["verdict"] == "FAIL" and "kernels-alone" in fails and "gemv" in fails["kernels-alone"], fails
