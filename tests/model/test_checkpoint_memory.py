"""Loading holds one copy of the weights: what ``Checkpoint.get`` returns is the file's bytes, not a copy.

Issue 2 caps a full-size load at ~1.3x the bf16 size of resident memory (measured by
``benchmarks/load_memory.py``). These tests pin the properties that make that hold, deterministically
and without measuring RSS: no dtype conversion of stored bf16, no tensor that is a view into a larger
private buffer (e.g. the whole file read into memory), no reference kept by the loader, and the tensor
data living in the checkpoint file's memory mapping (page cache) rather than in an anonymous copy.
"""

import gc
import json
import sys
import weakref
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tilepilot.model.checkpoint import load_checkpoint
from tilepilot.model.spec import spec_from_config

CFG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 96,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 128,
}


def _write_sharded(tmp_path: Path) -> dict[str, torch.Tensor]:
    spec = spec_from_config(CFG)
    g = torch.Generator().manual_seed(1)
    tensors = {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in spec.tensor_shapes().items()}
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for fname, ns in shards.items():
        save_file({n: tensors[n] for n in ns}, str(tmp_path / fname))
        weight_map.update({n: fname for n in ns})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps(CFG))
    return tensors


def _file_mappings() -> list[tuple[int, int, str]]:
    """(start, end, path) of every file-backed mapping of this process."""
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6:
            start, end = (int(x, 16) for x in parts[0].split("-"))
            out.append((start, end, parts[5]))
    return out


def test_bf16_tensors_are_returned_as_stored_and_own_exactly_their_bytes(tmp_path):
    expected = _write_sharded(tmp_path)
    ck = load_checkpoint(tmp_path)
    for name, want in expected.items():
        t = ck.get(name)
        assert t.dtype == torch.bfloat16, f"{name} was converted to {t.dtype} (a second copy)"
        assert torch.equal(t, want)
        # A view into a bigger private buffer (a whole file read into memory) would keep that buffer alive.
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), name


def test_loader_keeps_no_reference_to_returned_tensors(tmp_path):
    _write_sharded(tmp_path)
    ck = load_checkpoint(tmp_path)
    refs = [weakref.ref(ck.get(n)) for n in ck.names()]
    lw = ck.layer(0)
    layer_ref = weakref.ref(lw.w_down)
    del lw
    gc.collect()
    alive = [r for r in refs if r() is not None]
    assert not alive and layer_ref() is None, "Checkpoint caches tensors: a layer-by-layer walk would hold them all"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_tensor_data_lives_in_the_checkpoint_file_mapping(tmp_path):
    expected = _write_sharded(tmp_path)
    ck = load_checkpoint(tmp_path)
    shard_paths = {str(p.resolve()) for p in tmp_path.glob("*.safetensors")}
    kept = {n: ck.get(n) for n in expected}
    maps = [(a, b, path) for a, b, path in _file_mappings() if path in shard_paths]
    assert maps, "no checkpoint shard is memory-mapped"
    for name, t in kept.items():
        ptr = t.data_ptr()
        assert any(a <= ptr and ptr + t.numel() * t.element_size() <= b for a, b, _ in maps), (
            f"{name} lives in private memory: the loader copied it out of the file mapping"
        )
