"""Exports for training, and the import that merges many users' exports into one store.

`export(db, out_dir)` writes one folder:

  sessions.jsonl    every row of every session-owned table ({"table": ..., "row": ...}), blobs as
                    text: what `import_export` merges into another store (a team's training store)
  pretrain.jsonl    {"id", "text", "source", "document_uri"}: distinct file snapshots and task
                    workspace files, deduplicated by sha256
  sft.jsonl         {"id", "messages", "reward", "stop_reason", ...}: agent tasks whose reward >=
                    min_reward, in OpenAI chat format (assistant `tool_calls` with JSON-string
                    arguments, then `tool` messages with `tool_call_id`)
  rl_tasks.jsonl    {"id", "instruction", "workspace": {path: text}, "verify", "stop_reason",
                    "reference_diff"}: tasks with a verifying command, for rollouts; the
                    reference diff is the recorded run's final diff when that run answered
                    (status done), else null
  benchmark.jsonl   the same shape as rl_tasks, for held-out sessions only
  manifest.json     format, schema version, reward function@version and threshold, the split rule,
                    and for each file its record count, bytes and sha256

Held-out split: a session is held out when int(sha256(salt + ":" + session_id)[:8], 16) % 100 <
held_out_percent. It depends on nothing but the session id, so every machine and every re-export
agrees; nothing from a held-out session is written to pretrain, sft or rl_tasks.

Only sessions recorded at consent `code` contribute to the training files; every string in every
file passes `redaction.redact` again on the way out (rows were redacted when stored; this also
covers rows imported from elsewhere).

`import_export(db, folder)` checks the manifest's hashes, then inserts the rows of sessions.jsonl
with ON CONFLICT(id) DO NOTHING: importing the same export twice, or two overlapping exports,
changes nothing the second time. The training files are derived data and are not imported;
export again from the merged store to get them for everyone's sessions.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telemetry import redaction, rewards, store

FORMAT = "flywheel-telemetry-export"
FORMAT_VERSION = 1
DEFAULT_SALT = "flywheel-benchmark-v1"
FILES = ("sessions.jsonl", "pretrain.jsonl", "sft.jsonl", "rl_tasks.jsonl", "benchmark.jsonl")
# Tables exported and imported row by row (blobs travel as text, see _blob_row).
EXPORT_TABLES = ("sessions", *(t for t in store.SESSION_TABLES if t != "sessions"), "blobs")


def is_held_out(session_id: str, percent: float, salt: str = DEFAULT_SALT) -> bool:
    """Whether a session belongs to the held-out benchmark split (deterministic, by hash)."""
    digest = hashlib.sha256(f"{salt}:{session_id}".encode()).hexdigest()
    return int(digest[:8], 16) % 100 < percent


def _redact_all(value: Any) -> Any:
    if isinstance(value, str):
        return redaction.redact(value)
    if isinstance(value, dict):
        return {k: _redact_all(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_all(v) for v in value]
    return value


class _Writer:
    """One JSONL file: redacts, counts and hashes as it writes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open("w", encoding="utf-8", newline="\n")
        self.hash = hashlib.sha256()
        self.count = 0
        self.bytes = 0

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(_redact_all(record), ensure_ascii=False, sort_keys=True) + "\n"
        data = line.encode("utf-8")
        self.file.write(line)
        self.hash.update(data)
        self.count += 1
        self.bytes += len(data)

    def close(self) -> dict[str, Any]:
        self.file.close()
        return {"count": self.count, "bytes": self.bytes, "sha256": self.hash.hexdigest()}


@dataclass
class ExportReport:
    out_dir: Path
    manifest: dict[str, Any]

    def counts(self) -> dict[str, int]:
        return {name: info["count"] for name, info in self.manifest["files"].items()}


def export(
    db_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    reward: str = "total",
    min_reward: float = 0.5,
    held_out_percent: float = 10.0,
    salt: str = DEFAULT_SALT,
) -> ExportReport:
    """Write the export folder described in the module docstring; returns its manifest."""
    function = rewards.get(reward)
    if not 0 <= held_out_percent <= 100:
        raise ValueError("held_out_percent must be within 0..100")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    db = store.open_db(db_path, create=False)
    conn = db.conn
    writers = {name: _Writer(out / name) for name in FILES}
    try:
        conn.execute("BEGIN")  # one consistent snapshot while recorders keep writing
        sessions = conn.execute(
            "SELECT id, consent FROM sessions ORDER BY started_at, id"
        ).fetchall()
        held = {sid for sid, _ in sessions if is_held_out(sid, held_out_percent, salt)}
        with_code = {sid for sid, consent in sessions if consent == "code"}
        _export_rows(conn, writers["sessions.jsonl"])
        _export_pretrain(conn, writers["pretrain.jsonl"], with_code - held)
        _export_tasks(conn, writers, _tasks(conn, with_code), held, function, min_reward)
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        files = {name: w.close() for name, w in writers.items()}
        conn.close()
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "schema_version": store.SCHEMA_VERSION,
        "created_at": time.time(),
        "reward": {"function": function.name, "version": function.version, "min": min_reward},
        "held_out": {
            "rule": "int(sha256(salt:session_id)[:8], 16) % 100 < percent",
            "percent": held_out_percent,
            "salt": salt,
            "sessions": len(held),
        },
        "sessions": len(sessions),
        "files": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return ExportReport(out, manifest)


def _export_tasks(
    conn: sqlite3.Connection,
    writers: dict[str, _Writer],
    tasks: list[dict[str, Any]],
    held: set[str],
    function: rewards.RewardFunction,
    min_reward: float,
) -> None:
    """Each task with a workspace and a verify command as an RL task (benchmark.jsonl when its
    session is held out, rl_tasks.jsonl otherwise); each task not held out whose reward is at
    least `min_reward` as an SFT conversation (sft.jsonl)."""
    for task in tasks:
        in_benchmark = task["session_id"] in held
        if task["verify"] and task["workspace"] is not None:
            target = "benchmark.jsonl" if in_benchmark else "rl_tasks.jsonl"
            writers[target].write(
                {
                    "id": task["id"],
                    "instruction": task["instruction"],
                    "workspace": task["workspace"],
                    "verify": task["verify"],
                    "stop_reason": task["stop_reason"],
                    # what the recorded run changed, when it ended with an answer: a
                    # reference to compare rollouts with, never part of the prompt
                    "reference_diff": (task["diff"] or None) if task["status"] == "done" else None,
                }
            )
        if in_benchmark:
            continue
        value = function.fn(rewards.signals_for_task(conn, task["id"]))
        if value is None or value < min_reward:
            continue
        messages = _messages(conn, task)
        if len(messages) < 2:
            continue
        writers["sft.jsonl"].write(
            {
                "id": task["id"],
                "messages": messages,
                "reward": value,
                "reward_function": function.key,
                "model_version": task["model_version"],
                "stop_reason": task["stop_reason"],
            }
        )


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


def _export_rows(conn: sqlite3.Connection, writer: _Writer) -> None:
    for table in EXPORT_TABLES:
        columns = _columns(conn, table)
        for values in conn.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY id"):
            row = dict(zip(columns, values, strict=True))
            if table == "blobs":
                row = {
                    "id": row["id"],
                    "text": zlib.decompress(row["data"]).decode("utf-8", "replace"),
                    "created_at": row["created_at"],
                }
            writer.write({"table": table, "row": row})


def _export_pretrain(conn: sqlite3.Connection, writer: _Writer, sessions: set[str]) -> None:
    seen: set[str] = set()

    def emit(text: str, source: str, uri: str | None) -> None:
        text = redaction.redact(text)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if digest in seen or not text.strip():
            return
        seen.add(digest)
        writer.write({"id": digest, "text": text, "source": source, "document_uri": uri})

    for session_id, uri, bid in conn.execute(
        "SELECT session_id, document_uri, blob_id FROM files ORDER BY at, id"
    ):
        data = store.get_blob(conn, bid) if session_id in sessions else None
        if data is not None:
            emit(data.decode("utf-8", "replace"), "file", uri)
    for session_id, bid in conn.execute(
        "SELECT session_id, workspace_blob FROM tasks WHERE workspace_blob IS NOT NULL "
        "ORDER BY created_at, id"
    ):
        data = store.get_blob(conn, bid) if session_id in sessions else None
        if data is None:
            continue
        for path, text in _load_workspace(data).items():
            emit(text, "workspace", path)


def _load_workspace(data: bytes) -> dict[str, str]:
    try:
        files = json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return {}
    return (
        {str(p): t for p, t in files.items() if isinstance(t, str)}
        if isinstance(files, dict)
        else {}
    )


def _tasks(conn: sqlite3.Connection, sessions: set[str]) -> list[dict[str, Any]]:
    tasks = []
    for tid, sid, instruction, blob, verify, model, status, stop_reason, diff in conn.execute(
        "SELECT id, session_id, instruction, workspace_blob, verify_command, model_version, "
        "status, stop_reason, diff FROM tasks ORDER BY created_at, id"
    ):
        if sid not in sessions:
            continue
        data = store.get_blob(conn, blob) if blob else None
        tasks.append(
            {
                "id": tid,
                "session_id": sid,
                "instruction": instruction,
                "workspace": None if data is None else _load_workspace(data),
                "verify": verify,
                "model_version": model,
                "status": status,
                "stop_reason": stop_reason,
                "diff": diff,
            }
        )
    return tasks


def _messages(conn: sqlite3.Connection, task: dict[str, Any]) -> list[dict[str, Any]]:
    """A task's steps as OpenAI-style chat messages."""
    messages: list[dict[str, Any]] = []
    for role, content, tool_calls, tool_call_id, tool_name, result, error in conn.execute(
        "SELECT role, content, tool_calls, tool_call_id, tool_name, result, error FROM steps "
        "WHERE task_id = ? ORDER BY idx",
        (task["id"],),
    ):
        if role == "tool":
            message: dict[str, Any] = {
                "role": "tool",
                "tool_call_id": tool_call_id,
                "content": result if result is not None else (error or ""),
            }
            if tool_name:
                message["name"] = tool_name
        else:
            message = {"role": role, "content": content or ""}
            calls = json.loads(tool_calls) if tool_calls else []
            if calls:
                message["tool_calls"] = [
                    {
                        "id": call.get("id") or f"call_{i}",
                        "type": "function",
                        "function": {
                            "name": call.get("name"),
                            "arguments": call["arguments"]
                            if isinstance(call.get("arguments"), str)
                            else json.dumps(call.get("arguments") or {}, ensure_ascii=False),
                        },
                    }
                    for i, call in enumerate(calls)
                    if isinstance(call, dict)
                ]
        messages.append(message)
    if task["instruction"] and not any(m["role"] == "user" for m in messages):
        at = 1 if messages and messages[0]["role"] == "system" else 0
        messages.insert(at, {"role": "user", "content": task["instruction"]})
    return messages


# --- import ----------------------------------------------------------------------------------


class ExportError(ValueError):
    """An export folder that is incomplete, altered, or from an unknown format."""


@dataclass
class ImportReport:
    inserted: dict[str, int] = field(default_factory=dict)  # table -> new rows
    skipped: int = 0  # rows already present (same id)
    rejected: int = 0  # rows that did not fit (unknown table, blob hash mismatch)

    @property
    def total_inserted(self) -> int:
        return sum(self.inserted.values())


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and verify an export folder's manifest (format and every file's sha256)."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except FileNotFoundError as exc:
        raise ExportError(f"{folder}: no manifest.json; not a flywheel export") from exc
    except ValueError as exc:
        raise ExportError(f"{folder}/manifest.json is not JSON: {exc}") from exc
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise ExportError(f"{folder}: unknown export format {manifest.get('format')!r}")
    for name, info in manifest.get("files", {}).items():
        path = folder / name
        if not path.exists():
            raise ExportError(f"{folder}: {name} is listed in the manifest but missing")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != info.get("sha256"):
            raise ExportError(f"{folder}: {name} does not match its sha256 in the manifest")
    return manifest


def import_export(db_path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> ImportReport:
    """Merge an export's sessions.jsonl into the database at db_path (idempotent)."""
    folder = Path(folder)
    read_manifest(folder)
    db = store.open_db(db_path)
    conn = db.conn
    report = ImportReport()
    try:
        columns = {t: set(_columns(conn, t)) for t in EXPORT_TABLES}
        with store.write_transaction(conn), (folder / "sessions.jsonl").open(encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                table, row = record.get("table"), record.get("row")
                if table not in columns or not isinstance(row, dict) or "id" not in row:
                    report.rejected += 1
                    continue
                row = _redact_all(row)
                if table == "blobs":
                    data = str(row.get("text", "")).encode("utf-8")
                    if store.blob_id(data) != row["id"]:
                        report.rejected += 1
                        continue
                    row = {
                        "id": row["id"],
                        "size": len(data),
                        "data": zlib.compress(data, 6),
                        "created_at": row.get("created_at") or time.time(),
                    }
                row = {k: v for k, v in row.items() if k in columns[table]}
                names = ", ".join(row)
                marks = ", ".join("?" * len(row))
                try:
                    cur = conn.execute(
                        f"INSERT INTO {table} ({names}) VALUES ({marks}) "
                        "ON CONFLICT(id) DO NOTHING",
                        tuple(row.values()),
                    )
                except sqlite3.IntegrityError:  # a required column missing or NULL
                    report.rejected += 1
                    continue
                if cur.rowcount:
                    report.inserted[table] = report.inserted.get(table, 0) + 1
                else:
                    report.skipped += 1
    finally:
        conn.close()
    return report
