"""The client goes away mid-request: the server
cancels the running agent task and completion, records both, ends and flushes the telemetry
session, and exits by itself. SIGTERM (an editor stopping the server) ends it the same way.

A real `flywheel lsp` subprocess (with the replay engine, tests/lsp/replay_server.py) is driven by
raw JSON-RPC frames; the test then closes the server's stdin (the editor crashed) or sends `exit`
without `shutdown`, and waits for the process to end.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import rows
from tests.lsp.conftest import replay_command
from tests.lsp.test_bad_input import Wire, inline

WAITING = b"replay: waiting for cancel"


async def _start(tmp_path):
    db = tmp_path / "t.db"
    wire = await Wire.spawn(*replay_command("--model", "replay", "--db", str(db)))
    return wire.proc, wire, db


async def _until_waiting(proc, count: int) -> None:
    """Read the server's stderr until `count` model turns block on their cancel event."""
    seen = 0
    while seen < count:
        line = await proc.stderr.readline()
        assert line, "the server ended before its model turns started"
        seen += WAITING in line


async def _busy_server(wire: Wire, proc, tmp_path) -> None:
    """A task and a completion both running inside a model turn."""
    root = tmp_path / "ws"
    root.mkdir()
    rid = wire.send("initialize", {"processId": None, "capabilities": {}, "rootUri": root.as_uri()})
    await wire.answer(rid)
    wire.send("initialized", {}, request=False)
    rid = wire.send("flywheel/test/replay", {"turns": [{"waitForCancel": True}] * 2})
    assert (await wire.answer(rid))["result"]["loaded"] == 2
    uri = (root / "a.py").as_uri()
    doc = {"uri": uri, "languageId": "python", "version": 1, "text": "def f():\n    "}
    wire.send("textDocument/didOpen", {"textDocument": doc}, request=False)
    wire.send("workspace/executeCommand", {"command": "flywheel.ask", "arguments": [{}]})
    wire.send("textDocument/inlineCompletion", inline(uri, 1, 4))
    await _until_waiting(proc, 2)


@pytest.mark.parametrize("how", ["stdin_closed", "exit_without_shutdown", "sigterm"])
async def test_client_gone_mid_task_cancels_and_flushes(tmp_path, how):
    proc, wire, db = await _start(tmp_path)
    try:
        await asyncio.wait_for(_busy_server(wire, proc, tmp_path), timeout=120)
        if how == "exit_without_shutdown":
            wire.send("exit", None, request=False)
            await proc.stdin.drain()
        if how == "sigterm":
            proc.terminate()
        else:
            proc.stdin.close()
        code = await asyncio.wait_for(proc.wait(), timeout=60)  # a hang guard, not a measure
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    stderr = (await proc.stderr.read()).decode()
    assert "Traceback" not in stderr, stderr
    assert code in (0, 1), stderr  # LSP: exit without shutdown is exit code 1

    (task,) = rows(db, "SELECT * FROM tasks")
    assert (task["status"], task["stop_reason"]) == ("cancelled", "cancelled")
    events = rows(db, "SELECT event FROM suggestion_events")
    assert [e["event"] for e in events] == ["cancelled"]
    (session,) = rows(db, "SELECT * FROM sessions")
    assert session["ended_at"] is not None, "the session was ended and flushed"
