"""The harness with a real tiny model (random weights): through the `local` backend and through
`flywheel serve` with the `openai` backend. The model answers or emits garbage; the test checks
that the loop runs, records and stops with a reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.engine import EngineConfig, open_engine
from agent.harness import Harness, HarnessConfig, Workspace
from tests.conftest import rows

ROOT = Path(__file__).resolve().parents[2]
REASONS = {
    "answered",
    "max_steps",
    "max_tokens",
    "wall_time",
    "repeated_failure",
    "context_overflow",
    "engine_error",
}
SMALL = dict(max_steps=2, turn_max_tokens=24, max_wall_s=120, map_tokens=0)


def check_recorded(db, stop_reason):
    [task] = rows(db, "SELECT * FROM tasks")
    assert task["status"] in {"done", "limit", "failed"} and task["ended_at"] is not None
    assert task["stop_reason"] == stop_reason and task["diff_chars"] is not None
    steps = rows(db, "SELECT * FROM steps ORDER BY idx")
    assistant = [s for s in steps if s["role"] == "assistant"]
    assert assistant and assistant[0]["token_ids"] and assistant[0]["output_tokens"]  # it ran


def fix_add_and_check(engine, workspace, recorder) -> None:
    """Run "fix add" on `engine` (closed afterwards); the task ends for a reason of its own, not
    an engine error, and is recorded."""
    try:
        out = Harness(
            engine, Workspace(workspace), HarnessConfig(**SMALL), recorder=recorder
        ).start("fix add")
    finally:
        engine.close()
    assert out.stop_reason in REASONS - {"engine_error"}, out.detail
    recorder.flush()
    check_recorded(recorder.path, out.stop_reason)


def test_local_backend(workspace, long_context_checkpoint, recorder):
    fix_add_and_check(
        open_engine(EngineConfig(model=str(long_context_checkpoint))), workspace, recorder
    )


@pytest.mark.slow
def test_flywheel_run_command_with_a_checkpoint(workspace, long_context_checkpoint, tmp_path):
    db = tmp_path / "tel.db"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.run",
            "fix add",
            "--workspace",
            str(workspace),
            "--model",
            str(long_context_checkpoint),
            "--max-steps",
            "2",
            "--turn-tokens",
            "16",
            "--telemetry-db",
            str(db),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert "stopped" in proc.stdout or "done" in proc.stdout
    [task] = rows(db, "SELECT status FROM tasks")
    assert task["status"] in {"done", "limit", "failed"}


@pytest.mark.slow
def test_openai_backend_through_flywheel_serve(workspace, long_context_checkpoint, recorder):
    from tests.flywheel_server import running_server

    with running_server(long_context_checkpoint) as url:
        fix_add_and_check(open_engine(EngineConfig(model=url + "/v1")), workspace, recorder)
