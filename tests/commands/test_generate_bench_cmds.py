"""`tilepilot generate` and `tilepilot bench` end to end on a reduced (2-layer) zoo checkpoint."""

from __future__ import annotations

import json

import pytest

from tilepilot.cli import main
from tilepilot.npu.calibration import CALIBRATION
from tilepilot.runtime.eta import decode_streamed_bytes
from tilepilot.runtime.workspace import load_workspace, make_workspace


@pytest.fixture(scope="module")
def model_dir(zoo_model):
    return zoo_model("qwen3-0.6b", layers=2)


@pytest.fixture(scope="module")
def workspace(model_dir, tmp_path_factory):
    return make_workspace(model_dir, "paper-like", tmp_path_factory.mktemp("ws") / "ws").path


def test_generate_streams_text_and_ends_with_labelled_figures(workspace, capsys):
    rc = main(["generate", str(workspace), "--prompt", "The quick brown fox", "--max-new-tokens", "6"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    last = out[-1]
    assert last.startswith("[prompt ") and "generated 6 tokens" in last
    assert "modeled TTFT" in last and "modeled decode" in last and "measured host wall time" in last


def test_generate_sampling_is_reproducible_with_a_seed(workspace, capsys):
    args = ["generate", str(workspace), "--prompt", "Hello", "--max-new-tokens", "5", "--temperature", "1.0"]
    args += ["--top-k", "50", "--top-p", "0.9", "--seed", "7", "--chat"]
    main(args)
    first = capsys.readouterr().out.splitlines()[0]
    main(args)
    assert capsys.readouterr().out.splitlines()[0] == first


def test_generate_errors_are_one_sentence(workspace, tmp_path, capsys):
    assert main(["generate", str(tmp_path / "nope"), "--prompt", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["generate", str(workspace), "--prompt", "x", "--top-p", "0"]) == 2
    assert "top-p must be in (0, 1]" in capsys.readouterr().err
    long_prompt = "word " * 50000
    assert main(["generate", str(workspace), "--prompt", long_prompt, "--max-new-tokens", "1"]) == 2
    assert "but the model's context is 40960; shorten it" in capsys.readouterr().err


def test_bench_json_on_a_workspace(workspace, tmp_path, capsys):
    trace = tmp_path / "trace.json"
    rc = main(["bench", str(workspace), "--prompt-len", "256", "--decode-tokens", "3", "--json", "--trace", str(trace)])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    m, f = res["modeled"], res["functional_run"]
    assert res["plan"] == "paper-like" and m["prompt_len"] == 256
    assert m["ttft_s"] > 0 and m["decode_ms_per_token"] > 0 and m["decode_tok_s"] > 0
    assert m["dispatches_per_layer"] == {"prefill": 3, "decode": 2}
    assert {g["name"] for g in m["groups"]} >= {"rms_gemms_rope", "flash_attn", "o_ffn", "lm_head", "cpu_attention"}
    assert f["prompt_tokens_executed"] == 32 and f["decode_steps"] == 3
    assert f["dispatches_traced"] == (2 * 3 + 1) + 3 * (2 * 2 + 1)  # prefill (2 layers + head) + 3 decode steps
    assert "traceEvents" in json.loads(trace.read_text())


def test_bench_a_model_dir_with_a_builtin_plan(model_dir, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    rc = main(["bench", str(model_dir), "--plan", "iron-like", "--prompt-len", "64", "--decode-tokens", "1"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "iron-like" in out and "modeled" in out and "measured" in out
    # the per-stage group tables read whole in an 80-column terminal: every group name and its numbers, uncut
    assert "prefill groups" in out and "decode groups" in out and "…" not in out.split("prefill groups")[1]
    assert max(len(line) for line in out.split("prefill groups")[1].splitlines()) <= 80
    assert main(["bench", str(model_dir), "--plan", "deployed"]) == 2
    assert "not a workspace" in capsys.readouterr().err


def test_bench_states_same_model_speedups_and_no_silicon_claim_for_a_reduced_model(workspace, capsys):
    """Issue 11 item 8: the deployed plan against the same model's paper-like and iron-like plans, same run."""
    rc = main(["bench", str(workspace), "--prompt-len", "256", "--decode-tokens", "1", "--json"])
    assert rc == 0
    c = json.loads(capsys.readouterr().out)["claims"]
    # the workspace deploys the paper-like plan: 1.0x over itself, exactly (deterministic modeled time)
    assert c["speedup_over_paper_like"] == {"ttft": 1.0, "decode": 1.0}
    assert c["speedup_over_iron_like"]["ttft"] > 1 and c["speedup_over_iron_like"]["decode"] > 1
    assert c["model_error_vs_silicon"] is None  # 2 layers at 256 tokens: nothing published to compare with


def test_bench_states_the_plans_weight_streaming_bound(workspace, capsys):
    """The bound is the plan's decode weights per token over the model's DDR rate, computed apart from the timing of
    any launch; every launch is bounded by its own DDR bytes, so no plan may reach more than all of it."""
    rc = main(["bench", str(workspace), "--prompt-len", "256", "--decode-tokens", "1", "--json"])
    assert rc == 0
    m = json.loads(capsys.readouterr().out)["modeled"]
    ws = load_workspace(workspace)
    bytes_per_token = decode_streamed_bytes(ws.spec, ws.plan.weight_format())
    assert m["weight_streaming_bound_tok_s"] == pytest.approx(CALIBRATION.ddr_bytes_per_s / bytes_per_token)
    assert m["decode_of_bound"] == pytest.approx(m["decode_tok_s"] / m["weight_streaming_bound_tok_s"])
    assert 0 < m["decode_of_bound"] < 1
    # the DDR floor adds the KV readback the step streams at its context: K and V, bf16, every layer
    spec = ws.spec
    kv = spec.n_layers * m["decode_kv_rows"] * 2 * spec.n_kv_heads * spec.head_dim * 2
    assert m["decode_kv_rows"] >= m["decode_context_len"] - 1
    assert m["ddr_floor_tok_s"] == pytest.approx(CALIBRATION.ddr_bytes_per_s / (bytes_per_token + kv))
    assert m["decode_of_bound"] < m["decode_of_floor"] < 1
    assert "decode DDR floor" in _table(workspace, capsys)


def _table(workspace, capsys) -> str:
    assert main(["bench", str(workspace), "--prompt-len", "256", "--decode-tokens", "1"]) == 0
    return capsys.readouterr().out


def test_bench_splits_a_one_dispatch_decode_by_launch_kind(model_dir, capsys):
    """A one-dispatch decode (the air-q4 plan) is broken down by launch kind: the kinds' launches and modeled times
    add up to the dispatch's launches, each kind's fills and drains are a part of its time, and its DDR time is its
    bytes at the model's DDR rate. A plan dispatched per group has no such breakdown."""
    rc = main(["bench", str(model_dir), "--plan", "air-q4", "--prompt-len", "64", "--decode-tokens", "1", "--json"])
    assert rc == 0
    m = json.loads(capsys.readouterr().out)["modeled"]
    dl = m["decode_launches"]
    kinds = {k["kind"]: k for k in dl["kinds"]}
    assert {"qgemv", "rmsnorm", "attention"} <= set(kinds)
    # the kinds hold every launch of the decode dispatch once: with its host round trip and tile configuration they
    # make up exactly the dispatch's time, the one the per-group table gives for the decode step's dispatch
    total = dl["dispatch_s"] + dl["switches_and_config_s"] + sum(k["seconds"] for k in dl["kinds"])
    assert total == pytest.approx(dl["seconds"], rel=1e-12)
    one = [g for g in m["groups"] if g["stage"] == "decode" and g["name"] == "decode_one_dispatch"]
    assert len(one) == 1 and one[0]["dispatch_ms"] == pytest.approx(dl["seconds"] * 1e3, rel=1e-12)
    assert sum(k["launches"] for k in dl["kinds"]) == dl["launches"] > 2 * 9  # two layers' launches, and the head
    assert dl["prefetch"] is None  # AIR's plan does not fetch weights ahead (``npu/prefetch.py``)
    for k in dl["kinds"]:
        assert 0 < k["fill_drain_s"] < k["seconds"]
        assert k["ddr_s"] == pytest.approx(k["ddr_bytes"] / CALIBRATION.ddr_bytes_per_s)
    assert main(["bench", str(model_dir), "--plan", "iron-like", "--prompt-len", "64", "--decode-tokens", "1"]) == 0
    assert "by launch kind" not in capsys.readouterr().out


def test_generate_warns_when_the_deployment_has_not_passed_its_gates(model_dir, tmp_path, capsys):
    """A workspace holds a runnable plan from its first phase on; until every phase's gate has passed, running it
    says so (the output is not validated), and the evaluator's FAIL is named."""
    from tilepilot.skills.journal import Journal
    from tilepilot.skills.registry import phases

    ws = make_workspace(model_dir, "paper-like", tmp_path / "ws").path
    args = ["generate", str(ws), "--prompt", "Hello", "--max-new-tokens", "2"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "phase 0 build-cpu-oracle has not run to its gate" in err and "--resume" in err
    journal = Journal(ws)
    for skill in phases():
        journal.write_gate(skill.name, {"passed": True, "verdict": "PASS"})
    journal.write_gate("independent-evaluator", {"passed": False, "verdict": "FAIL"})
    assert main(args) == 0
    assert "phase 7 independent-evaluator ended FAIL" in capsys.readouterr().err
    journal.write_gate("independent-evaluator", {"passed": True, "verdict": "PASS"})
    assert main(args) == 0
    assert "warning" not in capsys.readouterr().err
