"""Whether an inline suggestion is sure enough to show.

A suggestion's confidence is the mean log-probability of the tokens the model wrote for it (the
healed text and the stop token included). A model whose flywheel.json holds `show_min_confidence`
shows a suggestion only at or above it; a model without it shows every suggestion.

The completion RL stage (training/tab_rl.py) fits the threshold to the outcomes of the trained
model's own greedy suggestions with the stage's reward (`fit_threshold`): below it, keeping quiet
earned more than showing. The policy gradient alone does not learn to keep quiet: it would have to
make end-of-text the most likely first token, and the model almost never samples it. The
language server (lsp/completion.py) and the simulated user (training/simulated_user.py) apply the
same rule (`worth_showing`). A model served over HTTP carries its threshold with it: `flywheel
serve` reports it in /v1/models under the same key, and the openai backend reads it from there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

KEY = "show_min_confidence"  # in a model folder's flywheel.json


def confidence(logprobs: Sequence[float]) -> float:
    """The mean log-probability per token (-inf for no token)."""
    return sum(logprobs) / len(logprobs) if logprobs else -math.inf


def threshold(folder: str | Path | None) -> float | None:
    """The model folder's threshold, or None (show everything: no folder, no flywheel.json, no
    threshold in it, or one that is not a finite number)."""
    if folder is None:
        return None
    try:
        value = json.loads((Path(folder) / "flywheel.json").read_text()).get(KEY)
    except (OSError, ValueError, AttributeError):
        return None
    return as_threshold(value)


def as_threshold(value: object) -> float | None:
    """`value` (read from a file or a server) as a threshold: a finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def worth_showing(logprobs: Sequence[float] | None, minimum: float | None) -> bool:
    """Show the suggestion: no threshold, no log-probabilities to judge by, or confident enough."""
    return minimum is None or logprobs is None or confidence(logprobs) >= minimum


def fit_threshold(scored: Sequence[tuple[float, float, float]]) -> float | None:
    """The threshold that earns the most over `scored`: (confidence, reward if shown, reward if
    not shown) per suggestion. None when showing everything earns as much (nothing to withhold).
    Among equal earners the lowest threshold wins: it withholds the fewest suggestions."""
    ranked = sorted((c, shown - quiet) for c, shown, quiet in scored if math.isfinite(c))
    gain = sum(g for _, g in ranked)  # of showing what is at or above ranked[i][0]
    best, best_gain, i = None, gain, 0
    while i < len(ranked):
        c = ranked[i][0]
        if gain > best_gain:
            best, best_gain = c, gain
        while i < len(ranked) and ranked[i][0] == c:
            gain -= ranked[i][1]
            i += 1
    return best
