"""The independent evaluator: a clean deployment passes; each sabotage FAILs with its reason named.

Sabotages that edit the workspace are evaluated in-process (the evaluator reads only files); the two that
change the code of the production path run ``tilepilot evaluate`` in a fresh interpreter whose
``sitecustomize`` patches the runner, as a tampered installation would.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fresh_evaluation import evaluate_in_fresh_process

from tilepilot.skills import journal as J
from tilepilot.skills.evaluator import OracleCallAudit, evaluate

SEED = 11


@pytest.fixture
def ws(deployment, tmp_path) -> Path:
    """A private copy of the deployed tiny Llama workspace, safe to sabotage."""
    dst = tmp_path / "ws"
    shutil.copytree(deployment("llama").workspace, dst)
    return dst


def _gate(ws: Path, name: str) -> tuple[Path, dict]:
    p = ws / J.GATES_DIR / f"{name}.json"
    return p, json.loads(p.read_text())


def _reasons(ev) -> str:
    return " ".join(c.detail for c in ev.checks if c.status == "fail")


def test_clean_deployment_passes_and_read_nothing_but_deployment_json(ws):
    _, g = _gate(ws, "independent-evaluator")  # phase 7 ran the evaluator in a fresh process
    checks = {c["name"]: c for c in g["evidence"]["checks"]}
    assert g["passed"] and checks["independence"]["status"] == "pass"
    assert checks["no-oracle-in-production"]["status"] == "pass"
    assert checks["dispatches-prefill"]["status"] == checks["dispatches-decode"]["status"] == "pass"
    ev = evaluate(ws, seed=SEED)
    assert ev.verdict in ("PASS", "PASS-with-warnings"), _reasons(ev)
    assert "Verdict: PASS" in (ws / J.EVALUATION).read_text()
    assert (
        ev.measured["prompts"]["first"]
        != json.loads((ws / J.GATES_DIR / "build-cpu-oracle.json").read_text())["evidence"]["prompt_ids"]
    )


ORACLE_SWAP = """
    import tilepilot.runtime.runner as nr
    from tilepilot.oracle.model import Oracle

    _init, _prefill, _decode = nr.NpuRunner.__init__, nr.NpuRunner.prefill, nr.NpuRunner.decode

    def __init__(self, plan, weights, *a, **k):
        _init(self, plan, weights, *a, **k)
        self._oracle = None if self.dry else Oracle(weights)  # time_plan's dry runs stay untouched

    def _step(self, out, capture):
        n = self.spec.n_layers
        layers = [out.captures[f"layer{i}.out"] for i in range(n)] if capture else None
        return nr.RunnerStep(logits=out.logits, layer_outputs=layers, start=out.start)

    def _names(self, capture):
        return [f"layer{i}.out" for i in range(self.spec.n_layers)] if capture else False

    def prefill(self, ids, capture_layers=False, all_logits=True):
        if self._oracle is None:
            return _prefill(self, ids, capture_layers, all_logits)
        return _step(self, self._oracle.prefill(list(ids), capture=_names(self, capture_layers)), capture_layers)

    def decode(self, token_id, capture_layers=False):
        if self._oracle is None:
            return _decode(self, token_id, capture_layers)
        return _step(self, self._oracle.decode(int(token_id), capture=_names(self, capture_layers)), capture_layers)

    nr.NpuRunner.__init__, nr.NpuRunner.prefill, nr.NpuRunner.decode = __init__, prefill, decode
"""


def test_sabotage_oracle_swapped_into_the_runner(ws, tmp_path):
    out = evaluate_in_fresh_process(ws, ORACLE_SWAP, tmp_path, SEED)
    reasons = " ".join(out["reasons"])
    assert out["verdict"] == "FAIL"
    assert "oracle code ran in the production path" in reasons
    assert "bit-identical to the FP32 oracle" in reasons and "NPU dispatches but the plan implies" in reasons


STALE_CACHE = """
    import tilepilot.runtime.runner as nr

    _prefill = nr.NpuRunner.prefill

    def prefill(self, ids, capture_layers=False, all_logits=True):
        if self.dry:
            return _prefill(self, ids, capture_layers, all_logits)
        if getattr(self, "_cached", None) is None:  # serve the first prompt's outputs from then on
            self._cached = _prefill(self, ids, capture_layers, all_logits)
        return self._cached

    nr.NpuRunner.prefill = prefill
"""


def test_sabotage_stale_cached_outputs(ws, tmp_path):
    out = evaluate_in_fresh_process(ws, STALE_CACHE, tmp_path, SEED)
    reasons = " ".join(out["reasons"])
    assert out["verdict"] == "FAIL" and "stale outputs: first prompt correct, the second wrong" in reasons
    fails = {c["name"] for c in out["checks"] if c["status"] == "fail"}
    assert "outputs-distinct" in fails  # two different prompts, one answer


def test_sabotage_stale_cached_gate_results(ws):
    """Gate files kept from another plan (the deployed plan swapped afterwards) are stale claims."""
    from tilepilot.plan.builtin import paper_like_plan
    from tilepilot.runtime.workspace import load_workspace

    w = load_workspace(ws)
    w.set_plan(paper_like_plan(w.spec))
    ev = evaluate(ws, seed=SEED)
    assert ev.verdict == "FAIL" and "stale results" in _reasons(ev)


def test_sabotage_thresholds_loosened_in_the_workspace(ws):
    path, g = _gate(ws, "full-model-validation")
    for t in g["thresholds"]:
        if t["metric"] == "logits.cosine":
            t["value"] = 0.5
    path.write_text(json.dumps(g))
    ev = evaluate(ws, seed=SEED)
    assert ev.verdict == "FAIL"
    assert "thresholds in the workspace were loosened" in _reasons(ev) and "logits.cosine >= 0.5" in _reasons(ev)


def test_sabotage_performance_claims_inflated(ws):
    path, g = _gate(ws, "decode-optimization")
    g["evidence"]["claims"]["ttft_s"] *= 0.5
    g["evidence"]["claims"]["decode_ms_per_token"] *= 0.5
    path.write_text(json.dumps(g))
    ev = evaluate(ws, seed=SEED)
    assert ev.verdict == "FAIL" and "performance claims do not reproduce" in _reasons(ev)


def test_weights_changed_after_deployment_fail(ws, deployment, tmp_path):
    from safetensors.torch import load_file, save_file

    from tilepilot.runtime.workspace import load_workspace

    model = tmp_path / "model"
    shutil.copytree(deployment("llama").model, model)
    tensors = load_file(str(model / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 1.01
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    w = load_workspace(ws)
    w.model_dir = model
    w.save()
    ev = evaluate(ws, seed=SEED)
    assert ev.verdict == "FAIL" and "the weights are not the ones validated" in _reasons(ev)


def test_oracle_call_audit_sees_aliased_calls():
    import torch

    from tilepilot.oracle import ops

    alias = ops.rmsnorm  # imported under another name: still audited
    with OracleCallAudit() as audit:
        alias(torch.ones(2, 4), torch.ones(4), 1e-6)
    assert audit.calls["ops.rmsnorm"] == 1
