"""Agent tasks, reviewable proposals (hunk by hunk, stale refused), feedback and survival."""

from __future__ import annotations

import ast

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


async def test_ask_streams_steps_and_records_the_task(editor, tmp_path):
    ed, uri = editor, (tmp_path / "ask.py").as_uri()
    ed.open(uri, BASE)
    result = await ed.command(
        "flywheel.ask",
        {
            "uri": uri,
            "question": "why?",
            "range": {"start": {"line": 1, "character": 4}, "end": {"line": 1, "character": 16}},
        },
    )
    assert result["status"] == "done"
    tid = result["taskId"]
    steps = [n for n in ed.notes["flywheel/taskStep"] if n["taskId"] == tid]
    assert [s["role"] for s in steps][:2] == ["user", "assistant"]
    assert "return a - b" in steps[0]["text"] and steps[0]["text"].endswith("why?")
    progress = ed.client.progress_reports[f"flywheel-task-{tid}"]
    assert type(progress[0]).__name__ == "WorkDoneProgressBegin"
    assert type(progress[-1]).__name__ == "WorkDoneProgressEnd"
    (task,) = await ed.rows("tasks", id=tid)
    assert task["status"] == "done" and task["instruction"] == "why?"
    assert len(await ed.rows("steps", task_id=tid)) >= 2

    # Asking again at once marks the first answer as dissatisfying.
    again = await ed.command("flywheel.ask", {"uri": uri, "question": "why, really?"})
    assert again["status"] == "done"
    outcomes = await ed.rows("outcomes", task_id=tid)
    assert [o["dissatisfied_followup"] for o in outcomes] == [1]

    assert (await ed.command("flywheel.rate", {"taskId": tid, "rating": -1, "comment": "meh"}))[
        "recorded"
    ]
    (fb,) = await ed.rows("feedback", task_id=tid)
    assert fb["rating"] == -1 and fb["comment"] == "meh"


async def test_code_actions_offer_fix_and_ask(editor, tmp_path):
    ed, uri = editor, (tmp_path / "act.py").as_uri()
    ed.open(uri, BASE)
    diag = types.Diagnostic(
        range=types.Range(start=types.Position(1, 4), end=types.Position(1, 16)), message="wrong op"
    )
    actions = await ed.client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=diag.range,
            context=types.CodeActionContext(diagnostics=[diag]),
        )
    )
    titles = [a.title for a in actions]
    assert titles == ["Fix with Flywheel: wrong op", "Ask Flywheel about selection"]
    # The test client's converter reads CodeAction | Command back as a Command whose `command` is
    # the action's command printed as a Python literal (an lsprotocol union quirk).
    fix = ast.literal_eval(actions[0].command)
    assert fix["command"] == "flywheel.fixDiagnostic"
    result = await ed.command(fix["command"], *fix["arguments"])
    assert result["status"] == "done"
    (task,) = await ed.rows("tasks", id=result["taskId"])
    assert task["instruction"] == "Fix this problem: wrong op"


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
