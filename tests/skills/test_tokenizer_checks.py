"""Phase 0 catches a tokenizer or chat template that does not belong to the checkpoint, before any NPU work: one case
per mistake, each made on a copy of the trained SmolLM2-135M's files (real tokenizer, template and configs, weights
linked), each reported as one sentence naming the problem and what to do."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tilepilot.model.spec import load_spec
from tilepilot.model.tokenizer import Tokenizer, checkpoint_mismatches
from tilepilot.skills.context import DeployContext, Settings
from tilepilot.skills.orchestrator import Orchestrator
from tilepilot.skills.phases.oracle import BuildCpuOracle


@pytest.fixture
def model_copy(smollm2_dir, tmp_path) -> Path:
    """The one-layer trained model's small files copied, its weights linked: a checkpoint whose files a test edits."""
    src = smollm2_dir(layers=1)
    out = tmp_path / "model"
    out.mkdir()
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            os.symlink(f, out / f.name)
        else:
            shutil.copy(f, out / f.name)
    return out


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _mismatches(model: Path) -> list[tuple[str, str]]:
    spec = load_spec(model)
    return checkpoint_mismatches(Tokenizer.from_dir(model), model, spec.vocab, spec.bos_id, spec.eos_ids)


def test_the_checkpoints_own_tokenizer_matches(model_copy):
    assert _mismatches(model_copy) == []


def test_tokenizer_with_more_tokens_than_embedding_rows(model_copy):
    def add(tok):
        tok["added_tokens"].append(
            {"id": 49152, "content": "<|tool_call|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
        )  # fmt: skip

    _edit(model_copy / "tokenizer.json", add)
    [(key, why)] = _mismatches(model_copy)
    assert key == "vocab_exceeds_embedding"
    assert "49153 tokens" in why and "49152 rows" in why and "use the tokenizer" in why


def test_end_of_generation_id_outside_the_vocabulary(model_copy):
    _edit(model_copy / "generation_config.json", lambda g: g.update(eos_token_id=[2, 49155]))
    [(key, why)] = _mismatches(model_copy)
    assert key == "eos_outside_vocab.generation_config.json"
    assert why.startswith("generation_config.json names end-of-generation id 49155") and "'<|im_end|>' is id 2" in why


def test_chat_template_naming_a_token_the_tokenizer_lacks(model_copy):
    """A Llama-3 style end-of-turn token in a template for a ChatML tokenizer."""
    _edit(model_copy / "tokenizer_config.json", lambda c: c.update(chat_template=c["chat_template"].replace(
        "<|im_end|>", "<|eot_id|>")))  # fmt: skip
    [(key, why)] = _mismatches(model_copy)
    assert key == "template_token_missing" and "<|eot_id|>" in why and "<|im_start|>" not in why


def test_bos_disagreement_between_config_and_tokenizer(model_copy):
    _edit(model_copy / "config.json", lambda c: c.update(bos_token_id=0))
    [(key, why)] = _mismatches(model_copy)
    assert key == "bos_disagrees"
    assert "config.json says BOS is id 0" in why and "'<|im_start|>' is id 1" in why


def test_phase0_stops_on_a_mismatch_before_the_oracle_and_the_deployment_says_why(model_copy, tmp_path):
    _edit(model_copy / "generation_config.json", lambda g: g.update(eos_token_id=49155))
    ctx = DeployContext.create(model_copy, tmp_path / "ws", settings=Settings(greedy_steps=4))
    result = BuildCpuOracle().run(ctx)
    assert not result.ok and "the tokenizer does not match the checkpoint" in result.summary
    assert result.evidence["tokenizer_mismatches"][0].startswith("generation_config.json names end-of-generation")
    assert not ctx.model.cache  # no oracle run on a checkpoint whose tokenizer is wrong
    summary = Orchestrator(ctx).run()
    assert summary.verdict == "needs-human-review" and "49155" in summary.review and "eos_token_id" in summary.review
    assert [p.status for p in summary.phases][1:] == ["pending"] * 7
