"""Fast apply that copies: a logit bonus for the tokens that continue the texts being rewritten.

A fast-apply request (`Request.apply`) asks for a whole file: the original (the request's
`speculation`) with an edit sketch applied. Nearly every output token continues one of two
texts: the original, where the code is unchanged, or the sketch, where it changes. A small
model knows some files by heart, and there its memory can outvote what it reads: it "fixes" a
comment word, a return value or a name it remembers differently. `CopyBias` adds `bias` to the
logit of each token that continues a source text where the output stands in it, so the model
leaves both sources only where it is more than e^bias times surer of another token. An edit
the sketch makes stays possible: the sketch's own continuation gets the bonus too.

Where the output stands in a source: it follows the source token by token while the output
copies it. After a token that leaves it, it re-anchors on the longest suffix of the output (at
least ANCHOR_MIN, at most ANCHOR_MAX tokens) that occurs in the source: of its occurrences, the
first that ends after the old position (a rewrite moves forward through a file), else the last.
No such suffix: no bonus from that source until one occurs.

    original (tokens): x = 1 \\n y = 2 \\n z = 3 \\n
    output  x = 1 \\n y =      the bonus goes to 2
    output  ... y = 5          it left the original: "= 5", "5" are nowhere in it; no bonus
    output  ... y = 5 \\n z    "\\n z" is: the bonus goes to "=" again, then 3, and so on

The sources: the speculation (the original file, which the output starts at), and the prompt
text after it (in agent/chat_format.py's `apply_messages` layout, the sketch). The rule shapes
the logits like the tool-call grammar does (tool_grammar.py): plain decoding applies it at each
step, the speculative verifier at each draft position with the state after the drafts before
it, so speculation stays exact. Local backend only; `EngineConfig.apply_copy_bias` sets the
bonus (default config.APPLY_COPY_BIAS; 0 turns it off).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from agent.engine.local.proposers import occurrences

if TYPE_CHECKING:
    import torch

ANCHOR_MIN = 2  # shortest output suffix that re-anchors (one token matches too many places)
ANCHOR_MAX = 24  # longest output suffix compared


class CopyBias:
    """The rule for one request: its source texts, as token ids, and the bonus."""

    def __init__(self, sources: list[list[int]], bias: float):
        self.sources = [np.asarray(s, dtype=np.int64) for s in sources]
        self.bias = float(bias)

    @classmethod
    def for_request(
        cls,
        prompt_ids: list[int],
        speculation: str | None,
        speculation_ids: list[int] | None,
        tokenizer,
        bias: float,
    ) -> CopyBias | None:
        """The speculation (its token ids given) and the prompt text after its last occurrence
        in the prompt (the whole prompt if it does not occur there); None without a speculation
        or a bonus."""
        if not speculation or not speculation_ids or not bias:
            return None
        prompt = tokenizer.decode(prompt_ids)
        at = prompt.rfind(speculation)
        rest = prompt[at + len(speculation) :] if at >= 0 else prompt
        return cls([speculation_ids, tokenizer.encode(rest, add_special_tokens=False)], bias)

    def start(self) -> CopyState:
        """The state before the first output token: at the start of the speculation, nowhere
        yet in the other sources."""
        return CopyState(self, [0] + [None] * (len(self.sources) - 1), [0] * len(self.sources))


class CopyState:
    """Where one sample's output stands in each source; `adjust_` then `advance` at every
    position (the interface of tool_grammar.GrammarState)."""

    def __init__(self, rule: CopyBias, at: list[int | None], last: list[int]):
        self.rule = rule
        self.at = at  # per source: the index of the token the output continues with, or None
        self.last = last  # per source: the last index it stood at (where re-anchoring searches)
        self.recent: list[int] = []  # the output's last ANCHOR_MAX tokens

    def copy(self) -> CopyState:
        new = CopyState(self.rule, list(self.at), list(self.last))
        new.recent = list(self.recent)
        return new

    def favoured(self) -> list[int]:
        """The tokens that continue a source here (each once)."""
        out = []
        for source, at in zip(self.rule.sources, self.at, strict=True):
            if at is not None and at < len(source) and int(source[at]) not in out:
                out.append(int(source[at]))
        return out

    def constrain(self, logits: torch.Tensor) -> torch.Tensor:
        """A copy of `logits` ([..., vocab]) with the bonus added."""
        logits = logits.clone()
        self.adjust_(logits)
        return logits

    def adjust_(self, logits: torch.Tensor) -> None:
        """Add the bonus to the favoured tokens' logits ([..., vocab]), in place."""
        ids = [t for t in self.favoured() if t < logits.shape[-1]]
        if ids:
            logits[..., ids] += self.rule.bias

    def advance(self, token: int) -> None:
        self.recent = (self.recent + [token])[-ANCHOR_MAX:]
        for k, source in enumerate(self.rule.sources):
            at = self.at[k]
            if at is not None and at < len(source) and source[at] == token:
                self.at[k] = self.last[k] = at + 1
                continue
            self.at[k] = _anchor(source, self.recent, self.last[k])
            if self.at[k] is not None:
                self.last[k] = self.at[k]


def _anchor(source: np.ndarray, recent: list[int], cursor: int) -> int | None:
    """The index after the longest suffix of `recent` (>= ANCHOR_MIN tokens) that occurs in
    `source` followed by a token: of its occurrences, the first that ends after `cursor`, else
    the last. None when no such suffix occurs."""
    n = ANCHOR_MIN
    if len(recent) < n:
        return None
    starts = occurrences(source, np.asarray(recent[-n:], dtype=np.int64))
    while len(starts) and n < len(recent):  # grow the suffix while some occurrence still fits
        before = starts - 1
        keep = before >= 0
        keep[keep] = source[before[keep]] == recent[-n - 1]
        if not keep.any():
            break
        starts, n = before[keep], n + 1
    if not len(starts):
        return None
    ends = starts + n
    later = ends[ends > cursor]
    return int(later[0]) if len(later) else int(ends[-1])
