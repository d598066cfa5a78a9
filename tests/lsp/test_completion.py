"""Inline completion end to end: `flywheel lsp` as a subprocess, a tiny checkpoint as the model."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types

from tests.lsp.conftest import inline_params

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_ghost_text_shown_accepted_recorded_with_utf16_positions(editor, doc_uri):
    ed = editor
    # Emoji (2 UTF-16 units) and CJK (1 unit) before the cursor on the same line.
    line = 's = "😀中文😀" + '
    ed.open(doc_uri, "import os\n" + line + "\n")
    cursor = len(line.encode("utf-16-le")) // 2  # 16 UTF-16 units, 14 code points
    result = await ed.client.text_document_inline_completion_async(
        inline_params(doc_uri, 1, cursor)
    )
    assert result is not None and len(result.items) == 1
    item = result.items[0]
    assert item.insert_text
    assert item.range.start == types.Position(line=1, character=cursor) == item.range.end
    assert item.command.command == "flywheel.acceptCompletion"
    sid = item.command.arguments[0]

    (row,) = await ed.rows("suggestions", id=sid)
    assert row["kind"] == "inline" and row["output"] == item.insert_text
    assert row["model_version"] == "tiny-seed0" and row["document_version"] == 1
    assert row["context"].count("😀") == 2  # the prefix was cut at the right code point
    (session,) = await ed.rows("sessions", id=row["session_id"])
    assert session["model_version"] == "tiny-seed0"  # known once the engine loaded

    ed.client.protocol.notify("flywheel/completionShown", {"suggestionId": sid})
    # The editor inserts the text at the cursor, then runs the item's command.
    ed.change(doc_uri, item.range, item.insert_text)
    answer = await ed.command("flywheel.acceptCompletion", sid)
    assert answer == {"suggestionId": sid, "tracked": True}
    events = {r["event"]: r for r in await ed.rows("suggestion_events", suggestion_id=sid)}
    assert set(events) == {"shown", "accepted"}
    assert events["accepted"]["accepted_chars"] == len(item.insert_text)
    # split at "\n" both sides: str.splitlines also splits at \x0c, \u2028 ..., which a sampled
    # suggestion may hold and which are no line breaks to an editor
    assert ed.texts[doc_uri].split("\n")[1] == line + item.insert_text.split("\n")[0]


async def test_partial_acceptance_and_rejection_are_recorded(editor, doc_uri):
    ed = editor
    ed.open(doc_uri, "x = 1\ny = ")
    first = await ed.client.text_document_inline_completion_async(inline_params(doc_uri, 1, 4))
    sid = first.items[0].command.arguments[0]
    ed.client.protocol.notify(
        "flywheel/completionPartiallyAccepted", {"suggestionId": sid, "acceptedChars": 2}
    )
    ed.client.protocol.notify("flywheel/completionRejected", {"suggestionId": sid})
    rows = await ed.rows("suggestion_events", suggestion_id=sid)
    assert [(r["event"], r["accepted_chars"]) for r in rows] == [
        ("partially_accepted", 2),
        ("rejected", None),
    ]


async def test_a_rejection_that_arrives_after_the_next_request_is_still_recorded(editor, doc_uri):
    ed = editor
    ed.open(doc_uri, "x = 1\ny = ")
    first = await ed.client.text_document_inline_completion_async(inline_params(doc_uri, 1, 4))
    sid = first.items[0].command.arguments[0]
    # The user moves on and types elsewhere: the next request supersedes the suggestion before
    # the client's own "rejected" for it arrives.
    ed.change(doc_uri, types.Range(start=types.Position(0, 5), end=types.Position(0, 5)), "2")
    second = await ed.client.text_document_inline_completion_async(inline_params(doc_uri, 0, 6))
    assert second is not None and second.items[0].command.arguments[0] != sid
    for _ in range(2):  # a repeated rejection is recorded once
        ed.client.protocol.notify("flywheel/completionRejected", {"suggestionId": sid})
    rows = await ed.rows("suggestion_events", suggestion_id=sid)
    assert [r["event"] for r in rows] == ["superseded", "rejected"]


async def test_new_keystrokes_cancel_or_supersede_earlier_requests(editor, doc_uri):
    ed = editor
    ed.open(doc_uri, "def f():\n    ")
    ids = []
    pending = []
    for i in range(4):  # type a character, ask again at once: each request replaces the last
        ed.change(
            doc_uri, types.Range(start=types.Position(1, 4 + i), end=types.Position(1, 4 + i)), "a"
        )
        pending.append(
            asyncio.ensure_future(
                ed.client.text_document_inline_completion_async(inline_params(doc_uri, 1, 5 + i))
            )
        )
    results = await asyncio.gather(*pending)
    assert results[-1] is not None, "the newest request gets its suggestion"
    for r in results:
        if r is not None:
            ids.append(r.items[0].command.arguments[0])
    suggestions = await ed.rows("suggestions", document_uri=doc_uri)
    events = await ed.rows("suggestion_events")
    ended = {e["suggestion_id"] for e in events if e["event"] in ("cancelled", "superseded")}
    latest = ids[-1]
    earlier = {s["id"] for s in suggestions} - {latest}
    assert earlier, "earlier requests reached the model or were answered"
    assert earlier <= ended, "every earlier suggestion ended cancelled or superseded"
    assert latest not in ended


async def test_completion_fallback_and_cache(editor, doc_uri):
    ed = editor
    ed.open(doc_uri, "value = ")
    params = types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=doc_uri),
        position=types.Position(line=0, character=8),
    )
    first = await ed.client.text_document_completion_async(params)
    item = first.items[0]
    assert item.text_edit.new_text and item.command.command == "flywheel.acceptCompletion"
    # Asked again for the same place while it is open: the same suggestion (one ghost text).
    repeat = await ed.client.text_document_completion_async(params)
    sid = item.command.arguments[0]
    assert list(repeat.items[0].command.arguments) == [sid]
    # Once it is rejected (Esc), the cache never offers it again: the model is asked anew.
    ed.client.protocol.notify("flywheel/completionRejected", {"suggestionId": sid})
    again = await ed.client.text_document_completion_async(params)
    rows = {r["id"]: r for r in await ed.rows("suggestions")}
    assert rows[again.items[0].command.arguments[0]]["trigger"] != "cache"
