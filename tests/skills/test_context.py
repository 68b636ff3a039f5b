"""DeployContext split along what it holds: workspace + journal, model reference, runner factory, knowledge."""

from __future__ import annotations

import pytest

from tilepilot.model.quant import QuantizedWeights, WeightFormat
from tilepilot.plan.plan import with_weights
from tilepilot.runtime.dispatcher import KernelLibrary
from tilepilot.skills.context import FLAT_NAMES, DeployContext, Settings
from tilepilot.skills.knowledge import Knowledge
from tilepilot.skills.reference import ModelReference
from tilepilot.skills.runners import RunnerFactory
from tilepilot.skills.workspace import DeployWorkspace


def test_parts_are_built_on_first_use_and_flat_names_reach_them(fresh_ctx):
    ctx = fresh_ctx("llama", layers=1)
    assert isinstance(ctx.workspace, DeployWorkspace) and isinstance(ctx.runners, RunnerFactory)
    assert isinstance(ctx.knowledge, Knowledge)
    assert ctx.workspace.plan.name == "default"
    assert ctx._model is None  # reading the plan opened no checkpoint, built no oracle
    assert isinstance(ctx.model, ModelReference) and "checkpoint" not in vars(ctx.model)
    for name, part in FLAT_NAMES.items():
        assert hasattr(getattr(ctx, part), name), (name, part)
    assert ctx.journal is ctx.workspace.journal and ctx.spec == ctx.model.spec
    assert ctx.oracle is ctx.model.oracle and ctx.library is ctx.runners.library
    with pytest.raises(AttributeError):
        ctx.no_such_thing  # noqa: B018
    mine = KernelLibrary()
    ctx.library = mine  # a flat name set on the context lands on the part that holds it
    assert ctx.runners.library is mine and "library" not in vars(ctx)


def test_a_quantized_context_gates_against_the_deployed_model(tiny_model, tmp_path):
    ctx = DeployContext.create(
        tiny_model("qwen2", layers=1), tmp_path / "ws", settings=Settings(weights=WeightFormat("q8_0"))
    )
    m = ctx.model
    assert isinstance(m.weights, QuantizedWeights) and m.weights.format.format == "q8_0"
    assert m.source_oracle is not m.oracle and m.source_oracle.weights is m.checkpoint
    runner = ctx.runners.make_runner()
    assert runner.weights is m.weights  # runners of the deployment share its packed weights
    bf16 = ctx.runners.make_runner(with_weights(ctx.workspace.plan, WeightFormat()))
    assert bf16.weights is m.checkpoint
