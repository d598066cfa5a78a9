"""`flywheel demo`, the README's first command: a task on the sample project, logged and scored."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest


@pytest.mark.base
def test_demo_runs_logs_and_scores_a_task(tmp_path):
    db = tmp_path / "telemetry.db"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli",
            "demo",
            "--workspace",
            str(tmp_path / "ws"),
            "--telemetry-db",
            str(db),
            "--max-steps",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "rewards of this task" in out.stdout and "Where to look next" in out.stdout
    assert (tmp_path / "ws" / "inventory.py").exists()
    conn = sqlite3.connect(db)
    (task_id, stop_reason) = conn.execute("SELECT id, stop_reason FROM tasks").fetchone()
    assert stop_reason
    outcome = conn.execute(
        "SELECT tests_before_passed, tests_before_failed, tests_after_passed + tests_after_failed "
        "FROM outcomes WHERE task_id = ?",
        (task_id,),
    ).fetchone()
    # the sample project: 2 of 4 tests fail before; after, whatever the model did is counted
    # (an edit that breaks the module's import leaves fewer tests to count)
    assert outcome[:2] == (2, 2) and outcome[2] is not None and outcome[2] >= 1
    functions = {
        f for (f,) in conn.execute("SELECT function FROM rewards WHERE subject_id = ?", (task_id,))
    }
    assert {"task_success", "total"} <= functions


def test_demo_refuses_a_non_empty_workspace(tmp_path):
    (tmp_path / "x").write_text("keep me")
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo", "--workspace", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "not empty" in out.stdout
    assert (tmp_path / "x").read_text() == "keep me"
