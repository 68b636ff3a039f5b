"""Gate and evaluator prompts on the trained model's real tokenizer."""

from __future__ import annotations

import random

from tilepilot.harness.prompts import EVAL_TEXTS, distinct_prompt_pair, prompt_ids
from tilepilot.model.tokenizer import Tokenizer


def test_the_evaluators_two_prompts_differ_for_every_seed(smollm2_dir):
    """Two texts drawn independently from a pool of four coincide one seed in four; the evaluator then saw identical
    logits for its 'different' prompts and failed a correct deployment ('outputs are cached')."""
    tok = Tokenizer.from_dir(smollm2_dir(layers=1))
    texts_used = set()
    for seed in range(64):
        a, b = distinct_prompt_pair(tok, 49152, 20, random.Random(seed), EVAL_TEXTS)
        assert len(a) == len(b) == 20 and a != b
        texts_used.add(tuple(a))
    assert len(texts_used) == len(EVAL_TEXTS)  # every text of the pool is drawn, not a fixed pair
    a, b = distinct_prompt_pair(None, 1000, 20, random.Random(0), EVAL_TEXTS)
    assert a != b and all(0 <= t < 1000 for t in a + b)


def test_prompts_are_the_texts_own_tokens(smollm2_dir):
    tok = Tokenizer.from_dir(smollm2_dir(layers=1))
    ids = prompt_ids(tok, 49152, 12, 1, EVAL_TEXTS)
    assert tok.decode(ids).startswith(EVAL_TEXTS[1][:20])
