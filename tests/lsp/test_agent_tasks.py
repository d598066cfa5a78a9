"""Agent tasks through the real harness, driven over stdio by a real client.

The server is `flywheel lsp` with a replay engine standing in for the model
(tests/lsp/replay_server.py); the harness, its tools, the buffer-overlay workspace, the server and
telemetry are real. Each test loads the turns the model will emit, runs a task and checks the
streamed steps, the proposals, the edits that land in the editor and the telemetry rows.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types

from tests.harness.replay import call
from tests.lsp.conftest import start_editor, stop_editor

pytestmark = pytest.mark.asyncio(loop_scope="module")

BASE = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a + b\n"
ADD_FIX = {
    "search": "def add(a, b):\n    return a - b",
    "replace": "def add(a, b):\n    return a + b",
}
MUL_FIX = {
    "search": "def mul(a, b):\n    return a + b",
    "replace": "def mul(a, b):\n    return a * b",
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def agent(tmp_path_factory):
    """One replay server per module, rooted at a workspace folder the tests write into."""
    tmp = tmp_path_factory.mktemp("agent")
    root = tmp / "ws"
    root.mkdir()
    ed = await start_editor(tmp, "replay", {"agent": {"maxSteps": 6}}, root=root)
    ed.root = root
    yield ed
    await stop_editor(ed)


async def run(ed, turns: list, command: str = "flywheel.ask", **args) -> dict:
    assert (await ed.request("flywheel/test/replay", {"turns": turns}))["loaded"] == len(turns)
    return await ed.command(command, args)


def steps_of(ed, task_id: str) -> list[dict]:
    return [n for n in ed.notes["flywheel/taskStep"] if n["taskId"] == task_id]


def file_in(ed, name: str, text: str | None) -> tuple[str, str]:
    """A file under the workspace (written to disk unless text is None): (relative path, uri)."""
    path = Path(ed.root) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if text is not None:
        path.write_text(text)
    return name, path.as_uri()


async def test_task_edits_unsaved_buffer_hunk_by_hunk(agent):
    ed = agent
    rel, uri = file_in(ed, "t1/calc.py", BASE)
    unsaved = "# 😀 中文 not saved yet\n" + BASE  # emoji and CJK before the edits
    ed.open(uri, unsaved)
    turns = [
        call("read_file", path=rel),
        call("edit_file", path=rel, hunks=[ADD_FIX, MUL_FIX]),
        "Fixed add and mul.",
    ]
    result = await run(ed, turns, uri=uri, question="fix the operators")
    assert (result["status"], result["stopReason"]) == ("done", "answered")
    assert result["answer"] == "Fixed add and mul."
    tid = result["taskId"]

    steps = steps_of(ed, tid)
    roles = "user assistant tool assistant tool assistant system"
    assert [s["role"] for s in steps] == roles.split()
    assert steps[0]["text"] == "fix the operators"
    assert steps[1]["calls"][0]["name"] == "read_file"
    assert "not saved yet" in steps[2]["text"], "the agent reads the editor's unsaved text"
    assert steps[-1]["text"] == "stopped: answered"
    progress = ed.client.progress_reports[f"flywheel-task-{tid}"]
    assert type(progress[0]).__name__ == "WorkDoneProgressBegin"
    assert type(progress[-1]).__name__ == "WorkDoneProgressEnd"

    (proposal,) = result["proposals"]
    assert proposal["uri"] == uri and proposal["version"] == 1 and proposal["taskId"] == tid
    assert [h["newText"] for h in proposal["hunks"]] == ["    return a + b\n", "    return a * b\n"]
    assert proposal["hunks"][0]["range"]["start"] == {"line": 2, "character": 0}
    assert Path(ed.root, rel).read_text() == BASE, "nothing is written before the review"

    pid = proposal["proposalId"]
    assert (await ed.command("flywheel.acceptHunk", pid, 0))["state"] == "accepted"
    assert (await ed.command("flywheel.rejectHunk", pid, 1))["state"] == "rejected"
    assert ed.texts[uri] == unsaved.replace("a - b", "a + b")

    (task,) = await ed.rows("tasks", id=tid)
    assert task["status"] == "done" and task["instruction"] == "fix the operators"
    recorded = await ed.rows("steps", task_id=tid)
    assistant = [s for s in recorded if s["role"] == "assistant"]
    assert len(assistant) == 3 and assistant[0]["policy_version"] == "replay-1"
    assert assistant[0]["token_ids"]
    (edit,) = await ed.rows("edits", task_id=tid)  # one per proposal, with its hunks
    assert edit["id"] == pid and edit["document_version"] == 1
    outcomes = {h["idx"]: h["outcome"] for h in await ed.rows("hunks", edit_id=pid)}
    assert outcomes == {0: "accepted", 1: "rejected"}

    # Asking again at once marks the task as dissatisfying; a rating is recorded.
    again = await run(ed, ["Still fine."], uri=uri, question="are you sure?")
    assert again["status"] == "done" and again["proposals"] == []
    outcomes = await ed.rows("outcomes", task_id=tid)
    assert [o["dissatisfied_followup"] for o in outcomes] == [1]
    rated = await ed.command("flywheel.rate", {"taskId": tid, "rating": -1, "comment": "meh"})
    assert rated["recorded"]
    (fb,) = await ed.rows("feedback", task_id=tid)
    assert fb["rating"] == -1 and fb["comment"] == "meh"


async def test_files_not_open_and_new_files_become_proposals(agent):
    ed = agent
    rel, uri = file_in(ed, "t2/other.py", BASE)
    new_rel, new_uri = file_in(ed, "t2/new.py", None)
    turns = [
        call("edit_file", path=rel, hunks=[MUL_FIX]),
        call("write_file", path=new_rel, content="x = 1\n"),
        "Done.",
    ]
    result = await run(ed, turns, question="tidy up")
    assert result["status"] == "done"
    by_uri = {p["uri"]: p for p in result["proposals"]}
    assert set(by_uri) == {uri, new_uri}
    assert by_uri[uri]["version"] is None  # the file on disk: the editor does not have it open
    assert not Path(ed.root, new_rel).exists()
    for p in by_uri.values():
        await ed.command("flywheel.acceptAll", p["proposalId"])
    assert ed.texts[uri] == BASE.replace("a + b", "a * b")
    assert ed.texts[new_uri] == "x = 1\n"


async def test_approval_is_asked_and_resumed(agent):
    ed = agent
    rel, uri = file_in(ed, "t3/old.py", "x = 1\n")
    ed.approval_answer = "Allow"
    result = await run(ed, [call("delete_file", path=rel), "Deleted it."], question="remove old.py")
    assert result["status"] == "done"
    assert "delete_file" in ed.approval_asks[-1] and "deleting a file" in ed.approval_asks[-1]
    assert any(s.get("kind") == "approval_request" for s in steps_of(ed, result["taskId"]))
    assert result["skipped"] == [f"{rel}: the agent deleted it; delete it yourself if you agree"]
    assert Path(ed.root, rel).exists(), "the workspace is an overlay: nothing is deleted"

    ed.approval_answer = "Stop the task"
    stopped = await run(ed, [call("delete_file", path=rel)], question="remove old.py again")
    assert (stopped["status"], stopped["stopReason"]) == ("cancelled", "denied")
    (task,) = await ed.rows("tasks", id=stopped["taskId"])
    assert task["status"] == "cancelled"
    ed.approval_answer = "Allow"


async def test_cancel_stops_the_running_turn(agent):
    ed = agent
    assert await ed.request("flywheel/test/replay", {"turns": [{"waitForCancel": True}]})
    running = asyncio.ensure_future(ed.command("flywheel.ask", {"question": "take your time"}))
    first = await ed.next("flywheel/taskStep")
    assert (await ed.command("flywheel.cancelTask", first["taskId"]))["cancelled"]
    result = await asyncio.wait_for(running, 60)
    assert result["status"] == "cancelled" and result["taskId"] == first["taskId"]
    (task,) = await ed.rows("tasks", id=result["taskId"])
    assert task["status"] == "cancelled"


async def test_engine_error_fails_the_task_and_the_server_keeps_serving(agent):
    ed = agent
    result = await run(ed, [{"error": "the model server went away"}], question="hello?")
    assert (result["status"], result["stopReason"]) == ("failed", "engine_error")
    assert "went away" in result["answer"]
    again = await run(ed, ["Hello."], question="hello again")
    assert again["status"] == "done" and again["answer"] == "Hello."


async def test_fix_with_flywheel_code_action(agent):
    ed = agent
    rel, uri = file_in(ed, "t6/act.py", BASE)
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
    assert [a.title for a in actions] == [
        "Fix with Flywheel: wrong op",
        "Ask Flywheel about selection",
    ]
    # The test client's converter reads CodeAction | Command back as a Command whose `command` is
    # the action's command printed as a Python literal (an lsprotocol union quirk).
    fix = ast.literal_eval(actions[0].command)
    assert fix["command"] == "flywheel.fixDiagnostic"
    turns = [call("edit_file", path=rel, hunks=[ADD_FIX]), "Fixed."]
    result = await run(ed, turns, fix["command"], **fix["arguments"][0])
    assert result["status"] == "done" and len(result["proposals"]) == 1
    (task,) = await ed.rows("tasks", id=result["taskId"])
    assert task["instruction"] == "Fix this problem: wrong op"


async def test_a_task_runs_in_the_workspace_folder_that_holds_its_file(tmp_path):
    """Multi-root: a task on a file in the second folder is rooted there, so its tools see that
    project's paths and the harness reads that project's AGENTS.md."""
    main, other = tmp_path / "main", tmp_path / "other"
    (other / "pkg").mkdir(parents=True)
    main.mkdir()
    (other / "AGENTS.md").write_text("Keep functions short.\n")
    (other / "pkg" / "calc.py").write_text(BASE)
    ed = await start_editor(
        tmp_path, "replay", {"agent": {"maxSteps": 4}}, root=main, folders=(main, other)
    )
    try:
        uri = (other / "pkg" / "calc.py").as_uri()
        ed.open(uri, BASE)
        turns = [call("read_file", path="pkg/calc.py"), "Read it."]
        result = await run(ed, turns, uri=uri, question="look at this")
        assert result["status"] == "done", result
        texts = [s.get("text", "") for s in steps_of(ed, result["taskId"])]
        assert any("project rules: AGENTS.md" in t for t in texts), texts
        assert any("return a - b" in t for t in texts), texts  # read_file found pkg/calc.py
    finally:
        await stop_editor(ed)
