"""`tilepilot report`: the page of a real (tiny) deployment, and of workspaces missing parts of it."""

from __future__ import annotations

import json
import os
import re
import shutil

from tilepilot.cli import main
from tilepilot.files import write_text_atomic
from tilepilot.report import build_report

FIGURE_KEYS = ("phases", "trajectory", "layers", "roofline", "gates", "calibration")


def _svg_texts(html: str) -> list[str]:
    return re.findall(r"<text[^>]*>([^<]*)</text>", html)


def test_report_has_every_figure_and_is_self_contained(deployed, report):
    path, data = report
    assert deployed.verdict == "PASS"
    assert path == deployed.workspace / "report.html"
    html = path.read_text(encoding="utf-8")
    assert [s.key for s in data.sections] == list(FIGURE_KEYS)
    assert all(s.ok for s in data.sections), [(s.key, s.missing) for s in data.sections if not s.ok]
    for key in FIGURE_KEYS:
        assert f'data-figure="{key}"' in html
    assert html.count("<svg") == len(FIGURE_KEYS)
    # nothing to fetch: no script, no external reference, no web font
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", html)
    assert "@font-face" not in html and "url(http" not in html
    assert 'xlink:href="http' not in html and "<image" not in html


def test_every_figure_title_says_modeled_or_measured(report):
    path, _ = report
    html = path.read_text(encoding="utf-8")
    # svg.fonttype 'none' keeps every label a <text> element (no glyph paths, no font to fetch)
    figures = re.findall(r'data-figure="(\w+)">(.*?)</figure>', html, flags=re.S)
    assert len(figures) == len(FIGURE_KEYS)
    for key, body in figures:
        titles = [t for t in _svg_texts(body) if " — " in t]
        assert titles, f"{key}: no title found"
        assert all("modeled" in t or "measured" in t for t in titles), (key, titles)


def test_report_numbers_come_from_the_same_timing_model(deployed, report):
    """The deployed plan re-timed for the report equals the claim the deployment recorded (same model, plan)."""
    _, data = report
    layers = data.section("layers").data
    plans = {p["label"]: p for p in layers["plans"]}
    assert set(plans) == {"deployed", "paper-like", "iron-like"}
    claims = json.loads((deployed.workspace / "gates" / "decode-optimization.json").read_text())["evidence"]["claims"]
    assert abs(plans["deployed"]["ttft_s"] - claims["ttft_s"]) <= 1e-3 * claims["ttft_s"] + 2e-3
    # a deployed plan at least as fast as iron-like, one dispatch per op is slower
    assert plans["iron-like"]["decode_s_per_token"] > plans["deployed"]["decode_s_per_token"]
    roof = data.section("roofline").data
    assert roof["points"] and all(p["seconds"] > 0 for p in roof["points"])
    peak = roof["peak_macs_per_s"]["bfp16"]
    assert all(p["macs"] / p["seconds"] <= peak * (1 + 1e-9) for p in roof["points"])
    cal = data.section("calibration").data
    assert cal["has_cv"] and sum(r["cv_modeled_s"] is not None for r in cal["rows"]) == 1


def test_missing_parts_give_sections_that_say_so(deployed, calibration, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(deployed.workspace, ws)
    for name in ("phase_timing.json", "perf_opt_traj.json", "evaluation_report.md", "report.html"):
        (ws / name).unlink(missing_ok=True)
    for gate in (ws / "gates").glob("*.json"):
        gate.unlink()
    path, data = build_report(ws, tmp_path / "out" / "r.html", calibration={"kernels": {}})
    html = path.read_text(encoding="utf-8")
    missing = {s.key: s.missing for s in data.sections if not s.ok}
    assert set(missing) == {"phases", "trajectory", "gates", "calibration"}
    for text in missing.values():
        assert text and text.replace("'", "&#39;") in html
    assert html.count("<svg") == 2  # the two figures that need only deployment.json: layers and roofline
    assert "not evaluated yet" in html


def test_report_file_mode_follows_umask(report, tmp_path):
    """The page is written with the mode the user's umask allows (not mkstemp's 0600), atomically."""
    path, _ = report
    old = os.umask(0o022)
    try:
        a = write_text_atomic(tmp_path / "a.html", "x")
        assert a.stat().st_mode & 0o777 == 0o644
        os.umask(0o077)
        b = write_text_atomic(tmp_path / "b.html", "y")
        assert b.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o666 & ~old
    assert not list(tmp_path.glob(".*.tmp"))


def test_report_command(deployed, calibration, tmp_path, capsys):
    out, cal = tmp_path / "cli.html", tmp_path / "cal.json"
    cal.write_text(json.dumps(calibration))
    args = ["report", str(deployed.workspace), "--out", str(out), "--cpu", "estimated", "--calibration", str(cal)]
    assert main(args) == 0
    said = capsys.readouterr().out
    assert out.is_file() and f"wrote {out}: 6/6 figures" in said and "modeled" in said
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "error" in capsys.readouterr().err
