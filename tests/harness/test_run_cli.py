"""`flywheel run`: a task on a sample workspace, recorded completely in telemetry; exit status."""

from __future__ import annotations

import signal

import pytest

from agent import run
from agent.engine import EngineError
from tests.conftest import rows
from tests.harness.replay import ReplayEngine, call

FIX = call(
    "edit_file", path="calc.py", hunks=[{"search": "return a - b", "replace": "return a + b"}]
)


@pytest.fixture
def model(monkeypatch):
    """Replace the model behind --model by a replay engine (the engine stands in for the model)."""
    engines: list[ReplayEngine] = []

    def use(turns):
        engine = ReplayEngine(turns)
        engines.append(engine)
        monkeypatch.setattr("agent.engine.open_engine", lambda config: engine)
        return engine

    return use


def test_run_prints_answer_and_diff_and_records_the_task(workspace, tmp_path, model, capsys):
    model(
        [call("read_file", path="calc.py"), FIX, call("run_tests", args="-k add"), "Fixed add()."]
    )
    db = tmp_path / "tel.db"
    code = run.main(
        ["make test_add pass", "--workspace", str(workspace), "--telemetry-db", str(db)]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "step 1" in out and "read_file" in out and "tests passed" in out  # live progress
    assert "Fixed add()." in out and "+    return a + b" in out  # answer and diff
    [session] = rows(db, "SELECT * FROM sessions")
    assert session["editor"] == "headless" and session["ended_at"] is not None
    [task] = rows(db, "SELECT * FROM tasks")
    assert task["status"] == "done" and task["ended_at"] is not None
    assert task["instruction"] == "make test_add pass" and task["model_version"] == "replay-1"
    steps = rows(db, "SELECT * FROM steps WHERE task_id = ? ORDER BY idx", task["id"])
    assert [s["idx"] for s in steps] == list(range(len(steps))) and len(steps) == 9
    tools = [s["tool_name"] for s in steps if s["role"] == "tool"]
    assert tools == ["read_file", "edit_file", "run_tests"]
    assert all(s["token_ids"] for s in steps if s["role"] == "assistant")
    assert task["stop_reason"] == "answered" and "+    return a + b" in task["diff"]
    assert rows(db, "SELECT document_uri FROM edits") == [{"document_uri": "calc.py"}]


def test_engine_failure_exits_non_zero_and_is_recorded(workspace, tmp_path, model, capsys):
    model([EngineError("connection refused by http://127.0.0.1:9")])
    db = tmp_path / "tel.db"
    code = run.main(["x", "--workspace", str(workspace), "--telemetry-db", str(db), "-q"])
    out = capsys.readouterr().out
    assert code == 1 and "engine_error" in out and "connection refused" in out
    assert rows(db, "SELECT status FROM tasks") == [{"status": "failed"}]


def test_missing_workspace_is_a_usage_error(tmp_path, capsys):
    code = run.main(["x", "--workspace", str(tmp_path / "nope"), "--no-telemetry"])
    assert code == 2 and "does not exist" in capsys.readouterr().err


def test_unopenable_model_is_a_usage_error(workspace, tmp_path, capsys):
    code = run.main(
        ["x", "--workspace", str(workspace), "--model", str(tmp_path / "no-ckpt"), "--no-telemetry"]
    )
    assert code == 2 and "cannot open model" in capsys.readouterr().err


def test_wait_for_approval_then_resume(workspace, tmp_path, model, capsys):
    ckpt = str(tmp_path / "ckpt.db")
    model([call("delete_file", path="calc.py")])
    args = ["--workspace", str(workspace), "--checkpoint-db", ckpt, "--no-telemetry", "-q"]
    code = run.main(["remove calc", "--thread", "T", "--approve", "no-wait", *args])
    assert code == 3 and "--resume T" in capsys.readouterr().out
    model(["Removed."])
    code = run.main(["--resume", "T", "--approve", "yes", *args])
    assert code == 0 and not (workspace / "calc.py").exists()


def test_ctrl_c_cancels_the_task_and_records_it(workspace, tmp_path, model, monkeypatch, capsys):
    """The first Ctrl-C (a real SIGINT, raised once the first step has been shown) stops the
    task at the harness's next check: recorded as cancelled with its edit, exit status 130."""
    model([FIX, call("run_tests"), "Fixed add()."])
    show = run._progress

    def progress_then_ctrl_c(console):
        shown = show(console)

        def on_event(event):
            shown(event)
            if event["kind"] == "tool":  # the edit has been made
                signal.raise_signal(signal.SIGINT)

        return on_event

    monkeypatch.setattr(run, "_progress", progress_then_ctrl_c)
    db = tmp_path / "tel.db"
    code = run.main(["fix add", "--workspace", str(workspace), "--telemetry-db", str(db)])
    captured = capsys.readouterr()
    assert code == 130, captured.out
    assert "Ctrl-C: cancelling the task after the current step" in captured.err
    assert "stopped: cancelled" in captured.out and "Traceback" not in captured.err
    [task] = rows(db, "SELECT * FROM tasks")
    assert task["stop_reason"] == "cancelled" and task["ended_at"] is not None
    assert "+    return a + b" in task["diff"]  # what was done before the cancel is kept
    tools = [s["tool_name"] for s in rows(db, "SELECT * FROM steps") if s["role"] == "tool"]
    assert tools == ["edit_file"]  # run_tests was never started
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
