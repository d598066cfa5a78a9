"""Where draft tokens come from: n-gram prompt lookup, the model's MTP heads, a draft model.

A proposer serves one sample of one request (it may keep per-sample state) and is asked for up to
k draft tokens after each verify step. Drafts never change what is sampled: the rejection sampler
(`rejection_sampler.py`) keeps only what the target model agrees with, so a proposer only has to
be cheap and often right. None of them take the engine's lock; the engine holds it around calls
that run a model (`mtp`, `draft`).

- `NgramProposer` (no model): find the latest earlier occurrence of the context's last n tokens
  (n from ngram_max down to ngram_min) that is followed by k tokens (else the earliest) and
  propose the tokens that followed it. The request's
  `speculation` text (the original file of an apply/rewrite request) is searched first, from a
  cursor that follows the output along it, so a rewrite is drafted from the original text.

  Worked example (ngram_max 2, k 3), context ... `x = 1 ; y = x` with tokens [x, =, 1, ;, y, =, x]:
  the suffix [=, x] does not occur earlier; [x] occurs at index 0, followed by [=, 1, ;]: the
  draft is [=, 1, ;] (deterministic, so q is one-hot).
- `MTPProposer`: the trunk's own MTP heads (`agent.model.MTPHeads`). It keeps a rolling buffer of
  the trunk's final hidden states h_0 for the last `window` positions in the target's KV cache
  and re-runs the heads causally over that window each step (no per-head KV cache): head j at the
  last position i = len(tokens) - 2 reads h_j[i] and the embedding of t[i+j+1] (the previous
  draft for j >= 1) and drafts t[i+j+2]. Drafts are the heads' argmax (deterministic), at most
  `depth` per step. Approximate by design: the verifier makes the output exact.
- `DraftModelProposer`: a smaller model sharing the tokenizer, with its own KV cache that is
  re-synchronised with the accepted tokens before each proposal; drafts are sampled from its own
  distribution q (same temperature/top-k/top-p as the request; argmax when greedy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from agent.engine.model_runner import LoadedModel
from agent.engine.request import SamplingParams
from agent.engine.sampling import sample, target_probs


@dataclass
class Draft:
    token_ids: list[int]  # [k'] k' <= k draft tokens (may be empty)
    probs: torch.Tensor | None = None  # [k', vocab] q of each draft, None when deterministic


class Proposer(Protocol):
    max_depth: int  # the most drafts one call can return (e.g. the number of MTP heads)
    needs_hidden: bool  # whether `observe` wants the trunk's hidden states

    def observe(self, hidden: torch.Tensor) -> None:
        """h_0 [m, hidden] of the positions just kept in the target's KV cache, in order."""
        ...

    def propose(self, tokens: list[int], k: int) -> Draft:
        """Up to k drafts to follow `tokens` (prompt + accepted output so far)."""
        ...


NO_DRAFT = Draft([])


class NgramProposer:
    """Prompt lookup over the context, plus the request's speculation text."""

    max_depth = 1 << 30
    needs_hidden = False

    def __init__(self, ngram_min: int, ngram_max: int, speculation: list[int] | None = None):
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.speculation = np.asarray(speculation or [], dtype=np.int64)
        self.cursor = 0  # where the output last continued from in `speculation`

    def observe(self, hidden: torch.Tensor) -> None:
        pass

    def propose(self, tokens: list[int], k: int) -> Draft:
        if k <= 0:
            return NO_DRAFT
        context = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.ngram_max, len(context) - 1), self.ngram_min - 1, -1):
            suffix = context[-n:]
            if len(self.speculation) > n:
                start = _match_after(self.speculation, suffix, self.cursor)
                if start is not None:
                    self.cursor = start + n
                    return Draft(self.speculation[start + n : start + n + k].tolist())
            start = _latest_match(context[:-1], suffix, k)
            if start is not None:
                return Draft(context[start + n : start + n + k].tolist())
        return NO_DRAFT


def _matches(haystack: np.ndarray, needle: np.ndarray) -> np.ndarray:
    """Start indices where `needle` occurs in `haystack` and at least one token follows it."""
    n = len(needle)
    if len(haystack) <= n:
        return np.empty(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(haystack[:-1], n)  # [len - n, n]
    return np.flatnonzero((windows == needle).all(axis=1))


def _latest_match(haystack: np.ndarray, needle: np.ndarray, k: int) -> int | None:
    """The latest match followed by k tokens, else the earliest (the longest continuation).

    In repetitive text the latest match sits just before the end, with too little after it.
    """
    found = _matches(haystack, needle)
    if not len(found):
        return None
    full = found[found + len(needle) + k <= len(haystack) + 1]
    return int(full[-1]) if len(full) else int(found[0])


def _match_after(haystack: np.ndarray, needle: np.ndarray, cursor: int) -> int | None:
    """The first match ending after `cursor` (the output moves forward), else the last one."""
    found = _matches(haystack, needle)
    if not len(found):
        return None
    after = found[found + len(needle) > cursor]
    return int(after[0]) if len(after) else int(found[-1])


class MTPProposer:
    """Drafts from the trunk's MTP heads over a rolling window of recent hidden states."""

    needs_hidden = True

    def __init__(self, model: LoadedModel, window: int = 32):
        heads = model.checkpoint.heads
        if heads is None:
            raise ValueError("MTPProposer needs a checkpoint with MTP heads")
        self.heads = heads
        self.max_depth = heads.config.depth
        self.window = window
        self.hidden: torch.Tensor | None = None  # [<= window, hidden] h_0 of the last positions
        self.known = 0  # positions whose h_0 has been observed (= target KV cache length)

    def observe(self, hidden: torch.Tensor) -> None:
        self.known += hidden.shape[0]
        joined = hidden if self.hidden is None else torch.cat([self.hidden, hidden])
        self.hidden = joined[-self.window :]

    def propose(self, tokens: list[int], k: int) -> Draft:
        k = min(k, self.max_depth)
        if k <= 0 or self.hidden is None or self.known != len(tokens) - 1:
            return NO_DRAFT
        size = self.hidden.shape[0]
        first = self.known - size  # absolute position of the window's first row
        device = self.hidden.device
        positions = torch.arange(first, self.known, device=device)[None]  # [1, size]
        ext = torch.tensor(tokens[first:], device=device)  # t[first..]
        h = self.hidden[None]  # [1, size, hidden]
        drafts: list[int] = []
        for j in range(k):
            # head j at position i reads t[i + j + 1]; past the end those are earlier drafts
            next_ids = ext[j + 1 : j + 1 + size][None]  # [1, size]
            h = self.heads.forward_head(j, h, next_ids, positions)
            draft = self.heads.logits(j, h[:, -1]).argmax(-1)  # [1]
            drafts.append(int(draft))
            ext = torch.cat([ext, draft])
        return Draft(drafts)


class DraftModelProposer:
    """Drafts sampled from a smaller model with its own KV cache."""

    max_depth = 1 << 30
    needs_hidden = False

    def __init__(
        self,
        model: LoadedModel,
        params: SamplingParams,
        generator: torch.Generator,
        target_vocab: int,
    ):
        self.model = model
        self.params = params
        self.generator = generator
        self.target_vocab = target_vocab
        self.cache = model.new_cache()
        self.fed: list[int] = []  # tokens whose keys/values are in self.cache
        self.stable = 0  # len(self.fed) is only trusted up to here (before the last drafts)

    def observe(self, hidden: torch.Tensor) -> None:
        pass

    def propose(self, tokens: list[int], k: int) -> Draft:
        k = min(k, self.model.context_length - len(tokens))
        if k <= 0:
            return NO_DRAFT
        keep = self.stable  # the accepted tokens only ever extend what we had before the drafts
        while keep < min(len(self.fed), len(tokens) - 1) and self.fed[keep] == tokens[keep]:
            keep += 1
        if keep < len(self.fed):
            self.cache.crop(keep - len(self.fed))
        device = self.model.device
        new = torch.tensor([tokens[keep:]], device=device)  # [1, >= 1]
        logits = self._logits(new)
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        for j in range(k):
            if self.params.greedy:
                token = logits.argmax(-1)  # [1]
            else:
                q = target_probs(logits, self.params)  # [1, vocab]
                token = sample(q, self.generator)
                probs.append(q[0])
            drafts.append(int(token))
            if j < k - 1:
                logits = self._logits(token[None])
        self.fed = tokens + drafts[:-1]
        self.stable = len(tokens)
        return Draft(drafts, torch.stack(probs) if probs else None)

    def _logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Last-position logits [1, target vocab] (padded or cut to the target's vocabulary)."""
        logits = self.model.forward(ids, self.cache, last_only=True)[0][:, -1].float()
        vocab = logits.shape[-1]
        if vocab > self.target_vocab:
            return logits[:, : self.target_vocab]
        if vocab < self.target_vocab:
            pad = logits.new_full((1, self.target_vocab - vocab), float("-inf"))
            return torch.cat([logits, pad], -1)
        return logits
