"""The recorder: callers enqueue events and return at once; one writer thread commits them.

    rec = Recorder(path, PrivacyPolicy(consent="code"))
    sid = rec.record("session_start", editor="vscode", plugin_version="0.1.0")
    sug = rec.record("suggestion", session_id=sid, kind="inline", output="x = 1")
    rec.record("suggestion_event", session_id=sid, suggestion_id=sug, event="accepted")
    rec.flush()    # True once everything recorded before it is committed with synchronous=FULL
    rec.close()    # flush, stop the writer, close the file

`record(kind, **fields)` is the whole writing API. It checks the kind and the field names (the
table `EVENTS` in events.py is the vocabulary), assigns an id and a timestamp, puts the event on a
queue and returns the id, or None when the event was refused; it never raises and never touches
the database. Refusals (unknown kind or field, missing field, bad enumerated value) are logged
once per reason and counted in `stats()`.

The writer thread takes everything queued (up to `batch_size`, waiting up to `linger_s` for more
when the queue runs dry, unless a flush() is waiting), cleans, redacts and strips each event per
the privacy policy (row_builder.py), and commits the batch in one `BEGIN IMMEDIATE` transaction,
its inserts sent with one `executemany` per statement (inserts.py). Lock contention with other
processes is waited out (SQLite's busy timeout, then our own backoff); it never reaches a caller.
Events that cannot be stored — a session that does not exist, a duplicate id — go to the
`dropped` table with a reason (never their content). A batch that fails for the environment
(disk full, file became read-only) is dropped, logged, and makes the next `flush()` return False.

What it does not do: it does not compute rewards (rewards.py) or read the environment; it does not
retry events after a failed batch (telemetry must never grow without bound in memory).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import sqlite3
import threading
import time
import uuid
import weakref
from collections import Counter
from typing import Any

from telemetry import privacy, store
from telemetry.events import EVENTS, Event
from telemetry.inserts import HELD, HeldRows, insert
from telemetry.privacy import PrivacyPolicy
from telemetry.row_builder import RowBuilder

log = logging.getLogger("flywheel.telemetry")


class _Flush:
    __slots__ = ("done", "ok")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False


_STOP = object()


class Recorder:
    """Enqueue-and-return event log over one database file. Thread-safe; one per process."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        policy: PrivacyPolicy | None = None,
        *,
        batch_size: int = 1000,  # most events committed in one transaction
        linger_s: float = 0.025,  # how long the writer waits for more events before a commit
    ) -> None:
        self.path = str(path)
        self.policy = policy or PrivacyPolicy()
        self.batch_size = batch_size
        self.linger_s = linger_s
        self.error: str | None = None  # why the recorder is disabled, or the last batch failure
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._wake = threading.Event()  # flush() ends the writer's linger early
        self._counts: Counter[str] = Counter()
        self._refused_logged: set[str] = set()
        self._batch_failed = False
        self._known_sessions: set[str] = set()
        self._builder = RowBuilder(self.policy)  # event -> stored row (writer thread only)
        self._conn: sqlite3.Connection | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self.enabled = self.policy.consent != "off"
        if not self.enabled:
            return
        try:
            self._conn = _open_for_writing(self.path)
        except (sqlite3.Error, OSError, store.SchemaError) as exc:
            self._disable(f"telemetry disabled: cannot write {self.path}: {_reason(exc)}")
            return
        self._thread = threading.Thread(target=self._run, name="telemetry-writer", daemon=True)
        self._thread.start()
        atexit.register(_close_at_exit, weakref.ref(self))

    # --- the caller's side -------------------------------------------------------------------

    def record(self, kind: str, /, **fields: Any) -> str | None:
        """Enqueue one event; return its id (a new one unless `id=` is given) or None if refused.

        `session_id` is required for every kind except session_start, model_version,
        training_run and training_metric. For session_end and session_model the id is the
        session's.
        """
        if not self.enabled or self._closed:
            return None
        spec = EVENTS.get(kind)
        if spec is None:
            return self._refuse(kind, f"unknown event kind {kind!r}; known: {sorted(EVENTS)}")
        session_id = fields.get("session_id")
        needs_session = spec.session and kind != "session_start"
        if needs_session and (not isinstance(session_id, str) or not session_id):
            return self._refuse(kind, f"{kind} needs session_id")
        unknown = fields.keys() - spec.fields - {"session_id"}
        if unknown:
            return self._refuse(kind, f"{kind}: unknown fields {sorted(unknown)}")
        missing = spec.required - fields.keys()
        if missing:
            return self._refuse(kind, f"{kind}: missing fields {sorted(missing)}")
        for name, allowed in spec.choices:
            if fields.get(name) not in allowed:
                return self._refuse(kind, f"{kind}: {name} must be one of {sorted(allowed)}")
        if kind in ("session_end", "session_model"):
            event_id = session_id
        elif kind == "step":
            event_id = f"{fields['task_id']}:{fields['idx']}"
        elif kind == "survival":
            event_id = f"{fields['suggestion_id']}:{fields['after_s']}"
        elif kind == "task_end":
            event_id = fields["task_id"]
        else:
            event_id = fields.get("id") or uuid.uuid4().hex
        self._counts["enqueued"] += 1
        self._queue.put(Event(kind, str(event_id), time.time(), fields))
        return str(event_id)

    def flush(self, timeout: float | None = None) -> bool:
        """Block until every event recorded before this call is durable (or refused/dropped).

        Returns False when the recorder is disabled, the timeout passes first, or a batch failed
        since the previous flush (see `error`).
        """
        if not self.enabled or self._thread is None or not self._thread.is_alive():
            return False
        marker = _Flush()
        self._queue.put(marker)
        self._wake.set()
        if not marker.done.wait(timeout):
            return False
        return marker.ok

    def close(self, timeout: float | None = 60.0) -> bool:
        """Flush, stop the writer and close the file; later record() calls return None."""
        if self._closed:
            return True
        ok = self.flush(timeout)
        self._closed = True
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)
        return ok

    def stats(self) -> dict[str, int]:
        """Counters: enqueued, written, refused, dropped, failed_batches, batches."""
        return dict(self._counts)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _refuse(self, kind: str, reason: str) -> None:
        self._counts["refused"] += 1
        if reason not in self._refused_logged and len(self._refused_logged) < 100:
            self._refused_logged.add(reason)
            log.warning("telemetry event refused: %s", reason)
        return None

    def _disable(self, message: str) -> None:
        self.enabled = False
        self.error = message
        log.error("%s", message)

    # --- the writer thread -------------------------------------------------------------------

    def _run(self) -> None:
        assert self._conn is not None
        pending: Any = None
        while True:
            item = pending if pending is not None else self._queue.get()
            pending = None
            if item is _STOP:
                break
            batch: list[Event] = []
            marker: _Flush | None = None
            lingered = False
            while True:
                if isinstance(item, _Flush):
                    marker = item
                    break
                if item is _STOP:
                    pending = item
                    break
                batch.append(item)
                if len(batch) >= self.batch_size:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    # Linger: events that trickle in (an editor, a paced caller) share one
                    # commit, and the writer is not woken for each one; flush() wakes it.
                    if lingered:
                        break
                    lingered = True
                    self._wake.wait(self.linger_s)
                    self._wake.clear()  # a flush marker put before set() is still drained
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
            if batch:
                self._write(batch, durable=marker is not None)
            if marker is not None:
                if not batch and not self._batch_failed:
                    self._sync()
                marker.ok = not self._batch_failed
                self._batch_failed = False
                marker.done.set()
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()

    def _sync(self) -> None:
        """Make earlier NORMAL commits durable: a checkpoint fsyncs the WAL before it copies."""
        assert self._conn is not None
        try:
            store.retry_locked(lambda: self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)"))
        except sqlite3.Error as exc:
            self._batch_failed = True
            self.error = f"telemetry flush failed: {_reason(exc)}"
            log.error("%s", self.error)

    def _write(self, batch: list[Event], *, durable: bool) -> None:
        conn = self._conn
        assert conn is not None
        new_sessions: set[str] = set()
        try:
            if durable:
                conn.execute("PRAGMA synchronous=FULL")
            with store.write_transaction(conn):
                rows = HeldRows(conn)
                for event in batch:
                    try:
                        reason = self._apply(conn, event, new_sessions, rows)
                    except sqlite3.IntegrityError as exc:  # this event's row, not the disk
                        reason = f"rejected by the schema: {exc}"
                    except sqlite3.Error:
                        raise  # the file or the disk: the whole batch fails below
                    except Exception as exc:  # e.g. an int too large for SQLite
                        reason = f"unstorable value: {type(exc).__name__}"
                    if reason is HELD:
                        continue
                    if reason is not None:
                        self._drop(conn, event, str(reason))
                    else:
                        self._counts["written"] += 1
                for event, reason in rows.outcomes():
                    if reason is None:
                        self._counts["written"] += 1
                    else:
                        self._drop(conn, event, reason)
            self._known_sessions |= new_sessions
            self._counts["batches"] += 1
        except (sqlite3.Error, OSError) as exc:
            # Lock errors only land here after LOCK_RETRY_S of waiting.
            self._counts["failed_batches"] += 1
            self._counts["lost"] += len(batch)
            self._batch_failed = True
            self.error = f"telemetry batch of {len(batch)} lost: {_reason(exc)}"
            log.error("%s", self.error)
        finally:
            if durable:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA synchronous=NORMAL")

    def _drop(self, conn: sqlite3.Connection, event: Event, reason: str) -> None:
        self._counts["dropped"] += 1
        conn.execute(
            "INSERT OR IGNORE INTO dropped (id, at, kind, reason) VALUES (?, ?, ?, ?)",
            (uuid.uuid4().hex, event.at, event.kind, reason),
        )

    def _session_exists(self, conn: sqlite3.Connection, sid: Any, new: set[str]) -> bool:
        if sid in self._known_sessions or sid in new:
            return True
        if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
            new.add(sid)
            return True
        return False

    def _apply(
        self, conn: sqlite3.Connection, event: Event, new: set[str], rows: HeldRows
    ) -> str | None | object:
        """Write one event inside the open transaction; return a drop reason, None when it is
        written, or HELD when its row waits in `rows` (which then reports how it ended)."""
        spec = EVENTS[event.kind]
        fields = event.fields
        sid = fields.get("session_id")
        needs_session = spec.session and event.kind != "session_start"
        if needs_session and not self._session_exists(conn, sid, new):
            return "unknown session"
        try:
            row = self._builder.row(event, spec)
        except Exception as exc:  # a value we could not turn into text: never the caller's crash
            return f"unstorable value: {type(exc).__name__}"
        kind = event.kind
        if kind == "session_start":
            row.update(id=event.id, started_at=event.at, consent=self.policy.consent)
            new.add(event.id)
            return rows.add(event, "sessions", row)
        if kind in ("session_end", "session_model", "task_end", "hunk_outcome"):
            rows.flush()  # the updates must see the rows held so far
            return self._update(conn, event, row, sid)
        row["id"] = event.id
        if not self._fill(conn, event, row, sid, rows):
            return None  # a file with nothing to keep (consent or exclusion)
        if spec.upsert:  # in order with the held rows: a later upsert of the same id wins
            rows.flush()
            return insert(conn, spec.table, row, upsert=True)
        return rows.add(event, spec.table, row)

    def _update(
        self, conn: sqlite3.Connection, event: Event, row: dict[str, Any], sid: Any
    ) -> str | None:
        """An event that changes a row already written (a session's end or model, a task's end,
        a hunk's outcome); a drop reason when that row is not there."""
        kind = event.kind
        if kind == "session_end":
            conn.execute("UPDATE sessions SET ended_at = ? WHERE id = ?", (event.at, event.id))
            return None
        if kind == "session_model":
            conn.execute(
                "UPDATE sessions SET model_version = ? WHERE id = ? "
                "AND (model_version IS NULL OR model_version = '')",
                (str(event.fields["model_version"]), event.id),
            )
            return None
        if kind == "task_end":
            cur = conn.execute(
                "UPDATE tasks SET status = ?, final_message = ?, final_message_chars = ?, "
                "stop_reason = ?, stop_detail = ?, diff = ?, diff_chars = ?, "
                "ended_at = ? WHERE id = ? AND session_id = ?",
                (
                    row.get("status"),
                    row.get("final_message"),
                    row.get("final_message_chars"),
                    row.get("stop_reason"),
                    row.get("stop_detail"),
                    row.get("diff"),
                    row.get("diff_chars"),
                    event.at,
                    event.id,
                    sid,
                ),
            )
            return None if cur.rowcount else "unknown task"
        cur = conn.execute(  # hunk_outcome
            "UPDATE hunks SET outcome = ? WHERE edit_id = ? AND idx = ? AND session_id = ?",
            (row["outcome"], row["edit_id"], row["idx"], sid),
        )
        return None if cur.rowcount else "unknown hunk"

    def _fill(
        self,
        conn: sqlite3.Connection,
        event: Event,
        row: dict[str, Any],
        sid: Any,
        rows: HeldRows,
    ) -> bool:
        """The columns a new row's kind adds (its time, blobs, an edit's hunks, held in `rows`);
        False when there is nothing to keep."""
        kind, fields = event.kind, event.fields
        if kind == "task_start":
            files = row.pop("workspace_files", None)
            row.update(created_at=event.at, status="running")
            if files is not None:
                data = files.encode("utf-8")
                row["workspace_blob"] = store.put_blob(conn, data, sid, event.at)
        elif kind == "edit":
            row["created_at"] = event.at
            row["excluded"] = int(self._builder.excluded(fields.get("document_uri")))
            self._hold_hunks(
                event, sid, rows, self.policy.consent == "code" and not row["excluded"]
            )
        elif kind == "file":
            text = row.pop("text", None)
            if text is None:  # consent or exclusion: nothing to keep for a file
                return False
            row["at"] = event.at
            row["blob_id"] = store.put_blob(conn, text.encode("utf-8"), sid, event.at)
        elif kind == "survival":
            accepted, surviving = row.get("accepted_chars"), row.get("surviving_chars")
            row["at"] = event.at
            if accepted and surviving is not None:
                row["share"] = max(0.0, min(1.0, surviving / accepted))
        elif kind == "suggestion":
            row["created_at"] = event.at
            row["excluded"] = int(self._builder.excluded(fields.get("document_uri")))
        elif kind in ("model_version", "training_run"):
            row["created_at"] = event.at
        else:
            row["at"] = event.at
        return True

    def _hold_hunks(self, event: Event, sid: Any, rows: HeldRows, store_code: bool) -> None:
        """An edit's hunks as `hunks` rows, outcome pending (their code only with `store_code`)."""
        hunks = event.fields.get("hunks") or []
        for i, hunk in enumerate(hunks if isinstance(hunks, list) else []):
            hunk = hunk if isinstance(hunk, dict) else {}
            rows.add(
                None,
                "hunks",
                {
                    "id": f"{event.id}:{i}",
                    "session_id": sid,
                    "edit_id": event.id,
                    "idx": i,
                    "original": self._builder.code(hunk.get("original")) if store_code else None,
                    "replacement": self._builder.code(hunk.get("replacement"))
                    if store_code
                    else None,
                    "outcome": "pending",
                },
            )


def _open_for_writing(path: str) -> sqlite3.Connection:
    db = store.open_db(path)
    conn = db.conn
    try:  # a read-only file opens fine and fails on the first write: find out now, not later
        with store.write_transaction(conn):
            conn.execute("INSERT INTO dropped (id, at, kind, reason) VALUES ('probe', 0, '', '')")
            conn.execute("DELETE FROM dropped WHERE id = 'probe'")
    except BaseException:
        conn.close()
        raise
    return conn


def _reason(exc: BaseException) -> str:
    if isinstance(exc, sqlite3.Error):
        return privacy.sqlite_error_text(exc)
    return str(exc)


def _close_at_exit(ref: weakref.ref[Recorder]) -> None:
    rec = ref()
    if rec is not None:
        rec.close(timeout=10.0)
