"""The recorder: enqueue-and-return, durable flush, several processes, a killed writer, and bad
input that must never crash the caller or corrupt the file."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from telemetry import EVENTS, PrivacyPolicy, Recorder, store
from tests.telemetry.conftest import all_text, count, record_session

ROOT = Path(__file__).resolve().parents[2]


def _child(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _integrity(db_path: Path) -> str:
    conn = sqlite3.connect(db_path)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def test_every_event_kind_lands_in_its_table(recorder: Recorder, db_path: Path):
    ids = record_session(recorder)
    recorder.record("model_version", id="m1", parent="m0", stage="sft", metrics={"loss": 1.5})
    recorder.record("model_version", id="m1", promoted_at=5.0)  # upsert: promoted later
    recorder.record("training_run", id="r1", stage="rl", model_in="m1", status="running")
    recorder.record("training_metric", run_id="r1", step=1, name="loss", value=0.7)
    recorder.record("session_end", session_id=ids["session"])
    assert recorder.flush()
    stats = recorder.stats()
    assert stats["refused"] == 0 if "refused" in stats else True
    assert stats.get("dropped", 0) == 0
    assert count(db_path, "SELECT COUNT(*) FROM steps WHERE task_id = ?", ids["task"]) == 6
    assert count(db_path, "SELECT status FROM tasks") == "done"
    assert count(db_path, "SELECT outcome FROM hunks WHERE edit_id = ?", ids["edit"]) == "accepted"
    assert count(db_path, "SELECT share FROM survival WHERE after_s = 300") == 0.5
    assert count(db_path, "SELECT ended_at IS NOT NULL FROM sessions") == 1
    assert count(db_path, "SELECT stage || promoted_at FROM model_versions") == "sft5.0"
    assert count(db_path, "SELECT COUNT(*) FROM training_metrics") == 1
    assert count(db_path, "SELECT output_chars FROM suggestions") > 0
    # the step's tool calls and sampling data come back as JSON
    calls = json.loads(count(db_path, "SELECT tool_calls FROM steps WHERE idx = 1"))
    assert calls[0]["arguments"] == {"path": "app/main.py"}
    assert json.loads(count(db_path, "SELECT logprobs FROM steps WHERE idx = 1")) == [
        -0.1,
        -0.2,
        -0.3,
    ]
    tables_used = {spec.table for spec in EVENTS.values()}
    for table in tables_used:
        assert count(db_path, f"SELECT COUNT(*) FROM {table}") > 0, table


@pytest.mark.parametrize(
    ("kind", "fields", "why"),
    [
        ("no_such_kind", {"session_id": "s"}, "unknown event kind"),
        ("suggestion", {"session_id": "s", "kind": "inline", "bogus": 1}, "unknown fields"),
        ("suggestion", {"session_id": "s"}, "missing fields"),
        ("suggestion", {"session_id": "s", "kind": "popup"}, "kind must be one of"),
        ("suggestion_event", {"suggestion_id": "x", "event": "shown"}, "needs session_id"),
        ("step", {"session_id": "s", "task_id": "t", "idx": 0, "role": "robot"}, "role must be"),
    ],
)
def test_refused_events_return_none_and_log_once(
    recorder: Recorder, kind, fields, why, caplog: pytest.LogCaptureFixture
):
    with caplog.at_level("WARNING", logger="flywheel.telemetry"):
        assert recorder.record(kind, **fields) is None
        assert recorder.record(kind, **fields) is None
    assert recorder.stats()["refused"] == 2
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and why in messages[0]


def test_events_for_a_missing_session_are_dropped_with_a_reason(recorder: Recorder, db_path: Path):
    assert recorder.record("feedback", session_id="no-such-session", rating=1, comment="hi")
    sid = recorder.record("session_start", editor="nvim")
    assert recorder.record("task_end", session_id=sid, task_id="no-such-task", status="done")
    assert recorder.flush()
    assert recorder.stats()["dropped"] == 2
    reasons = sqlite3.connect(db_path).execute("SELECT reason FROM dropped ORDER BY reason")
    assert [r[0] for r in reasons] == ["unknown session", "unknown task"]
    assert count(db_path, "SELECT COUNT(*) FROM feedback") == 0


def test_consent_off_writes_nothing(db_path: Path):
    rec = Recorder(db_path, PrivacyPolicy(consent="off"))
    assert rec.record("session_start", editor="vscode") is None
    assert rec.flush() is False
    rec.close()
    assert not db_path.exists() and not db_path.parent.exists()


def test_record_returns_while_another_process_holds_the_write_lock(
    recorder: Recorder, db_path: Path
):
    sid = recorder.record("session_start", editor="vscode")
    assert recorder.flush()
    blocker = sqlite3.connect(db_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        ids = [recorder.record("feedback", session_id=sid, rating=1) for _ in range(100)]
        assert all(ids)  # enqueued without waiting for the lock
        assert recorder.flush(timeout=0.3) is False  # not durable while the lock is held
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert recorder.flush()  # the writer waited the lock out; no error reached us
    assert recorder.error is None
    assert count(db_path, "SELECT COUNT(*) FROM feedback") == 100


def test_close_flushes_and_later_records_are_ignored(db_path: Path):
    rec = Recorder(db_path)
    sid = rec.record("session_start", editor="vscode")
    for _ in range(500):
        rec.record("feedback", session_id=sid, rating=-1)
    assert rec.close()
    assert rec.record("feedback", session_id=sid, rating=1) is None
    assert count(db_path, "SELECT COUNT(*) FROM feedback") == 500


def test_threads_share_one_recorder(recorder: Recorder, db_path: Path):
    sid = recorder.record("session_start", editor="vscode")

    def work(n: int) -> None:
        for i in range(500):
            recorder.record("survival", session_id=sid, suggestion_id=f"t{n}-{i}", after_s=30)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert recorder.flush()
    assert count(db_path, "SELECT COUNT(*) FROM survival") == 2000


# --- bad input ---------------------------------------------------------------------------------


def test_invalid_utf8_lone_surrogates_and_nul_are_stored_cleaned(recorder: Recorder, db_path: Path):
    sid = recorder.record("session_start", editor="vs\ud800code\x00")
    tid = recorder.record("task_start", session_id=sid, instruction=b"fix \xff\xfe it \xc3")
    recorder.record(
        "step",
        session_id=sid,
        task_id=tid,
        idx=0,
        role="tool",
        result="a\x00b\udcffc",
        tool_calls=[{"name": "x\ud83d", "arguments": {"k\x00": b"\x80"}}],
    )
    assert recorder.flush()
    assert count(db_path, "SELECT editor FROM sessions") == "vs\ufffd\ufffd\ufffdcode\u2400"
    assert count(db_path, "SELECT instruction FROM tasks") == "fix \ufffd\ufffd it \ufffd"
    assert count(db_path, "SELECT result FROM steps") == "a\u2400b\ufffd\ufffd\ufffdc"
    json.loads(count(db_path, "SELECT tool_calls FROM steps"))  # still valid JSON
    assert _integrity(db_path) == "ok"


def test_a_50_mb_payload_is_truncated_with_a_marker(recorder: Recorder, db_path: Path):
    sid = recorder.record("session_start", editor="vscode")
    big = "x = compute(1)\n" * (50_000_000 // 15)
    assert recorder.record("suggestion", session_id=sid, kind="apply", output=big)
    assert recorder.record(
        "file", session_id=sid, document_uri="big.bin", text=b"\xff" * 50_000_000
    )
    assert recorder.flush()
    stored = count(db_path, "SELECT output FROM suggestions")
    limit = PrivacyPolicy().max_code_chars
    assert stored.startswith("x = compute(1)\n")
    assert f"[truncated: {len(big)} chars, kept {limit}]" in stored
    assert len(stored) < limit + 100
    assert count(db_path, "SELECT size FROM blobs") < 4 * limit
    assert _integrity(db_path) == "ok"


def test_non_numeric_measures_become_null(recorder: Recorder, db_path: Path):
    sid = recorder.record("session_start")
    recorder.record("suggestion", session_id=sid, kind="inline", latency_ms="fast", ttft_ms="12")
    assert recorder.flush()
    assert count(db_path, "SELECT latency_ms IS NULL AND ttft_ms = 12.0 FROM suggestions") == 1


def test_unwritable_location_disables_the_recorder_with_a_clear_error(tmp_path: Path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    rec = Recorder(not_a_dir / "telemetry.db")
    assert not rec.enabled
    assert "cannot write" in (rec.error or "")
    assert rec.record("session_start", editor="vscode") is None
    assert rec.flush() is False
    rec.close()


def test_a_file_that_is_not_a_database_is_left_alone(tmp_path: Path):
    path = tmp_path / "telemetry.db"
    path.write_bytes(b"this is somebody's notes, not SQLite" * 100)
    rec = Recorder(path)
    assert not rec.enabled and "not a flywheel database" in (rec.error or "")
    assert path.read_bytes() == b"this is somebody's notes, not SQLite" * 100


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_directory_and_file(tmp_path: Path):
    folder = tmp_path / "ro"
    folder.mkdir()
    with Recorder(folder / "t.db") as rec:
        rec.record("session_start")
    folder.chmod(0o555)
    (folder / "t.db").chmod(0o444)
    try:
        rec = Recorder(folder / "t.db")
        assert not rec.enabled and "read-only" in (rec.error or "")
        assert rec.record("session_start") is None
        rec = Recorder(folder / "new.db")
        assert not rec.enabled and rec.error
    finally:
        folder.chmod(0o755)


def test_a_full_disk_loses_the_batch_but_not_the_caller_or_the_file(
    recorder: Recorder, db_path: Path
):
    """SQLITE_FULL, made real by capping the file's pages on the writer's own connection."""
    sid = recorder.record("session_start", editor="vscode")
    assert recorder.flush()
    conn = recorder._conn
    assert conn is not None
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    recorder.record("suggestion", session_id=sid, kind="inline", output="y = 2\n" * 50_000)
    assert recorder.flush() is False
    assert "full" in (recorder.error or "")
    conn.execute("PRAGMA max_page_count = 1073741823")
    assert recorder.record("feedback", session_id=sid, rating=1)
    assert recorder.flush() is True
    assert _integrity(db_path) == "ok"
    assert count(db_path, "SELECT COUNT(*) FROM feedback") == 1


def test_a_future_schema_disables_instead_of_crashing(db_path: Path):
    db = store.open_db(db_path)
    db.execute("INSERT INTO _migrations VALUES (99, 'future', 0)")
    db.conn.close()
    rec = Recorder(db_path)
    assert not rec.enabled and "newer than this flywheel" in (rec.error or "")


# --- several processes; a killed process ---------------------------------------------------------

WRITER = """
import json, sys
from telemetry import Recorder
rec = Recorder(sys.argv[1], batch_size=int(sys.argv[3]))
sid = rec.record("session_start", editor="proc" + sys.argv[2])
tid = rec.record("task_start", session_id=sid, instruction="concurrent")
for i in range(5000):
    rec.record("step", session_id=sid, task_id=tid, idx=i, role="assistant", content=f"step {i}")
ok = rec.close()
print(json.dumps({"ok": ok, "error": rec.error, "stats": rec.stats()}))
"""


def test_four_processes_write_5000_events_each(tmp_path: Path):
    path = tmp_path / "shared.db"
    procs = [_child(WRITER, str(path), str(n), "100") for n in range(4)]
    results = [p.communicate(timeout=240) for p in procs]
    for (out, err), proc in zip(results, procs, strict=True):
        assert proc.returncode == 0, err
        assert "locked" not in err.lower() and "busy" not in err.lower(), err
        report = json.loads(out)
        assert report["ok"] and report["error"] is None
        assert report["stats"]["written"] == 5002
    assert count(path, "SELECT COUNT(*) FROM steps") == 20_000
    assert count(path, "SELECT COUNT(DISTINCT session_id) FROM steps") == 4
    assert _integrity(path) == "ok"


KILLED = """
import sys
from telemetry import Recorder
rec = Recorder(sys.argv[1], batch_size=200)
sid = rec.record("session_start", editor="doomed")
tid = rec.record("task_start", session_id=sid, instruction="until killed")
print("TASK", tid, flush=True)
i = 0
while True:
    for _ in range(100):
        rec.record("step", session_id=sid, task_id=tid, idx=i, role="assistant", content="s" * 200)
        i += 1
    if rec.flush():
        print("ACK", i, flush=True)
"""


def test_sigkill_mid_stream_keeps_every_acknowledged_event(tmp_path: Path):
    path = tmp_path / "killed.db"
    for round_ in range(3):  # three kills at different points of the stream
        proc = _child(KILLED, str(path))
        assert proc.stdout is not None
        task = proc.stdout.readline().split()[1]
        acked = 0
        while acked < 1500 + 700 * round_:  # the writer is mid-batch: events keep streaming
            line = proc.stdout.readline()
            assert line.startswith("ACK"), proc.stderr.read() if proc.stderr else line
            acked = int(line.split()[1])
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
        for line in rest.splitlines():  # acknowledged before the kill, read after it
            acked = max(acked, int(line.split()[1]))
        assert proc.returncode == -signal.SIGKILL
        assert _integrity(path) == "ok"
        stored = count(
            path, "SELECT COUNT(*) FROM steps WHERE task_id = ? AND idx < ?", task, acked
        )
        assert stored == acked
    assert count(path, "SELECT COUNT(*) FROM sessions") == 3


def test_session_text_scan_helper_sees_stored_code(recorder: Recorder, db_path: Path):
    """The helper the privacy tests rely on finds code in rows and in compressed blobs."""
    record_session(recorder, "SCANME")
    assert recorder.flush()
    text = all_text(db_path)
    assert "SCANME instruction" in text  # a plain column
    assert "# SCANME test" in text  # only inside the compressed workspace blob


def test_values_sqlite_cannot_hold_do_not_stop_the_writer(recorder: Recorder, db_path: Path):
    sid = recorder.record("session_start", editor=object())  # stored as its str()
    recorder.record("suggestion", session_id=sid, kind="inline", prompt_tokens=2**70)
    recorder.record("feedback", session_id=sid, rating=float("nan"), comment=["a", 1])
    assert recorder.flush()
    assert count(db_path, "SELECT prompt_tokens FROM suggestions") == float(2**70)
    assert count(db_path, "SELECT COUNT(*) FROM feedback") == 1
    assert recorder.record("feedback", session_id=sid, rating=1)
    assert recorder.flush()


def test_task_end_carries_stop_reason_detail_and_diff(recorder: Recorder, db_path: Path):
    """Schema v3: the harness's stop reason, its detail and the final diff are task columns."""
    ids = record_session(recorder, "DIFFMARK")
    assert recorder.flush()
    row = sqlite3.connect(db_path).execute(
        "SELECT stop_reason, stop_detail, diff, diff_chars FROM tasks WHERE id = ?", (ids["task"],)
    )
    stop_reason, detail, diff, diff_chars = row.fetchone()
    assert stop_reason == "answered" and detail == "(DIFFMARK detail)"
    assert diff.startswith("--- a/app/main.py\n") and "+    return 'DIFFMARK'" in diff
    assert diff_chars == len(diff)


def test_a_large_diff_is_cut_with_a_marker_and_excluded_sections_dropped(db_path: Path):
    policy = PrivacyPolicy(max_code_chars=2000)
    with Recorder(db_path, policy) as rec:
        sid = rec.record("session_start")
        tid = rec.record("task_start", session_id=sid, instruction="big change")
        body = "".join(f"+line {i}\n" for i in range(1000))
        diff = f"--- /dev/null\n+++ b/big.py\n@@ -0,0 +1,1000 @@\n{body}"
        diff += "--- a/.env\n+++ b/.env\n@@ -1 +1 @@\n-A=1\n+A=2\n"
        rec.record("task_end", session_id=sid, task_id=tid, status="done", diff=diff)
        short = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n--- a/.env\n+++ b/.env\n"
        tid2 = rec.record("task_start", session_id=sid, instruction="small change")
        rec.record("task_end", session_id=sid, task_id=tid2, status="done", diff=short + "+X=1\n")
        assert rec.flush()
    stored, chars = (
        sqlite3.connect(db_path)
        .execute("SELECT diff, diff_chars FROM tasks WHERE id = ?", (tid,))
        .fetchone()
    )
    assert chars == len(diff) and len(stored) < 2100
    assert stored.startswith("--- /dev/null\n+++ b/big.py\n")
    assert stored.endswith(f"\n[truncated: {len(diff)} chars, kept 2000]")  # the cut is marked
    small = count(db_path, "SELECT diff FROM tasks WHERE id = ?", tid2)
    assert (
        small == "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n[diff of an excluded file omitted]\n"
    )


def test_held_rows_with_duplicate_ids_in_one_batch_match_one_by_one_writes(
    recorder: Recorder, db_path: Path
):
    """Inserts go out with executemany; a duplicate id in the batch makes the writer replay the
    batch row by row, so the first row wins and only the duplicate is dropped (with a reason)."""
    sid = recorder.record("session_start")
    recorder.record("suggestion", session_id=sid, id="dup", kind="inline", output="first")
    recorder.record("suggestion_event", session_id=sid, suggestion_id="dup", event="shown")
    recorder.record("suggestion", session_id=sid, id="dup", kind="apply", language="py")
    recorder.record("suggestion", session_id=sid, id="other", kind="inline", output="kept")
    assert recorder.flush()
    assert count(db_path, "SELECT output FROM suggestions WHERE id = 'dup'") == "first"
    assert count(db_path, "SELECT COUNT(*) FROM suggestions") == 2
    assert count(db_path, "SELECT COUNT(*) FROM suggestion_events") == 1
    assert count(db_path, "SELECT reason FROM dropped") == "duplicate id"
    stats = recorder.stats()
    assert stats["dropped"] == 1 and stats["written"] == 4


def test_session_model_fills_an_empty_version_and_never_overwrites(recorder: Recorder, db_path):
    empty = recorder.record("session_start", editor="nvim")  # the engine was still loading
    known = recorder.record("session_start", editor="nvim", model_version="v1")
    for sid in (empty, known):
        assert recorder.record("session_model", session_id=sid, model_version="v2") == sid
    assert recorder.flush()
    rows = sqlite3.connect(db_path).execute("SELECT id, model_version FROM sessions").fetchall()
    assert dict(rows) == {empty: "v2", known: "v1"}
