"""Journal documents are created once, appended atomically and never parsed for decisions."""

from __future__ import annotations

import json

from tilepilot.skills import journal as J


def test_scaffold_is_idempotent_and_keeps_history(tmp_path):
    j = J.Journal(tmp_path)
    written = j.scaffold("tiny-model")
    assert {p.name for p in written} == set(J.DOCUMENTS)
    j.progress("phase 0 started")
    assert j.scaffold("tiny-model") == []  # resume: nothing overwritten
    assert "phase 0 started" in (tmp_path / J.PROGRESS).read_text()
    assert (tmp_path / J.GATES_DIR).is_dir()


def test_todo_perf_and_timing_rows(tmp_path):
    j = J.Journal(tmp_path)
    j.scaffold("m")
    j.write_todo([J.PhaseRow(0, "build-cpu-oracle", "passed", 1.25), J.PhaseRow(1, "kernel-validation", "pending")])
    todo = (tmp_path / J.TODO).read_text()
    assert "- [x] phase 0 `build-cpu-oracle`: passed, 1.2 s measured" in todo
    assert "- [ ] phase 1 `kernel-validation`: pending" in todo
    for decision in ("applied", "rejected: not faster"):
        j.perf_step(
            {
                "skill": "merge-launches",
                "target": "prefill",
                "ttft_before": 2.0,
                "ttft_after": 1.5,
                "decode_before": 0.1,
                "decode_after": 0.1,
                "gate": "passed",
                "decision": decision,
            }
        )
    rows = [
        r for r in (tmp_path / J.PERF_TRAJ).read_text().splitlines() if r.startswith("| 1 ") or r.startswith("| 2 ")
    ]
    assert len(rows) == 2 and "2.0000 -> 1.5000" in rows[0] and "100.000 -> 100.000" in rows[0]
    j.phase_time(0, "build-cpu-oracle", 1, "passed", 0.5)
    assert "| 0 | build-cpu-oracle | 1 | passed | 0.50 |" in (tmp_path / J.PHASE_TIMING).read_text()


def test_gate_round_trip_and_atomic_write(tmp_path):
    j = J.Journal(tmp_path)
    assert j.read_gate("x") is None and not j.gate_passed("x")
    j.write_gate("x", {"passed": True, "measurements": {"cosine": 0.999}})
    assert j.gate_passed("x")
    assert json.loads(j.gate_path("x").read_text())["measurements"]["cosine"] == 0.999
    j.gate_path("x").write_text("{not json")
    assert j.read_gate("x") is None  # a damaged gate never counts as passed
    assert not list(tmp_path.rglob("*.tmp"))
