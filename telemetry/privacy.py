"""What may be written, and how to take it back: consent, exclusions, cleaning, forget.

Consent levels (one per recorder, stored on each session row):
  off      nothing is written; the database file is not even created
  metrics  counts, timings, outcomes, ratings and hashes; no code, prompts, outputs, tool
           arguments or results, token ids, file contents or free-text comments
  code     everything, after exclusion and redaction

Exclusions: a file whose path matches one of `PrivacyPolicy.exclude` (fnmatch on the base name
and on the whole path) is treated as `metrics` for that event: its code never reaches the file.
A task's final diff loses the sections of excluded files (`drop_excluded_files`).

Redaction: every code string passes `redact()` (redaction.py) before it is written.

Cleaning: `clean_text()` makes any value storable: bytes are decoded as UTF-8 with U+FFFD for bad
sequences, lone surrogates become U+FFFD, NUL becomes U+2400 (␀), and text longer than the limit
is cut with a `[truncated: N chars]` marker. `clean_code()` is clean_text plus redaction.

Forget: `forget()` deletes a session, a workspace or everything, with the blobs no other session
uses, then VACUUMs and truncates the WAL; with `secure_delete` on, the bytes are gone from the
file (tests/telemetry/test_privacy.py scans the raw file for them).
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import os
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlparse

from telemetry import store
from telemetry.redaction import redact

CONSENT_LEVELS = ("off", "metrics", "code")

DEFAULT_EXCLUDE = (
    ".env",
    ".env.*",
    "*.env",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "id_*",  # ssh keys: id_rsa, id_ed25519, ...
    "*.kdbx",
    ".netrc",
    ".pgpass",
    ".npmrc",
    ".pypirc",
    "credentials",
    "credentials.*",
    "*credentials*.json",
    "*secret*",
    ".aws/*",
    ".ssh/*",
    ".git-credentials",
)

MAX_CODE_CHARS = 1_000_000  # one code field; longer values are cut with a marker
MAX_META_CHARS = 1_000  # one metadata field (editor name, trigger, uri, ...)


@dataclass(frozen=True)
class PrivacyPolicy:
    consent: str = "code"  # one of CONSENT_LEVELS
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE  # globs; files matching never store code
    max_code_chars: int = MAX_CODE_CHARS  # per field, after which the value is truncated
    redact_secrets: bool = True  # False only for tests of the redactor itself

    def __post_init__(self) -> None:
        if self.consent not in CONSENT_LEVELS:
            raise ValueError(f"consent must be one of {CONSENT_LEVELS}, not {self.consent!r}")
        if self.max_code_chars < 1000:
            raise ValueError("max_code_chars below 1000 would cut ordinary files")


def workspace_id(root: str | os.PathLike[str]) -> str:
    """A stable id for a workspace folder that does not reveal its path."""
    resolved = str(Path(root).expanduser().resolve())
    return "ws_" + hashlib.sha256(resolved.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def uri_path(uri: str) -> str:
    """'file:///a/b%20c.py' -> '/a/b c.py'; plain paths pass through."""
    if "://" in uri:
        parsed = urlparse(uri)
        return unquote(parsed.path)
    return uri


def is_excluded(path_or_uri: str | None, globs: tuple[str, ...]) -> bool:
    """Whether a path or file URI matches one of `globs` (by base name, whole path, or tail)."""
    if not path_or_uri:
        return False
    return _is_excluded(path_or_uri, globs)


@functools.lru_cache(maxsize=4096)  # the same few documents come back in every event
def _is_excluded(path_or_uri: str, globs: tuple[str, ...]) -> bool:
    path = PurePosixPath(uri_path(path_or_uri).replace("\\", "/"))
    name = path.name
    full = str(path)
    for glob in globs:
        if fnmatch.fnmatchcase(name, glob) or fnmatch.fnmatchcase(full, glob):
            return True
        if "/" in glob and fnmatch.fnmatchcase(full, "*/" + glob):
            return True
    return False


# --- diffs ------------------------------------------------------------------------------------

_HUNK_HEADER = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
EXCLUDED_DIFF_MARK = "[diff of an excluded file omitted]\n"


def _diff_path(header: str) -> str | None:
    """'--- a/app/.env\t2024-01-01' -> 'app/.env'; '+++ /dev/null' -> None."""
    path = header[4:].split("\t", 1)[0].strip()
    if path == "/dev/null" or not path:
        return None
    return path[2:] if path[:2] in ("a/", "b/") else path


def drop_excluded_files(diff: str, globs: tuple[str, ...]) -> str:
    """A unified diff without the sections of files that match `globs` (each replaced by one
    EXCLUDED_DIFF_MARK line), so an edit of `.env` never reaches the database through a diff.

    A section starts at `diff --git`, or at a `--- `/`+++ ` header pair when the current section
    already has one. Hunk bodies are skipped by their line counts, so a removed line that reads
    `-- x` (shown as `--- x`) is never taken for a header.
    """
    if not globs or "--- " not in diff:
        return diff
    lines = diff.splitlines(keepends=True)
    sections: list[tuple[list[str], set[str]]] = [([], set())]
    has_pair = False  # the current section already has its ---/+++ headers
    old_left = new_left = 0  # lines still to come in the current hunk
    for i, line in enumerate(lines):
        if old_left > 0 or new_left > 0:
            if line.startswith("-"):
                old_left -= 1
            elif line.startswith("+"):
                new_left -= 1
            elif not line.startswith("\\"):  # "\ No newline at end of file" counts for none
                old_left -= 1
                new_left -= 1
            sections[-1][0].append(line)
            continue
        pair = line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
        if line.startswith("diff --git ") or (pair and has_pair):
            sections.append(([], set()))
            has_pair = False
        body, paths = sections[-1]
        if line.startswith("diff --git "):
            for part in line[len("diff --git ") :].split():
                paths.add(part[2:] if part[:2] in ("a/", "b/") else part)
        elif line.startswith(("--- ", "+++ ")):
            has_pair = has_pair or pair
            path = _diff_path(line)
            if path is not None:
                paths.add(path)
        else:
            match = _HUNK_HEADER.match(line)
            if match:
                old_left = int(match.group(1) or 1)
                new_left = int(match.group(2) or 1)
        body.append(line)
    out: list[str] = []
    for body, paths in sections:
        if any(is_excluded(p, globs) for p in paths):
            out.append(EXCLUDED_DIFF_MARK)
        else:
            out.extend(body)
    return "".join(out)


# --- cleaning --------------------------------------------------------------------------------

_NUL = "\x00"
_NUL_MARK = "\u2400"


def clean_text(value: object, limit: int, *, marker: bool = True) -> str:
    """Any value -> storable text of at most `limit` chars (+ a truncation marker unless
    marker=False). Never raises."""
    if type(value) is str and len(value) <= limit and value.isascii() and _NUL not in value:
        return value  # the common case, 10x cheaper than the checks below
    unit = "chars"
    if isinstance(value, bytes | bytearray | memoryview):
        original, unit = len(value), "bytes"
        text = bytes(value[: limit * 4 + 4]).decode("utf-8", "replace")
    elif isinstance(value, str):
        original, text = len(value), value
    else:
        text = str(value)
        original = len(text)
    text = text[: limit + 1]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if _NUL in text:
        text = text.replace(_NUL, _NUL_MARK)
    if len(text) > limit or (unit == "bytes" and original > limit * 4 + 4):
        text = text[:limit]
        if marker:
            text += f"\n[truncated: {original} {unit}, kept {limit}]"
    return text


_REDACT_MARGIN = 16_384  # chars past the limit that are redacted before the cut


def clean_code(value: object, limit: int, *, redact_secrets: bool = True) -> str:
    """clean_text + redact, cutting only after redaction, so a secret that straddles the limit
    is redacted whole instead of stored by halves."""
    if type(value) is str and len(value) <= limit and value.isascii() and _NUL not in value:
        return redact(value) if redact_secrets else value  # the common case: nothing to cut
    text = clean_text(value, limit + _REDACT_MARGIN, marker=False)
    if redact_secrets:
        text = redact(text)
    if len(text) <= limit and not _was_cut(value, limit + _REDACT_MARGIN):
        return text
    if isinstance(value, bytes | bytearray | memoryview):
        original, unit = len(value), "bytes"
    else:
        original, unit = (len(value) if isinstance(value, str) else len(text)), "chars"
    return text[:limit] + f"\n[truncated: {original} {unit}, kept {limit}]"


def _was_cut(value: object, limit: int) -> bool:
    if isinstance(value, str):
        return len(value) > limit
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value) > limit * 4 + 4
    return False


# --- forget ----------------------------------------------------------------------------------


@dataclass
class ForgetReport:
    sessions: int = 0  # sessions deleted
    rows: int = 0  # rows deleted across all tables (sessions included)
    blobs: int = 0  # blobs deleted (no session uses them any more)
    wal_truncated: bool = False  # False when another process kept the WAL open
    tables: dict[str, int] = field(default_factory=dict)


def forget(
    db_path: str | os.PathLike[str],
    *,
    session_id: str | None = None,
    workspace: str | None = None,
    everything: bool = False,
) -> ForgetReport:
    """Delete one session, one workspace (by id from workspace_id(), or by folder) or everything.

    After the deletes it VACUUMs (rewriting every page) and checkpoints the WAL with TRUNCATE, so
    the deleted bytes are not left in free pages, free cells or old WAL frames.
    """
    if sum(x is not None and x is not False for x in (session_id, workspace, everything)) != 1:
        raise ValueError("forget needs exactly one of session_id, workspace, everything")
    db = store.open_db(db_path, create=False)
    conn = db.conn
    report = ForgetReport()
    try:
        with store.write_transaction(conn):
            if everything:
                ids = [r[0] for r in conn.execute("SELECT id FROM sessions")]
            elif session_id is not None:
                ids = [
                    r[0] for r in conn.execute("SELECT id FROM sessions WHERE id=?", (session_id,))
                ]
            else:
                assert workspace is not None
                wid = workspace if workspace.startswith("ws_") else workspace_id(workspace)
                ids = [
                    r[0]
                    for r in conn.execute("SELECT id FROM sessions WHERE workspace_id=?", (wid,))
                ]
            report.sessions = len(ids)
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS forget_ids (id TEXT PRIMARY KEY)")
            conn.execute("DELETE FROM forget_ids")
            conn.executemany("INSERT OR IGNORE INTO forget_ids VALUES (?)", [(i,) for i in ids])
            for table in store.SESSION_TABLES:
                column = "id" if table == "sessions" else "session_id"
                cur = conn.execute(
                    f"DELETE FROM {table} WHERE {column} IN (SELECT id FROM forget_ids)"
                )
                report.tables[table] = cur.rowcount
                report.rows += cur.rowcount
            if everything:
                cur = conn.execute("DELETE FROM dropped")
                report.rows += cur.rowcount
            cur = conn.execute("DELETE FROM blobs WHERE id NOT IN (SELECT blob_id FROM blob_refs)")
            report.blobs = cur.rowcount
            conn.execute("DROP TABLE forget_ids")
        store.retry_locked(lambda: conn.execute("VACUUM"))
        row = store.retry_locked(lambda: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone())
        report.wal_truncated = row is not None and row[0] == 0
    finally:
        conn.close()
    return report


def sqlite_error_text(exc: sqlite3.Error) -> str:
    """A one-line, human reason for an SQLite failure, with the usual fix."""
    text = str(exc)
    low = text.lower()
    if "readonly" in low or "read-only" in low:
        return f"{text} (the file or its folder is read-only; fix permissions or pass --db)"
    if "full" in low:
        return f"{text} (the disk is full; free space or run `flywheel telemetry forget`)"
    if "unable to open" in low:
        return f"{text} (the folder does not exist or is not writable; pass --db)"
    if "not a database" in low or "malformed" in low:
        return f"{text} (the file is not a flywheel database; pass --db to use another)"
    return text
