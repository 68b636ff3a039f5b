"""The report in a real browser: headless Chromium renders every figure, with no console error."""

from __future__ import annotations

import json

import pytest
from browser import chromium, probe_page

pytestmark = pytest.mark.skipif(chromium() is None, reason="chromium not installed (.ci/run installs it)")

SIZES = """JSON.stringify([...document.querySelectorAll('figure[data-figure]')].map(f => {
  const s = f.querySelector('svg'); const b = s ? s.getBoundingClientRect() : {width: 0, height: 0};
  return {key: f.dataset.figure, svg: !!s, w: b.width, h: b.height}; }))"""


def test_report_renders_every_figure_without_console_errors(report):
    path, data = report
    res = probe_page(path, SIZES, timeout_s=60)
    assert res.errors == []
    figures = json.loads(res.value)
    assert [f["key"] for f in figures] == [s.key for s in data.sections if s.ok]
    assert len(figures) == 6
    for f in figures:
        assert f["svg"] and f["w"] > 100 and f["h"] > 100, f


def test_the_probe_sees_console_errors_and_failed_loads(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text('<html><body><img src="missing.png"><script>console.error("boom")</script></body></html>')
    res = probe_page(page, "document.images.length", timeout_s=60)
    assert res.value == 1
    assert any("boom" in e for e in res.errors) and any("missing.png" in e for e in res.errors)
