"""Bad command-line input is refused before any work: one sentence, exit 2, nothing written.

Every case here is refused before a model is imported or a workspace created, so no test deploys anything: an --out
that is a file or cannot be written, a zoo model cut to more layers than it has, a checkpoint with a bad tensor, a
--resume of a directory holding no deployment. Ctrl-C during a deploy says how to continue; bench names the option
to change. Output directories of import and zoo make get the umask's modes, as workspaces do.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).parents[1] / "skills"))  # tiny.py: toy checkpoints of each family
sys.path.insert(0, str(Path(__file__).parents[1] / "model"))  # the tiny GGUF writer of the import tests

from test_gguf_tiny import write_tiny_gguf  # noqa: E402
from tiny import write_tiny  # noqa: E402

from tilepilot.cli import main  # noqa: E402
from tilepilot.model.gguf.importer import import_gguf  # noqa: E402
from tilepilot.model.zoo import write_zoo_model  # noqa: E402
from tilepilot.plan.builtin import BUILTIN_PLANS  # noqa: E402

UNWRITABLE = Path("/proc/tilepilot-test-nope")  # /proc takes no new directory, whoever asks (root too)
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"
# a small config for a fast zoo write (tests/model/test_zoo.py's), not a published model
TINY_ZOO = {
    "hidden_size": 64,
    "intermediate_size": 1280,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 2048,
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return write_tiny("llama", tmp_path_factory.mktemp("tiny") / "llama", layers=1)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path, "llama")
    return path


@pytest.fixture(autouse=True)
def no_deploy(monkeypatch):
    """A refused input never reaches the phases; if one did, it fails here at once instead of deploying."""

    def started(*_args, **_kwargs):
        raise AssertionError("the deployment started")

    monkeypatch.setattr("tilepilot.commands.deploy.deploy", started)


def _refused(argv: list[str], capsys, words: str) -> str:
    """Run the CLI; assert exit 2 and one line of error holding ``words``; return the line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tilepilot: error:") and err.count("\n") == 1 and words in err, err
    return err


def _entries(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


@pytest.mark.parametrize("resume", [False, True])
@pytest.mark.parametrize("size", [0, 3])
def test_deploy_out_an_existing_file_is_refused(tiny_dir, tmp_path, capsys, size, resume):
    afile = tmp_path / "afile"
    afile.write_bytes(b"x" * size)
    _refused(["deploy", str(tiny_dir), "--out", str(afile), *(["--resume"] * resume)], capsys, "is a file")
    assert _entries(tmp_path) == {"afile"} and afile.stat().st_size == size


def test_deploy_of_a_gguf_out_an_existing_file_imports_nothing(tiny_gguf, tmp_path, capsys):
    """The check comes before the import: no orphaned ``afile.model/`` beside the file."""
    afile = tmp_path / "afile"
    afile.touch()
    _refused(["deploy", str(tiny_gguf), "--out", str(afile)], capsys, "is a file")
    assert _entries(tmp_path) == {"afile"}


def test_import_and_zoo_make_out_an_existing_file_say_it_is_a_file(tiny_gguf, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.touch()
    for argv in (["import", str(tiny_gguf)], ["zoo", "make", "qwen3-0.6b", "--layers", "1"]):
        err = _refused([*argv, "--out", str(afile)], capsys, "is a file")
        assert "not empty" not in err
    assert _entries(tmp_path) == {"afile"}


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc (a file system that takes no new directory)")
def test_an_unwritable_out_is_one_sentence_in_every_command(tiny_dir, tiny_gguf, capsys):
    for argv in (
        ["deploy", str(tiny_dir)],
        ["deploy", str(tiny_gguf)],
        ["import", str(tiny_gguf)],
        ["zoo", "make", "qwen3-0.6b", "--layers", "1"],
    ):
        _refused([*argv, "--out", str(UNWRITABLE)], capsys, "cannot be written")


def test_an_out_under_a_file_is_refused(tiny_dir, tmp_path, capsys):
    (tmp_path / "afile").touch()
    _refused(["deploy", str(tiny_dir), "--out", str(tmp_path / "afile" / "ws")], capsys, "is a file")


def test_zoo_make_refuses_more_layers_than_the_model_has(tmp_path, capsys):
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep").touch()  # refused for its --out too, so a regression fails here instead of writing 29 GiB
    _refused(["zoo", "make", "qwen3-0.6b", "--out", str(out), "--layers", "999"], capsys, "pass --layers 1..28")
    assert _entries(tmp_path) == {"m"} and _entries(out) == {"keep"}


def _damaged(src: Path, out: Path, how: str) -> Path:
    """A copy of the tiny checkpoint with one tensor missing, mis-shaped or stored as int16, or its file truncated."""
    out.mkdir()
    (out / "config.json").write_bytes((src / "config.json").read_bytes())
    if how == "truncated":
        data = (src / "model.safetensors").read_bytes()
        (out / "model.safetensors").write_bytes(data[: len(data) // 2])
        return out
    tensors = load_file(str(src / "model.safetensors"))
    if how == "missing":
        del tensors[Q_PROJ]
    elif how == "shape":
        tensors[Q_PROJ] = tensors[Q_PROJ][:-8].contiguous()
    else:
        tensors[Q_PROJ] = tensors[Q_PROJ].to(torch.int16)
    save_file(tensors, str(out / "model.safetensors"))
    return out


@pytest.mark.parametrize(
    ("how", "words"),
    [("missing", "is missing"), ("shape", "has shape"), ("dtype", "stored as I16"), ("truncated", "is truncated")],
)
def test_a_bad_checkpoint_is_refused_before_the_workspace_exists(tiny_dir, tmp_path, capsys, how, words):
    """The header check of ``inspect`` runs before the workspace is made: a rerun after fixing the checkpoint is
    not told that the directory 'already holds a deployment'."""
    model = _damaged(tiny_dir, tmp_path / "model", how)
    ws = tmp_path / "ws"
    _refused(["deploy", str(model), "--out", str(ws)], capsys, words)
    assert not ws.exists()


def test_resume_refuses_a_directory_holding_no_deployment(tiny_dir, tmp_path, capsys):
    out = tmp_path / "nonempty"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    _refused(["deploy", str(tiny_dir), "--out", str(out), "--resume"], capsys, "holds no deployment to resume")
    assert _entries(out) == {"notes.txt"} and (out / "notes.txt").read_text() == "mine"


def test_resume_accepts_a_deployment_and_a_directory_not_made_yet(tmp_path):
    """A deploy interrupted before its first file (e.g. in a GGUF's import) is continued with --resume, as the
    interrupt message says, so a new or empty directory is accepted with it."""
    from tilepilot.skills.workspace import check_deploy_out

    check_deploy_out(tmp_path / "new", resume=True)
    ws = tmp_path / "ws"
    ws.mkdir()
    check_deploy_out(ws, resume=True)
    (ws / "deployment.json").write_text("{}")
    check_deploy_out(ws, resume=True)
    with pytest.raises(Exception, match="already holds a deployment; pass --resume"):
        check_deploy_out(ws, resume=False)


def test_ctrl_c_during_deploy_says_to_resume(tiny_dir, tmp_path, capsys, monkeypatch):
    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("tilepilot.commands.deploy.deploy", interrupted)
    assert main(["deploy", str(tiny_dir), "--out", str(tmp_path / "ws"), "--knowledge", str(tmp_path / "k")]) == 130
    err = capsys.readouterr().err
    assert err.startswith("tilepilot: interrupted;") and "rerun the same command with --resume" in err
    assert err.count("\n") == 1
    monkeypatch.setattr("tilepilot.commands.zoo._list", interrupted)  # a command with nothing to resume
    assert main(["zoo", "list"]) == 130
    assert capsys.readouterr().err == "tilepilot: interrupted\n"


def test_bench_names_the_option_to_change_and_every_plan(tiny_dir, capsys):
    err = _refused(["bench", str(tiny_dir), "--plan", "air-q4", "--prompt-len", "100000"], capsys, "--prompt-len")
    assert "pass --prompt-len 4095 or less" in err
    err = _refused(["bench", str(tiny_dir), "--plan", "deployed"], capsys, "not a workspace")
    assert all(name in err for name in BUILTIN_PLANS)


def _modes(directory: Path) -> set[int]:
    return {stat.S_IMODE(p.stat().st_mode) for p in (directory, *directory.iterdir())}


def test_import_and_zoo_make_write_with_the_umask(tiny_gguf, tmp_path):
    """Not a tempfile.mkdtemp's 0700 nor safetensors' 0600: a model directory is read like any checkpoint."""
    old = os.umask(0o022)
    try:
        assert main(["import", str(tiny_gguf), "--out", str(tmp_path / "imported")]) == 0
        direct = import_gguf(tiny_gguf, tmp_path / "direct").out  # the library call, not only the command
        zoo = write_zoo_model("smollm2-1.7b", tmp_path / "zoo", layers=1, overrides=TINY_ZOO)
    finally:
        os.umask(old)
    for out in (tmp_path / "imported", direct, zoo):
        assert stat.S_IMODE(out.stat().st_mode) == 0o755
        assert _modes(out) == {0o755, 0o644}, out


@pytest.mark.parametrize(
    "jobs, env, words",
    [("0", None, "--jobs must be at least 1"), (None, "many", "TILEPILOT_JOBS='many' is not a number")],
)
def test_a_bad_worker_count_is_refused_before_the_workspace_exists(tiny_dir, tmp_path, capsys, monkeypatch, jobs,
                                                                    env, words):  # fmt: skip
    if env is not None:
        monkeypatch.setenv("TILEPILOT_JOBS", env)
    out = tmp_path / "ws"
    _refused(["deploy", str(tiny_dir), "--out", str(out), *(["--jobs", jobs] if jobs else [])], capsys, words)
    assert not out.exists()


@pytest.mark.parametrize(
    "kv, small_heads, words",
    [
        ("fp8", False, "--kv-cache 'fp8' is not a KV-cache format; use one of bf16, q8_0"),
        ("q8_0", True, "(head_dim a multiple of 64), but a head holds 16 values"),
    ],
)
def test_a_kv_cache_format_the_model_cannot_use_is_refused_before_the_workspace_exists(
    tiny_dir, tmp_path, capsys, kv, small_heads, words
):
    model = write_zoo_model("smollm2-1.7b", tmp_path / "zoo", layers=1, overrides=TINY_ZOO) if small_heads else tiny_dir
    out = tmp_path / "ws"
    _refused(["deploy", str(model), "--out", str(out), "--kv-cache", kv], capsys, words)
    assert not out.exists()


def test_every_commands_help_renders(capsys):
    """argparse formats help strings with %: a bare percent sign in one crashed `deploy --help` with a traceback."""
    from tilepilot.cli import COMMANDS

    for name in COMMANDS:
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0, name
    assert "--kv-cache" in capsys.readouterr().out
