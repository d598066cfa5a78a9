"""The recorder: callers enqueue events and return at once; one writer thread commits them.

    rec = Recorder(path, PrivacyPolicy(consent="code"))
    sid = rec.record("session_start", editor="vscode", plugin_version="0.1.0")
    sug = rec.record("suggestion", session_id=sid, kind="inline", output="x = 1")
    rec.record("suggestion_event", session_id=sid, suggestion_id=sug, event="accepted")
    rec.flush()    # True once everything recorded before it is committed with synchronous=FULL
    rec.close()    # flush, stop the writer, close the file

`record(kind, **fields)` is the whole writing API. It checks the kind and the field names (the
table `EVENTS` below is the vocabulary), assigns an id and a timestamp, puts the event on a
queue and returns the id, or None when the event was refused; it never raises and never touches
the database. Refusals (unknown kind or field, missing field, bad enumerated value) are logged
once per reason and counted in `stats()`.

The writer thread takes everything queued (up to `batch_size`, waiting up to `linger_s` for more
when the queue runs dry, unless a flush() is waiting), cleans, redacts and strips each event per
the privacy policy (privacy.py), and commits the batch in one `BEGIN IMMEDIATE` transaction, its
inserts sent with one `executemany` per statement (`_Rows`). Lock contention with other processes is waited out (SQLite's busy timeout, then our
own backoff); it never reaches a caller. Events that cannot be stored — a session that does not
exist, a duplicate id — go to the `dropped` table with a reason (never their content). A batch
that fails for the environment (disk full, file became read-only) is dropped, logged, and makes
the next `flush()` return False.

What it does not do: it does not compute rewards (rewards.py) or read the environment; it does not
retry events after a failed batch (telemetry must never grow without bound in memory).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
import logging
import os
import queue
import re
import sqlite3
import threading
import time
import uuid
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any

from telemetry import privacy, store
from telemetry.privacy import PrivacyPolicy

log = logging.getLogger("flywheel.telemetry")

SUGGESTION_KINDS = frozenset({"inline", "next_edit", "apply", "agent_edit"})
SUGGESTION_EVENTS = frozenset(
    {
        "shown",
        "accepted",
        "partially_accepted",
        "rejected",
        "ignored",
        "superseded",
        "cancelled",
    }
)
TASK_STATUSES = frozenset({"running", "done", "failed", "cancelled", "limit"})
ROLES = frozenset({"system", "user", "assistant", "tool"})
HUNK_OUTCOMES = frozenset({"pending", "accepted", "rejected", "failed", "reverted"})


@dataclass(frozen=True)
class EventKind:
    """How one kind of event maps onto the schema (store.py)."""

    table: str
    fields: frozenset[str]  # fields a caller may pass (besides session_id)
    required: frozenset[str] = frozenset()
    code: frozenset[str] = frozenset()  # code/prompt/output: kept only at consent "code"
    json: frozenset[str] = frozenset()  # stored as JSON text
    choices: tuple[tuple[str, frozenset[str]], ...] = ()  # enumerated fields
    session: bool = True  # belongs to a session, which must exist
    upsert: bool = False  # may update an existing row with the same id


def _spec(
    table: str,
    *,
    fields: str = "",
    required: str = "",
    code: str = "",
    json: str = "",
    choices: dict[str, frozenset[str]] | None = None,
    session: bool = True,
    upsert: bool = False,
) -> EventKind:
    req = frozenset(required.split())
    return EventKind(
        table=table,
        fields=frozenset(fields.split()) | req | frozenset(code.split()) | frozenset(json.split()),
        required=req,
        code=frozenset(code.split()),
        json=frozenset(json.split()),
        choices=tuple((choices or {}).items()),
        session=session,
        upsert=upsert,
    )


# The vocabulary: event kind -> table. Every field not listed is refused by record().
EVENTS: dict[str, EventKind] = {
    "session_start": _spec(
        "sessions", fields="id editor plugin_version model_version workspace_id git_head"
    ),
    "session_end": _spec("sessions"),
    # the model a session runs, once known (an editor session starts before its engine loads);
    # fills an empty sessions.model_version, never overwrites one
    "session_model": _spec("sessions", required="model_version"),
    "suggestion": _spec(
        "suggestions",
        fields="id trigger document_uri document_version language latency_ms ttft_ms "
        "prompt_tokens output_tokens drafts_proposed drafts_accepted mean_acceptance_length "
        "model_version",
        required="kind",
        code="context output",
        json="context",
        choices={"kind": SUGGESTION_KINDS},
    ),
    "suggestion_event": _spec(
        "suggestion_events",
        fields="accepted_chars",
        required="suggestion_id event",
        choices={"event": SUGGESTION_EVENTS},
    ),
    "task_start": _spec(
        "tasks",
        fields="id model_version",
        code="instruction verify_command workspace_files",
        json="workspace_files",
    ),
    "task_end": _spec(
        "tasks",
        fields="stop_reason",  # the harness's reason: answered, max_steps, engine_error, ...
        required="task_id status",
        code="final_message stop_detail diff",  # diff: the final unified diff of the workspace
        choices={"status": TASK_STATUSES},
    ),
    "step": _spec(
        "steps",
        fields="tool_call_id tool_name is_error invalid policy_version duration_ms "
        "prompt_tokens output_tokens",
        required="task_id idx role",
        code="content tool_calls result error token_ids logprobs",
        json="tool_calls token_ids logprobs",
        choices={"role": ROLES},
    ),
    "edit": _spec(
        "edits",
        fields="id task_id suggestion_id document_uri document_version",
        code="hunks",
    ),
    "hunk_outcome": _spec(
        "hunks", required="edit_id idx outcome", choices={"outcome": HUNK_OUTCOMES}
    ),
    "outcome": _spec(
        "outcomes",
        fields="task_id suggestion_id tests_before_passed tests_before_failed "
        "tests_after_passed tests_after_failed diagnostics_before diagnostics_after "
        "lint_before lint_after reverted dissatisfied_followup",
    ),
    "survival": _spec(
        "survival",
        fields="accepted_chars surviving_chars",
        required="suggestion_id after_s",
    ),
    "feedback": _spec("feedback", fields="task_id suggestion_id rating", code="comment"),
    "file": _spec("files", fields="language", required="document_uri", code="text"),
    "model_version": _spec(
        "model_versions",
        fields="parent stage path promoted_at",
        required="id",
        json="metrics",
        session=False,
        upsert=True,
    ),
    "training_run": _spec(
        "training_runs",
        fields="stage model_in model_out status ended_at",
        required="id",
        json="config",
        session=False,
        upsert=True,
    ),
    "training_metric": _spec("training_metrics", required="run_id step name value", session=False),
}

# Columns holding counts or measures: anything else passed there is stored as NULL.
_NUMERIC = frozenset(
    [
        "document_version",
        "latency_ms",
        "ttft_ms",
        "prompt_tokens",
        "output_tokens",
        "drafts_proposed",
        "drafts_accepted",
        "mean_acceptance_length",
        "accepted_chars",
        "idx",
        "duration_ms",
        "is_error",
        "invalid",
        "tests_before_passed",
        "tests_before_failed",
        "tests_after_passed",
        "tests_after_failed",
        "diagnostics_before",
        "diagnostics_after",
        "lint_before",
        "lint_after",
        "reverted",
        "dissatisfied_followup",
        "after_s",
        "surviving_chars",
        "rating",
        "step",
        "value",
        "promoted_at",
        "ended_at",
    ]
)


# How _row treats each field of each kind (worked out once, not per event).
_AS_META, _AS_NUMBER, _AS_JSON, _AS_URI, _AS_CODE = range(5)


def _plan(spec: EventKind) -> dict[str, int]:
    plan = {}
    for name in spec.fields | {"session_id"}:
        if name in spec.code:
            plan[name] = _AS_CODE  # kept only at consent "code", after the metadata
        elif name in _NUMERIC:
            plan[name] = _AS_NUMBER
        elif name in spec.json:
            plan[name] = _AS_JSON  # metrics, config: metadata, still cleaned and redacted
        elif name == "document_uri":
            plan[name] = _AS_URI
        else:
            plan[name] = _AS_META
    return plan


_PLANS = {kind: _plan(spec) for kind, spec in EVENTS.items()}


@dataclass
class _Event:
    kind: str
    id: str
    at: float
    fields: dict[str, Any]


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
        # task id -> ids of its latest tool calls that named an excluded file (writer thread only)
        self._excluded_calls: dict[str, set[str]] = {}
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
        self._queue.put(_Event(kind, str(event_id), time.time(), fields))
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
            batch: list[_Event] = []
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

    def _write(self, batch: list[_Event], *, durable: bool) -> None:
        conn = self._conn
        assert conn is not None
        new_sessions: set[str] = set()
        try:
            if durable:
                conn.execute("PRAGMA synchronous=FULL")
            with store.write_transaction(conn):
                rows = _Rows(conn)
                for event in batch:
                    try:
                        reason = self._apply(conn, event, new_sessions, rows)
                    except sqlite3.IntegrityError as exc:  # this event's row, not the disk
                        reason = f"rejected by the schema: {exc}"
                    except sqlite3.Error:
                        raise  # the file or the disk: the whole batch fails below
                    except Exception as exc:  # e.g. an int too large for SQLite
                        reason = f"unstorable value: {type(exc).__name__}"
                    if reason is _HELD:
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

    def _drop(self, conn: sqlite3.Connection, event: _Event, reason: str) -> None:
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
        self, conn: sqlite3.Connection, event: _Event, new: set[str], rows: _Rows
    ) -> str | None | object:
        """Write one event inside the open transaction; return a drop reason, None when it is
        written, or _HELD when its row waits in `rows` (which then reports how it ended)."""
        spec = EVENTS[event.kind]
        fields = event.fields
        sid = fields.get("session_id")
        needs_session = spec.session and event.kind != "session_start"
        if needs_session and not self._session_exists(conn, sid, new):
            return "unknown session"
        try:
            row = self._row(event, spec)
        except Exception as exc:  # a value we could not turn into text: never the caller's crash
            return f"unstorable value: {type(exc).__name__}"
        kind = event.kind
        if kind == "session_start":
            row.update(id=event.id, started_at=event.at, consent=self.policy.consent)
            new.add(event.id)
            return rows.add(event, "sessions", row)
        if kind in ("session_end", "session_model", "task_end", "hunk_outcome"):
            rows.flush()  # the updates below must see the rows held so far
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
        if kind == "hunk_outcome":
            cur = conn.execute(
                "UPDATE hunks SET outcome = ? WHERE edit_id = ? AND idx = ? AND session_id = ?",
                (row["outcome"], row["edit_id"], row["idx"], sid),
            )
            return None if cur.rowcount else "unknown hunk"
        row["id"] = event.id
        if kind == "task_start":
            files = row.pop("workspace_files", None)
            row.update(created_at=event.at, status="running")
            if files is not None:
                data = files.encode("utf-8")
                row["workspace_blob"] = store.put_blob(conn, data, sid, event.at)
        elif kind == "edit":
            hunks = fields.get("hunks") or []
            row["created_at"] = event.at
            row["excluded"] = int(self._excluded(fields.get("document_uri")))
            store_code = self.policy.consent == "code" and not row["excluded"]
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
                        "original": self._code(hunk.get("original")) if store_code else None,
                        "replacement": self._code(hunk.get("replacement")) if store_code else None,
                        "outcome": "pending",
                    },
                )
        elif kind == "file":
            text = row.pop("text", None)
            if text is None:  # consent or exclusion: nothing to keep for a file
                return None
            row["at"] = event.at
            row["blob_id"] = store.put_blob(conn, text.encode("utf-8"), sid, event.at)
        elif kind == "survival":
            accepted, surviving = row.get("accepted_chars"), row.get("surviving_chars")
            row["at"] = event.at
            if accepted and surviving is not None:
                row["share"] = max(0.0, min(1.0, surviving / accepted))
        elif kind == "suggestion":
            row["created_at"] = event.at
            row["excluded"] = int(self._excluded(fields.get("document_uri")))
        elif kind in ("model_version", "training_run"):
            row["created_at"] = event.at
        else:
            row["at"] = event.at
        if spec.upsert:  # in order with the held rows: a later upsert of the same id wins
            rows.flush()
            return _insert(conn, spec.table, row, upsert=True)
        return rows.add(event, spec.table, row)

    # --- privacy: every value passes here before it is written -------------------------------

    def _excluded(self, uri: Any) -> bool:
        return isinstance(uri, str) and privacy.is_excluded(uri, self.policy.exclude)

    def _code(self, value: Any) -> str | None:
        if value is None:
            return None
        return privacy.clean_code(
            value, self.policy.max_code_chars, redact_secrets=self.policy.redact_secrets
        )

    def _json_code(self, value: Any) -> Any:
        """Clean and redact every string inside a JSON-like value; a string under a key that
        names a secret ({"password": "..."}) is redacted whole."""
        if isinstance(value, str | bytes | bytearray):
            return self._code(value)
        if isinstance(value, dict):  # keys are names: cleaned, not redacted
            out = {}
            redact_names = self.policy.redact_secrets
            for k, v in value.items():
                key = privacy.clean_text(k, privacy.MAX_META_CHARS)
                if redact_names and type(v) is str and privacy.named_secret(key, v):
                    out[key] = "[REDACTED:password_assignment]"
                else:
                    out[key] = self._json_code(v)
            return out
        if isinstance(value, list | tuple):
            return [self._json_code(v) for v in value]
        if value is None or isinstance(value, bool | int | float):
            return value
        return self._code(str(value))

    def _step_touches_excluded_file(self, fields: dict[str, Any]) -> bool:
        """An assistant step calling a tool on an excluded path, or the tool step answering it
        (matched by tool_call_id, or else the tool step right after such a call)."""
        task = str(fields.get("task_id"))
        if fields.get("role") == "assistant":
            ids = _excluded_call_ids(fields.get("tool_calls"), self.policy.exclude)
            if ids:
                if len(self._excluded_calls) > 10_000:  # bounded: old tasks are long done
                    self._excluded_calls.clear()
                self._excluded_calls[task] = ids
            else:
                self._excluded_calls.pop(task, None)
            return bool(ids)
        if fields.get("role") == "tool":
            ids = self._excluded_calls.get(task)
            if not ids:
                return False
            call_id = fields.get("tool_call_id")
            return call_id is None or str(call_id) in ids or "" in ids
        return False

    def _row(self, event: _Event, spec: EventKind) -> dict[str, Any]:
        fields = event.fields
        consent_code = self.policy.consent == "code"
        keep_code = consent_code
        uri = fields.get("document_uri")
        if keep_code and uri is not None and self._excluded(uri):
            keep_code = False
        plan = _PLANS[event.kind]
        row: dict[str, Any] = {}
        for name, value in fields.items():
            how = plan[name]
            if how == _AS_META or (how == _AS_URI and consent_code):
                if value is None or isinstance(value, bool | int | float):
                    row[name] = value
                else:
                    row[name] = privacy.clean_text(value, privacy.MAX_META_CHARS)
            elif how == _AS_NUMBER:
                row[name] = _number(value)
            elif how == _AS_JSON:
                row[name] = _dumps(self._json_code(value))
            elif how == _AS_URI:
                row[name] = _opaque_uri(value)
        if event.kind == "step":
            calls = fields.get("tool_calls")
            if calls is not None:
                row["tool_calls_hash"] = _hash(_dumps(calls, sort_keys=True))
            if keep_code and self._step_touches_excluded_file(fields):
                keep_code = False  # a read of .env: its arguments and result are not stored
        if event.kind == "task_end":
            message, diff = fields.get("final_message"), fields.get("diff")
            row["final_message_chars"] = len(message) if isinstance(message, str) else None
            row["diff_chars"] = len(diff) if isinstance(diff, str | bytes) else None
        if event.kind == "suggestion":
            output = fields.get("output")
            row["output_chars"] = len(output) if isinstance(output, str) else None
        if not keep_code:
            return row
        for name in spec.code & fields.keys() - {"hunks"}:  # hunks: one row each, in _apply
            value = fields[name]
            if name == "workspace_files":
                files = value if isinstance(value, dict) else {}
                kept = {
                    str(p): t
                    for p, t in files.items()
                    if not privacy.is_excluded(str(p), self.policy.exclude)
                }
                # keys are paths here, not field names: redact each file's text only
                kept = {
                    privacy.clean_text(p, privacy.MAX_META_CHARS): self._code(t)
                    for p, t in kept.items()
                }
                row[name] = _dumps(kept, sort_keys=True)
            elif name in spec.json:
                row[name] = _dumps(self._json_code(value))
            elif name == "diff":
                row[name] = self._diff(value)
            else:
                row[name] = self._code(value)
        return row

    def _diff(self, value: Any) -> str | None:
        """A diff as a code field (cleaned, redacted, cut with a marker), without the sections
        of excluded files; the cut's marker stays even when the last section is dropped."""
        text = self._code(value)
        if text is None:
            return None
        cut = _CUT_MARKER.search(text)
        body, marker = (text[: cut.start()], cut.group(0)) if cut else (text, "")
        return privacy.drop_excluded_files(body, self.policy.exclude) + marker


def _excluded_call_ids(calls: Any, globs: tuple[str, ...]) -> set[str]:
    """The ids ("" when missing) of tool calls whose arguments name an excluded path."""
    found: set[str] = set()
    if not isinstance(calls, list):
        return found
    for call in calls:
        args = call.get("arguments") if isinstance(call, dict) else None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = {"raw": args}
        if isinstance(args, dict) and any(
            isinstance(v, str) and privacy.is_excluded(v, globs) for v in args.values()
        ):
            found.add(str(call.get("id") or "") if isinstance(call, dict) else "")
    return found


_HELD = object()  # _apply's answer for a row that waits in _Rows
_CUT_MARKER = re.compile(r"\n\[truncated: \d+ (?:chars|bytes), kept \d+\]\Z")


class _Rows:
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
        self.order: list[tuple[_Event | None, str, tuple[Any, ...]]] = []
        self.done: list[tuple[_Event, str | None]] = []  # held events and their drop reasons

    def add(self, event: _Event | None, table: str, row: dict[str, Any]) -> object:
        """Hold one row; `event` None for a row whose outcome nobody counts (a hunk)."""
        sql = _insert_sql(table, tuple(row), False)
        params = tuple(row.values())
        group = self.groups.get(sql)
        if group is None:
            self.groups[sql] = group = []
        group.append(params)
        self.order.append((event, sql, params))
        return _HELD

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
                raise  # the file or the disk: the whole batch fails in _write
            except Exception:  # e.g. an int too large for SQLite
                complete = False
            if complete:
                conn.execute("RELEASE held_rows")
                self.done.extend((event, None) for event, _, _ in order if event is not None)
            else:
                conn.execute("ROLLBACK TO held_rows")
                conn.execute("RELEASE held_rows")
                for event, sql, params in order:
                    reason = _execute_insert(conn, sql, params)
                    if event is not None:
                        self.done.append((event, reason))

    def outcomes(self) -> list[tuple[_Event, str | None]]:
        """Flush, then every held event's drop reason (None: written) since the last call."""
        self.flush()
        done, self.done = self.done, []
        return done


def _execute_insert(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> str | None:
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
def _insert_sql(table: str, columns: tuple[str, ...], upsert: bool) -> str:
    names = ", ".join(columns)
    marks = ", ".join("?" * len(columns))
    if upsert:
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in ("id", "created_at"))
        return (
            f"INSERT INTO {table} ({names}) VALUES ({marks}) "
            f"ON CONFLICT(id) DO UPDATE SET {updates}"
        )
    return f"INSERT INTO {table} ({names}) VALUES ({marks}) ON CONFLICT(id) DO NOTHING"


def _insert(
    conn: sqlite3.Connection, table: str, row: dict[str, Any], *, upsert: bool = False
) -> str | None:
    cur = conn.execute(_insert_sql(table, tuple(row), upsert), tuple(row.values()))
    return None if cur.rowcount else "duplicate id"


def _number(value: Any) -> float | int | None:
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        return float(value)  # SQLite integers are 64-bit
    if value is None or isinstance(value, int | float):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _dumps(value: Any, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=sort_keys, default=str)


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _opaque_uri(uri: Any) -> str | None:
    """At `metrics` consent a path is replaced by a hash that keeps only its extension."""
    if not isinstance(uri, str):
        return None
    name = privacy.uri_path(uri).rsplit("/", 1)[-1]
    ext = name.rsplit(".", 1)[-1] if "." in name else ""
    digest = _hash(uri)[:16]
    return f"sha256:{digest}" + (f".{ext[:10]}" if ext.isalnum() else "")


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
