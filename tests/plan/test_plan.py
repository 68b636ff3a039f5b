from __future__ import annotations

import pytest

from tilepilot.errors import ConfigError
from tilepilot.model.graph import block_graph
from tilepilot.plan.builtin import BUILTIN_PLANS, builtin_plan, paper_like_plan
from tilepilot.plan.plan import DeploymentPlan, KernelCall, KernelGroup, check_plan, validate_plan


def test_graph_has_optional_ops_only_when_spec_has_them(tiny_spec):
    ops = block_graph(tiny_spec).block_ops
    assert ("q_bias" in ops) == tiny_spec.qkv_bias
    assert ("q_norm" in ops) == tiny_spec.qk_norm
    assert ("o_bias" in ops) == tiny_spec.o_bias
    assert ops[0] == "attn_norm" and ops[-1] == "resid2"
    # the node order is itself a valid topological order
    seen = {"x"}
    for node in block_graph(tiny_spec).block:
        assert set(node.inputs) <= seen, node
        seen.add(node.output)


@pytest.mark.parametrize("name", list(BUILTIN_PLANS))
def test_builtin_plans_are_valid_and_round_trip(tiny_spec, name, tmp_path):
    plan = builtin_plan(name, tiny_spec)
    assert validate_plan(plan, tiny_spec) == []
    again = DeploymentPlan.from_json(plan.to_json())
    assert again == plan
    path = plan.save(tmp_path / "p" / "deployment.json")
    assert DeploymentPlan.load(path) == plan
    assert not list(path.parent.glob("*.tmp"))


def test_dispatch_counts(tiny_spec):
    paper = paper_like_plan(tiny_spec)
    assert paper.dispatches_per_layer("prefill") == 3
    assert paper.dispatches_per_layer("decode") == 2
    iron = builtin_plan("iron-like", tiny_spec)
    n_graph = len(block_graph(tiny_spec).block)
    # one dispatch per op except the host-side KV write (and decode attention on the CPU)
    assert iron.dispatches_per_layer("prefill") == n_graph - 1
    assert iron.dispatches_per_layer("decode") == n_graph - 2
    assert iron.dispatches_per_token("decode") == tiny_spec.n_layers * (n_graph - 2) + 2


def test_validation_catches_missing_duplicate_and_misordered_ops(tiny_spec):
    plan = paper_like_plan(tiny_spec)
    first = plan.prefill.block[0]
    first.calls = [c for c in first.calls if c.op != "k_proj"]
    assert any("lacks ops ['k_proj']" in p for p in validate_plan(plan, tiny_spec))

    plan = paper_like_plan(tiny_spec)
    plan.decode.block[2].calls.append(KernelCall("resid1", "eltwise"))
    assert any("more than once" in p for p in validate_plan(plan, tiny_spec))

    plan = paper_like_plan(tiny_spec)
    plan.prefill.block.reverse()
    assert any("before it is computed" in p for p in validate_plan(plan, tiny_spec))

    plan = paper_like_plan(tiny_spec)
    plan.prefill.block[0].calls[1].family = "swiglu"
    assert any("uses family 'swiglu'" in p for p in validate_plan(plan, tiny_spec))
    with pytest.raises(ConfigError):
        check_plan(plan, tiny_spec)

    plan = paper_like_plan(tiny_spec)
    plan.decode.block[1] = KernelGroup("cpu_attention", [KernelCall("attention", "attention")], "cpu")
    assert any("use 'cpu'" in p for p in validate_plan(plan, tiny_spec))


def test_bad_json_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not valid JSON"):
        DeploymentPlan.from_json("{nope")
    with pytest.raises(ConfigError, match="malformed"):
        DeploymentPlan.from_json('{"name": "x"}')
    with pytest.raises(ConfigError, match="does not exist"):
        DeploymentPlan.load(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="unknown plan"):
        builtin_plan("fastest", None)


def test_a_plan_saved_with_the_old_cpu_family_name_loads_with_todays(tiny_spec):
    """Workspaces deployed before CPU calls were named "cpu" name them "host"; they must still load and run."""
    plan = paper_like_plan(tiny_spec)
    cpu_calls = [c for g in plan.decode.block + plan.decode.head if g.where == "cpu" for c in g.calls]
    assert cpu_calls and {c.family for c in cpu_calls} == {"cpu"}
    old = plan.to_json().replace('"family": "cpu"', '"family": "host"')
    assert '"family": "host"' in old
    loaded = DeploymentPlan.from_json(old)
    assert loaded.to_dict() == plan.to_dict()
    assert validate_plan(loaded, tiny_spec) == []
