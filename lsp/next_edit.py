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

`NextEditService` runs a request: one at a time per document (a newer request cancels the one
still running), records each as a `next_edit` suggestion, and offers what it found to the
completion service, so that accepting it (`flywheel.acceptCompletion`) is tracked like an inline
completion. A request is bounded: its prompt by `max_prompt_chars` (old edits are cut to their
first lines, then dropped; a region larger than that gets no next edit), its output by
`max_tokens`, its time by `max_wall_ms` (then it is stopped and answers nothing). It is stopped
as soon as the document changes (`cancel`), and it decodes in the engine's "prefetch" lane,
behind every inline completion (agent/engine/scheduler.py).

What it does not do: talk LSP (server.py checks the version asked for and converts the answer),
or apply the edit (the client does, after checking the version; the server refuses a request
whose version has moved on, before or after the model ran: `VersionMoved`).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lsprotocol import types

from agent.engine import Cancelled, EngineError, Request, Result
from lsp.completion import CompletionService, Suggestion, suggestion_request
from lsp.documents import apply_change, offset_at, range_of
from lsp.model_host import ModelHost
from lsp.proposals import hunks_between
from lsp.settings import ModelSettings, NextEditSettings

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


EDIT_CHARS = 400  # each side of a recent edit shown, at most (a paste is cut)


def _cut(text: str) -> str:
    return text if len(text) <= EDIT_CHARS else text[:EDIT_CHARS].rsplit("\n", 1)[0] + "\n…\n"


def build_prompt(
    name: str, text: str, edits: list[RecentEdit], region: Region, max_chars: int = 1 << 30
) -> str | None:
    """The next-edit prompt: recent edits (oldest first) as diffs, then the region to rewrite;
    within `max_chars` (edits cut, then the oldest dropped), None when the region alone is over."""
    head = f"# File: {name}\n# Recent edits, oldest first:\n"
    diffs = []
    for e in edits:
        line = text.count("\n", 0, min(e.start, len(text))) + 1
        removed, inserted = _diff_lines("-", _cut(e.removed)), _diff_lines("+", _cut(e.inserted))
        diffs.append(f"@@ line {line}\n{removed}{inserted}")
    tail = (
        f"# Lines {region.first_line + 1}-{region.first_line + region.text.count(chr(10))} "
        "before the next edit:\n"
        f"{REGION_OPEN}\n{region.text}{REGION_CLOSE}\n"
        "# The same lines after the next edit:\n"
        f"{REGION_OPEN}\n"
    )
    while diffs and len(head) + sum(map(len, diffs)) + len(tail) > max_chars:
        diffs.pop(0)
    prompt = head + "".join(diffs) + tail
    return prompt if len(prompt) <= max_chars else None


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


class VersionMoved(Exception):
    """The document is not at the version the edit was asked for (or made for)."""

    def __init__(self, asked: Any, now: Any) -> None:
        super().__init__(f"version {now}, not {asked}")
        self.asked, self.now = asked, now


@dataclass
class NextEdit:
    suggestion_id: str
    version: int  # the document version `range` is in
    range: types.Range
    new_text: str


class NextEditService:
    def __init__(
        self,
        host: ModelHost,
        completions: CompletionService,
        record: Callable[..., str | None],
        now: Callable[[], float],
        document: Callable[[str], Any],
    ) -> None:
        self.host = host
        self.completions = completions
        self.record = record
        self.now = now
        self.document = document  # uri -> the open document now, or None
        self.history = EditHistory()  # recent edits per document
        self.running: dict[str, threading.Event] = {}  # uri -> cancel of its request

    def abandon(self) -> None:
        """Cancel every request still running (the server is closing)."""
        for event in self.running.values():
            event.set()

    def cancel(self, uri: str) -> None:
        """The document changed: its running request is stopped (its answer would be stale)."""
        event = self.running.get(uri)
        if event is not None:
            event.set()

    async def suggest(
        self,
        doc: Any,
        position: types.Position | None,
        settings: NextEditSettings,
        model: ModelSettings,
    ) -> NextEdit | None:
        """The next edit in `doc` (a pygls document) near its last edit and `position`; None
        when there is no recent edit, no model, or nothing to change. Raises VersionMoved when
        the document changed while the model ran."""
        uri, version, text = doc.uri, doc.version or 0, doc.source
        edits = self.history.recent(uri)[-settings.recent_edits :]
        if not settings.enabled or not edits:
            return None
        last = edits[-1]
        anchors = [min(last.start + len(last.inserted), len(text))]
        if position is not None:
            anchors.append(offset_at(text, position))
        region = region_around(text, anchors, settings.context_lines)
        name = uri.rsplit("/", 1)[-1]
        prompt = build_prompt(name, text, edits, region, settings.max_prompt_chars)
        if prompt is None:
            return None  # lines too long to rewrite within the bound
        previous = self.running.pop(uri, None)
        if previous is not None:
            previous.set()
        cancel = self.running[uri] = threading.Event()
        try:
            engine = await self.host.get(model)
        except EngineError:
            return None
        sid = uuid.uuid4().hex
        # behind the inline completion of the next keystroke
        request = suggestion_request(prompt, settings, [REGION_CLOSE], cancel, sid, "prefetch")
        row = {
            "id": sid,
            "kind": "next_edit",
            "trigger": "invoked",
            "document_uri": uri,
            "document_version": version,
            "language": doc.language_id or "",
            "context": {"region": region.text, "recent_edits": len(edits)},
        }
        started = time.perf_counter()
        result = await self._generate(engine, request, row, settings.max_wall_ms)
        if result is None:
            return None
        sample = result.completions[0]
        rewrite = parse_rewrite(sample.text, stopped=sample.finish_reason == "stop")
        found = next_edit(region, rewrite) if rewrite is not None else None
        m = result.metrics
        self.record(
            "suggestion",
            **row,
            output=found[2] if found else "",
            latency_ms=(time.perf_counter() - started) * 1000,
            prompt_tokens=m.prompt_tokens,
            output_tokens=m.output_tokens,
            model_version=sample.model_version or engine.model_version,
        )
        moved = self._moved(uri, version)
        if moved is not None:
            self.record("suggestion_event", suggestion_id=sid, event="superseded")
            raise moved
        if found is None:
            self.record("suggestion_event", suggestion_id=sid, event="ignored")
            return None
        start, end, new_text = found
        self.completions.offer(
            Suggestion(sid, uri, version, start, text[:start], new_text, self.now())
        )
        return NextEdit(sid, version, range_of(text, start, end), new_text)

    async def _generate(
        self, engine: Any, request: Request, row: dict[str, Any], max_wall_ms: float
    ) -> Result | None:
        """The model's answer within `max_wall_ms`; None when it failed (reported once) or was
        cut short by a newer request or the time limit (recorded cancelled). Raises
        VersionMoved when a change of the document cut it short."""
        uri, cancel = row["document_uri"], request.cancel
        deadline = asyncio.get_running_loop().call_later(max_wall_ms / 1000, cancel.set)
        try:
            result = await self.host.call(engine.generate, request)
        except (Cancelled, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError):
                self._cancelled(row)
                raise
            result = None
        except EngineError as exc:
            self.host.error_once(str(exc))
            return None
        finally:
            deadline.cancel()
            if self.running.get(uri) is cancel:
                del self.running[uri]
        if result is None or result.completions[0].finish_reason == "cancelled" or cancel.is_set():
            self._cancelled(row)
            moved = self._moved(uri, row["document_version"])
            if moved is not None:  # stopped by a change
                raise moved
            return None  # superseded by a newer request, or out of time
        return result

    def _moved(self, uri: str, version: int) -> VersionMoved | None:
        """VersionMoved when the document is no longer at `version` (or closed), else None."""
        now = self.document(uri)
        if now is None or (now.version or 0) != version:
            return VersionMoved(version, now.version if now else "closed")
        return None

    def _cancelled(self, row: dict[str, Any]) -> None:
        self.record("suggestion", **row)
        self.record("suggestion_event", suggestion_id=row["id"], event="cancelled")
