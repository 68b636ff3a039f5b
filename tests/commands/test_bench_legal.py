"""Issue 11 item 7: `tilepilot bench` on a plan holding an illegal tiling exits non-zero naming the validator code."""

from __future__ import annotations

import sys
from pathlib import Path

from tilepilot.cli import main
from tilepilot.runtime.workspace import load_workspace, make_workspace

sys.path.insert(0, str(Path(__file__).parents[1] / "plan"))
from illegal import with_illegal_up_proj  # noqa: E402


def test_bench_refuses_an_illegal_tiling_with_its_code(zoo_model, tmp_path, capsys):
    ws = make_workspace(zoo_model("qwen3-0.6b", layers=2), "paper-like", tmp_path / "ws").path
    w = load_workspace(ws)
    w.set_plan(with_illegal_up_proj(w.plan))
    rc = main(["bench", str(ws), "--prompt-len", "256", "--decode-tokens", "1", "--json"])
    captured = capsys.readouterr()
    assert rc != 0
    assert "L1_OVERFLOW" in captured.err and captured.out == ""
