"""fit_resident's starts: the costliest family keeps the whole array, the others get whole columns of their own."""

from __future__ import annotations

import os
from dataclasses import asdict, replace

from tilepilot.kernels.attention import keeps_kv_heads_whole
from tilepilot.kernels.registry import family
from tilepilot.kernels.tuning import tune
from tilepilot.model.quant import WeightFormat
from tilepilot.plan import resident
from tilepilot.plan.air_q4 import fused_stage, window_ladder
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.plan.merge import gated_stage, merged_stage, normed_stage, residual_stage, split_moves
from tilepilot.plan.plan import validate_plan, with_weights
from tilepilot.plan.resident import search_structures
from tilepilot.runtime.timing import time_plan

Q4_0_PACKED_HEAD = WeightFormat("q4_0", bf16_tensors=("embed",))


def _one_dispatch_q4(spec, fmt=Q4_0_PACKED_HEAD):
    """A decode at 4 bits (Llama-3.2-1B's: q4_0 with a packed head) as the decode skills leave it before
    ``resident-decode``."""
    plan = with_weights(paper_like_plan(spec), fmt, packed_prefill=False)
    plan.host = replace(plan.host, handoff="device")
    plan = fused_stage(plan)
    plan.decode.kv_windows = window_ladder(max(plan.decode.kv_windows))
    return merged_stage(plan) or plan


def _configs(plan, fam):
    return [c.config for g in plan.decode.groups() for c in g.calls if c.family == fam and "cols" in c.config]


def test_the_projections_keep_every_column_when_one_pass_attention_starts_on_half(llama_1b):
    """Quantized GEMVs on all 8 columns and 4 rows with x riding a weight channel (16 weight channels) leave each
    tile 4 locks, too few for a small kernel beside one-pass decode attention on every tile; the start that gives
    attention half the columns is the only one that packs them, and the pass it finds is faster than the best of
    the other starts (same model, same run)."""
    plan = _one_dispatch_q4(llama_1b)
    found, notes = resident.fit_resident(plan, llama_1b, allowed=keeps_kv_heads_whole)
    assert notes[0].startswith(f"search from {resident.STARTS[3]}:")
    assert any(n.startswith("attention: start on half the columns") for n in notes)
    whole = [(c["cols"], c["rows"], c["x_rides"]) for c in _configs(found, "qgemv")]
    assert whole and all(w == (8, 4, True) for w in whole)
    kw = {"starts": resident.STARTS[:3], "allowed": keeps_kv_heads_whole}
    without, _ = resident.fit_resident(plan, llama_1b, kicks=0, **kw)
    assert not all((c["cols"], c["rows"], c["x_rides"]) == (8, 4, True) for c in _configs(without, "qgemv"))
    fast = time_plan(found, llama_1b, 2048).decode_s_per_token
    slow = time_plan(without, llama_1b, 2048).decode_s_per_token
    assert fast < 0.95 * slow


def test_the_improvement_pass_finds_a_faster_packing_the_repair_stopped_short_of(llama_1b):
    """From each launch's fastest config, the greedy repair of one-pass attention beside the q4 projections stops
    at the first packing; the improvement pass climbs from it to one >10 % faster, still legal (``time_plan`` packs a
    resident pass again and refuses one that breaks a budget),
    each of its changes lowering the modeled time."""
    plan = _one_dispatch_q4(llama_1b)
    start = (resident.STARTS[1],)
    kw = {"starts": start, "allowed": keeps_kv_heads_whole}
    repaired, before = resident.fit_resident(plan, llama_1b, improve=False, **kw)
    improved, notes = resident.fit_resident(plan, llama_1b, **kw)
    assert any("(improvement: " in n for n in notes)

    def launches_ms(notes):  # the search's own figure: modeled launch time per token of the pass it returns
        return float(notes[0].split(": ")[1].split(" ms/token")[0])

    assert launches_ms(notes) < launches_ms(before)
    assert improved.decode.resident
    fast = time_plan(improved, llama_1b, 2048).decode_s_per_token
    slow = time_plan(repaired, llama_1b, 2048).decode_s_per_token
    assert fast < 0.9 * slow


def test_flash_decoding_attention_leaves_rows_and_columns_to_the_projections(llama_1b):
    """Decode attention as flash-decoding (one unit per KV head with its group's heads as rows, 2 cascade stages,
    K/V on both shim channels) uses 2 rows of each column: the projections keep all 8 columns with x riding, the
    attention runs on all 8 too, and the pass is >10 % faster than the best pass with one-pass attention only (same
    model, same run)."""
    plan = _one_dispatch_q4(llama_1b)
    found, _ = resident.fit_resident(plan, llama_1b)
    assert all(c["cols"] == 8 and c["x_rides"] for c in _configs(found, "qgemv"))
    att = [(c["cols"], c["group_rows"], c["kv_stages"], c["kv_channels"]) for c in _configs(found, "attention")]
    assert att == [(8, True, 2, 2)]
    one_pass, _ = resident.fit_resident(plan, llama_1b, allowed=keeps_kv_heads_whole)
    fast = time_plan(found, llama_1b, 2048).decode_s_per_token
    slow = time_plan(one_pass, llama_1b, 2048).decode_s_per_token
    assert fast < 0.9 * slow


def test_a_launch_held_at_a_faster_config_finds_room_the_one_at_a_time_repair_cannot(smollm2_135m):
    """SmolLM2-135M at q4_1 with a bf16 LM head: from the plan's own configs the repair makes room by degrading the
    head (it runs once per token, the layer launches 30 times, so that is always the cheapest single change) to a
    compute-bound 8-core GEMV. The kick step holds the head at the fastest config of each smaller footprint and
    repairs the layer launches around it: the head keeps two weight channels on half the rows, and the pass is
    >10 % faster (same model, same run)."""
    spec = smollm2_135m
    plan = _one_dispatch_q4(spec, WeightFormat("q4_1", bf16_tensors=("embed", "lm_head")))
    start = (resident.STARTS[0],)
    plain, _ = resident.fit_resident(plan, spec, starts=start, kicks=0)
    kicked, notes = resident.fit_resident(plan, spec, starts=start)
    assert notes[0].startswith(f"search from {resident.STARTS[0]}, then lm_head held at a faster config:")

    def head(p):
        return next(c.config for g in p.decode.groups() for c in g.calls if c.op == "lm_head")

    assert head(plain).get("weight_channels", 1) == 1
    assert head(kicked)["weight_channels"] == 2 and head(kicked)["rows"] < 4
    assert kicked.decode.resident
    fast = time_plan(kicked, spec, 2048).decode_s_per_token  # packs the pass again: a broken budget would raise
    slow = time_plan(plain, spec, 2048).decode_s_per_token
    assert fast < 0.9 * slow


def _folded_q4(spec):
    """The q4 one-dispatch pass with every fold the decode skills make (norms, residual adds, SwiGLU)."""
    plan = _one_dispatch_q4(spec)
    for fold in (normed_stage, residual_stage, gated_stage):
        plan = fold(plan) or plan
    return plan


def test_split_moves_undo_one_unit_each_and_every_move_is_a_legal_plan(llama_1b):
    plan = _folded_q4(llama_1b)
    runs = plan.decode.block[0].merged
    assert ["q_proj", "k_proj", "v_proj", "attn_norm"] in runs and ["o_proj", "resid1"] in runs
    moves = split_moves(plan)
    got = {words: p.decode.block[0].merged for p, words in moves}
    # a fold out of a multi-matrix launch leaves the launch; a run undone leaves every other run as it was
    assert got["attn_norm out of q_proj's launch"] == [["q_proj", "k_proj", "v_proj"], *runs[1:]]
    assert got["o_proj+resid1 as separate launches"] == [r for r in runs if r != ["o_proj", "resid1"]]
    assert "resid1 out of o_proj's launch" not in got  # the same plan as the run undone: said once
    gate = next(r for r in runs if r[0] == "gate_proj")
    assert got["swiglu out of gate_proj's launch"] == [
        [o for o in gate if o != "swiglu"] if r == gate else r for r in runs
    ]
    assert len(moves) == len({tuple(map(tuple, m)) for m in got.values()})
    assert got["lm_head+final_norm as separate launches"] == runs  # the head's folded norm is a unit too

    def merged_ops(p):
        return sum(len(m) for g in p.decode.groups() for m in g.merged)

    for p, _ in moves:
        assert validate_plan(p) == [] and merged_ops(p) < merged_ops(plan)
    assert plan.decode.block[0].merged == runs  # the plan itself is left as it was


def test_the_structure_walk_takes_the_fastest_move_until_none_beats_the_best(smollm2_135m):
    """A fake fit (seconds = a function of the runs left, None for one that does not pack): the walk takes the
    fastest move each round, skips what does not pack, stops when no move is faster, and says every step."""
    plan = _folded_q4(smollm2_135m)
    cost = {"q_proj": 3.0, "rope_q": 1.0, "o_proj": 2.5, "down_proj": 0.5}  # a run's cost while merged

    def fit(p):
        runs = [m[0] for m in p.decode.block[0].merged]
        return None if "o_proj" not in runs else p  # splitting O's fold does not pack

    timers = set()

    def timed(p):
        timers.add(os.getpid())
        runs = [m[0] for m in p.decode.block[0].merged]
        return sum(cost.get(r, 0.0) for r in runs) + 0.1 * sum(map(len, p.decode.block[0].merged))

    start = timed(plan)
    steps = search_structures(plan, start, fit, timed, rounds=5)
    assert [s[1] is s[0] for s in steps] == [True] * len(steps)
    seconds = [s[2] for s in steps]
    assert seconds == sorted(seconds, reverse=True) and seconds[0] < start
    final = [m[0] for m in steps[-1][0].decode.block[0].merged]
    assert "q_proj" not in final and "rope_q" not in final and "o_proj" in final
    assert "q_proj+k_proj+v_proj" in steps[0][3]  # the costliest run first
    again = search_structures(steps[-1][0], seconds[-1], fit, timed)
    assert again == []  # the end of the walk is a local minimum
    assert search_structures(plan, start, fit, timed, rounds=1) == steps[:1]
    # a round's fits on two worker processes: the same steps (the fitted plans come back as copies), timed here
    on_two = search_structures(plan, start, fit, timed, rounds=5, jobs=2)
    assert [(s[0].decode.block[0].merged, s[1].decode.block[0].merged, s[2], s[3]) for s in on_two] == [
        (s[0].decode.block[0].merged, s[0].decode.block[0].merged, s[2], s[3]) for s in steps
    ]
    assert timers == {os.getpid()}


def test_squeezed_names_the_streams_a_packing_left_below_the_ddr_rate(llama_1b):
    """The family defaults leave every q4 stream of Llama-3.2-1B compute-bound, each with a config that streams at
    the DDR rate and more than ``KICK_MIN_SHARE`` of the pass to gain; at the tuner's config a stream is not
    squeezed; an illegal config names nothing (the fit repairs it first)."""
    plan = _one_dispatch_q4(llama_1b)
    ops = ["q_proj", "o_proj", "gate_proj", "down_proj", "lm_head"]
    assert resident.squeezed(plan, llama_1b) == [f"{op} (compute)" for op in ops]
    o_proj = next(c for g in plan.decode.groups() for c in g.calls if c.op == "o_proj")
    shape = family("qgemv").Shape(n=2048, k=2048, m=1, fmt="q4_0", block=32)
    o_proj.config = asdict(tune("qgemv", shape).config)
    assert resident.squeezed(plan, llama_1b) == [f"{op} (compute)" for op in ops if op != "o_proj"]
    o_proj.config = {**o_proj.config, "cols": 3}  # 2048 rows over 3 columns: no legal design
    assert resident.squeezed(plan, llama_1b) == []
