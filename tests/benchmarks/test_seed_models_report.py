"""The seed-model table states each goal from the records alone: met, not met, or unknown; never guessed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "seed_models.py"


@pytest.fixture(scope="module")
def sm():
    spec = importlib.util.spec_from_file_location("seed_models_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


def _record(ttft_s: float | None, decode_ms: float | None, wall_s: float, rss_gib: float, verdict: str = "PASS"):
    after = None
    if ttft_s is not None:
        after = {
            "plan": "deployed",
            "ttft_s": ttft_s,
            "decode_ms_per_token": decode_ms,
            "decode_tok_s": 1e3 / decode_ms,
            "dispatches_per_layer": {"prefill": 1, "decode": 1},
        }
    deploy = {
        "verdict": verdict,
        "wall_s": wall_s,
        "peak_rss_bytes": int(rss_gib * 1024**3),
        "returncode": 0 if after else 1,
        "timed_out": False,
        "killed_low_memory": False,
        "review": None if after else "phase 3 failed: logits cosine 0.5",
        "performance": {"after": after} if after else None,
        "phases": [],
    }
    return {"deploy": deploy, "evaluate": {"verdict": verdict}}


def test_rows_and_goals_follow_the_records(sm):
    records = {
        "llama-3.2-1b": _record(1.04, 77.0, 160, 4.9),
        "qwen2.5-0.5b": _record(0.70, 59.0, 16 * 60, 4.2),  # over 15 min: the wall goal is not met
        "qwen3-0.6b": _record(None, None, 90, 3.0, verdict="FAIL"),
    }
    rows = {r["model"]: r for r in sm.build_rows(records, sm.zoo_names(), None)}
    ref = rows["llama-3.2-1b"]
    assert ref["eta_scale"]["combined"] == pytest.approx(1.0)
    g = sm.goals(ref)
    # these records carry no paper-like timing of the same model, so no same-model speed-up is claimed
    assert g.pop("faster_than_paper_like") is None and g == dict.fromkeys(g, True)
    small = sm.goals(rows["qwen2.5-0.5b"])
    assert small["wall"] is False and small["eta_scale"] is False
    failed = rows["qwen3-0.6b"]
    assert failed["status"] == "deploy failed" and "logits cosine" in failed["reason"]
    assert sm.goals(failed)["evaluator_pass"] is False and sm.goals(failed)["faster_than_paper_like"] is None
    assert rows["qwen3-4b"]["status"] == "not run" and set(sm.goals(rows["qwen3-4b"]).values()) == {None}


def test_without_the_reference_no_eta_is_claimed(sm):
    rows = {r["model"]: r for r in sm.build_rows({"qwen2.5-0.5b": _record(0.7, 59.0, 100, 4)}, sm.zoo_names(), None)}
    row = rows["qwen2.5-0.5b"]
    assert row["eta_scale"] is None and "llama-3.2-1b" in row["eta_reason"]
    assert sm.goals(row)["eta_scale"] is None


def test_the_silicon_table_shows_the_figure_its_ratio_is_taken_on_and_says_which(sm):
    """The model-error ratio is taken on the paper-like plan at the paper's short prompt when the record has that
    figure; an older record's ratio falls back to the deployment's own context and the table labels it so."""
    new, old = _record(1.04, 77.0, 160, 4.9), _record(0.70, 59.0, 100, 4.2)
    figures = {"plan": "paper-like", "ttft_s": 1.1, "decode_ms_per_token": 100.0, "decode_tok_s": 10.0}
    for rec in (new, old):
        rec["deploy"]["performance"]["paper_like"] = dict(figures)
    new["deploy"]["performance"]["paper_like_as_measured"] = dict(figures, decode_tok_s=23.45)
    rows = sm.build_rows({"llama-3.2-1b": new, "qwen2.5-0.5b": old}, sm.zoo_names(), None)
    meta = {"layers": None, "written": "now", "code_used": [], "host": {"cpus": 2, "mem_gib": 24}}
    lines = sm.render_markdown(rows, meta).splitlines()
    table = lines[lines.index("## The timing model against the paper's silicon (model error, not a speed-up)") :]
    llama = next(x for x in table if x.startswith("| llama-3.2-1b |"))
    qwen = next(x for x in table if x.startswith("| qwen2.5-0.5b |"))
    assert "| 23.45 |" in llama and llama.endswith("| short prompt |")
    assert "| 10.00 |" in qwen and qwen.endswith("| own context |")
