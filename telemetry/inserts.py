"""The writer's inserts: rows held back per batch and sent with one executemany per statement.

`HeldRows` collects a batch's inserts and reports, per event, whether its row went in or why it
was dropped (a duplicate id, a schema rejection, a value SQLite cannot bind). `insert()` writes
one row at once (upserts of model versions and training runs). Plain inserts are
`ON CONFLICT(id) DO NOTHING`, so a duplicate id is a drop reason rather than an error; upserts are
`ON CONFLICT(id) DO UPDATE`, so the latest one wins.
"""

from __future__ import annotations

import functools
import sqlite3
from typing import Any

from telemetry.events import Event

HELD = object()  # the writer's answer for a row that waits in HeldRows


class HeldRows:
    """The inserts of one batch, held back and sent with one executemany per statement.

    Rows of different tables and shapes are independent, so each statement's rows go together
    in the order they came. When every row went in (the sum of rowcounts says so) the savepoint
    is released; otherwise (a duplicate id, a schema rejection, a value SQLite cannot bind) it
    is rolled back and the rows are replayed one at a time, in the order of their events, so each
    event gets its own outcome exactly as if it had been written alone. Callers flush() before
    any statement that must see the held rows (an UPDATE, an upsert).
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.groups: dict[str, list[tuple[Any, ...]]] = {}
        self.order: list[tuple[Event | None, str, tuple[Any, ...]]] = []
        self.done: list[tuple[Event, str | None]] = []  # held events and their drop reasons

    def add(self, event: Event | None, table: str, row: dict[str, Any]) -> object:
        """Hold one row; `event` None for a row whose outcome nobody counts (a hunk)."""
        sql = insert_sql(table, tuple(row), False)
        params = tuple(row.values())
        group = self.groups.get(sql)
        if group is None:
            self.groups[sql] = group = []
        group.append(params)
        self.order.append((event, sql, params))
        return HELD

    def flush(self) -> None:
        """Insert the held rows; each held event's outcome goes to `done`."""
        if self.order:
            order, groups = self.order, self.groups
            self.order, self.groups = [], {}
            conn = self.conn
            conn.execute("SAVEPOINT held_rows")
            complete = True
            try:
                for sql, params in groups.items():
                    if conn.executemany(sql, params).rowcount != len(params):
                        complete = False
                        break
            except sqlite3.IntegrityError:
                complete = False
            except sqlite3.Error:
                raise  # the file or the disk: the whole batch fails in the recorder
            except Exception:  # e.g. an int too large for SQLite
                complete = False
            if complete:
                conn.execute("RELEASE held_rows")
                self.done.extend((event, None) for event, _, _ in order if event is not None)
            else:
                conn.execute("ROLLBACK TO held_rows")
                conn.execute("RELEASE held_rows")
                for event, sql, params in order:
                    reason = execute_insert(conn, sql, params)
                    if event is not None:
                        self.done.append((event, reason))

    def outcomes(self) -> list[tuple[Event, str | None]]:
        """Flush, then every held event's drop reason (None: written) since the last call."""
        self.flush()
        done, self.done = self.done, []
        return done


def execute_insert(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> str | None:
    """One INSERT; a drop reason for this row, or None. Errors of the file itself propagate."""
    try:
        cur = conn.execute(sql, params)
    except sqlite3.IntegrityError as exc:
        return f"rejected by the schema: {exc}"
    except sqlite3.Error:
        raise
    except Exception as exc:  # e.g. an int too large for SQLite
        return f"unstorable value: {type(exc).__name__}"
    return None if cur.rowcount else "duplicate id"


@functools.lru_cache(maxsize=256)
def insert_sql(table: str, columns: tuple[str, ...], upsert: bool) -> str:
    names = ", ".join(columns)
    marks = ", ".join("?" * len(columns))
    if upsert:
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in ("id", "created_at"))
        return (
            f"INSERT INTO {table} ({names}) VALUES ({marks}) "
            f"ON CONFLICT(id) DO UPDATE SET {updates}"
        )
    return f"INSERT INTO {table} ({names}) VALUES ({marks}) ON CONFLICT(id) DO NOTHING"


def insert(
    conn: sqlite3.Connection, table: str, row: dict[str, Any], *, upsert: bool = False
) -> str | None:
    cur = conn.execute(insert_sql(table, tuple(row), upsert), tuple(row.values()))
    return None if cur.rowcount else "duplicate id"
