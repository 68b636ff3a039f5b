"""Validation prompts: fixed texts for the deployment's gates, different ones for the independent evaluator.

The evaluator must measure on prompts the deployment never saw (a deployment tuned to pass on its own
gate prompts would otherwise pass the evaluation too), so the two pools share no text and the evaluator
also draws a fresh seed. Without a tokenizer, prompts are seeded random token ids.

The teacher-forced KL gate (IRON's accuracy gate, ``gates/thresholds.py``) needs real text: a few paragraphs of
varied English prose, code and dialogue, long enough for a prefix plus 40 teacher-forced steps in any tokenizer.
``KL_TEXTS`` feed the deployment's gates, ``EVAL_KL_TEXTS`` only the evaluator; they were written for tilepilot.
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

KL_TEXTS = (
    # prose
    "The river had been low all summer, and by September the stones of the old ford showed above the water like "
    "the backs of sleeping animals. Children crossed there on their way to school, jumping from one to the next, "
    "while their parents argued at the market about whether the autumn rains would come in time for the last "
    "sowing. Nobody remembered a drier year, although the miller's grandmother claimed that in her youth the "
    "river had stopped altogether and the fish had been gathered by hand from the mud.",
    # code
    "def moving_average(values, window):\n"
    '    """Return the mean of each run of `window` consecutive values."""\n'
    "    if window <= 0:\n"
    "        raise ValueError('window must be positive')\n"
    "    total = sum(values[:window])\n"
    "    out = [total / window]\n"
    "    for i in range(window, len(values)):\n"
    "        total += values[i] - values[i - window]\n"
    "        out.append(total / window)\n"
    "    return out\n\n"
    "print(moving_average([3, 5, 7, 9, 11, 13], 3))\n",
    # dialogue
    '"Are you sure this is the right platform?" Maria asked, looking up at the departure board.\n'
    '"It says Edinburgh, doesn\'t it?" said her brother. "Platform four, the ten fifteen."\n'
    '"It says the ten fifteen is delayed by forty minutes."\n'
    '"Then we have time for a coffee. Do you want anything to eat?"\n'
    "\"Just a croissant, if they have one. And please don't wander off this time; last year we nearly missed the "
    'train because you were reading the timetable of a different station."',
)

EVAL_KL_TEXTS = (
    # prose
    "When the first snow fell on the observatory, the astronomers covered the great telescope and went down to the "
    "village for supplies. The road was narrow and steep, cut into the side of the mountain a century earlier by "
    "workers who had carried every beam and every pane of glass on their backs. In winter the journey took most of "
    "a day, and the cook, who had made it more often than anyone, always insisted on leaving before sunrise.",
    # code
    "SELECT customers.name, COUNT(orders.id) AS order_count, SUM(orders.total) AS revenue\n"
    "FROM customers\n"
    "JOIN orders ON orders.customer_id = customers.id\n"
    "WHERE orders.created_at >= DATE '2023-01-01'\n"
    "GROUP BY customers.name\n"
    "HAVING COUNT(orders.id) > 5\n"
    "ORDER BY revenue DESC\n"
    "LIMIT 20;\n\n"
    "-- The same report for the previous year, kept for comparison:\n"
    "SELECT customers.name, COUNT(orders.id) FROM customers JOIN orders ON orders.customer_id = customers.id;\n",
    # dialogue
    "Customer: Hello, I ordered a bookshelf two weeks ago and it still hasn't arrived.\n"
    "Agent: I'm sorry to hear that. Could you give me your order number, please?\n"
    "Customer: Yes, it's four seven two nine one. The website said it would be delivered last Tuesday.\n"
    "Agent: Thank you. I can see that the parcel left our warehouse on Monday, but the courier marked it as "
    "delayed because of the storm. It should reach you by Friday at the latest.\n"
    "Customer: Friday is fine. Will someone call before they come?",
)


def kl_text_ids(
    tokenizer, vocab: int, n_tokens: int, seed: int, texts: tuple[str, ...] = KL_TEXTS
) -> tuple[list[int], bool]:
    """``n_tokens`` ids of real text (text ``seed % len(texts)``, continued by the next texts if it is short) and
    True, or seeded random ids and False when there is no tokenizer or its ids do not fit the vocabulary."""
    if tokenizer is not None:
        ids: list[int] = []
        for i in range(len(texts) * 4):
            if len(ids) >= n_tokens:
                break
            ids += [int(t) for t in tokenizer.encode(texts[(seed + i) % len(texts)] + "\n\n", add_bos=False)]
        ids = ids[:n_tokens]
        if len(ids) == n_tokens and all(0 <= t < vocab for t in ids):
            return ids, True
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n_tokens)], False


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


def distinct_prompt_pair(
    tokenizer, vocab: int, n_tokens: int, rng: random.Random, texts: tuple[str, ...]
) -> tuple[list[int], list[int]]:
    """Two prompts of ``n_tokens`` from different texts of ``texts`` (two rng draws), for a check that different
    prompts give different outputs: drawn independently, two texts of a pool of four coincide one time in four, and
    then the outputs are rightly identical. Without a tokenizer the two seeds differ, so the random ids do too."""
    first = rng.randrange(1 << 30)
    offset = 1 + rng.randrange(1 << 30) % (len(texts) - 1)  # another text of the pool, never the first one's
    return (
        prompt_ids(tokenizer, vocab, n_tokens, first, texts),
        prompt_ids(tokenizer, vocab, n_tokens, first + offset, texts),
    )
