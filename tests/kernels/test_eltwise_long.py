"""The residual add of long prompts: every length up to the context builds a legal design (QA: 4097, 6001, 7777, 8101
and 8191 tokens of SmolLM2-135M failed; so did 4112, 6001, 6144, 8101, 8191 and 8192 of Llama-3.2-1B), and the
designs that were legal before keep their config, tasks and groups.

The causes, all in how the runtime streams one long slice: the cut of a too long pattern ended inside an object, and
for some lengths the rows the slice was folded into could not be cut into whole objects at all (SHAPE_NOT_TILING);
and a slice of many patterns put them all in one task group, more than a shim's 16 buffer descriptors (BD_LIMIT).
Cuts and folds now keep whole objects and the tasks are packed into as many groups as the BDs need.
"""

from __future__ import annotations

import pytest
import torch

from tilepilot.kernels import eltwise
from tilepilot.kernels.bind import _add_shape
from tilepilot.model.graph import block_graph
from tilepilot.model.spec import ModelSpec
from tilepilot.model.zoo import get_zoo_model
from tilepilot.npu.device import npu2
from tilepilot.npu.execute import run_fast, run_tile
from tilepilot.npu.placer import SequentialPlacer
from tilepilot.npu.resources import resource_use
from tilepilot.npu.validate import validate

SMOLLM2_HIDDEN = 576  # SmolLM2-135M's residual width
SMOLLM2_135M = ModelSpec.from_config(
    {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": SMOLLM2_HIDDEN,
        "num_hidden_layers": 1, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "intermediate_size": 1536, "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
        "vocab_size": 49152, "max_position_embeddings": 8192, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    },
    name="smollm2-135m",
)  # fmt: skip
LLAMA_1B_HIDDEN = 2048


@pytest.mark.parametrize("hidden", [SMOLLM2_HIDDEN, LLAMA_1B_HIDDEN])
@pytest.mark.parametrize("tokens", [4097, 4112, 6001, 6144, 7777, 8101, 8191, 8192])
def test_long_prompt_residual_adds_are_legal(hidden, tokens):
    shape = eltwise.Shape(n=tokens * hidden)
    d = eltwise.make_design(shape, eltwise.default_config(shape))
    assert validate(d) == []
    chunk = d.meta["config"]["chunk"]
    assert all(t.tap.n_elements % chunk == 0 for t in d.runtime.tasks)


@pytest.mark.parametrize("spec", [SMOLLM2_135M, get_zoo_model("llama-3.2-1b").spec(layers=1)], ids=lambda s: s.name)
def test_the_bound_shape_of_a_long_prompt_is_legal(spec):
    """The shape ``kernels.bind`` gives the residual add of a 6001-token prompt (the QA repro), default config."""
    node = next(n for n in block_graph(spec).block if n.kind == "add")
    shape = _add_shape(node, spec, 6001, 0, {})
    assert validate(eltwise.make_design(shape)) == []


def test_a_slice_of_many_patterns_is_packed_into_groups_within_the_shim_bds():
    shape = eltwise.Shape(n=8191 * SMOLLM2_HIDDEN)  # 8191 is prime: the slice does not fold into few patterns
    d = eltwise.make_design(shape)
    assert len(d.runtime.groups()) > 1
    placed = SequentialPlacer().place(d)
    assert all(u.bds <= npu2().shim.bds for t, u in resource_use(placed).items() if npu2().is_shim(t))


@pytest.mark.parametrize("tokens", [1, 2, 1024, 2048])
def test_shapes_legal_before_keep_one_group_and_their_config(tokens):
    """The figures of the benchmark tables (1024 and 2048 tokens, decode) come from these designs: one task group,
    one pattern per fifo and worker, the 8-tile default (or the small-shape default) as before."""
    shape = eltwise.Shape(n=tokens * SMOLLM2_HIDDEN)
    d = eltwise.make_design(shape)
    assert len(d.runtime.groups()) == 1
    assert len(d.runtime.tasks) == 3 * d.meta["config"]["tiles"]
    if tokens >= 1024:
        assert eltwise.default_config(shape) == eltwise.Config(tiles=8, chunk=4096)
        assert [t.fifo for t in d.runtime.tasks] == [f"{x}_{i}" for i in range(8) for x in "abc"]


@pytest.mark.parametrize(
    ("n", "config"),
    [
        (64 * 5119, eltwise.Config(tiles=1, chunk=64)),  # 6 patterns per fifo: 18 BDs, two task groups
        (2 * 64 * 5119, eltwise.Config(tiles=2, chunk=64)),  # the same on two shims
    ],
)
def test_packed_groups_run_bit_identical_on_tile_and_fast_paths(n, config):
    d = eltwise.make_design(eltwise.Shape(n), config)
    assert validate(d) == [] and len(d.runtime.groups()) > 1
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, generator=g).bfloat16(), torch.randn(n, generator=g).bfloat16()
    ins = eltwise.prepare_inputs(d, a, b)
    tile = run_tile(d, ins)["c"]
    assert torch.equal(tile, run_fast(d, ins, exact=True)["c"])
    assert torch.equal(tile, run_fast(d, ins)["c"])
    assert torch.equal(eltwise.crop_outputs(d, {"c": tile})["c"], (a.float() + b.float()).bfloat16())
