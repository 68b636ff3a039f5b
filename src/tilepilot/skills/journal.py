"""The workspace journal: the human-readable record a deployment leaves behind.

Each document has one job (checklist, narrative, lessons, debugging, timing, optimization trajectory,
evaluation) so a person or an agent resuming the work can read the one they need. Every write goes
through a temp file and a rename: a crash never leaves a half-written document, and appends re-write the
whole (small) file for the same reason. Gate results are JSON under ``gates/`` because the evaluator and
``--resume`` read them back; the markdown files are for people and are never parsed for decisions. The two
tables a program wants to read (phase timing, optimization trajectory) get a JSON twin written by the same
call, so ``tilepilot report`` reads structured rows instead of parsing Markdown.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilepilot.files import write_text_atomic

DEPLOYMENT = "deployment.json"
TODO = "TODO.md"
PROGRESS = "progress.md"
LESSONS = "LESSONS.md"
DEBUG_LOG = "debug_log.md"
PHASE_TIMING = "phase_timing.md"
PERF_TRAJ = "perf_opt_traj.md"
EVALUATION = "evaluation_report.md"
PHASE_TIMING_JSON = "phase_timing.json"  # JSON twin of PHASE_TIMING
PERF_TRAJ_JSON = "perf_opt_traj.json"  # JSON twin of PERF_TRAJ
GATES_DIR = "gates"
TRACE_DIR = "trace"

# The journal documents in the order a reader should open them (deployment.json belongs to workspace.py).
DOCUMENTS = (TODO, PROGRESS, LESSONS, DEBUG_LOG, PHASE_TIMING, PERF_TRAJ)

_HEADERS = {
    TODO: "# TODO: deployment phases\n\n",
    PROGRESS: "# Progress\n\nWhat happened, in order. Host times are measured; NPU times are modeled.\n\n",
    LESSONS: "# Lessons\n\nNovel failures met in this deployment and how they were fixed.\n\n",
    DEBUG_LOG: "# Debug log\n\nFailure signatures, diagnoses and remedies, in order.\n\n",
    PHASE_TIMING: (
        "# Phase timing\n\nMeasured host wall-clock seconds per phase attempt.\n\n"
        "| phase | skill | attempt | status | seconds (measured) |\n|---|---|---|---|---|\n"
    ),
    PERF_TRAJ: (
        "# Performance optimization trajectory\n\nEvery optimization skill tried, with the modeled figures before "
        "and after and the decision. TTFT at the stated prompt length; decode is modeled latency per token.\n\n"
        "| # | skill | target | TTFT before -> after (s, modeled) | decode before -> after (ms/token, modeled) "
        "| dispatches/layer prefill, decode | gate | decision |\n|---|---|---|---|---|---|---|---|\n"
    ),
}


def atomic_write_json(path: Path, payload: Any) -> None:
    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    """Numbers from torch/numpy land in evidence dicts; store them as plain floats/ints/lists."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot store {type(obj).__name__} in the journal")


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


@dataclass(frozen=True)
class PhaseRow:
    """One line of the TODO checklist."""

    phase: int
    name: str
    status: str  # "pending" | "running" | "passed" | "failed" | "needs-human-review"
    seconds: float | None = None
    note: str = ""


class Journal:
    """Reads and writes the journal documents of one workspace directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    # ---- paths ------------------------------------------------------------------------------
    def path(self, name: str) -> Path:
        return self.root / name

    def gate_path(self, phase_name: str) -> Path:
        return self.root / GATES_DIR / f"{phase_name}.json"

    # ---- scaffold ---------------------------------------------------------------------------
    def scaffold(self, title: str) -> list[Path]:
        """Create the documents that do not exist yet (never overwrites: resume keeps the history)."""
        written = []
        (self.root / GATES_DIR).mkdir(parents=True, exist_ok=True)
        (self.root / TRACE_DIR).mkdir(parents=True, exist_ok=True)
        for name in DOCUMENTS:
            p = self.path(name)
            if not p.exists():
                header = _HEADERS[name]
                if name in (TODO, PROGRESS):
                    header = header.replace("\n\n", f"\n\nDeployment of {title}.\n\n", 1)
                write_text_atomic(p, header)
                written.append(p)
        return written

    def _append(self, name: str, text: str) -> None:
        p = self.path(name)
        old = p.read_text(encoding="utf-8") if p.exists() else _HEADERS.get(name, "")
        write_text_atomic(p, old + text)

    # ---- documents --------------------------------------------------------------------------
    def write_todo(self, rows: Iterable[PhaseRow]) -> None:
        """Rewrite the phase checklist from the orchestrator's current view of the phases."""
        marks = {"passed": "x", "running": "~", "failed": "!", "needs-human-review": "!"}
        lines = [_HEADERS[TODO]]
        for r in rows:
            secs = f", {r.seconds:.1f} s measured" if r.seconds is not None else ""
            note = f" — {r.note}" if r.note else ""
            lines.append(f"- [{marks.get(r.status, ' ')}] phase {r.phase} `{r.name}`: {r.status}{secs}{note}\n")
        write_text_atomic(self.path(TODO), "".join(lines))

    def progress(self, message: str) -> None:
        self._append(PROGRESS, f"- {_stamp()} {message}\n")

    def lesson(self, title: str, text: str) -> None:
        self._append(LESSONS, f"## {title}\n\n{text.strip()}\n\n")

    def debug(self, title: str, lines: Iterable[str]) -> None:
        body = "".join(f"- {line}\n" for line in lines)
        self._append(DEBUG_LOG, f"## {_stamp()} {title}\n\n{body}\n")

    def phase_time(self, phase: int, name: str, attempt: int, status: str, seconds: float) -> None:
        self._append(PHASE_TIMING, f"| {phase} | {name} | {attempt} | {status} | {seconds:.2f} |\n")
        row = {"phase": phase, "skill": name, "attempt": attempt, "status": status, "seconds": float(seconds)}
        self._append_json(PHASE_TIMING_JSON, {**row, "clock": "measured", "ended_at": time.time()})

    def perf_step(self, row: dict[str, Any]) -> None:
        """Append one optimization attempt; ``row`` carries the numbers named in the table header."""
        n = self._count_rows(PERF_TRAJ) + 1

        def pair(a: float | None, b: float | None, scale: float = 1.0, fmt: str = "{:.4f}") -> str:
            if a is None or b is None:
                return "n/a"
            return f"{fmt.format(a * scale)} -> {fmt.format(b * scale)}"

        disp = row.get("dispatches_after") or row.get("dispatches_before") or {}
        self._append(
            PERF_TRAJ,
            f"| {n} | {row['skill']} | {row.get('target', '')} "
            f"| {pair(row.get('ttft_before'), row.get('ttft_after'))} "
            f"| {pair(row.get('decode_before'), row.get('decode_after'), 1e3, '{:.3f}')} "
            f"| {disp.get('prefill', 'n/a')}, {disp.get('decode', 'n/a')} "
            f"| {row.get('gate', 'not run')} | {row['decision']} |\n",
        )
        self._append_json(PERF_TRAJ_JSON, {"step": n, **row, "clock": "modeled"})

    def _append_json(self, name: str, row: dict[str, Any]) -> None:
        """Append one row to a JSON twin (``{"rows": [...]}``); an unreadable twin starts over rather than
        stopping the deployment, since the Markdown table beside it keeps the full record."""
        p = self.path(name)
        rows: list[Any] = []
        if p.exists():
            try:
                rows = list(json.loads(p.read_text(encoding="utf-8")).get("rows", []))
            except (OSError, ValueError, AttributeError):
                rows = []
        atomic_write_json(p, {"rows": [*rows, row]})

    def read_rows(self, name: str) -> list[dict[str, Any]] | None:
        """Rows of a JSON twin, or None when the workspace has none (written before twins existed)."""
        p = self.path(name)
        try:
            rows = json.loads(p.read_text(encoding="utf-8"))["rows"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else None

    def _count_rows(self, name: str) -> int:
        p = self.path(name)
        if not p.exists():
            return 0
        return sum(
            1 for line in p.read_text(encoding="utf-8").splitlines() if line.startswith("| ") and line[2:3].isdigit()
        )

    # ---- gates ------------------------------------------------------------------------------
    def write_gate(self, phase_name: str, payload: dict[str, Any]) -> Path:
        p = self.gate_path(phase_name)
        atomic_write_json(p, payload)
        return p

    def read_gate(self, phase_name: str) -> dict[str, Any] | None:
        p = self.gate_path(phase_name)
        if not p.exists():
            return None
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None

    def gate_passed(self, phase_name: str) -> bool:
        g = self.read_gate(phase_name)
        return bool(g and g.get("passed") is True)
