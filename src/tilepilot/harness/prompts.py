"""Validation prompts: fixed texts for the deployment's gates, different ones for the independent evaluator.

The evaluator must measure on prompts the deployment never saw (a deployment tuned to pass on its own
gate prompts would otherwise pass the evaluation too), so the two pools share no text and the evaluator
also draws a fresh seed. Without a tokenizer, prompts are seeded random token ids.
"""

from __future__ import annotations

import random

GATE_TEXTS = (
    "The tile array moves data through object fifos while the host waits for the dispatch to finish.",
    "A small language model answers questions about the weather, the tides and the price of bread.",
    "Each layer reads the residual stream, normalizes it, attends to earlier tokens and adds the result back.",
)

EVAL_TEXTS = (
    "Lighthouse keepers once logged every passing ship, the wind direction and the colour of the sea at dawn.",
    "To bake rye bread, mix the starter with warm water, rest the dough overnight and bake it in a hot oven.",
    "Mountain railways climb steep grades with a toothed rack between the rails that the engine's cog grips.",
    "The orchestra tuned to the oboe's A before the conductor raised the baton for the first movement.",
)


def prompt_ids(tokenizer, vocab: int, n_tokens: int, seed: int, texts: tuple[str, ...] = GATE_TEXTS) -> list[int]:
    """``n_tokens`` ids: text ``seed % len(texts)`` (repeated as needed) or, without a tokenizer, random ids."""
    if tokenizer is not None:
        text = texts[seed % len(texts)]
        ids: list[int] = []
        while len(ids) < n_tokens:
            ids += [int(t) for t in tokenizer.encode(text + " ", add_bos=False)]
        ids = ids[:n_tokens]
        if all(0 <= t < vocab for t in ids):
            return ids
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n_tokens)]
