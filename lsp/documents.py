"""Positions and offsets in document text, in LSP's units.

LSP positions are (line, character) where `character` counts UTF-16 code units: an emoji such as
"😀" (outside the Basic Multilingual Plane) is 2 units, a CJK character "中" is 1. Python strings
index code points, so every position that crosses the wire goes through this module:

    text = "a😀中b"
    offset_at(text, Position(0, 4))    -> 3   ("a", "😀", "中" precede it)
    position_at(text, 3)               -> Position(line=0, character=4)

Lines end at "\\n" ("\\r\\n" counts its "\\r" as part of the line, as LSP says). A position past the
end of a line clamps to the line's end; a line past the end clamps to the end of the text.

The server stores open documents in pygls's workspace (text and version); this module holds the
pure functions on top of it. It also applies one content change to a text (`apply_change`), which
survival tracking uses to follow accepted code through edits.
"""

from __future__ import annotations

from lsprotocol import types

MAX_DOCUMENT_CHARS = 20_000_000  # larger documents are kept but get no suggestions


def _utf16_len(s: str) -> int:
    return len(s) + sum(1 for c in s if ord(c) > 0xFFFF)


def _line_start(text: str, line: int) -> int | None:
    """Offset of the first character of `line`, or None past the last line."""
    start = 0
    for _ in range(line):
        nl = text.find("\n", start)
        if nl < 0:
            return None
        start = nl + 1
    return start


def offset_at(text: str, position: types.Position) -> int:
    """Code-point offset of an LSP position (UTF-16 units), clamped into the text."""
    start = _line_start(text, position.line)
    if start is None:
        return len(text)
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    units = 0
    i = start
    while i < end and units < position.character:
        units += 2 if ord(text[i]) > 0xFFFF else 1
        i += 1
    return i


def position_at(text: str, offset: int) -> types.Position:
    """LSP position (UTF-16 units) of a code-point offset, clamped into the text."""
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset)
    line_start = text.rfind("\n", 0, offset) + 1
    return types.Position(line=line, character=_utf16_len(text[line_start:offset]))


def range_of(text: str, start: int, end: int) -> types.Range:
    return types.Range(start=position_at(text, start), end=position_at(text, end))


def apply_change(
    text: str, change: types.TextDocumentContentChangeEvent
) -> tuple[str, int, int, int]:
    """Apply one change; return (new text, start, end, inserted length) in old-text offsets."""
    rng = getattr(change, "range", None)
    if rng is None:  # a whole-document replacement
        return change.text, 0, len(text), len(change.text)
    start, end = offset_at(text, rng.start), offset_at(text, rng.end)
    start, end = min(start, end), max(start, end)
    return text[:start] + change.text + text[end:], start, end, len(change.text)


def looks_binary(text: str) -> bool:
    """A NUL in the first 8 KB: the client opened a binary file (no completions for it)."""
    return "\x00" in text[:8192]


def suggestible(text: str) -> bool:
    """Documents too large or binary are kept but get no suggestions."""
    return len(text) <= MAX_DOCUMENT_CHARS and not looks_binary(text)
