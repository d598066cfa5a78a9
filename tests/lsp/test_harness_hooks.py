"""The two harness hooks the language server relies on: a caller's cancel event stops a
task with the stop reason `cancelled`, and a task can join an existing telemetry session.

The engine is the replay engine (tests/harness/replay.py); the harness and telemetry are real.
"""

from __future__ import annotations

import threading

from agent.harness import Harness, HarnessConfig, Workspace
from tests.conftest import rows
from tests.harness.replay import ReplayEngine, call


def test_cancel_stops_the_running_turn_with_reason_cancelled(tmp_path):
    from telemetry.recorder import Recorder

    (tmp_path / "a.py").write_text("x = 1\n")
    started = threading.Event()
    cancel = threading.Event()

    def wait_for_cancel(request):  # the model turn runs until its request is cancelled
        started.set()
        assert request.cancel.wait(timeout=30), "the cancel never reached the engine request"
        return "(stopped)"

    def press_cancel() -> None:
        started.wait(timeout=30)
        cancel.set()

    db = tmp_path / "t.db"
    with Recorder(db) as rec:
        sid = rec.record("session_start", editor="pytest", model_version="replay-1")
        engine = ReplayEngine([wait_for_cancel, "never reached"])
        harness = Harness(
            engine, Workspace(tmp_path), HarnessConfig(map_tokens=0), recorder=rec, session_id=sid
        )
        presser = threading.Thread(target=press_cancel)
        presser.start()
        outcome = harness.start("take your time", cancel=cancel)
        presser.join()
        harness.close()
        assert (outcome.stop_reason, outcome.detail) == ("cancelled", "the user cancelled the task")
        assert engine.turns == ["never reached"], "no turn starts after a cancel"
        rec.flush(timeout=10)
    (task,) = rows(db, "SELECT * FROM tasks")
    assert task["session_id"] == sid and task["stop_reason"] == "cancelled"
    (session,) = rows(db, "SELECT * FROM sessions")
    assert session["id"] == sid, "the task joined the given session; none was started"
    assert session["ended_at"] is None, "close() leaves a session it did not start open"


def test_cancel_before_a_tool_call_stops_the_task(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    cancel = threading.Event()

    def answer_then_cancel(request):
        cancel.set()  # the user cancels while the model writes its tool call
        return call("read_file", path="a.py")

    harness = Harness(ReplayEngine([answer_then_cancel]), Workspace(tmp_path), HarnessConfig())
    outcome = harness.start("read it", cancel=cancel)
    assert outcome.stop_reason == "cancelled"
    assert not [m for m in outcome.messages if m["role"] == "tool"], "no tool ran after it"
