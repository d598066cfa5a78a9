"""Schema and migrations (a database created by an older schema version opens and upgrades),
the file's pragmas, and content-addressed blobs."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from telemetry import folders, store


def test_new_database_is_migrated_and_recorded(db_path: Path):
    db = store.open_db(db_path)
    rows = db.execute("SELECT version, name FROM _migrations ORDER BY version").fetchall()
    assert [v for v, _ in rows] == [m.version for m in store.MIGRATIONS]
    assert store.schema_version(db.conn) == store.SCHEMA_VERSION == 3
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA secure_delete").fetchone()[0] == 1
    for table in ("sessions", "suggestions", "tasks", "steps", "rewards", "blobs", "survival"):
        assert table in db.table_names()
    db.conn.close()


def test_v1_database_opens_and_upgrades(db_path: Path):
    """Build a real v1 file (the first released schema) with data, then open it with today's code."""
    db_path.parent.mkdir(parents=True)
    conn = store.connect(db_path)
    assert store.migrate(conn, target=1) == 1
    columns_v1 = {r[1] for r in conn.execute("PRAGMA table_info(sessions)")}
    assert "git_head" not in columns_v1
    assert "tasks" not in {
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
    }
    conn.execute(
        "INSERT INTO sessions (id, started_at, editor, consent) VALUES ('s1', 1.0, 'nvim', 'code')"
    )
    conn.execute(
        "INSERT INTO suggestions (id, session_id, created_at, kind, output, latency_ms) "
        "VALUES ('g1', 's1', 2.0, 'inline', 'x = 1', 30.0)"
    )
    conn.close()

    db = store.open_db(db_path)
    assert store.schema_version(db.conn) == store.SCHEMA_VERSION
    assert db.execute("SELECT editor, git_head FROM sessions WHERE id='s1'").fetchone() == (
        "nvim",
        None,
    )
    assert db.execute("SELECT output, excluded FROM suggestions").fetchone() == ("x = 1", 0)
    assert db["tasks"].count == 0
    db.conn.close()

    # and the recorder writes into the upgraded file
    from telemetry import Recorder

    with Recorder(db_path) as rec:
        rec.record("task_start", session_id="s1", instruction="go")
        assert rec.flush()
    db = store.open_db(db_path)
    assert db["tasks"].count == 1
    db.conn.close()


def test_v2_database_with_data_opens_and_upgrades(db_path: Path):
    """A v2 file (agent tasks, before the stop reason and diff columns) holding a finished task
    upgrades to v3: old rows keep their values, the new columns are NULL, and the recorder writes
    the new task_end fields into it."""
    db_path.parent.mkdir(parents=True)
    conn = store.connect(db_path)
    assert store.migrate(conn, target=2) == 2
    assert "stop_reason" not in {r[1] for r in conn.execute("PRAGMA table_info(tasks)")}
    conn.execute("INSERT INTO sessions (id, started_at, consent) VALUES ('s1', 1.0, 'code')")
    conn.execute(
        "INSERT INTO tasks (id, session_id, created_at, ended_at, instruction, status, "
        "final_message, final_message_chars) VALUES ('t1', 's1', 2.0, 3.0, 'fix it', 'done', "
        "'Fixed.', 6)"
    )
    conn.execute(
        "INSERT INTO steps (id, session_id, task_id, idx, at, role, content) "
        "VALUES ('t1:0', 's1', 't1', 0, 2.5, 'system', 'stopped: answered')"
    )
    conn.close()

    db = store.open_db(db_path)
    assert store.schema_version(db.conn) == store.SCHEMA_VERSION == 3
    row = db.execute(
        "SELECT status, final_message, final_message_chars, stop_reason, stop_detail, diff, "
        "diff_chars FROM tasks WHERE id = 't1'"
    ).fetchone()
    assert row == ("done", "Fixed.", 6, None, None, None, None)
    assert db["steps"].count == 1
    names = [r[0] for r in db.execute("SELECT name FROM _migrations ORDER BY version")]
    assert names == [m.name for m in store.MIGRATIONS]
    db.conn.close()

    from telemetry import Recorder

    with Recorder(db_path) as rec:
        tid = rec.record("task_start", session_id="s1", instruction="again")
        rec.record(
            "task_end",
            session_id="s1",
            task_id=tid,
            status="limit",
            stop_reason="max_steps",
            stop_detail="10 model turns",
            diff=(diff := "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"),
        )
        assert rec.flush()
    db = store.open_db(db_path)
    assert db.execute(
        "SELECT status, stop_reason, stop_detail, diff_chars FROM tasks WHERE id = ?", (tid,)
    ).fetchone() == ("limit", "max_steps", "10 model turns", len(diff))
    db.conn.close()


def test_newer_schema_is_refused_with_a_clear_error(db_path: Path):
    db = store.open_db(db_path)
    db.execute("INSERT INTO _migrations VALUES (99, 'from the future', 0)")
    db.conn.close()
    with pytest.raises(store.SchemaError, match="newer than this flywheel"):
        store.open_db(db_path)


def test_two_processes_migrating_a_new_file_apply_each_migration_once(tmp_path: Path):
    path = tmp_path / "race.db"
    code = "import sys; from telemetry import store; store.open_db(sys.argv[1]).conn.close()"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)]) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM _migrations").fetchone()[0] == len(store.MIGRATIONS)
    conn.close()


def test_blobs_are_content_addressed_and_shared(db_path: Path):
    db = store.open_db(db_path)
    conn = db.conn
    with store.write_transaction(conn):
        a = store.put_blob(conn, b"print('hi')\n" * 100, "s1", time.time())
        b = store.put_blob(conn, b"print('hi')\n" * 100, "s2", time.time())
    assert a == b == store.blob_id(b"print('hi')\n" * 100)
    assert conn.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 1
    assert conn.execute("SELECT COUNT(*) FROM blob_refs").fetchone()[0] == 2
    size, stored = conn.execute("SELECT size, length(data) FROM blobs").fetchone()
    assert size == 1200 and stored < 100  # compressed
    assert store.get_blob(conn, a) == b"print('hi')\n" * 100
    assert store.get_blob(conn, "nope") is None
    conn.close()


def test_open_without_create_does_not_make_a_file(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        store.open_db(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()


def test_per_user_folders_follow_xdg(tmp_path: Path):
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    assert folders.db_path(None, env) == tmp_path / "data" / "flywheel" / "telemetry.db"
    assert folders.cache_home(env) == tmp_path / "cache" / "flywheel"
    assert folders.cache_home({**env, "FLYWHEEL_CACHE": str(tmp_path / "c")}) == tmp_path / "c"
