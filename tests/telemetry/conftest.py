"""Fixtures for telemetry: a fresh database file per test, and one realistic recorded session."""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telemetry import PrivacyPolicy, Recorder


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "telemetry.db"


@pytest.fixture
def recorder(db_path: Path) -> Iterator[Recorder]:
    rec = Recorder(db_path, PrivacyPolicy(consent="code"))
    yield rec
    rec.close()


def record_session(
    rec: Recorder,
    marker: str = "MARKER",
    *,
    session_id: str | None = None,
    workspace_id: str = "ws_test",
    tests_after: tuple[int, int] = (4, 0),
    extra_code: str = "",
) -> dict[str, str]:
    """One editor session with every kind of event; `marker` is in every code field (the
    task's final diff and stop detail included).

    Returns the ids: session, suggestion, task, edit.
    """
    code = f"def {marker.lower()}_fn():\n    return '{marker}'\n{extra_code}"
    sid = rec.record(
        "session_start",
        id=session_id,
        editor="vscode",
        plugin_version="0.1.0",
        model_version="m1",
        workspace_id=workspace_id,
        git_head="3f786850e387550fdab836ed7e6dc881de23001b",
    )
    assert sid
    sug = _record_suggestion(rec, sid, marker, code)
    task, edit = _record_task(rec, sid, marker, code, tests_after)
    rec.record(
        "file",
        session_id=sid,
        document_uri="file:///work/app/main.py",
        language="python",
        text=code,
    )
    return {"session": sid, "suggestion": sug, "task": task, "edit": edit}


def _record_suggestion(rec: Recorder, sid: str, marker: str, code: str) -> str:
    """An inline suggestion, shown, half accepted, and its survival checks."""
    sug = rec.record(
        "suggestion",
        session_id=sid,
        kind="inline",
        trigger="typing",
        document_uri="file:///work/app/main.py",
        document_version=3,
        language="python",
        context={"prefix": f"# {marker} prefix\n", "suffix": f"# {marker} suffix"},
        output=code,
        latency_ms=41.5,
        ttft_ms=12.0,
        prompt_tokens=120,
        output_tokens=20,
        drafts_proposed=16,
        drafts_accepted=12,
        mean_acceptance_length=3.0,
    )
    rec.record("suggestion_event", session_id=sid, suggestion_id=sug, event="shown")
    rec.record(
        "suggestion_event",
        session_id=sid,
        suggestion_id=sug,
        event="partially_accepted",
        accepted_chars=len(code) // 2,
    )
    for after_s, share in ((30, 1.0), (120, 1.0), (300, 0.5)):
        rec.record(
            "survival",
            session_id=sid,
            suggestion_id=sug,
            after_s=after_s,
            accepted_chars=100,
            surviving_chars=int(100 * share),
        )
    return sug


def _record_task(
    rec: Recorder, sid: str, marker: str, code: str, tests_after: tuple[int, int]
) -> tuple[str, str]:
    """An agent task with its steps, an edit and its hunk outcome, the outcome, its end and
    feedback; returns (task id, edit id)."""
    task = rec.record(
        "task_start",
        session_id=sid,
        instruction=f"Fix the failing test ({marker} instruction)",
        workspace_files={"app/main.py": code, "tests/test_main.py": f"# {marker} test\n"},
        verify_command="pytest -q tests",
        model_version="m1",
    )
    steps: list[dict[str, Any]] = [
        {"role": "user", "content": f"Fix the failing test ({marker} prompt)"},
        {
            "role": "assistant",
            "content": "Reading the file.",
            "tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "app/main.py"}}],
            "token_ids": [11, 12, 13],
            "logprobs": [-0.1, -0.2, -0.3],
            "policy_version": "m1",
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "tool_name": "read_file",
            "result": f"{code}# {marker} tool output",
        },
        {
            "role": "assistant",
            "content": "Applying the fix.",
            "tool_calls": [
                {
                    "id": "c2",
                    "name": "edit",
                    "arguments": {"path": "app/main.py", "search": "a", "replace": marker},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "tool_name": "edit", "result": "applied 1 hunk"},
        {"role": "assistant", "content": f"Fixed it; the test passes now. ({marker} answer)"},
    ]
    for idx, step in enumerate(steps):
        assert rec.record("step", session_id=sid, task_id=task, idx=idx, **step)
    edit = rec.record(
        "edit",
        session_id=sid,
        task_id=task,
        document_uri="file:///work/app/main.py",
        document_version=4,
        hunks=[{"original": "return 1", "replacement": f"return '{marker}'"}],
    )
    rec.record("hunk_outcome", session_id=sid, edit_id=edit, idx=0, outcome="accepted")
    passed, failed = tests_after
    rec.record(
        "outcome",
        session_id=sid,
        task_id=task,
        tests_before_passed=3,
        tests_before_failed=1,
        tests_after_passed=passed,
        tests_after_failed=failed,
        lint_before=2,
        lint_after=1,
        reverted=False,
        dissatisfied_followup=False,
    )
    rec.record(
        "task_end",
        session_id=sid,
        task_id=task,
        status="done",
        final_message=f"Fixed the off-by-one in main.py; all tests pass. ({marker} final)",
        stop_reason="answered",
        stop_detail=f"({marker} detail)",
        diff=(
            "--- a/app/main.py\n+++ b/app/main.py\n@@ -1,2 +1,2 @@\n"
            f" def {marker.lower()}_fn():\n-    return 1\n+    return '{marker}'\n"
        ),
    )
    rec.record("feedback", session_id=sid, task_id=task, rating=1, comment=f"{marker} thanks")
    return task, edit


def all_text(db_path: Path) -> str:
    """Every TEXT value of every table, and every blob decompressed, joined by newlines."""
    conn = sqlite3.connect(db_path)
    parts: list[str] = []
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            columns = [r[1] for r in conn.execute(f"PRAGMA table_info([{table}])")]
            for column in columns:
                for (value,) in conn.execute(f"SELECT [{column}] FROM [{table}]"):
                    if isinstance(value, str):
                        parts.append(value)
                    elif isinstance(value, bytes):
                        try:
                            parts.append(zlib.decompress(value).decode("utf-8", "replace"))
                        except zlib.error:
                            parts.append(value.decode("utf-8", "replace"))
    finally:
        conn.close()
    return "\n".join(parts)


def count(db_path: Path, sql: str, *params: Any) -> Any:
    conn = sqlite3.connect(db_path)
    try:
        return conn.execute(sql, params).fetchone()[0]
    finally:
        conn.close()
