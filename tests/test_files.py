"""The one atomic write: whole files or none, with the mode the user's umask allows, for every writer."""

from __future__ import annotations

import os

import pytest

from tilepilot.files import assembled_dir, write_json_atomic, write_text_atomic
from tilepilot.kernels.registry import Registry
from tilepilot.npu.trace import Trace
from tilepilot.skills.journal import Journal


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_mode_follows_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        assert write_text_atomic(tmp_path / "a" / "b.txt", "x").stat().st_mode & 0o777 == 0o644
        os.umask(0o077)
        assert write_text_atomic(tmp_path / "c.txt", "y").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    p = write_json_atomic(tmp_path / "d.json", {"v": 1})
    with pytest.raises(TypeError):
        write_json_atomic(p, {"v": object()})  # not serializable: refused before anything is replaced
    assert p.read_text() == '{\n  "v": 1\n}\n' and sorted(x.name for x in tmp_path.iterdir()) == ["d.json"]


def test_journal_registry_and_trace_files_are_readable_by_the_team(tmp_path, umask_022):
    journal = Journal(tmp_path).scaffold("a deployment")
    Registry().save(tmp_path / "registry.json")
    Trace().to_chrome(tmp_path / "trace" / "t.json")
    assert journal
    for path in [*journal, tmp_path / "registry.json", tmp_path / "trace" / "t.json"]:
        assert path.stat().st_mode & 0o777 == 0o644, path


def test_an_assembled_directory_lands_whole_with_umask_modes(tmp_path, umask_022):
    """A model directory (zoo writer, GGUF importer) is renamed into place with the modes a mkdir/open would give,
    not mkdtemp's 0700: other users' deployments read it like any checkpoint."""
    out = tmp_path / "model"
    out.mkdir()  # an empty directory is taken over
    with assembled_dir(out) as tmp:
        assert tmp.parent == tmp_path and tmp != out
        (tmp / "sub").mkdir()
        (tmp / "sub" / "w.bin").write_bytes(b"x")
        os.chmod(tmp / "sub" / "w.bin", 0o600)  # as safetensors' writer leaves its files
    assert (out / "sub" / "w.bin").read_bytes() == b"x"
    assert {p.stat().st_mode & 0o777 for p in (out, out / "sub")} == {0o755}
    assert (out / "sub" / "w.bin").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_failed_assembly_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with assembled_dir(tmp_path / "model") as tmp:
            (tmp / "config.json").write_text("{}")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
