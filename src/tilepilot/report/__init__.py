"""``tilepilot report``: one self-contained HTML page that shows a deployment.

Three jobs, one module each: ``data`` gathers numbers from the workspace (and times the plans it compares),
``figures`` draws them as inline SVG, ``page`` lays them out with jinja2. ``build_report`` ties them together
and writes the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tilepilot.files import write_text_atomic
from tilepilot.report.data import ReportData, gather
from tilepilot.report.figures import FIGURES
from tilepilot.report.page import render_page

REPORT_FILE = "report.html"


def render(data: ReportData) -> str:
    """The page for gathered data: a figure for every section that has data, a sentence for the others."""

    svgs = {s.key: FIGURES[s.key](s.data) for s in data.sections if s.ok}
    return render_page(data, svgs)


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
    return write_text_atomic(path, render(data)), data
