"""The modeled path at the shortest prompts: ``time_plan`` (and so ``tilepilot bench --prompt-len``) at 1 and 2
tokens. Before, a 1-token prompt raised ValueError (its default decode context of 1 is below the 2 a decode step
reads) and a 2-token one failed with "decode() needs a prefilled sequence" (the untimed first decode step started
from an empty cache)."""

from __future__ import annotations

import pytest

from tilepilot.plan.builtin import builtin_plan
from tilepilot.runtime.timing import time_plan


@pytest.mark.parametrize("plan_name", ["default", "air-q4"])
@pytest.mark.parametrize("prompt_len", [1, 2])
def test_one_and_two_token_prompts_are_timed_at_a_context_of_two(weights_of, plan_name, prompt_len):
    spec = weights_of("llama").spec
    t = time_plan(builtin_plan(plan_name, spec), spec, prompt_len=prompt_len)
    assert t.context_len == 2 and t.ttft_s > 0 and t.decode_s_per_token > 0
    assert t.dispatches["decode"] == time_plan(builtin_plan(plan_name, spec), spec, 5).dispatches["decode"]


def test_a_context_of_two_times_the_step_that_reads_two_positions(weights_of):
    """The timed step at a context of 2 is the same step whichever prompt came before it, and no slower than the
    one at a context of 3 (its attention reads fewer positions)."""
    spec = weights_of("llama").spec
    plan = builtin_plan("default", spec)
    at_two = time_plan(plan, spec, prompt_len=5, context_len=2).decode_s_per_token
    assert time_plan(plan, spec, prompt_len=1).decode_s_per_token == at_two
    assert at_two <= time_plan(plan, spec, prompt_len=5, context_len=3).decode_s_per_token


def test_a_context_below_two_stays_an_error(weights_of):
    spec = weights_of("llama").spec
    with pytest.raises(ValueError, match="context_len >= 2"):
        time_plan(builtin_plan("default", spec), spec, prompt_len=4, context_len=1)
