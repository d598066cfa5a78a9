"""Whether accepted code survives, and whether the user undid it at once.

Vocabulary:
  tracked span   where an accepted suggestion's text sits in its document now; every content
                 change moves it (a change before it shifts it; a change inside it widens it to
                 cover the new text, so a rewrite that keeps characters still counts them)
  surviving      characters of the accepted text still present in the span, in order (the
                 matching blocks of difflib's SequenceMatcher between the accepted text and the
                 span's text)
  check          at 30 s, 2, 5, 10 and 15 min after acceptance: one `survival` row each
  undone         within `undo_window_s` of acceptance nothing of the text survives: recorded as
                 a dissatisfied follow-up (and `reverted`) for that suggestion, once

Worked example: "return a + b" accepted at offset 10; the user types "x" at offset 0 (span moves
to 11..23), then replaces "a + b" with "a - b" (span text "return a - b"): 11 of 12 characters
survive, share 0.92.

The clock is injected (`clock()` returns seconds): the server passes `time.monotonic`, tests pass
a counter they advance, so nothing here sleeps. Documents are followed by their own text snapshot
(`apply_change` replays each change), kept only while they hold a tracked span.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field

from lsprotocol import types

from lsp.documents import apply_change

CHECKPOINTS_S = (30, 120, 300, 600, 900)
MAX_COMPARE_CHARS = 20_000  # longer accepted texts are compared on their first 20k characters


@dataclass
class Tracked:
    suggestion_id: str
    uri: str
    text: str  # what was accepted
    start: int  # span in the current snapshot of the document
    end: int
    accepted_at: float
    checks_done: int = 0  # how many of CHECKPOINTS_S are recorded
    undone: bool = False


@dataclass
class SurvivalCheck:
    suggestion_id: str
    after_s: int
    accepted_chars: int
    surviving_chars: int


def surviving_chars(accepted: str, current: str) -> int:
    a, b = accepted[:MAX_COMPARE_CHARS], current[: MAX_COMPARE_CHARS * 2]
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks())


@dataclass
class SurvivalTracker:
    clock: Callable[[], float]
    undo_window_s: float = 30.0
    _tracked: list[Tracked] = field(default_factory=list)
    _snapshots: dict[str, str] = field(default_factory=dict)  # uri -> text, tracked docs only

    def track(self, suggestion_id: str, uri: str, doc_text: str, offset: int, text: str) -> bool:
        """Follow `text`, expected at `offset` of `doc_text` (or nearby). False if not found."""
        if not text:
            return False
        start = offset if doc_text[offset : offset + len(text)] == text else -1
        if start < 0:  # the client moved the cursor or inserted with different indentation
            lo = max(0, offset - len(text) - 200)
            start = doc_text.find(text, lo, offset + 2 * len(text) + 200)
        if start < 0:
            return False
        self._snapshots[uri] = doc_text
        self._tracked.append(
            Tracked(suggestion_id, uri, text, start, start + len(text), self.clock())
        )
        return True

    def tracking(self, uri: str) -> bool:
        return uri in self._snapshots

    def on_change(self, uri: str, changes: list[types.TextDocumentContentChangeEvent]) -> list[str]:
        """Move spans through `changes`; return suggestion ids just undone (at most once each)."""
        text = self._snapshots.get(uri)
        if text is None:
            return []
        items = [t for t in self._tracked if t.uri == uri]
        for change in changes:
            text, cs, ce, n = apply_change(text, change)
            delta = n - (ce - cs)
            for t in items:
                if t.start == t.end and cs <= t.start <= ce:  # text lands where the span was
                    t.start, t.end = cs, ce + delta
                elif ce <= t.start:
                    t.start += delta
                    t.end += delta
                elif cs >= t.end:
                    continue
                else:
                    t.start, t.end = min(t.start, cs), max(t.end, ce) + delta
        self._snapshots[uri] = text
        undone = []
        now = self.clock()
        for t in items:
            if t.undone or now - t.accepted_at > self.undo_window_s:
                continue
            if surviving_chars(t.text, text[t.start : t.end]) == 0:
                t.undone = True
                undone.append(t.suggestion_id)
        return undone

    def due(self) -> list[SurvivalCheck]:
        """Checks whose time has come; each is returned once. Finished spans are dropped."""
        now = self.clock()
        out: list[SurvivalCheck] = []
        for t in self._tracked:
            while t.checks_done < len(CHECKPOINTS_S):
                after = CHECKPOINTS_S[t.checks_done]
                if now - t.accepted_at < after:
                    break
                current = self._snapshots.get(t.uri, "")[t.start : t.end]
                out.append(
                    SurvivalCheck(
                        t.suggestion_id, after, len(t.text), surviving_chars(t.text, current)
                    )
                )
                t.checks_done += 1
        self._tracked = [t for t in self._tracked if t.checks_done < len(CHECKPOINTS_S)]
        live = {t.uri for t in self._tracked}
        self._snapshots = {u: s for u, s in self._snapshots.items() if u in live}
        return out

    def __len__(self) -> int:
        return len(self._tracked)
