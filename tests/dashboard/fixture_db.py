"""A telemetry database with something in every dashboard panel, written by the real Recorder.

build(path) -> path      # sessions from two editors, suggestions with feedback, survival
                         # and draft statistics, agent tasks with steps and tool errors,
                         # rewards (recomputed), a training run with a loss curve, and two
                         # model versions with a benchmark summary and a gate decision
"""

from __future__ import annotations

from pathlib import Path


def build(path: Path) -> Path:
    from telemetry import PrivacyPolicy, Recorder, open_db, recompute

    rec = Recorder(path, PrivacyPolicy(consent="code"))
    for i, editor in enumerate(["vscode", "nvim", "headless"]):
        sid = rec.record("session_start", editor=editor, plugin_version="0.1.0")
        _suggestions(rec, sid, i)
        _task(rec, sid, i)
        rec.record("session_end", session_id=sid)
    _training_and_versions(rec)
    assert rec.close(), rec.error
    db = open_db(path, create=False)
    try:
        recompute(db.conn)
    finally:
        db.conn.close()
    return path


def _suggestions(rec, sid: str, i: int) -> None:
    """Three inline suggestions, shown; every other one accepted, with its survival."""
    for j in range(3):
        sug = rec.record(
            "suggestion",
            session_id=sid,
            kind="inline",
            output="x = 1",
            latency_ms=40.0,
            drafts_proposed=10,
            drafts_accepted=6 + j,
            mean_acceptance_length=2.5 + j / 2,
        )
        rec.record("suggestion_event", session_id=sid, suggestion_id=sug, event="shown")
        if (i + j) % 2 == 0:
            rec.record(
                "suggestion_event",
                session_id=sid,
                suggestion_id=sug,
                event="accepted",
                accepted_chars=5,
            )
            rec.record(
                "survival",
                session_id=sid,
                suggestion_id=sug,
                after_s=30,
                accepted_chars=5,
                surviving_chars=5 - j,
            )


def _task(rec, sid: str, i: int) -> None:
    """An agent task: a read_file call (an error in the second session), its outcome and end."""
    tid = rec.record(
        "task_start",
        session_id=sid,
        instruction="fix add",
        workspace_files={"a.py": "x = 1\n"},
        verify_command="true",
    )
    rec.record(
        "step",
        session_id=sid,
        task_id=tid,
        idx=0,
        role="assistant",
        content="",
        tool_calls=[{"id": "c1", "name": "read_file", "arguments": {"path": "a.py"}}],
    )
    rec.record(
        "step",
        session_id=sid,
        task_id=tid,
        idx=1,
        role="tool",
        tool_name="read_file",
        tool_call_id="c1",
        result="1 x = 1",
        is_error=int(i == 1),
    )
    rec.record("outcome", session_id=sid, task_id=tid, tests_after_passed=1, tests_after_failed=0)
    rec.record(
        "task_end",
        session_id=sid,
        task_id=tid,
        status="done" if i else "failed",
        stop_reason="answered" if i else "max_steps",
        final_message="done",
    )


def _training_and_versions(rec) -> None:
    """A training run with a loss curve, and two model versions with a benchmark and a gate."""
    run = rec.record(
        "training_run", id="run-sft-1", stage="sft", status="done", config={"steps": 20}
    )
    for step in range(0, 20, 2):
        rec.record("training_metric", run_id=run, step=step, name="loss", value=3.0 / (1 + step))
        rec.record("training_metric", run_id=run, step=step, name="lr", value=1e-3)
    rec.record(
        "model_version",
        id="v1-aaaa",
        stage="starter",
        path="agent/starter",
        promoted_at=1.0,
        metrics={
            "benchmark": {
                "benchmark": "agent",
                "summary": {"pass@1": {"mean": 0.35, "ci95": [0.2, 0.5]}},
            },
            "gate": {"accepted": True, "reasons": ["first version"]},
        },
    )
    rec.record(
        "model_version",
        id="v2-bbbb",
        parent="v1-aaaa",
        stage="candidate",
        metrics={
            "benchmark": {
                "benchmark": "agent",
                "summary": {"pass@1": {"mean": 0.2, "ci95": [0.1, 0.3]}},
            },
            "gate": {"accepted": False, "reasons": ["pass@1 worse beyond noise: [-0.3, -0.05]"]},
        },
    )
