"""``tilepilot report``: one self-contained HTML page that shows a deployment.

Three jobs, one module each: ``data`` gathers numbers from the workspace (and times the plans it compares),
``figures`` draws them as inline SVG, ``page`` lays them out with jinja2. ``build_report`` ties them together
and writes the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tilepilot.report.data import ReportData, gather
from tilepilot.report.figures import FIGURES
from tilepilot.report.page import render_page

REPORT_FILE = "report.html"


def render(data: ReportData) -> str:
    """The page for gathered data: a figure for every section that has data, a sentence for the others."""

    svgs = {s.key: FIGURES[s.key](s.data) for s in data.sections if s.ok}
    return render_page(data, svgs)


def write_text_umask(path: Path, text: str) -> Path:
    """Write through a temp file and a rename (no half-written page), with the mode the user's umask allows
    (a plain ``open`` honours it; ``tempfile.mkstemp`` would make the page 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def build_report(
    workspace: str | Path,
    out: str | Path | None = None,
    *,
    calibration: dict[str, Any] | Path | None = None,
    prompt_len: int | None = None,
    cpu: str = "measured",
) -> tuple[Path, ReportData]:
    """Gather, draw and write the report of ``workspace`` (default ``WORKSPACE/report.html``)."""
    data = gather(workspace, calibration=calibration, prompt_len=prompt_len, cpu=cpu)
    path = Path(out) if out is not None else Path(workspace) / REPORT_FILE
    return write_text_umask(path, render(data)), data
