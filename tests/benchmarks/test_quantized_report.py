"""The quantized table's goal check reads its verdicts off the rows at both contexts and bounds what the KV readback
leaves; a synthetic run stands in for the benchmark (which takes an hour)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "quantized.py"


@pytest.fixture(scope="module")
def qz():
    spec = importlib.util.spec_from_file_location("quantized_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_kv_ceiling_is_the_bound_time_over_bound_plus_readback(qz):
    kv_bytes = qz.CALIBRATION.ddr_bytes_per_s * 1e-3  # 1 ms of KV readback at the DDR rate
    kinds = [
        {"kind": "qgemv", "ddr_s": 9e-3},
        {"kind": "attention", "ddr_s": kv_bytes / qz.CALIBRATION.ddr_bytes_per_s},
    ]
    one = SimpleNamespace(by_kind=lambda rate: kinds)
    assert qz.kv_ceiling(one, 100.0) == pytest.approx(10 / 11)  # a 10 ms bound and 1 ms of KV
    kinds[1]["kind"] = "rmsnorm"  # no attention launch: nothing but the weights to read
    assert qz.kv_ceiling(one, 100.0) == pytest.approx(1.0)


def _row(fmt: str, tok_s: float, frac: float, tok_s_1k: float, frac_1k: float) -> dict:
    return {
        "format": fmt,
        "bits_per_weight": 4.5,
        "ttft_s": 0.9,
        "decode_tok_s": tok_s,
        "switched_decode_tok_s": tok_s / 2,
        "bound_tok_s": tok_s / frac,
        "bound_fraction": frac,
        "kv_ceiling": 0.91,
        "at_goal_context": {"context": 1024, "decode_tok_s": tok_s_1k, "bound_fraction": frac_1k, "kv_ceiling": 0.95},
        "resident": True,
        "prefill_kernel": "gemm (bf16)",
        "speedup_vs_bf16": {"ttft": 1.0, "decode": 2.0},
        "speedup_vs_air_q4": {"ttft": 1.0, "decode": 1.2},
        "quantization_error": None,
        "decode_dispatch": {
            "launches": 178,
            "host_round_trip_s": 8.5e-5,
            "design_switches_and_tile_config_s": 1e-6,
            "launches_s": 1e-2,
            "kinds": [
                {"kind": "qgemv", "launches": 65, "seconds": 0.0102, "fill_drain_s": 4.9e-4, "ddr_s": 0.0097,
                 "bounds": {"ddr": 65}},
            ],
        },
    }  # fmt: skip


def test_the_goal_is_met_only_where_both_contexts_meet_it(qz):
    rows = [_row("bf16", 30.0, 0.95, 31.0, 0.97), _row("q4_0+head", 83.0, 0.81, 87.0, 0.91)]
    met = {"2048": False, "1024": True}
    goal = {
        **qz.GOAL, "format": "q4_0+head", "decode_tok_s": 83.0, "bound_fraction": 0.81, "ttft_s": 0.9,
        "bf16_ttft_s": 0.9, "met": all(met.values()), "met_at_context": met, "kv_ceiling": 0.91,
        "at_goal_context": rows[1]["at_goal_context"], "kinds": rows[1]["decode_dispatch"]["kinds"],
        "launches": 178, "resident": True, "switch_floor_s": 0.0, "switches_and_config_s": 1e-6, "launches_s": 1e-2,
    }  # fmt: skip
    data = {
        "prompt_len": 2048,
        "commit": "abc1234",
        "models": [{"model": "llama-3.2-1b", "air_q4": {"ttft_s": 0.9, "decode_tok_s": 60.0}, "rows": rows}],
        "goal": goal,
    }
    md = qz.render(data)
    assert "| llama-3.2-1b | q4_0+head | 83.00 | 81 % | 91 % | 87.00 | 91 % | 95 % |" in md
    assert "context 2048: modeled decode 83.00 tok/s" in md and "**not met**. Where the time goes" in md
    assert "the same plan: 87.00 tok/s, 91.0 % of the bound: **met**" in md
    assert "The goal is **not met** (it names no context; checked at both)" in md
    assert "| qgemv | 65 | 10.200 | 0.490 | 9.700 | ddr 65 |" in md
    # a results JSON from before the goal-context column renders as it did (no section, no KeyError)
    for r in rows:
        del r["at_goal_context"]
    old = {**data, "goal": {k: v for k, v in goal.items() if k not in ("met_at_context", "at_goal_context")}}
    assert "## Decode at context 1024" not in qz.render(old)


def test_goal_rows_are_the_4bit_rows_meeting_decode_bound_and_ttft_at_each_context(qz):
    bf = _row("bf16", 30.0, 0.95, 31.0, 0.97)
    head = _row("q4_0+head", 86.0, 0.85, 92.0, 0.905)  # TTFT as bf16's: meets at 1024 only
    kv = _row("q4_0+head+kv4", 93.0, 0.91, 95.0, 0.93)  # meets decode and bound at both, but TTFT is worse
    kv["ttft_s"] = bf["ttft_s"] * 1.01
    q8 = _row("q8_0", 90.0, 0.95, 95.0, 0.96)  # not a 4-bit row
    rows = qz.goal_rows([bf, head, kv, q8], 2048)
    assert rows == {"2048": [], "1024": ["q4_0+head"]}
    head["decode_tok_s"], head["bound_fraction"] = 93.0, 0.91
    assert qz.goal_rows([bf, head, kv, q8], 2048) == {"2048": ["q4_0+head"], "1024": ["q4_0+head"]}
    head["at_goal_context"]["decode_tok_s"] = 60.0  # below 65 tok/s at 1024
    assert qz.goal_rows([bf, head, kv, q8], 2048)["1024"] == []
