"""The reads other packages make (telemetry/queries.py): answers from a recorded session, the
empty database, and a clear error, never an empty answer, for a table an old file lacks."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from telemetry import Recorder, open_db, queries, recompute
from telemetry.rewards import latest
from tests.telemetry.conftest import record_session


def test_reads_of_a_recorded_session(recorder: Recorder, db_path: Path):
    ids = record_session(recorder)
    assert recorder.flush()
    db = open_db(db_path)
    recompute(db.conn, latest(), task_ids=[ids["task"]])
    total, fresh, newest = queries.session_counts(db, 0.0)
    assert (total, fresh) == (1, 1) and newest == queries.session_span(db)[1]
    assert queries.session_counts(db, newest) == (1, 0, newest)
    assert queries.latest_task_id(db, ids["session"]) == ids["task"]
    assert queries.latest_task_id(db, "no-such-session") is None
    rewards = queries.rewards_of(db, ids["task"])
    names = [r["function"] for r in rewards]
    assert names == sorted(names) and {"task_success", "total"} <= set(names)
    [row] = queries.sessions_per_bucket(db, "hour")
    assert row["editor"] == "vscode" and row["n"] == 1 and row["t"].endswith(":00")
    [row] = queries.suggestions_per_bucket(db, "day")
    assert (row["made"], row["shown"], row["accepted"], row["kept"]) == (1, 1, 1, 0.5)
    assert [(r["reason"], r["n"]) for r in queries.stop_reasons(db)] == [("answered", 1)]
    db.close()


def test_an_empty_database_answers_with_nothing(db_path: Path):
    db = open_db(db_path)
    assert queries.session_counts(db, 5.0) == (0, 0, None)
    assert queries.session_span(db) == (None, None)
    assert queries.training_runs(db) == [] and queries.model_versions(db) == []
    db.close()


def test_read_only_never_creates_and_a_missing_table_is_an_error(tmp_path: Path):
    assert queries.open_read_only(tmp_path / "none.db") is None
    assert not (tmp_path / "none.db").exists()
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old)
    conn.execute("CREATE TABLE sessions (id TEXT, started_at REAL, editor TEXT)")
    conn.commit()
    conn.close()
    db = queries.open_read_only(old)
    assert db is not None
    with pytest.raises(sqlite3.OperationalError, match="no such table: training_runs"):
        queries.training_runs(db)
    with pytest.raises(sqlite3.OperationalError):
        db.conn.execute("INSERT INTO sessions VALUES ('s', 1.0, 'nvim')")  # read-only
    db.close()
