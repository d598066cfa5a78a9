"""The telemetry database: where it lives, how it is opened, and its schema as ordered migrations.

What it does: opens one SQLite file (WAL, `busy_timeout`, `secure_delete`), applies the
migrations in `MIGRATIONS` that the file has not seen yet (each in its own transaction, recorded in
`_migrations`), and stores code snapshots as content-addressed, zlib-compressed blobs.

What it does not do: decide what may be written (that is `privacy.py`), queue writes (that is
`recorder.py`), or read the environment. The one default path helper takes the XDG data folder as
an argument; only the command line looks at `FLYWHEEL_DB` / `XDG_DATA_HOME`.

Vocabulary used across `telemetry/`:
  session   one editor window / headless run / rollout, from start to end (table `sessions`)
  event     one thing the recorder is asked to write (a row, or an update of one)
  subject   what a reward is about: an agent `task` or an inline `suggestion`
  blob      a compressed, content-addressed code snapshot (table `blobs`), owned by sessions
            through `blob_refs`; a blob with no refs left is deleted by `forget`

Every row that belongs to a session carries `session_id`, so `forget` is one DELETE per table.
Every table has a globally unique TEXT primary key `id` (uuid or derived), so exports from many
machines merge by primary key (`exports.import_export`).

Usage:
    db = open_db(path)             # sqlite_utils.Database, migrated to SCHEMA_VERSION
    with write_transaction(db.conn):
        ...
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import sqlite_utils

BUSY_TIMEOUT_MS = 5000  # SQLite's own wait for a lock before it reports "database is locked"
LOCK_RETRY_S = 60.0  # after that, our retry loop keeps trying this long with backoff


class SchemaError(RuntimeError):
    """The file holds a schema this code cannot use (newer than SCHEMA_VERSION, or not ours)."""


@dataclass(frozen=True)
class Migration:
    version: int  # applied in increasing order; never renumber a released one
    name: str  # one line: what it adds
    sql: str  # executed as one script inside one transaction


# v1: the first released schema (inline suggestions and feedback only). Kept verbatim: databases
# created by it exist and must upgrade (tests/telemetry/test_store.py builds one).
_V1 = """
CREATE TABLE sessions (
  id TEXT PRIMARY KEY,
  started_at REAL NOT NULL,
  ended_at REAL,
  editor TEXT,             -- "vscode", "nvim", "headless", "rollout"
  plugin_version TEXT,
  model_version TEXT,
  workspace_id TEXT,       -- privacy.workspace_id(root): a hash, never the path
  consent TEXT NOT NULL    -- "metrics" | "code" ("off" writes no session at all)
);
CREATE TABLE suggestions (
  id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL,
  created_at REAL NOT NULL,
  kind TEXT NOT NULL,      -- "inline" | "next_edit" | "apply" | "agent_edit"
  trigger TEXT,            -- "typing" | "invoked" | "automatic" ...
  document_uri TEXT,
  document_version INTEGER,
  language TEXT,
  context TEXT,            -- code: the prompt context (JSON: prefix/suffix/...)
  output TEXT,             -- code: what the model proposed
  latency_ms REAL
);
CREATE TABLE suggestion_events (
  id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL,
  suggestion_id TEXT NOT NULL,
  at REAL NOT NULL,
  event TEXT NOT NULL,     -- shown | accepted | partially_accepted | rejected | ignored | ...
  accepted_chars INTEGER
);
CREATE TABLE feedback (
  id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL,
  at REAL NOT NULL,
  suggestion_id TEXT,
  rating INTEGER,          -- -1 | 0 | +1
  comment TEXT             -- code-level: free text from the user
);
CREATE TABLE blobs (
  id TEXT PRIMARY KEY,     -- sha256 of the uncompressed bytes
  size INTEGER NOT NULL,   -- uncompressed bytes
  data BLOB NOT NULL,      -- zlib
  created_at REAL NOT NULL
);
CREATE TABLE blob_refs (
  id TEXT PRIMARY KEY,     -- blob id + ":" + session id
  blob_id TEXT NOT NULL,
  session_id TEXT NOT NULL
);
CREATE INDEX suggestions_session ON suggestions(session_id);
CREATE INDEX suggestion_events_suggestion ON suggestion_events(suggestion_id);
"""

# v2: agent tasks and everything that rewards and exports need.
_V2 = """
ALTER TABLE sessions ADD COLUMN git_head TEXT;
ALTER TABLE suggestions ADD COLUMN model_version TEXT;
ALTER TABLE suggestions ADD COLUMN ttft_ms REAL;
ALTER TABLE suggestions ADD COLUMN prompt_tokens INTEGER;
ALTER TABLE suggestions ADD COLUMN output_tokens INTEGER;
ALTER TABLE suggestions ADD COLUMN output_chars INTEGER;
ALTER TABLE suggestions ADD COLUMN drafts_proposed INTEGER;
ALTER TABLE suggestions ADD COLUMN drafts_accepted INTEGER;
ALTER TABLE suggestions ADD COLUMN mean_acceptance_length REAL;
ALTER TABLE suggestions ADD COLUMN excluded INTEGER NOT NULL DEFAULT 0;
ALTER TABLE feedback ADD COLUMN task_id TEXT;
CREATE TABLE tasks (
  id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL,
  created_at REAL NOT NULL,
  ended_at REAL,
  instruction TEXT,        -- code: the user's request
  workspace_blob TEXT,     -- blobs.id of the workspace snapshot (JSON {path: text})
  verify_command TEXT,     -- code: a command whose exit status 0 means "solved"
  model_version TEXT,
  status TEXT,             -- running | done | failed | cancelled | limit
  final_message TEXT,      -- code: the agent's last answer
  final_message_chars INTEGER
);
CREATE TABLE steps (
  id TEXT PRIMARY KEY,     -- task id + ":" + idx
  session_id TEXT NOT NULL,
  task_id TEXT NOT NULL,
  idx INTEGER NOT NULL,
  at REAL NOT NULL,
  role TEXT NOT NULL,      -- system | user | assistant | tool
  content TEXT,            -- code
  tool_calls TEXT,         -- code: JSON [{"id","name","arguments"}]
  tool_calls_hash TEXT,    -- sha256 of tool_calls, kept at every consent level (loop detection)
  tool_call_id TEXT,
  tool_name TEXT,
  result TEXT,             -- code: tool output
  error TEXT,              -- code: error text of a failed/invalid tool call
  is_error INTEGER NOT NULL DEFAULT 0,
  invalid INTEGER NOT NULL DEFAULT 0,  -- the call did not parse / named no tool
  token_ids TEXT,          -- code: JSON [int], the sampled tokens
  logprobs TEXT,           -- code: JSON [float], their sampling logprobs
  policy_version TEXT,
  duration_ms REAL,
  prompt_tokens INTEGER,
  output_tokens INTEGER
);
CREATE TABLE edits (
  id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL,
  created_at REAL NOT NULL,
  task_id TEXT,
  suggestion_id TEXT,
  document_uri TEXT,
  document_version INTEGER,
  excluded INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE hunks (
  id TEXT PRIMARY KEY,     -- edit id + ":" + idx
  session_id TEXT NOT NULL,
  edit_id TEXT NOT NULL,
  idx INTEGER NOT NULL,
  original TEXT,           -- code
  replacement TEXT,        -- code
  outcome TEXT             -- pending | accepted | rejected | failed | reverted
);
CREATE TABLE outcomes (
  id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL,
  at REAL NOT NULL,
  task_id TEXT,
  suggestion_id TEXT,
  tests_before_passed INTEGER, tests_before_failed INTEGER,
  tests_after_passed INTEGER, tests_after_failed INTEGER,
  diagnostics_before INTEGER, diagnostics_after INTEGER,
  lint_before INTEGER, lint_after INTEGER,
  reverted INTEGER,
  dissatisfied_followup INTEGER
);
CREATE TABLE survival (
  id TEXT PRIMARY KEY,     -- suggestion id + ":" + after_s
  session_id TEXT NOT NULL,
  suggestion_id TEXT NOT NULL,
  at REAL NOT NULL,
  after_s INTEGER NOT NULL,  -- 30, 120, 300, 600, 900
  accepted_chars INTEGER,
  surviving_chars INTEGER,
  share REAL               -- surviving / accepted, in [0, 1]
);
CREATE TABLE files (
  id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL,
  at REAL NOT NULL,
  document_uri TEXT,
  language TEXT,
  blob_id TEXT NOT NULL    -- blobs.id of the text
);
CREATE TABLE rewards (
  id TEXT PRIMARY KEY,     -- subject kind:subject id:function@version
  session_id TEXT NOT NULL,
  subject_kind TEXT NOT NULL,  -- task | suggestion
  subject_id TEXT NOT NULL,
  function TEXT NOT NULL,
  version INTEGER NOT NULL,
  value REAL,              -- NULL when the function had no signal to judge
  computed_at REAL NOT NULL
);
CREATE TABLE model_versions (
  id TEXT PRIMARY KEY,
  created_at REAL NOT NULL,
  parent TEXT,
  stage TEXT,
  path TEXT,
  promoted_at REAL,
  metrics TEXT             -- JSON
);
CREATE TABLE training_runs (
  id TEXT PRIMARY KEY,
  created_at REAL NOT NULL,
  ended_at REAL,
  stage TEXT,
  model_in TEXT,
  model_out TEXT,
  status TEXT,
  config TEXT              -- JSON
);
CREATE TABLE training_metrics (
  id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL,
  at REAL NOT NULL,
  step INTEGER NOT NULL,
  name TEXT NOT NULL,
  value REAL
);
CREATE TABLE dropped (
  id TEXT PRIMARY KEY,
  at REAL NOT NULL,
  kind TEXT NOT NULL,      -- the event kind; never its content
  reason TEXT NOT NULL
);
CREATE INDEX tasks_session ON tasks(session_id);
CREATE INDEX steps_task ON steps(task_id, idx);
CREATE INDEX hunks_edit ON hunks(edit_id);
CREATE INDEX outcomes_task ON outcomes(task_id);
CREATE INDEX outcomes_suggestion ON outcomes(suggestion_id);
CREATE INDEX survival_suggestion ON survival(suggestion_id);
CREATE INDEX rewards_subject ON rewards(subject_kind, subject_id);
CREATE INDEX blob_refs_blob ON blob_refs(blob_id);
CREATE INDEX blob_refs_session ON blob_refs(session_id);
CREATE INDEX training_metrics_run ON training_metrics(run_id, step);
"""

# v3: how a task ended, from the harness: why it stopped, and the change it left behind.
_V3 = """
ALTER TABLE tasks ADD COLUMN stop_reason TEXT;   -- answered | max_steps | wall_time | ...
ALTER TABLE tasks ADD COLUMN stop_detail TEXT;   -- code: the harness's detail (an error text)
ALTER TABLE tasks ADD COLUMN diff TEXT;          -- code: the final unified diff, redacted
ALTER TABLE tasks ADD COLUMN diff_chars INTEGER; -- its length as given, kept at every consent
"""

MIGRATIONS: list[Migration] = [
    Migration(1, "sessions, inline suggestions, feedback, blobs", _V1),
    Migration(
        2, "agent tasks and steps, edits, outcomes, survival, rewards, models, training", _V2
    ),
    Migration(3, "task stop reason and detail, final diff", _V3),
]
SCHEMA_VERSION = MIGRATIONS[-1].version

# Tables whose rows belong to a session (forget deletes from each by session_id).
SESSION_TABLES = (
    "suggestions",
    "suggestion_events",
    "feedback",
    "tasks",
    "steps",
    "edits",
    "hunks",
    "outcomes",
    "survival",
    "files",
    "rewards",
    "blob_refs",
    "sessions",
)


def is_lock_error(exc: BaseException) -> bool:
    """SQLite's "someone else holds the lock" family: worth waiting for, never worth reporting."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def retry_locked(fn, *, deadline_s: float = LOCK_RETRY_S):
    """Call fn() until it stops failing with a lock error (exponential backoff up to 50 ms)."""
    delay = 0.001
    stop = time.monotonic() + deadline_s
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if not is_lock_error(exc) or time.monotonic() > stop:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE (waiting out other writers) ... COMMIT, or ROLLBACK on error.

    IMMEDIATE takes the write lock up front, so SQLite's busy handler covers the whole wait; a
    deferred BEGIN that later upgrades can fail with SQLITE_BUSY without waiting.
    """
    retry_locked(lambda: conn.execute("BEGIN IMMEDIATE"))
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    try:
        retry_locked(lambda: conn.execute("COMMIT"))
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def connect(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A raw connection with our pragmas; the caller owns transactions (isolation_level=None)."""
    conn = sqlite3.connect(
        str(path), isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
    )
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    # Freed cells and pages are zeroed, so deleted code does not linger in the file.
    conn.execute("PRAGMA secure_delete=ON")
    mode = retry_locked(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
    if str(mode).lower() != "wal" and str(path) != ":memory:":
        raise SchemaError(f"{path}: could not switch to WAL (journal_mode is {mode})")
    # WAL + NORMAL survives a killed process; flush() commits with FULL for power loss too.
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def schema_version(conn: sqlite3.Connection) -> int:
    """The highest applied migration (0 for a new file)."""
    has = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='_migrations'"
    ).fetchone()
    if not has:
        return 0
    row = conn.execute("SELECT MAX(version) FROM _migrations").fetchone()
    return int(row[0] or 0)


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Apply every migration above the file's version up to `target`; return the new version.

    Each migration runs in its own IMMEDIATE transaction and re-reads the version inside it, so
    two processes opening a new file at once apply each migration exactly once.
    """
    if target > SCHEMA_VERSION:
        raise SchemaError(f"no migration {target}; this code knows up to v{SCHEMA_VERSION}")
    current = schema_version(conn)
    if current > SCHEMA_VERSION:
        raise SchemaError(
            f"the database is at schema v{current}, newer than this flywheel (v{SCHEMA_VERSION});"
            " upgrade flywheel or point --db at another file"
        )
    for migration in MIGRATIONS:
        if migration.version <= current or migration.version > target:
            continue
        with write_transaction(conn):
            conn.execute(
                "CREATE TABLE IF NOT EXISTS _migrations ("
                "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            if schema_version(conn) >= migration.version:  # another process got here first
                continue
            for statement in _statements(migration.sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO _migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, time.time()),
            )
    return schema_version(conn)


def _statements(script: str) -> list[str]:
    """Split a migration script into statements (ours hold no ';' inside literals)."""
    lines = [line.split("--", 1)[0] for line in script.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def open_db(path: str | os.PathLike[str], *, create: bool = True) -> sqlite_utils.Database:
    """Open (creating folders and file if `create`) and migrate; a sqlite_utils.Database.

    Raises SchemaError for a file from a newer flywheel, sqlite3.Error for I/O problems
    (read-only, not a database), FileNotFoundError when `create` is False and it does not exist.
    """
    path = Path(path)
    if str(path) != ":memory:" and not path.exists():
        if not create:
            raise FileNotFoundError(f"no telemetry database at {path}")
        path.parent.mkdir(parents=True, exist_ok=True)
    conn = connect(path)
    try:
        migrate(conn)
    except BaseException:
        conn.close()
        raise
    return sqlite_utils.Database(conn, execute_plugins=False)


# --- blobs -----------------------------------------------------------------------------------


def blob_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put_blob(conn: sqlite3.Connection, data: bytes, session_id: str, now: float) -> str:
    """Store `data` once (by sha256) and record that `session_id` uses it; returns the blob id."""
    bid = blob_id(data)
    conn.execute(
        "INSERT OR IGNORE INTO blobs (id, size, data, created_at) VALUES (?, ?, ?, ?)",
        (bid, len(data), zlib.compress(data, 6), now),
    )
    conn.execute(
        "INSERT OR IGNORE INTO blob_refs (id, blob_id, session_id) VALUES (?, ?, ?)",
        (f"{bid}:{session_id}", bid, session_id),
    )
    return bid


def get_blob(conn: sqlite3.Connection, bid: str) -> bytes | None:
    row = conn.execute("SELECT data FROM blobs WHERE id = ?", (bid,)).fetchone()
    return None if row is None else zlib.decompress(row[0])
