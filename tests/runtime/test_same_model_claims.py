"""The two kinds of speed claim (runtime.timing.same_model_claims): same-model speed-ups, and the model's error
against silicon taken on the paper-like plan under the paper's own measurement conditions."""

from __future__ import annotations

import pytest

from tilepilot.runtime.timing import MODEL_ERROR_BASIS, same_model_claims

DEPLOYED = {"ttft_s": 0.5, "decode_tok_s": 40.0}
PAPER_LIKE = {"ttft_s": 1.0, "decode_tok_s": 10.0}  # at the deployment's own decode context (2048)
AS_MEASURED = {"ttft_s": 1.0, "decode_tok_s": 12.0}  # decode at the paper's short prompt
PUBLISHED = {"ttft_s": 1.25, "decode_tok_s": 12.5}


def test_speed_ups_use_the_plans_timed_together_and_the_error_uses_the_papers_conditions():
    c = same_model_claims(DEPLOYED, PAPER_LIKE, None, PUBLISHED, AS_MEASURED)
    assert c["speedup_over_paper_like"] == {"ttft": 2.0, "decode": 4.0}
    assert c["speedup_over_iron_like"] is None
    e = c["model_error_vs_silicon"]
    assert e["decode_tok_s_modeled_over_published"] == pytest.approx(12.0 / 12.5)
    assert e["ttft_modeled_over_published"] == pytest.approx(1.0 / 1.25)
    assert e["basis"] == MODEL_ERROR_BASIS["as_measured"] and e["modeled"]["decode_tok_s"] == 12.0


def test_without_the_as_measured_figures_the_error_falls_back_to_the_paper_like_plan_and_needs_a_published_one():
    c = same_model_claims(DEPLOYED, PAPER_LIKE, None, PUBLISHED)
    assert c["model_error_vs_silicon"]["decode_tok_s_modeled_over_published"] == pytest.approx(10.0 / 12.5)
    # the label says so: an old record's figure is not the paper's short prompt
    assert c["model_error_vs_silicon"]["basis"] == MODEL_ERROR_BASIS["deployment_context"]
    assert same_model_claims(DEPLOYED, PAPER_LIKE, None, None, AS_MEASURED)["model_error_vs_silicon"] is None
