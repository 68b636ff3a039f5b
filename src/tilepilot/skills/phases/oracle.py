"""Phase 0, build-cpu-oracle: the FP32 reference every later gate trusts, checked against transformers.

Everything after this phase is judged against the oracle, so the oracle itself is judged against an
independent implementation (Hugging Face transformers in FP32) on the checkpoint itself: logits,
per-layer hidden states and a greedy continuation. transformers shares the checkpoint's mapped tensors with
the oracle (no second copy of the weights) but runs its own modeling code on them under its own parameter
names, and every shared tensor is first compared with an independent read of the safetensors files, so neither
the oracle's arithmetic nor tilepilot's loader is taken on trust. Where transformers is not installed the phase
cannot make that check; it then checks what it can (KV-cache decode equals a full recompute, finite
logits) and says so in the gate, which a later evaluator reports as a warning.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from tilepilot.gates import metrics as M
from tilepilot.gates import thresholds as T
from tilepilot.gates.gate import Gate, Threshold
from tilepilot.harness.model_gate import gate_prompts, oracle_reference
from tilepilot.model.tokenizer import checkpoint_mismatches
from tilepilot.oracle.transformers_reference import load_reference_model, run_reference
from tilepilot.skills.base import PhaseSkill
from tilepilot.skills.phases.common import WORKSPACE_INPUT, finish
from tilepilot.skills.weights import WEIGHTS_KEY, packed_digest

SRC_SELF = "tilepilot: FP32 decode with the KV cache must equal a full FP32 recompute (same arithmetic)"
KV_SELF_MAX_REL_ERR = 1e-5  # fp32 reassociation only; observed ~1e-7 on test models
STORED_MISMATCH = "weights.stored_tensors_mismatch"
SRC_STORED = (
    "tilepilot: a deployment recorded as using its GGUF's blocks as stored packs every projection from them (issue "
    "14: no dequantize-requantize round trip)"
)


def _weights_evidence(ctx) -> dict[str, Any]:
    """The recorded weight format, the fingerprint of every packed projection's bytes and how many came from the
    GGUF's stored blocks (packing them all here is what the runners of the deployment then share)."""
    weights = ctx.model.weights
    digest = packed_digest(weights)
    return {
        **(ctx.workspace.get_extra(WEIGHTS_KEY) or {"format": "bf16"}),
        "packed_sha256": digest,
        "stored_tensors_used": int(getattr(weights, "used_stored", 0)),
    }


def _hf_reference(ctx, ids: list[int], continuation: list[int], n_layers: int):
    """transformers' FP32 logits and hidden states on ``ids`` and its greedy choices along ``continuation``
    (in the checkpoint's dtype, sharing the checkpoint's mapped tensors, one module in FP32 at a time: neither a
    second copy of the weights nor an FP32 one)."""

    tensors = getattr(ctx.model.checkpoint, "get", None)
    return run_reference(load_reference_model(ctx.workspace.model_dir, tensors), ids, continuation, n_layers)


class BuildCpuOracle(PhaseSkill):
    name = "build-cpu-oracle"
    phase = 0
    description = (
        "Builds the FP32 CPU reference of the checkpoint (layer by layer, KV cache, captures) and checks it against "
        "Hugging Face transformers FP32: logits relative error <= 1e-4, top-1 equal, per-layer cosine, identical "
        "greedy tokens. Use first on any new checkpoint, before any NPU work."
    )
    purpose = "Establishes the reference every later gate compares against, and records the checkpoint's digest."
    inputs = (WORKSPACE_INPUT,)
    commands = (
        "tilepilot inspect MODEL_DIR",
        "tilepilot deploy MODEL_DIR --out WORKSPACE   # runs this phase first",
        "tilepilot skills run build-cpu-oracle WORKSPACE --json",
    )
    gate_text = (
        "Against transformers FP32 on the gate prompt: logits max relative error (max|a-b|/max|b|) <= 1e-4, top-1 "
        "equal at every position, logits cosine >= 0.999, per-layer cosine >= 0.99, no NaN/Inf, identical greedy "
        "32 tokens. Without transformers: KV-cache decode equals a full recompute (rel err <= 1e-5) and finite "
        "logits, reported as a warning."
    )
    failure_modes = (
        "Tokenizer files that disagree with the checkpoint (more tokens than embedding rows, an end id outside the "
        "vocabulary, a chat-template token the tokenizer lacks, two BOS ids): the gate fails before the oracle runs, "
        "with one sentence per problem saying what to fix.",
        "Checkpoint that disagrees with config.json (missing tensor, wrong shape): CheckpointError with the tensor "
        "name; fix the checkpoint.",
        "Oracle disagreeing with transformers: a modeling gap (RoPE scaling, bias, Q/K norm); needs a human.",
    )

    def _tokenizer_mismatch(self, ctx, digest: str):
        """A failed gate, before any oracle run, when the tokenizer files disagree with the checkpoint (one
        threshold per problem, its sentence saying what is wrong and what to do); None when they agree."""
        tok, spec = ctx.model.tokenizer, ctx.model.spec
        problems = (
            []
            if tok is None
            else checkpoint_mismatches(tok, ctx.workspace.model_dir, spec.vocab, spec.bos_id, spec.eos_ids)
        )
        if not problems:
            return None
        gate = Gate(T.phase0_gate().name, [Threshold(f"tokenizer.{k}", "<=", 0, why) for k, why in problems])
        report = gate.evaluate({f"tokenizer.{k}": 1.0 for k, _ in problems})
        sentences = [why for _, why in problems]
        evidence = {"tokenizer_mismatches": sentences, "checkpoint_sha256": digest}
        return finish(
            self, ctx, report, evidence, "the tokenizer does not match the checkpoint: " + " ".join(sentences)
        )

    def run(self, ctx):

        spec = ctx.model.spec
        digest = ctx.workspace.checkpoint_digest()
        ctx.workspace.set_extra("checkpoint_sha256", digest)
        mismatch = self._tokenizer_mismatch(ctx, digest)
        if mismatch is not None:
            return mismatch
        ids, second = gate_prompts(ctx)
        # The model gate's own reference (prompt logits, every layer's output, the 32-token greedy), computed
        # once here and reused by phases 3-5: what phase 0 certifies is exactly what they compare against.
        ctx.workspace.journal.progress(
            f"oracle: prefill of {len(ids)} tokens and a {ctx.settings.greedy_steps}-token greedy"
        )
        ref = ctx.model.reference(ids, second)
        logits = ref.logits
        # transformers runs the checkpoint; for packed weights or a quantized KV cache the oracle's code is checked on
        # the bf16 original (same code, the weights the checkpoint holds, a bf16 cache), and the deployed model's
        # reference above is what phases 3-5 compare with.
        original = ctx.model.source_oracle is ctx.model.oracle
        src = ref if original else oracle_reference(ctx.model.source_oracle, ids, second, ctx.settings.greedy_steps)
        # KV-cache self-consistency: prefill all but the last token, decode the last one.
        ctx.model.oracle.prefill(ids[:-1])
        last = ctx.model.oracle.decode(ids[-1]).logits[0]
        kv_rel = M.max_rel_err(logits[-1], last)
        m: dict[str, Any] = {
            T.NONFINITE: float(M.nonfinite_count(logits)),
            "kv_decode.max_rel_err": kv_rel,
        }
        evidence: dict[str, Any] = {"prompt_ids": ids, "checkpoint_sha256": digest}
        weights = _weights_evidence(ctx)
        evidence["weights"] = weights
        m[STORED_MISMATCH] = float(abs(weights["stored_tensors_used"] - weights.get("stored_tensors", 0)))
        have_hf = importlib.util.find_spec("transformers") is not None
        if have_hf:
            ctx.workspace.journal.progress(
                "transformers reference: one FP32 pass over the prompt and the oracle's greedy"
            )
            hf = _hf_reference(ctx, ids, src.greedy_tokens, spec.n_layers)
            layer_cos = [M.cosine(h, mine) for h, mine in zip(hf.hidden, src.layers, strict=True)]
            # The last HF hidden state is taken after the final norm; compare only the layers before it.
            layer_cos = layer_cos[:-1] or [M.cosine(src.logits, hf.logits)]
            m.update(
                {
                    T.LOGITS_MAX_REL_ERR: M.max_rel_err(hf.logits, src.logits),
                    T.LOGITS_TOP1: M.top1_agreement(hf.logits, src.logits),
                    T.LOGITS_COSINE: M.cosine(hf.logits, src.logits),
                    T.LAYERS_MIN_COSINE: min(layer_cos),
                    T.GREEDY_IDENTICAL: float(hf.choices == src.greedy_tokens),
                }
            )
            evidence.update(reference="transformers", layer_cosine=layer_cos, greedy=src.greedy_tokens)
            gate = Gate(
                T.phase0_gate().name,
                [
                    *T.phase0_gate().thresholds,
                    Threshold("kv_decode.max_rel_err", "<=", KV_SELF_MAX_REL_ERR, SRC_SELF),
                    Threshold(STORED_MISMATCH, "<=", 0, SRC_STORED),
                ],
            )
            what = "oracle matches transformers FP32"
        else:
            evidence.update(reference="none", warning="transformers is not installed: oracle not cross-checked")
            gate = Gate(
                T.phase0_gate().name + "-self",
                [
                    Threshold("kv_decode.max_rel_err", "<=", KV_SELF_MAX_REL_ERR, SRC_SELF),
                    Threshold(T.NONFINITE, "<=", 0, T.SRC_FINITE),
                    Threshold(STORED_MISMATCH, "<=", 0, SRC_STORED),
                ],
            )
            what = "oracle self-consistent (transformers not installed: not cross-checked)"
        report = gate.evaluate(m)
        if not report.passed:
            what = "oracle does not match transformers FP32" if have_hf else "oracle is not self-consistent"
        return finish(self, ctx, report, evidence, f"{what}; logits rel err {m.get(T.LOGITS_MAX_REL_ERR, kv_rel):.2e}")
