"""Reviewable proposals (hunk by hunk, stale refused) and survival of accepted code.

Agent tasks, which make proposals through the harness, are in test_agent_tasks.py."""

from __future__ import annotations

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException

pytestmark = pytest.mark.asyncio(loop_scope="module")

BASE = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a + b\n"
FIXED = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"


async def propose(ed, uri: str) -> dict:
    answer = await ed.command(
        "flywheel.reviewEdit", {"uri": uri, "version": ed.versions[uri], "text": FIXED}
    )
    return answer["proposal"]


async def test_accept_one_hunk_reject_the_other(editor, tmp_path):
    ed, uri = editor, (tmp_path / "calc.py").as_uri()
    ed.open(uri, BASE)
    proposal = await propose(ed, uri)
    assert [h["newText"] for h in proposal["hunks"]] == ["    return a + b\n", "    return a * b\n"]
    assert proposal["version"] == 1
    note = ed.notes["flywheel/proposal"][-1]
    assert note["proposalId"] == proposal["proposalId"]

    pid = proposal["proposalId"]
    assert (await ed.command("flywheel.rejectHunk", pid, 0))["state"] == "rejected"
    assert (await ed.command("flywheel.acceptHunk", pid, 1))["state"] == "accepted"
    assert ed.texts[uri] == BASE.replace("a + b\n", "a * b\n")

    hunks = {h["idx"]: h for h in await ed.rows("hunks", edit_id=pid)}
    assert hunks[0]["outcome"] == "rejected" and hunks[1]["outcome"] == "accepted"
    assert hunks[1]["replacement"] == "    return a * b\n"
    (edit,) = await ed.rows("edits", id=pid)
    assert edit["document_version"] == 1


async def test_second_hunk_lands_after_first_moved_the_text(editor, tmp_path):
    ed, uri = editor, (tmp_path / "both.py").as_uri()
    ed.open(uri, "x = 1\n" + BASE)
    answer = await ed.command(
        "flywheel.reviewEdit", {"uri": uri, "text": "x = 1\n# two\n# lines\n" + FIXED}
    )
    proposal = answer["proposal"]
    pid = proposal["proposalId"]
    for h in proposal["hunks"]:
        await ed.command("flywheel.acceptHunk", pid, h["index"])
    assert ed.texts[uri] == "x = 1\n# two\n# lines\n" + FIXED


async def test_stale_proposal_is_refused_not_misapplied(editor, tmp_path):
    ed, uri = editor, (tmp_path / "stale.py").as_uri()
    ed.open(uri, BASE)
    pid = (await propose(ed, uri))["proposalId"]
    ed.change(uri, types.Range(start=types.Position(0, 0), end=types.Position(0, 0)), "# hi\n")
    before = ed.texts[uri]
    with pytest.raises(JsonRpcException) as err:
        await ed.command("flywheel.acceptHunk", pid, 0)
    assert err.value.code == -32803 and "changed since" in err.value.message
    assert ed.texts[uri] == before
    assert {h["outcome"] for h in await ed.rows("hunks", edit_id=pid)} == {"failed"}


async def test_survival_checks_and_undo(editor, tmp_path):
    ed, uri = editor, (tmp_path / "keep.py").as_uri()
    ed.open(uri, "x = ")
    kept = await ed.client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(0, 4),
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Invoked
            ),
        )
    )
    item = kept.items[0]
    sid = item.command.arguments[0]
    ed.change(uri, item.range, item.insert_text)
    await ed.command("flywheel.acceptCompletion", sid)
    # Typing above the accepted text moves it; it still survives whole.
    ed.change(uri, types.Range(start=types.Position(0, 0), end=types.Position(0, 0)), "# 😀\n")
    await ed.request("flywheel/debug/advanceClock", {"seconds": 30})
    (row,) = await ed.rows("survival", suggestion_id=sid)
    assert (row["after_s"], row["share"]) == (30, 1.0)
    # Deleting it: the 2-minute check finds nothing left.
    end = ed.texts[uri].count("\n")
    ed.change(uri, types.Range(start=types.Position(1, 0), end=types.Position(end + 1, 0)), "")
    answer = await ed.request("flywheel/debug/advanceClock", {"seconds": 90})
    assert [
        (c["after_s"], c["surviving_chars"]) for c in answer["checks"] if c["suggestion_id"] == sid
    ] == [(120, 0)]
