"""Synthetic retrieval rows for the long-context stage: facts hidden in a window of code, asked
for at its end.

Continued pretraining on long code alone lowers the loss past the old context but teaches little
retrieval: few tokens of real code depend on one line thousands of tokens back. A share of the
stage's windows (`Recipe.retrieval_fraction`) therefore carry 1–3 facts ("the build number is
41873", "the locker code is 902") at random depths, with a question about each of them and its
answer as the window's last tokens, so the loss rewards looking back across the whole window.

The facts are Python comments, assignments or short sentences, with names and phrasing of their
own. `flywheel bench passkey` hides a "pass key" in filler prose, neither of which the stage
ever sees: it measures whether the skill carries over.
"""

from __future__ import annotations

import numpy as np
import torch

THINGS = [
    "build", "ticket", "order", "invoice", "room", "account", "serial", "batch", "locker",
    "flight", "parcel", "badge", "release", "session", "voucher", "station",
]  # fmt: skip
KINDS = ["number", "code", "key", "id"]  # what a fact names: "the locker code is 41873"
FACTS = [  # each on a line of its own, wherever it lands
    "\n# Note: the {thing} is {value}.\n",
    "\n{name} = {value}  # the {thing}\n",
    "\n# Remember this: {value} is the {thing}.\n",
    "\nThe {thing} is {value}. Keep it in mind.\n",
]
QUESTIONS = [
    "\n# Question: what is the {thing}? Answer: the {thing} is {value}.\n",
    "\n# The {thing} noted above is {value}.\n",
    "\nassert {name} == {value}  # the {thing} from above\n",
    "\nWhat was the {thing}? The {thing} was {value}.\n",
]


def retrieval_row(
    tokenizer, window: torch.Tensor, rng: np.random.Generator, max_facts: int = 3
) -> torch.Tensor:
    """`window` [length] with 1..max_facts facts inserted at random depths and a question about
    each of them (and its answer), in another order, at the end; as long as `window`, its code
    cut to make room. Every answer is a token the loss scores against a fact far back."""
    length = len(window)
    count = int(rng.integers(1, max_facts + 1))
    things = rng.choice(len(THINGS), size=count, replace=False)
    facts = []
    for index in things:
        thing, kind = THINGS[index], KINDS[int(rng.integers(len(KINDS)))]
        value = int(rng.integers(10 ** int(rng.integers(3, 6)), 10**6))
        name = f"{thing.upper()}_{kind.upper()}"
        facts.append({"thing": f"{thing} {kind}", "name": name, "value": value})

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    inserts = [encode(FACTS[int(rng.integers(len(FACTS)))].format(**f)) for f in facts]
    order = [int(i) for i in rng.permutation(count)]  # the questions' order
    asks = {
        i: encode(QUESTIONS[int(rng.integers(len(QUESTIONS)))].format(**facts[i])) for i in order
    }
    while count > 1 and length - sum(map(len, [*inserts, *asks.values()])) < length // 2:
        count -= 1  # a short window: fewer facts
        inserts, order = inserts[:count], [i for i in order if i < count]
        asks.pop(count)
    questions = [t for i in order for t in asks[i]]
    room = length - len(questions) - sum(map(len, inserts))
    if room < length // 2:  # a window too short to hide even one fact in: left as it is
        return window
    code = window[:room].tolist()
    depths = sorted(int(rng.integers(0, max(1, len(code) - 1))) for _ in inserts)
    pieces, last = [], 0
    for depth, insert in zip(depths, inserts, strict=True):
        pieces += [code[last:depth], insert]
        last = depth
    out = [t for piece in [*pieces, code[last:], questions] for t in piece]
    return torch.tensor(out[:length], dtype=window.dtype, device=window.device)


def add_retrieval_rows(
    tokenizer, windows: torch.Tensor, rng: np.random.Generator, fraction: float
) -> torch.Tensor:
    """`windows` [rows, length] with each row, with probability `fraction`, made a retrieval
    row (`retrieval_row`)."""
    if fraction <= 0:
        return windows
    rows = [
        retrieval_row(tokenizer, row, rng) if rng.random() < fraction else row for row in windows
    ]
    return torch.stack(rows)
