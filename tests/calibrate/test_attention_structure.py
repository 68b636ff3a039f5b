"""How the registry's FlashAttention rows are timed, and the held-out judgement of the alternative."""

import pytest

from tilepilot.calibrate import attention_structure as ast
from tilepilot.calibrate import harness
from tilepilot.errors import TilepilotError


def _held_out(latency_ms: float) -> dict:
    row = {"lq_x_lk": "512×512", "dk_dv": "64/64", "heads_q_kv": "2/2", "causal": "✗", "latency_ms": f"{latency_ms} ms"}
    return {"flash_attention": [row]}


def test_frozen_mapping_is_our_dataflow_and_cascade_is_airs_structure():
    assert harness.AIR_ATTENTION_STRUCTURE == "ours"
    ours = harness.kernel_rows(tables=["flash_attention"], data=_held_out(1.0))["flash_attention"][0].design()
    cas = harness.kernel_rows(tables=["flash_attention"], data=_held_out(1.0), attention="cascade")
    cas = cas["flash_attention"][0].design()
    assert ours.meta["kv_stages"] == 1 and ours.meta["config"]["skip_masked"]
    c = cas.meta["config"]
    assert (c["kv_stages"], c["rounds"], c["skip_masked"], c["share_cols"]) == (4, True, False, 4)
    assert len(cas.workers) == 32 and cas.meta["task_groups"] > 1  # every tile busy, units in sequential rounds
    with pytest.raises(TilepilotError):
        harness.kernel_rows(tables=["flash_attention"], attention="sideways")


def test_judgement_refits_on_the_fitted_rows_only():
    """Changing a held-out latency tenfold changes its ratio tenfold and nothing the efficiency was fitted on."""
    a, b = ast.judge("cascade", _held_out(1.0)), ast.judge("cascade", _held_out(10.0))
    assert a["attention_efficiency"] == b["attention_efficiency"]
    assert a["in_sample"] == b["in_sample"]
    (ra,), (rb,) = a["held_out"]["rows"].values(), b["held_out"]["rows"].values()
    assert ra["modeled"] == rb["modeled"] and ra["ratio"] == pytest.approx(10 * rb["ratio"])
    # the frozen mapping refits to the frozen efficiency (it is the fit's choice for these rows)
    assert ast.judge("ours", _held_out(1.0))["attention_efficiency"] == pytest.approx(
        ast.judge("ours", _held_out(1.0))["frozen_attention_efficiency"]
    )
