"""Next edit: from the user's recent edits in a document to the edit they will likely make next,
anywhere in a region around the last one (not only at the cursor).

Vocabulary:
  recent edit  one change the user made (didChange), kept per document as (start offset, removed
               text, inserted text, version); the last few are the model's evidence
  region       the lines around the most recent edit (and the cursor) that the model rewrites
  next edit    the first difference between the region and the model's rewrite, as a document
               range (UTF-16 positions of the version it was made for) and its new text

The prompt shows the recent edits as small diffs and the region, and asks for the region after
the next edit; the answer stops at the closing marker. Worked example:

    region (lines 3-5)       model's rewrite            next edit
    def area(w, h):          def area(width, h):        line 3 "def area(w, h):\\n"
        return w * h             return width * h    -> "def area(width, h):\\n" ... (the first
                                                        differing line block, one edit)

What it does not do: talk LSP or choose the model (server.py), or apply the edit (the client does,
after checking the version; the server refuses a request whose version has moved on).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from lsprotocol import types

from lsp.agent_tasks import hunks_between
from lsp.documents import apply_change

REGION_OPEN, REGION_CLOSE = "<region>", "</region>"


@dataclass
class RecentEdit:
    start: int  # code-point offset in the text before the edit
    removed: str
    inserted: str
    version: int  # the document version after the edit


@dataclass
class EditHistory:
    """Each open document's text as the server last saw it and its last `keep` edits."""

    keep: int = 8
    texts: dict[str, str] = field(default_factory=dict)
    edits: dict[str, deque[RecentEdit]] = field(default_factory=dict)

    def open(self, uri: str, text: str) -> None:
        self.texts[uri] = text
        self.edits[uri] = deque(maxlen=self.keep)

    def change(
        self, uri: str, version: int, changes: list[types.TextDocumentContentChangeEvent]
    ) -> None:
        text = self.texts.get(uri)
        if text is None:
            return
        history = self.edits.setdefault(uri, deque(maxlen=self.keep))
        for change in changes:
            new, start, end, inserted = apply_change(text, change)
            if getattr(change, "range", None) is None:  # a whole-document replacement
                history.clear()
            else:
                history.append(RecentEdit(start, text[start:end], change.text, version))
            text = new
        self.texts[uri] = text

    def close(self, uri: str) -> None:
        self.texts.pop(uri, None)
        self.edits.pop(uri, None)

    def recent(self, uri: str) -> list[RecentEdit]:
        return list(self.edits.get(uri, ()))


@dataclass
class Region:
    start: int  # code-point offsets of the region in the document
    end: int
    first_line: int  # 0-based line of `start`
    text: str


def region_around(text: str, offsets: list[int], context_lines: int) -> Region:
    """Whole lines from `context_lines` above the first offset to as many below the last."""
    lo, hi = min(offsets), max(offsets)
    start = text.rfind("\n", 0, lo) + 1
    for _ in range(context_lines):
        if start == 0:
            break
        start = text.rfind("\n", 0, start - 1) + 1
    end = hi
    for _ in range(context_lines + 1):
        nl = text.find("\n", end)
        if nl < 0:
            end = len(text)
            break
        end = nl + 1
    return Region(start, end, text.count("\n", 0, start), text[start:end])


def _diff_lines(prefix: str, text: str) -> str:
    return "".join(f"{prefix}{line}\n" for line in text.splitlines()) if text else ""


def build_prompt(name: str, text: str, edits: list[RecentEdit], region: Region) -> str:
    """The next-edit prompt: recent edits (oldest first) as diffs, then the region to rewrite."""
    parts = [f"# File: {name}\n# Recent edits, oldest first:\n"]
    for e in edits:
        line = text.count("\n", 0, min(e.start, len(text))) + 1
        parts.append(f"@@ line {line}\n{_diff_lines('-', e.removed)}{_diff_lines('+', e.inserted)}")
    parts.append(
        f"# Lines {region.first_line + 1}-{region.first_line + region.text.count(chr(10))} "
        "before the next edit:\n"
        f"{REGION_OPEN}\n{region.text}{REGION_CLOSE}\n"
        "# The same lines after the next edit:\n"
        f"{REGION_OPEN}\n"
    )
    return "".join(parts)


def parse_rewrite(output: str, stopped: bool) -> str | None:
    """The rewritten region from the model's output; None when it never closed the region.

    `stopped`: the engine stopped at the closing marker (stop strings are not part of the output).
    """
    end = output.find(REGION_CLOSE)
    if end >= 0:
        return output[:end]
    return output if stopped else None


def next_edit(region: Region, rewrite: str) -> tuple[int, int, str] | None:
    """The first change from the region to its rewrite: (start, end) document offsets and new
    text; None when the rewrite changes nothing."""
    old = region.text if region.text.endswith("\n") or not region.text else region.text + "\n"
    new = rewrite if rewrite.endswith("\n") or not rewrite else rewrite + "\n"
    hunks = hunks_between(old, new)
    if not hunks:
        return None
    h = hunks[0]
    end = min(h.end, len(region.text))
    replacement = h.replacement
    if h.end > len(region.text) and replacement.endswith("\n"):  # the newline we added above
        replacement = replacement[:-1]
    return region.start + h.start, region.start + end, replacement
