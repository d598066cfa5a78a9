"""The reads other packages make of telemetry's tables: the dashboard, `flywheel cycle`, the demo.

Training and the agent ask these functions rather than the tables, so the schema stays telemetry's
own. Each takes a `sqlite_utils.Database` (store.open_db(), or open_read_only() for a reader that
must never create or migrate the file) and returns plain dicts or tuples, in a fixed order.

A table that an old file lacks raises sqlite3.OperationalError ("no such table"), as a plain
SELECT would, never an empty answer: the dashboard turns it into a sentence that names the fix.

Per-bucket queries take a `unit`, "hour" or "day": rows are grouped by the UTC start of that
unit, formatted by BUCKET_FORMATS[unit] ("2025-03-01 14:00" or "2025-03-01"), oldest first.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from sqlite_utils import Database
from sqlite_utils.db import Table

BUCKET_FORMATS = {"hour": "%Y-%m-%d %H:00", "day": "%Y-%m-%d"}

Rows = list[dict[str, Any]]


def open_read_only(path: str | Path) -> Database | None:
    """The file opened read-only (`mode=ro`), or None when it does not exist: never created."""
    if not Path(path).is_file():
        return None
    conn = sqlite3.connect(f"file:{Path(path).absolute()}?mode=ro", uri=True, timeout=5)
    return Database(conn, recursive_triggers=False, execute_plugins=False)


def _table(db: Database, name: str) -> Table:
    """`db[name]`, or the error SQLite gives for a missing table (rows_where would yield none)."""
    table = db.table(name)
    if not table.exists():
        raise sqlite3.OperationalError(f"no such table: {name}")
    return table


def _bucketed(db: Database, sql: str, unit: str) -> Rows:
    return list(db.query(sql, {"fmt": BUCKET_FORMATS[unit]}))


# --- sessions ----------------------------------------------------------------------------------


def session_span(db: Database) -> tuple[float | None, float | None]:
    """(first, last) session start, in Unix seconds; (None, None) without sessions."""
    row = next(db.query("SELECT MIN(started_at) AS first, MAX(started_at) AS last FROM sessions"))
    return row["first"], row["last"]


def session_counts(db: Database, since: float) -> tuple[int, int, float | None]:
    """(all sessions, sessions started after `since`, the newest start or None)."""
    row = next(
        db.query(
            "SELECT count(*) AS total, sum(started_at > ?) AS fresh, max(started_at) AS newest "
            "FROM sessions",
            (since,),
        )
    )
    return int(row["total"] or 0), int(row["fresh"] or 0), row["newest"]


def sessions_per_bucket(db: Database, unit: str) -> Rows:
    """{t, editor ('?' when unknown), n}: sessions started per bucket and editor."""
    return _bucketed(
        db,
        "SELECT strftime(:fmt, started_at, 'unixepoch') AS t, COALESCE(editor, '?') AS editor, "
        "COUNT(*) AS n FROM sessions GROUP BY 1, 2 ORDER BY 1",
        unit,
    )


# --- suggestions -------------------------------------------------------------------------------


def suggestions_per_bucket(db: Database, unit: str) -> Rows:
    """{t, made, shown, accepted, kept}: suggestions made per bucket, how many were shown and
    accepted (fully or partly), and the mean share of accepted code surviving at its last check
    (None when none was checked)."""
    return _bucketed(
        db,
        """SELECT strftime(:fmt, s.created_at, 'unixepoch') AS t, COUNT(*) AS made,
          SUM(EXISTS(SELECT 1 FROM suggestion_events e WHERE e.suggestion_id = s.id
                     AND e.event = 'shown')) AS shown,
          SUM(EXISTS(SELECT 1 FROM suggestion_events e WHERE e.suggestion_id = s.id
                     AND e.event IN ('accepted', 'partially_accepted'))) AS accepted,
          AVG((SELECT v.share FROM survival v WHERE v.suggestion_id = s.id
               ORDER BY v.after_s DESC LIMIT 1)) AS kept
        FROM suggestions s GROUP BY 1 ORDER BY 1""",
        unit,
    )


def drafts_per_bucket(db: Database, unit: str) -> Rows:
    """{t, proposed, accepted, length}: speculative drafts of suggestions that drafted at all,
    and their mean acceptance length."""
    return _bucketed(
        db,
        """SELECT strftime(:fmt, created_at, 'unixepoch') AS t, SUM(drafts_proposed) AS proposed,
          SUM(drafts_accepted) AS accepted, AVG(mean_acceptance_length) AS length
        FROM suggestions WHERE drafts_proposed > 0 GROUP BY 1 ORDER BY 1""",
        unit,
    )


# --- agent tasks and rewards -------------------------------------------------------------------


def tasks_per_bucket(db: Database, unit: str) -> Rows:
    """{t, tasks, ok, errors}: finished tasks per bucket (by creation), how many answered, and
    their tool errors."""
    return _bucketed(
        db,
        """SELECT strftime(:fmt, t.created_at, 'unixepoch') AS t, COUNT(*) AS tasks,
          SUM(t.stop_reason = 'answered' OR (t.stop_reason IS NULL AND t.status = 'done')) AS ok,
          SUM(COALESCE(e.n, 0)) AS errors
        FROM tasks t
        LEFT JOIN (SELECT task_id, SUM(is_error) AS n FROM steps GROUP BY task_id) e
          ON e.task_id = t.id
        WHERE t.ended_at IS NOT NULL GROUP BY 1 ORDER BY 1""",
        unit,
    )


def stop_reasons(db: Database) -> Rows:
    """{reason, n}: finished tasks per stop reason (else status), most frequent first."""
    return list(
        db.query(
            "SELECT COALESCE(stop_reason, status, '?') AS reason, COUNT(*) AS n FROM tasks "
            "WHERE ended_at IS NOT NULL GROUP BY 1 ORDER BY 2 DESC"
        )
    )


def latest_task_id(db: Database, session_id: str) -> str | None:
    """The id of the session's most recently created task, or None."""
    rows = _table(db, "tasks").rows_where(
        "session_id = ?", [session_id], select="id", order_by="created_at DESC", limit=1
    )
    return next((row["id"] for row in rows), None)


def rewards_of(db: Database, subject_id: str) -> Rows:
    """{function, version, value}: every reward stored for one task or suggestion, by name."""
    return list(
        _table(db, "rewards").rows_where(
            "subject_id = ?", [subject_id], select="function, version, value", order_by="function"
        )
    )


def rewards_per_bucket(db: Database, unit: str) -> Rows:
    """{t, f ('name@version'), mean, n}: non-null rewards per bucket of their session's start."""
    return _bucketed(
        db,
        """SELECT strftime(:fmt, s.started_at, 'unixepoch') AS t,
          r.function || '@' || r.version AS f, AVG(r.value) AS mean, COUNT(*) AS n
        FROM rewards r JOIN sessions s ON s.id = r.session_id
        WHERE r.value IS NOT NULL GROUP BY 1, 2 ORDER BY 1""",
        unit,
    )


# --- training and model versions ---------------------------------------------------------------


def training_runs(db: Database) -> Rows:
    """{id, stage, status, created_at}, oldest first."""
    return list(
        _table(db, "training_runs").rows_where(
            select="id, stage, status, created_at", order_by="created_at"
        )
    )


def training_metrics(db: Database) -> Rows:
    """{run_id, name, step, value} with a value, by run, name and step."""
    return list(
        _table(db, "training_metrics").rows_where(
            "value IS NOT NULL", select="run_id, name, step, value", order_by="run_id, name, step"
        )
    )


def model_versions(db: Database) -> Rows:
    """{id, parent, stage, promoted_at, metrics (JSON text)}, oldest first."""
    return list(
        _table(db, "model_versions").rows_where(
            select="id, parent, stage, promoted_at, metrics", order_by="created_at"
        )
    )
