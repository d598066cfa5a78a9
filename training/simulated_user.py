"""A simulated user: replays a repository's held-out files and judges inline suggestions.

For measurement, and for a new user with no history. The user "writes" each held-out file as its
author did; at the requests below it asks the model for a completion (training/line_completion.py,
the repository-level FIM prompt, token-healed as the language server's is) and judges it against
what the author actually wrote next, up to the end of the line:

    accepted  the suggestion equals the rest of the line (trailing blanks ignored), or is a prefix
              of it at least `min_prefix_chars` long (a correct start the user takes)
    rejected  anything else that is shown
    declined  the model wrote nothing (`<|endoftext|>` first), or text that does not continue the
              cursor's line (not the healed line break and indentation): not shown, neither

Requests (`requests`): cursors at line starts (after the indentation) and at word boundaries
(after a space, `(`, `.`, `=` or `,` inside a line), on lines with at least `min_rest_chars`
characters left to write; at most `max_requests` in all, chosen by a seeded hash of each file's
path and spread evenly over the files, so the same split always gives the same requests.

The result is a list of `telemetry.acceptance.Outcome`, scored by `telemetry.acceptance.score`,
the code that scores real telemetry: accept rate, shown per request, accepted characters per
request.

What it does not do: type character by character or move the cursor after an acceptance (every
request sees the author's true text before it), or model a user's patience and latency.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from telemetry.acceptance import Outcome
from training.line_completion import (
    WORD_BOUNDARY,
    Completion,
    Cursor,
    cursor_prompt,
    prompt_ids,
    spread_cursors,
)
from training.repo_files import RepoFile


@dataclass
class UserConfig:
    min_prefix_chars: int = 8  # a suggestion that is a correct prefix this long is accepted
    max_requests: int = 200  # requests in all, spread over the files
    min_rest_chars: int = 4  # a cursor needs this much of its line left to write
    seed: int = 0  # which cursors
    seq_len: int = 1024  # prompt tokens, the completion included
    max_new_tokens: int = 48
    context_share: float = 0.25  # share of the prompt given to other files of the repository

    def __post_init__(self) -> None:
        if self.min_prefix_chars < 1 or self.max_requests < 1 or self.seq_len < 32:
            raise ValueError("min_prefix_chars and max_requests must be >= 1, seq_len >= 32")


def requests(files: list[RepoFile], config: UserConfig) -> list[Cursor]:
    """The cursors the user asks at (see the module docstring), in file order."""
    per_file: list[list[int]] = []
    for f in files:
        offsets, at = [], 0
        for line in f.text.splitlines(keepends=True):
            body = line.rstrip("\n")
            indent = len(body) - len(body.lstrip())
            if body.strip() and not body.lstrip().startswith("#"):
                stops = [indent] + [m.end() for m in WORD_BOUNDARY.finditer(body, indent)]
                for s in sorted(set(stops)):
                    if len(body[s:].strip()) >= config.min_rest_chars and at + s > 0:
                        offsets.append(at + s)
            at += len(line)
        random.Random(f"{config.seed}:{f.path}").shuffle(offsets)
        per_file.append(offsets)
    return spread_cursors(files, per_file, config.max_requests)


def judge(cursor: Cursor, suggestion: str, config: UserConfig) -> Outcome:
    """What the user does with `suggestion` at `cursor` (see the module docstring)."""
    request = f"{cursor.path}:{len(cursor.prefix)}"
    extra = {"expected": cursor.expected}
    if not suggestion:
        return Outcome(request, "", shown=False, extra=extra)
    truth = cursor.expected.rstrip()
    said = suggestion.rstrip()
    whole = said == truth and said != ""
    start = len(said) >= config.min_prefix_chars and truth.startswith(said)
    return Outcome(request, suggestion, True, len(said) if whole or start else 0, extra=extra)


def prompt_for(
    tokenizer, repo: str, context: list[RepoFile], cursor: Cursor, config: UserConfig
) -> list[int]:
    from training.repo_pretrain import CHARS_PER_TOKEN

    budget = int((config.seq_len - config.max_new_tokens) * CHARS_PER_TOKEN)
    prompt = cursor_prompt(repo, context, cursor, budget, config.context_share)
    return prompt_ids(tokenizer, prompt, config.seq_len - config.max_new_tokens)


def session(
    trunk,
    tokenizer,
    repo: str,
    context: list[RepoFile],
    files: list[RepoFile],
    config: UserConfig,
    show_min: float | None = None,
) -> list[Outcome]:
    """The user replays `files` (held out) with `context` (train files) and judges the model's
    greedy suggestions; one outcome per request. A suggestion below the model's threshold
    `show_min` (agent/confidence.py) is not shown; `extra` keeps its confidence, and what was
    withheld."""
    from agent.confidence import confidence, worth_showing
    from training.line_completion import complete

    out = []
    was_training = trunk.training
    trunk.eval()
    try:
        for cursor in requests(files, config):
            ids = prompt_for(tokenizer, repo, context, cursor, config)
            done: Completion = complete(
                trunk, tokenizer, ids, config.max_new_tokens, healed=cursor.healed
            )
            shown = worth_showing(done.logprobs, show_min)
            outcome = judge(cursor, done.text if shown else "", config)
            outcome.extra["confidence"] = confidence(done.logprobs)
            if not shown:
                outcome.extra["withheld"] = done.text
            out.append(outcome)
    finally:
        trunk.train(was_training)
    return out
