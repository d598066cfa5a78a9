"""Where draft tokens come from: n-gram prompt lookup, the model's MTP heads, both, a draft model.

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
- `MTPProposer`: the trunk's own MTP heads (`agent.mtp.MTPHeads`), run incrementally as in
  DeepSeek-V3 / vLLM MTP drafting: each head keeps its own KV cache. Head j at position i reads
  h_j[i] (h_0: the trunk's final hidden state, from `observe`) and the embedding of t[i+j+1], and
  drafts t[i+j+2] from the last position i = len(tokens) - 2. Past the accepted tokens, t[i+j+1]
  is an earlier draft, so head j caches only positions i < len(tokens) - 1 - j (inputs final) and
  re-runs the rest on the next call; nothing is ever cropped for a rejection beyond that.
  Worked example (2 heads, tokens t0..t5, so h_0 is known for positions 0..4): head 0 runs over
  its new positions up to 4 reading t[i+1] (all accepted) and drafts d1 = t6; head 1 runs up to
  4 reading t[i+2], which at position 4 is d1, drafts d2 = t7, then drops position 4 from its
  cache. The heads attend over a window: their caches restart from the last `window` positions
  once they span 2 * `window` (heads trained on short sequences draft worse over long contexts,
  and a long prompt costs them only `window` positions). Drafts are argmax over the heads'
  draft vocabulary (`MTPHeads.draft_vocab`, else the whole vocabulary), deterministic, at most
  `depth` per step, and with `alternatives` the first head's next best tokens beside them: a
  tree of drafts (`Draft.parents`) that the verify step checks in one pass. Approximate by
  design: the verifier makes the output exact.
- `NgramThenMTPProposer` ("ngram+mtp"): the n-gram draft where a suffix of two or more tokens
  occurs earlier, the heads' draft elsewhere; only the n-gram draft length adapts.
- `DraftModelProposer`: a smaller model sharing the tokenizer, with its own KV cache that is
  re-synchronised with the accepted tokens before each proposal; drafts are sampled from its own
  distribution q (same temperature/top-k/top-p as the request; argmax when greedy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from agent.engine.local.model_runner import LoadedModel
from agent.engine.local.sampling import sample, target_probs
from agent.engine.request import SamplingParams


@dataclass
class Draft:
    token_ids: list[int]  # [k'] k' <= k draft tokens (may be empty)
    probs: torch.Tensor | None = None  # [k', vocab] q of each draft, None when deterministic
    # other candidates for the first draft (deterministic drafts only): each is verified as a
    # branch of one token beside the chain, and kept with the token after it when the chain's
    # first draft is rejected and the target's own token there is that candidate
    alternatives: list[int] = field(default_factory=list)

    def parents(self) -> list[int] | None:
        """The verify step's tree over [last token, drafts, alternatives] (batched.Part), or
        None for a chain."""
        if not self.alternatives:
            return None
        k = len(self.token_ids)
        return [-1, *range(k)] + [0] * len(self.alternatives)


class Proposer(Protocol):
    max_depth: int  # the most drafts one call can return (e.g. the number of MTP heads)
    needs_hidden: bool  # whether `observe` wants the trunk's hidden states

    def skip(self, n: int) -> None:
        """The first `n` positions are in the target's KV cache without their hidden states
        (a prefix-cache hit); `observe` continues from there."""
        ...

    def observe(self, hidden: torch.Tensor) -> None:
        """h_0 [m, hidden] of the positions just kept in the target's KV cache, in order."""
        ...

    def propose(self, tokens: list[int], k: int) -> Draft:
        """Up to k drafts to follow `tokens` (prompt + accepted output so far)."""
        ...


NO_DRAFT = Draft([])
MTP_WINDOW = 32  # positions of trunk hidden states the MTP heads attend over
MIN_ALTERNATIVE_P = 0.1  # MTPProposer: the first head's least probability for an alternative


class NgramProposer:
    """Prompt lookup over the context, plus the request's speculation text."""

    max_depth = 1 << 30
    needs_hidden = False

    def __init__(self, ngram_min: int, ngram_max: int, speculation: list[int] | None = None):
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.speculation = np.asarray(speculation or [], dtype=np.int64)
        self.cursor = 0  # where the output last continued from in `speculation`

    def skip(self, n: int) -> None:
        pass

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


def occurrences(haystack: np.ndarray, needle: np.ndarray) -> np.ndarray:
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
    found = occurrences(haystack, needle)
    if not len(found):
        return None
    full = found[found + len(needle) + k <= len(haystack) + 1]
    return int(full[-1]) if len(full) else int(found[0])


def _match_after(haystack: np.ndarray, needle: np.ndarray, cursor: int) -> int | None:
    """The first match ending after `cursor` (the output moves forward), else the last one."""
    found = occurrences(haystack, needle)
    if not len(found):
        return None
    after = found[found + len(needle) > cursor]
    return int(after[0]) if len(after) else int(found[-1])


class MTPProposer:
    """Drafts from the trunk's MTP heads, each run incrementally over its own KV cache.

    Every call drafts with every head (`adapts`: the engine passes only its cap, never a
    shortened length): a head step costs a small fraction of a trunk step and a draft row a
    smaller one of the verify step, so cutting the draft after a miss saves almost nothing and
    loses the steps where both heads would have been right.

    With `alternatives`, the first head's next best tokens come with the draft
    (`Draft.alternatives`) where their probability is at least MIN_ALTERNATIVE_P: where its best
    is wrong its second is often right, and the verify step checks each as a branch of one token
    for one more row (local.SpeculativeSequence). The heads' probabilities are close to how
    often they are right, and a row pays only where it is right often enough."""

    needs_hidden = True
    adapts = True

    def __init__(self, model: LoadedModel, window: int = MTP_WINDOW, alternatives: int = 0):
        heads = model.checkpoint.heads
        if heads is None:
            raise ValueError("MTPProposer needs a checkpoint with MTP heads")
        if window < 1:
            raise ValueError("the MTP attention window must be >= 1")
        self.heads = heads
        self.max_depth = heads.config.depth
        self.window = window
        self.alternatives = alternatives  # the first head's next best tokens, at most
        self.device = model.device
        self.draft_vocab = heads.draft_vocab  # [d] ids drafted from, or None: every id
        self.draft_rows = heads.draft_rows()  # [d, hidden] their lm_head rows, or None
        self.known = 0  # positions whose h_0 has been observed (= target KV cache length)
        self.history: torch.Tensor | None = None  # [<= 2 window, hidden] h_0 of the last positions
        self.last: tuple[int, Draft] = (0, NO_DRAFT)  # len(tokens), the last call's draft
        self._restart(0)

    def _restart(self, base: int) -> None:
        """Empty the heads' caches; they start again at position `base`."""
        self.base = base
        self.cache = self.heads.new_cache()  # head j: keys/values of positions [base, c_j)
        self.cached = [base] * self.max_depth  # c_j >= c_j+1: head j's final inputs end sooner
        # pending[j]: [c_j-1 - c_j, hidden] the final inputs h_j of positions [c_j, c_j-1) that
        # head j has not cached yet (for j = 0: the observed h_0 of [c_0, known))
        self.pending: list[torch.Tensor | None] = [None] * self.max_depth
        if self.history is not None and self.known > base:
            self.pending[0] = self.history[base - self.known :]

    def skip(self, n: int) -> None:
        self.known, self.history = n, None
        self._restart(n)

    def observe(self, hidden: torch.Tensor) -> None:
        self.known += hidden.shape[0]
        self.pending[0] = _cat(self.pending[0], hidden)
        self.history = _cat(self.history, hidden)[-2 * self.window :]

    def propose(self, tokens: list[int], k: int) -> Draft:
        k = min(k, self.max_depth)
        n = len(tokens)
        if k <= 0 or self.known == 0 or self.known != n - 1:
            return NO_DRAFT
        if self.last[0] == n:  # asked again with nothing new observed: head 0 has no input
            last = self.last[1]
            return Draft(last.token_ids[:k], alternatives=last.alternatives)
        if n - 1 - self.base > 2 * self.window:  # also the first call after a long prompt
            self._restart(n - 1 - self.window)
        drafts: list[int] = []
        alternatives: list[int] = []
        speculative = None  # h_j of positions [n - j, n - 2]: built on drafts, never cached
        for j in range(k):
            start = self.cached[j]
            h = _cat(self.pending[j], speculative)  # [n - 1 - start, hidden] h_j of [start, n-2]
            ids = tokens[start + j + 1 :] + drafts  # t[i + j + 1] for i in [start, n - 2]
            out = self.heads.forward_head_cached(
                j,
                h[None],
                torch.tensor([ids], device=self.device),
                torch.arange(start, n - 1, device=self.device)[None],
                self.cache,
            )[0]  # [n - 1 - start, hidden] h_j+1 of [start, n - 2]
            logits = self.heads.logits(j, out[-1], self.draft_rows)  # [d] or [vocab]
            if j == 0 and self.alternatives:
                top = logits.softmax(-1).topk(1 + self.alternatives)
                kept = top.values >= MIN_ALTERNATIVE_P
                kept[0] = True
                best = top.indices[kept].tolist()
            else:
                best = [int(logits.argmax())]
            if self.draft_vocab is not None:
                best = self.draft_vocab[best].tolist()
            drafts.append(best[0])
            alternatives += best[1:]
            final = n - 1 - j  # head j read only accepted tokens at positions < final
            if j:
                self.cache[j].crop(-j)  # drop the positions that read drafts
            self.cached[j] = final
            end = n - 1 if j == 0 else self.cached[j - 1]
            self.pending[j] = h[final - start : end - start]  # h_j of [c_j, c_j-1)
            if j + 1 < self.max_depth:
                self.pending[j + 1] = _cat(self.pending[j + 1], out[: final - start])
            speculative = out[final - start :]  # h_j+1 of [final, n - 2]
        draft = Draft(drafts, alternatives=alternatives)
        self.last = (n, draft)
        return draft


class NgramThenMTPProposer:
    """Prompt lookup where the output repeats its context, the MTP heads elsewhere.

    An agent's turn alternates between text it copies (the search text of an edit, a file it
    rewrites) and text it writes fresh (a new line of code, its answer). Prompt lookup drafts the
    first in long runs and nothing useful for the second; the heads draft the second, two tokens
    at a time. So: the n-gram draft when a suffix of at least `NgramProposer.ngram_min` tokens
    (at least HYBRID_MIN_MATCH) occurs earlier, else the heads' draft. The heads observe every
    step either way, so they are in step whenever they are asked.

    The n-gram draft length adapts here (`adapts`: the engine then passes only a cap), by the
    engine's rule: +2 after a step that accepted the whole draft, -1 otherwise; the heads always
    draft with all of them (`MTPProposer`). With one shared length the heads' frequent misses
    would cut the long copies short. What was accepted is read off the next call's tokens: the
    n-gram drafts that reappear there, in order.
    """

    needs_hidden = True
    adapts = True

    def __init__(self, ngram: NgramProposer, mtp: MTPProposer, start: int, adaptive: bool):
        self.ngram, self.mtp = ngram, mtp
        self.max_depth = ngram.max_depth
        self.adaptive = adaptive
        self.length = start  # of n-gram drafts
        self.last: tuple[int, list[int]] | None = None  # len(tokens), drafts of an n-gram call

    def skip(self, n: int) -> None:
        self.mtp.skip(n)

    def observe(self, hidden: torch.Tensor) -> None:
        self.mtp.observe(hidden)

    def propose(self, tokens: list[int], k: int) -> Draft:
        if self.last is not None and self.adaptive:
            n, drafts = self.last
            kept = 0
            while (
                kept < len(drafts) and n + kept < len(tokens) and tokens[n + kept] == drafts[kept]
            ):
                kept += 1
            step = 2 if kept == len(drafts) else -1
            self.length = max(1, min(self.length + step, self.max_depth))
        self.last = None
        if k <= 0:
            return NO_DRAFT
        self.length = min(self.length, k)  # k: the engine's longest draft
        draft = self.ngram.propose(tokens, self.length)
        if draft.token_ids:
            self.last = (len(tokens), draft.token_ids)
            return draft
        return self.mtp.propose(tokens, k)


HYBRID_MIN_MATCH = 2  # a one-token match says little about what follows; the heads do better


def _cat(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    """Rows of a then rows of b; either may be None."""
    if a is None or not len(a):
        return b
    if b is None or not len(b):
        return a
    return torch.cat([a, b])


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

    def skip(self, n: int) -> None:
        pass

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
