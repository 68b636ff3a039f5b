from __future__ import annotations

import json

import pytest

from tilepilot.errors import ConfigError, ScopeError, WorkspaceError
from tilepilot.runtime.workspace import DEPLOYMENT_FILE, is_workspace, load_workspace, make_workspace

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 256,
}


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    return d


def test_make_and_load_round_trip(model_dir, tmp_path):
    ws = make_workspace(model_dir, "paper-like", tmp_path / "ws")
    assert is_workspace(ws.path)
    again = load_workspace(ws.path)
    assert again.plan == ws.plan and again.spec == ws.spec
    assert again.model_dir == model_dir.resolve()
    assert again.plan.name == "paper-like"
    with pytest.raises(WorkspaceError, match="already holds"):
        make_workspace(model_dir, "default", ws.path)
    make_workspace(model_dir, "iron-like", ws.path, overwrite=True)
    assert load_workspace(ws.path).plan.name == "iron-like"


def test_extra_keys_survive_a_save(model_dir, tmp_path):
    ws = make_workspace(model_dir, "default", tmp_path / "ws")
    data = json.loads(ws.deployment_file.read_text())
    data["journal"] = {"phase": 3}
    ws.deployment_file.write_text(json.dumps(data))
    ws = load_workspace(ws.path)
    ws.save()
    assert json.loads(ws.deployment_file.read_text())["journal"] == {"phase": 3}


def test_bad_workspaces_are_workspace_errors(model_dir, tmp_path):
    with pytest.raises(WorkspaceError, match="does not exist"):
        load_workspace(tmp_path / "nope")
    with pytest.raises(WorkspaceError, match="not a tilepilot workspace"):
        load_workspace(model_dir)
    ws = make_workspace(model_dir, "default", tmp_path / "ws")
    ws.deployment_file.write_text("{broken")
    with pytest.raises(WorkspaceError, match="not valid JSON"):
        load_workspace(ws.path)
    ws.deployment_file.write_text(json.dumps({"format": 1, "spec": {}}))
    with pytest.raises(WorkspaceError, match="malformed"):
        load_workspace(ws.path)
    with pytest.raises(ConfigError, match="unknown plan"):
        make_workspace(model_dir, "turbo", tmp_path / "ws2")


def test_out_of_scope_model_is_refused(tmp_path):
    d = tmp_path / "moe"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**CONFIG, "num_experts": 8}))
    with pytest.raises(ScopeError):
        make_workspace(d, "default", tmp_path / "ws")
    assert not (tmp_path / "ws" / DEPLOYMENT_FILE).exists()


def test_runner_options_come_from_the_runtime_key(model_dir, tmp_path):
    ws = make_workspace(model_dir, "default", tmp_path / "ws")
    assert ws.runner_options == {}
    ws.extra["runtime"] = {"static_buffers": ["decode.rope_tables"], "note": "ignored"}
    ws.save()
    assert load_workspace(ws.path).runner_options == {"static_buffers": ["decode.rope_tables"]}
