"""Quantized deployments: packed weights run in decode, every gate compares with the oracle of the *deployed*
(dequantized) model, ``deploy --weights`` reaches the evaluator's PASS on each family and on the trained model (its
GGUF blocks as stored), the evaluator refuses a deployment whose recorded format does not match its files, and the
quantization error against the bf16 original is reported beside the gates, never inside one."""

from __future__ import annotations

import argparse
import io
import json
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch
from tiny import write_tiny

from tilepilot.cli import main
from tilepilot.commands.deploy import weight_args, weight_format
from tilepilot.errors import InputError, WorkspaceError
from tilepilot.harness.quant_quality import quantization_quality
from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.quant import (
    DEFAULT_BF16_TENSORS,
    LINEAR_FIELDS,
    QuantizedWeights,
    WeightFormat,
    deployment_weights,
)
from tilepilot.model.spec import load_spec
from tilepilot.model.tokenizer import Tokenizer
from tilepilot.oracle.model import Oracle
from tilepilot.plan.builtin import default_plan
from tilepilot.plan.plan import check_plan, with_weights
from tilepilot.runtime.runner import NpuRunner
from tilepilot.skills import journal as J
from tilepilot.skills.context import DeployContext, Settings
from tilepilot.skills.evaluator import evaluate
from tilepilot.skills.weights import AS_STORED, ROUND_TO_NEAREST, UNPACKED, WEIGHTS_KEY, check_format, weights_record

PASS = ("PASS", "PASS-with-warnings")
# One format per family so each format and each family is deployed end to end once (four full deployments of
# one-layer tiny models; every (family, format) pair would be twelve for no new code path), and a q8_0 KV cache on
# one of them (``--kv-cache``): its writes are kvquant launches and its gates compare with the oracle under it.
FAMILY_FORMATS = (("llama", "q4_0", "q8_0"), ("smollm2", "q4_1", "bf16"), ("qwen2", "q8_0", "bf16"),
                  ("qwen3", "q4_0", "bf16"))  # fmt: skip


def _deploy(model: Path, ws: Path, knowledge: Path, *flags: str) -> tuple[int, dict]:
    buf = io.StringIO()
    args = ["deploy", str(model), "--out", str(ws), "--json", "--knowledge", str(knowledge), "--tune-candidates", "2"]
    with redirect_stdout(buf):
        code = main([*args, *flags])
    return code, json.loads(buf.getvalue())


@pytest.fixture(scope="session")
def quantized(tmp_path_factory):
    """``quantized(family, fmt)``: the family's one-layer tiny model deployed with ``--weights fmt`` (once)."""
    base = tmp_path_factory.mktemp("quantized")
    done: dict[tuple[str, str, str], tuple[Path, int, dict]] = {}

    def get(family: str, fmt: str, kv: str = "bf16"):
        key = (family, fmt, kv)
        if key not in done:
            model = write_tiny(family, base / f"tiny-{family}", layers=1)
            ws = base / f"ws-{family}-{fmt}-{kv}"
            done[key] = (ws, *_deploy(model, ws, base / "knowledge", "--weights", fmt, "--kv-cache", kv))
        return done[key]

    return get


def _record(ws: Path) -> dict:
    return json.loads((ws / J.DEPLOYMENT).read_text())


@pytest.mark.parametrize(("family", "fmt", "kv"), FAMILY_FORMATS)
def test_deploy_weights_reaches_pass_on_every_family(quantized, family, fmt, kv):
    ws, code, s = quantized(family, fmt, kv)
    assert code == 0 and s["verdict"] in PASS, s.get("review")
    d = _record(ws)
    assert d[WEIGHTS_KEY]["format"] == fmt and d[WEIGHTS_KEY]["packing"] == ROUND_TO_NEAREST
    assert d["plan"]["weights"]["format"] == fmt
    fams = {c["family"] for g in d["plan"]["decode"]["block"] for c in g["calls"]}
    assert "qgemv" in fams and "gemv" not in fams  # decode streams the packed blocks
    oracle_gate = json.loads((ws / J.GATES_DIR / "build-cpu-oracle.json").read_text())
    assert oracle_gate["evidence"]["weights"]["packed_sha256"]
    ev = json.loads((ws / J.GATES_DIR / "independent-evaluator.json").read_text())["evidence"]
    assert any(c["name"] == "weight-format" and c["status"] == "pass" for c in ev["checks"])
    # the reported measure, labelled, in the summary and the journal; no gate threshold reads it
    q = s["quantization_error"]
    assert "not a gate" in q["label"] and q["kl_mean"] > 0 and 0 < q["top1_agreement"] <= 1
    assert (ws / "quantization_error.md").is_file()
    gates = [json.loads(p.read_text()) for p in (ws / J.GATES_DIR).glob("*.json")]
    assert not [t for g in gates for t in g.get("thresholds", []) if "quantization" in t["metric"]]
    assert s["performance"]["weights"].startswith(fmt)
    # the KV cache's format: recorded, and every NPU write and read of the optimized plan in it
    assert d["plan"]["weights"]["kv_cache"] == kv and d[WEIGHTS_KEY]["kv_cache"] == kv
    calls = [(c, g["where"]) for st in ("prefill", "decode") for g in d["plan"][st]["block"] for c in g["calls"]]
    writes = {c["family"] for c, where in calls if c["op"] == "kv_write" and where == "npu"}
    reads = {c["config"].get("kv_format", "bf16") for c, where in calls if c["op"] == "attention" and where == "npu"}
    assert writes == {"kvquant" if kv == "q8_0" else "kv_cache"} and reads == {kv}
    assert (f"KV cache {kv}" in s["performance"]["weights"]) == (kv != "bf16")


def test_trained_smollm2_deploys_its_q4_1_blocks_as_stored(smollm2_dir, tmp_path):
    """The trained model (cut to one layer), Q4_1 from its GGUF: every projection streams the file's own blocks."""
    model = smollm2_dir(layers=1)
    code, s = _deploy(model, tmp_path / "ws", tmp_path / "knowledge", "--weights", "q4_1")
    assert code == 0 and s["verdict"] in PASS, s.get("review")
    rec = _record(tmp_path / "ws")[WEIGHTS_KEY]
    assert rec["packing"] == AS_STORED and rec["stored_tensors"] == rec["packed_tensors"] == 7
    oracle_gate = json.loads((tmp_path / "ws" / J.GATES_DIR / "build-cpu-oracle.json").read_text())
    assert oracle_gate["evidence"]["weights"]["stored_tensors_used"] == 7
    q = s["quantization_error"]
    assert q["text"].startswith("shipped real text") and q["perplexity_deployed"] > 1


def test_a_gguf_input_deploys_its_own_format_by_default_and_a_directory_bf16(smollm2_dir, smollm2_gguf):
    model = smollm2_dir(layers=1)

    def args(src, **kw):
        return argparse.Namespace(model_dir=Path(src), weights=None, block=None, keep_bf16="", resume=False, **kw)

    assert weight_format(args(smollm2_gguf), model) == WeightFormat("q4_1")
    assert weight_format(args(model), model) == WeightFormat("bf16")


def test_bad_weight_values_are_one_sentence_and_nothing_is_written(tiny_model, tmp_path, capsys):
    model = tiny_model("llama", layers=1)
    for flags, words in (
        (["--weights", "q5_0"], "is not a weight format"),
        (["--weights", "q4_0", "--block", "48"], "does not divide K=512"),
        (["--weights", "q4_0", "--block", "7"], "is not an even number"),
        (["--weights", "q4_0", "--block", "x"], "is not a number"),
        (["--weights", "q8_0", "--keep-bf16", "w_foo"], "not a projection tilepilot packs"),
        # block options with bf16 weights (the default of a model directory, or named): refused before any work, not
        # after the whole deployment at phase 7 ("records bf16 weights but its plan deploys bf16 (block 32, ...)")
        (["--block", "64"], "--block applies only to a block format"),
        (["--weights", "bf16", "--block", "32"], "--block applies only to a block format"),
        (["--keep-bf16", "wq"], "--keep-bf16 applies only to a block format"),
        (["--weights", "bf16", "--block", "64", "--keep-bf16", "wq"], "--block and --keep-bf16 apply only to a block"),
        # a block format that packs nothing is not a deployment in that format
        (["--weights", "q4_0", "--keep-bf16", ",".join(LINEAR_FIELDS)], "nothing would be packed in q4_0"),
    ):
        assert main(["deploy", str(model), "--out", str(tmp_path / "ws"), *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tilepilot: error:") and err.count("\n") == 1 and words in err, err
        assert not (tmp_path / "ws").exists()


def test_block_options_apply_to_a_gguf_inputs_own_format(smollm2_dir):
    """A GGUF input defaults to its stored block format, so --block and --keep-bf16 are not refused before import
    (what the format is becomes known then); once it is known to be bf16 they are."""
    model = smollm2_dir(layers=1)

    def args(src, **kw):
        return argparse.Namespace(model_dir=Path(src), weights=None, block="64", keep_bf16="wq", resume=False, **kw)

    assert weight_args(args("model.gguf"))[1:] == (64, ("wq",))
    assert weight_format(args(Path("model.gguf")), model) == WeightFormat("q4_1", 64, (*DEFAULT_BF16_TENSORS, "wq"))
    with pytest.raises(InputError, match="only to a block format"):
        weight_args(args(model))


def test_a_bf16_format_with_block_options_or_a_format_packing_nothing_is_refused(tiny_model):
    """What the CLI refuses is refused to any caller of DeployContext too (check_format), and the record never
    labels an empty set of packed projections as the GGUF's blocks "as stored"."""
    model = tiny_model("llama", layers=1)
    spec = load_spec(model)
    for fmt in (WeightFormat("bf16", 64), WeightFormat("bf16", bf16_tensors=(*DEFAULT_BF16_TENSORS, "wq"))):
        with pytest.raises(InputError, match="only to a block format"):
            check_format(fmt, spec)
    check_format(WeightFormat("bf16"), spec)
    nothing = WeightFormat("q4_0", bf16_tensors=(*DEFAULT_BF16_TENSORS, *LINEAR_FIELDS))
    with pytest.raises(InputError, match="nothing would be packed"):
        check_format(nothing, spec)
    rec = weights_record(nothing, model, spec)
    assert rec["packing"] == UNPACKED and rec["packed_tensors"] == 0
    head_only = WeightFormat("q4_0", bf16_tensors=("embed", *LINEAR_FIELDS))  # the LM head alone is packed
    check_format(head_only, spec)
    assert weights_record(head_only, model, spec)["packing"] == ROUND_TO_NEAREST


def test_resume_keeps_the_recorded_format(tiny_model, tmp_path):
    model = tiny_model("llama", layers=1)
    DeployContext.create(model, tmp_path / "ws", settings=Settings(weights=WeightFormat("q4_0")))
    ctx = DeployContext.create(model, tmp_path / "ws", resume=True)
    assert ctx.workspace.plan.weight_format().format == "q4_0" and ctx.model.format.format == "q4_0"
    with pytest.raises(WorkspaceError, match="deploys q4_0"):
        DeployContext.create(model, tmp_path / "ws", resume=True, settings=Settings(weights=WeightFormat("q8_0")))


def test_the_evaluator_refuses_a_recorded_format_its_files_do_not_match(quantized, tmp_path):
    src, code, _ = quantized("llama", "q4_0", "q8_0")
    assert code == 0
    ws = tmp_path / "ws"
    shutil.copytree(src, ws)
    d = json.loads((ws / J.DEPLOYMENT).read_text())
    d[WEIGHTS_KEY]["format"] = "q8_0"  # the record says q8_0, the plan and the packed bytes are q4_0
    (ws / J.DEPLOYMENT).write_text(json.dumps(d))
    ev = evaluate(ws, seed=3)
    bad = [c for c in ev.checks if c.name == "weight-format"]
    assert ev.verdict == "FAIL" and bad and bad[0].status == "fail" and "records q8_0" in bad[0].detail


def test_quantized_runner_matches_the_oracle_of_the_deployed_model(tiny_model):
    ck = load_checkpoint(tiny_model("qwen2", layers=1))
    plan = with_weights(default_plan(ck.spec), WeightFormat("q4_1"))
    check_plan(plan)
    runner = NpuRunner(plan, ck)
    assert isinstance(runner.weights, QuantizedWeights)
    oracle = Oracle(deployment_weights(ck, plan.weight_format()))
    ids = [1, 5, 9, 13]
    a, b = runner.prefill(ids).logits[-1], oracle.prefill(ids).logits[-1]
    nxt = int(b.argmax())
    a2, b2 = runner.decode(nxt).logits[-1], oracle.decode(nxt).logits[-1]
    for npu, ref in ((a, b), (a2, b2)):
        assert torch.nn.functional.cosine_similarity(npu.float(), ref.float(), dim=0) > 0.999
    assert not torch.equal(Oracle(ck).prefill(ids).logits[-1], b)  # the quantized model is not the bf16 one


def test_quantization_error_moves_with_the_format(smollm2_dir):
    """Same model, same text: 4-bit blocks are further from the bf16 original than 8-bit ones."""
    ck = load_checkpoint(smollm2_dir(layers=1))
    original = Oracle(ck)
    tok = Tokenizer.from_dir(smollm2_dir(layers=1))
    q = {}
    for fmt in ("q4_0", "q8_0"):
        runner = NpuRunner(with_weights(default_plan(ck.spec), WeightFormat(fmt)), ck)
        q[fmt] = quantization_quality(runner, original, tok)
    assert q["q8_0"]["text"].startswith("shipped real text")
    assert 0 < q["q8_0"]["kl_mean"] < q["q4_0"]["kl_mean"]
    assert q["q8_0"]["top1_agreement"] >= q["q4_0"]["top1_agreement"]
    assert abs(q["q8_0"]["perplexity_deployed"] - q["q8_0"]["perplexity_original"]) < abs(
        q["q4_0"]["perplexity_deployed"] - q["q4_0"]["perplexity_original"]
    )
